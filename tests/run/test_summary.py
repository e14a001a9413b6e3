"""summary.json as records: the layout it has always had, read back unchanged, older files read with defaults."""

from __future__ import annotations

import dataclasses
import json

from modelopt.evaluation.metrics import Metrics
from modelopt.objective import Objective
from modelopt.run.summary import (
    Baseline,
    ConfirmationEntry,
    Finalist,
    PlanEntry,
    Preparation,
    RunSummary,
    Scores,
    read_summary,
)

VAL = Metrics(split="val", n_samples=200, accuracy=0.9, baseline_accuracy=0.92, retention=0.978, agreement=0.95,
              size_bytes=1000, float_size_bytes=4000, compression=4.0, bitops=10, macs=20, eval_seconds=0.5,
              base_right=184, lost=5, gained=1)
TEST = dataclasses.replace(VAL, split="test", n_samples=300, retention=0.981)
CONFIRM = dataclasses.replace(VAL, split="confirm", n_samples=250, retention=0.99, latency_ms=1.5)
OBJ = Objective(min_retention=0.97, confidence=0.95, claim_images=250)
PLAN = {"version": 1, "default": {"quantize": {"bits": 4, "granularity": "per_channel", "rounding": "gptq"}}}


def _summary() -> RunSummary:
    def entry(trial: int, confirmed: bool | None = None, name: str | None = None) -> PlanEntry:
        return PlanEntry(trial, f"key{trial}", PLAN, Scores.of(TEST, OBJ), Scores.of(CONFIRM, OBJ), Scores.of(VAL, OBJ),
                         confirmed, name)

    return RunSummary(
        version="0.1", run_dir="runs/r", config={"model": "m", "compressors": {"quantize": {}}}, objective=OBJ,
        budget=10.0, budget_used=10.5, n_trials=12, n_failed=1, n_feasible=4,
        baseline={"val": Baseline(0.92, 200), "confirm": Baseline(0.91, 250), "test": Baseline(0.93, 300)},
        float_size_bytes=4000, device="cpu", best=entry(3, confirmed=True), search_best=entry(5),
        confirmation=ConfirmationEntry("confirm", True, 0.995, 1, (
            Finalist(0, "key0", False, 0.4, Scores.of(CONFIRM, OBJ)), Finalist(3, "key3", True, None, None))),
        anchors=(entry(0, name="INT8"), entry(1, name="INT4")), pareto=(entry(3), entry(5)),
        preparation=Preparation({"layer_inputs:256": 2.1}, {"layer_inputs:256": 0.128}),
        search_wall_seconds=30.5, eval_seconds_this_session=20.25,
    )


def test_the_summary_reads_back_as_written(tmp_path):
    s = _summary()
    (tmp_path / "summary.json").write_text(json.dumps(s.to_json(), indent=1, allow_nan=False))
    assert read_summary(tmp_path) == s == RunSummary.from_json(json.loads(json.dumps(s.to_json())))
    assert s.confirmed and s.best is not None and s.best.test is not None
    assert s.best.test.metrics == TEST and s.best.test.retention_certified == OBJ.retention_lower(TEST)


def test_the_layout_is_summary_json_s():
    """The keys and nesting every summary.json has had: readers of the file (scripts, older reports) keep working."""
    doc = _summary().to_json()
    assert list(doc) == ["version", "run_dir", "config", "objective", "budget", "budget_used", "n_trials", "n_failed",
                         "n_feasible", "baseline", "float_size_bytes", "device", "best", "search_best", "confirmation",
                         "anchors", "pareto", "preparation", "search_wall_seconds", "eval_seconds_this_session"]
    assert doc["objective"] == {"target": "size", "min_retention": 0.97, "confidence": 0.95, "count_gains": True,
                                "claim_images": 250}
    assert doc["baseline"]["test"] == {"accuracy": 0.93, "n_samples": 300}
    entry = ["trial", "plan_key", "plan", "test", "confirm", "val"]
    assert list(doc["best"]) == [*entry, "confirmed"] and list(doc["search_best"]) == entry
    assert [list(a) for a in doc["anchors"]] == [[*entry, "name"]] * 2 and [a["name"] for a in doc["anchors"]] == [
        "INT8", "INT4"]
    lo, hi = TEST.retention_bounds(0.95)
    assert doc["best"]["test"] == {**TEST.to_dict(), "retention_lower": lo, "retention_upper": hi,
                                   "retention_certified": OBJ.retention_lower(TEST)}
    assert doc["confirmation"] == {"split": "confirm", "usable": True, "ceiling": 0.995, "confirmed": 1, "finalists": [
        {"trial": 0, "plan_key": "key0", "confirmed": False, "pass_chance": 0.4,
         "confirm": doc["best"]["confirm"], "composed": None},
        {"trial": 3, "plan_key": "key3", "confirmed": True, "pass_chance": None, "confirm": None, "composed": None}]}
    assert doc["preparation"] == {"seconds": {"layer_inputs:256": 2.1}, "charged": {"layer_inputs:256": 0.128}}


def test_an_older_summary_reads_with_defaults():
    """A file from before confidence, confirmation and anchors: what it lacks reads as the run ran without it."""
    old = {"budget": 5, "budget_used": 5.2, "n_trials": 6, "objective": {"target": "size", "min_retention": 0.99},
           "float_size_bytes": 4000, "baseline": {"val": {"accuracy": 0.9, "n_samples": 100}},
           "best": {"trial": 2, "plan_key": "k", "plan": PLAN, "test": TEST.to_dict(), "val": VAL.to_dict()},
           "pareto": [{"trial": 2, "plan_key": "k", "plan": PLAN, "test": None}]}
    s = RunSummary.from_json(old)
    assert s.objective.confidence == 0.0 and not s.objective.count_gains and s.objective.claim_images is None
    assert s.confirmation == ConfirmationEntry() and s.anchors == () and not s.confirmed
    assert s.best is not None and s.best.confirm is None and s.best.confirmed is None
    assert s.best.test is not None and s.best.test.metrics == TEST and s.best.test.retention_lower is None
    assert "confirmed" not in s.to_json()["best"]  # not made up where the file said nothing
    assert s.pareto[0].test is None and s.preparation == Preparation()


def test_a_missing_or_foreign_summary_reads_as_none(tmp_path):
    assert read_summary(tmp_path) is None
    (tmp_path / "summary.json").write_text(json.dumps({"best": "not an entry"}))
    assert read_summary(tmp_path) is None


def test_preparations_held_twice_are_named_apart():
    """Batch-norm references on 64 and on 512 images are two preparations: the line says which is which."""
    from modelopt.cli.display import _preparation_text

    text = _preparation_text(Preparation({}, {"norm_reference:64": 0.03, "norm_reference:512": 0.26,
                                              "skip:layer1.0": 0.77}))
    assert "batch-norm reference (64 images) 0.03 units" in text and "(512 images) 0.26 units" in text
    assert "repair of the removed layer1.0 0.77 units" in text
