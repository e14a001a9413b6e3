"""The runner on the real ResNet-20: journal, failures, resume after SIGKILL, the final test re-score."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import modelopt
from modelopt.cli.app import app
from modelopt.compressors import COMPRESSORS, Compressor
from modelopt.errors import ConfigError
from modelopt.run.finish import RunResult
from modelopt.run.summary import read_summary
from modelopt.testing.env import child_env
from modelopt.testing.journal import wait_for_trials

REPO = Path(__file__).resolve().parents[2]
# Quantization alone, 8 or 4 bits per channel rounded to nearest, no latency timing, no report: what these tests check
# (the journal, the summary's records and bounds, failures, resume) is the runner's, which GPTQ's passes, a larger
# menu, the timed plans and the report do not touch; each costs seconds a run.
CHEAP = dict(progress=False, report=False, compressors=["quantize"], bits=[8, 4], granularity=["per_channel"],
             rounding=["nearest"], latency=None, reconstruct=False)
# The same settings on the command line.
CHEAP_CLI = ["--compressors", "quantize", "--bits", "8,4", "--granularity", "per_channel", "--rounding", "nearest",
             "--latency", "none", "--reconstruct", "off", "--no-progress"]
# The tests that only read `finished` run in one test process, which makes it once.
SHARES_FINISHED = pytest.mark.xdist_group("runner_finished")


def _journal(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trials.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def finished(tmp_path_factory, fewer_workload) -> RunResult:
    """A finished run on `fewer_workload` (its 80 confirm images certify a 90 % floor for plans that change few
    answers), budget 6, seed 0: the tests of its journal, summary and confirmation read it (none changes it)."""
    return modelopt.optimize(fewer_workload, budget=6, seed=0, min_retention=0.9,
                             out=tmp_path_factory.mktemp("finished") / "run", **CHEAP)


@pytest.mark.slow
@SHARES_FINISHED
def test_run_writes_journal_best_plan_and_summary(finished, fewer_data):
    result, run = finished, finished.run_dir
    records = _journal(run)
    n = len(records)  # trials with a 4-bit layer cost more than one evaluation (batch norms re-estimated)
    assert n >= 2 and [r["number"] for r in records] == list(range(n))
    assert len({r["plan_key"] for r in records}) == n
    assert result.budget_used == pytest.approx(sum(r["cost"] for r in records)) and result.budget_used >= 6
    assert result.budget_used - records[-1]["cost"] < 6  # it stopped once the budget was spent
    summary = json.loads((run / "summary.json").read_text())
    assert summary["n_trials"] == n
    if result.best is not None:
        assert (run / "best_plan.yaml").exists()
        assert result.best_test.split == "test" and result.best_test.n_samples == 160
        assert summary["best"]["test"]["retention"] == pytest.approx(result.best_test.retention)
        # The saved plan reloads to the same plan.
        m = modelopt.evaluate(plan=run / "best_plan.yaml", data=fewer_data, split="test",
                              reconstruct=False)  # scored as the run (reconstruct off) certified it
        assert m.accuracy == pytest.approx(result.best_test.accuracy)
    assert all(t.metrics.split == "val" for t, _ in result.pareto)


@pytest.mark.slow
def test_an_existing_run_folder_is_not_overwritten(tmp_path, fewer_workload):
    small = dict(CHEAP, min_retention=0.9)  # what fewer_workload's 80 val images can certify
    modelopt.optimize(fewer_workload, budget=1, out=tmp_path / "run", **small)
    journal = (tmp_path / "run" / "trials.jsonl").read_bytes()
    with pytest.raises(ConfigError, match=r"already holds a run .1 trials.; pass --resume"):
        modelopt.optimize(fewer_workload, budget=1, out=tmp_path / "run", **small)
    with pytest.raises(ConfigError, match="it was run with seed=0, not 5"):
        modelopt.optimize(fewer_workload, budget=2, out=tmp_path / "run", resume=True, seed=5, **small)
    assert (tmp_path / "run" / "trials.jsonl").read_bytes() == journal


class _Poison(Compressor):
    """Makes a layer's weight NaN: a trial that must be recorded as failed."""

    name = "poison"

    def menu(self, layer):
        return (None, "nan") if layer.name == "linear" else (None,)

    def parse(self, raw, layer):
        return raw

    def dump(self, choice):
        return choice

    def apply(self, weight, choice):
        return weight if choice is None else torch.full_like(weight, float("nan"))

    def weight_bytes(self, layer, choice):
        return layer.params * 4


@pytest.mark.slow
def test_failed_trials_are_recorded_and_the_search_goes_on(tmp_path, fewer_workload):
    COMPRESSORS.register("poison")(_Poison)
    try:
        result = modelopt.optimize(fewer_workload, budget=12, out=tmp_path / "run", min_retention=0.9,
                                   strategy="random", **dict(CHEAP, compressors=("quantize", "poison")))
    finally:
        COMPRESSORS._items.pop("poison")
    records = _journal(tmp_path / "run")
    costs = [r["cost"] for r in records]  # failed trials are charged too, so the budget runs out as usual
    # (a trial's batch-norm re-estimation on 64 calib images, 0.8 of 80 val images' worth, is charged on top of its
    # evaluation: no trial costs more than 1.8)
    assert sum(costs[:-1]) < 12 <= sum(costs) and len(records) >= 7
    failed = [r for r in records if r["status"] == "failed"]
    assert failed and all("non-finite" in r["error"] for r in failed)
    assert all(r["plan"]["linear/poison"] == "nan" for r in failed)
    assert any(r["status"] == "complete" for r in records)
    assert result.summary.n_failed == len(failed)


@pytest.mark.slow
def test_resume_after_sigkill_loses_and_repeats_nothing(tmp_path, fewer_data, fewer_workload):
    run_dir = tmp_path / "run"
    # Without reconstruction, as the uninterrupted run below: refitting the finalists changes no trial. Rounded to
    # nearest, 8 or 4 bits per channel, no latency: what survives a kill is the journal and the strategy's state, not
    # GPTQ's passes or the timed plans (three runs pay them).
    args = ["optimize", "--budget", "10", "--data", str(fewer_data), "--min-retention", "0.9", "--out", str(run_dir),
            *CHEAP_CLI]
    proc = subprocess.Popen([sys.executable, "-m", "modelopt", *args], env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    journal = run_dir / "trials.jsonl"
    wait_for_trials(run_dir, 4, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = journal.read_text().splitlines(keepends=True)
    before = [line for line in before if line.endswith("\n")]
    assert len(before) >= 4, "the run must be killed half-way"

    # The resume is the command line's, in this process: what a kill leaves is on disk, not in the killed process.
    done = CliRunner().invoke(app, [*args, "--resume", "--json"])
    assert done.exit_code == 0, done.stderr
    after = journal.read_text().splitlines(keepends=True)
    assert after[: len(before)] == before, "finished trials must survive unchanged"
    records = [json.loads(line) for line in after]
    n = len(records)
    assert n > len(before), "the resumed run went on"
    assert [r["number"] for r in records] == list(range(n))
    assert len({r["plan_key"] for r in records}) == n, "no plan is evaluated twice"
    assert sum(r["cost"] for r in records) >= 10 - 1e-9
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["n_trials"] == n

    # The resumed run proposes what an uninterrupted run would have (the strategy state survived).
    straight = modelopt.optimize(fewer_workload, budget=10, min_retention=0.9, out=tmp_path / "straight", **CHEAP)
    assert [t.plan.key for t in straight.trials] == [r["plan_key"] for r in records]
    # ... and reports what the whole run paid for its preparations, the killed part's included (issue 61).
    paid = read_summary(run_dir).preparation.charged
    assert paid and paid == pytest.approx(straight.summary.preparation.charged)


@pytest.mark.slow
def test_a_moved_run_folder_resumes_and_other_weights_are_refused(tmp_path, fewer_workload, fewer_data):
    import shutil

    small = dict(CHEAP, strategy="random", min_retention=0.9)
    first = modelopt.optimize(fewer_workload, budget=2, out=tmp_path / "a", **small)
    assert len(first.trials) == 2
    shutil.move(tmp_path / "a", tmp_path / "b")
    result = modelopt.optimize(fewer_workload, budget=4, out=tmp_path / "b", resume=True, **small)
    # The run's two trials cost less than 4 units: a third was needed and made.
    assert first.budget_used < 4 and len(result.trials) == 3
    assert [t.plan.key for t in result.trials[:2]] == [t.plan.key for t in first.trials]
    other = modelopt.build_workload("cifar10_resnet20", str(fewer_data), device="cpu")
    other.model.linear.bias.data += 1.0  # different weights, same name and path
    with pytest.raises(ConfigError, match="model_sha256"):
        modelopt.optimize(other, budget=4, out=tmp_path / "b", resume=True, **small)


# ---- confidence and confirmation (issue 11) ------------------------------------------------------


@pytest.mark.slow
def test_confidence_zero_runs_on_point_estimates(tmp_path, fewer_workload):
    """--confidence 0 is today's rule: a plan is feasible when its val retention meets the floor."""
    result = modelopt.optimize(fewer_workload, budget=4, seed=1, out=tmp_path / "r", confidence=0.0,
                               min_retention=0.99, **CHEAP)
    assert result.summary.objective.confidence == 0.0
    for t in result.trials:
        if t.ok:
            assert t.feasible == (t.metrics.stopped is None and t.metrics.retention >= 0.99)
    assert result.summary.confirmation.split == "confirm"  # the bundled sample's own confirm images


@pytest.mark.slow
@SHARES_FINISHED
def test_the_summary_leads_with_test_and_bounds(finished):
    result = finished
    best = result.summary.to_json()["best"]  # summary.json's layout: the test figures first
    assert best is not None and list(best)[:6] == ["trial", "plan_key", "plan", "test", "confirm", "val"]
    lo, hi = best["test"]["retention_lower"], best["test"]["retention_upper"]
    assert lo < best["test"]["retention"] < hi
    assert best["val"]["retention_lower"] >= 0.9  # feasible means the val bound clears the floor
    assert result.summary.confirmation.split == "confirm"
    assert best["confirmed"] is True and best["confirm"]["retention_certified"] >= 0.9
    assert json.loads((result.run_dir / "summary.json").read_text()) == result.summary.to_json()
    assert result.trials[0].plan == result.trials[0].plan.__class__(tuple(result.trials[0].plan.choices))
    assert all(c is not None for n, c in result.trials[0].plan.choices if n.endswith("/quantize"))  # the anchor


def test_a_val_split_too_small_to_certify_the_floor_is_refused_before_the_search(tmp_path, small_workload):
    with pytest.raises(ConfigError, match=r"val split \(169 images\) is too small to certify a 99.0% retention floor"):
        modelopt.optimize(small_workload, budget=4, out=tmp_path / "r", progress=False, report=False,
                          compressors=["quantize"], min_retention=0.99, reconstruct=False)
    assert not (tmp_path / "r").exists()  # nothing was written


def test_a_float_model_that_gets_nothing_right_is_refused_in_one_line(tmp_path, resnet20_workload, monkeypatch):
    """Retention would be 0 / 0 (it printed "nan%"), and "pass more data" cannot help: the line says what is wrong.
    The val labels are set one class off the float model's own answers, as a head that fits other classes does."""
    import dataclasses

    from modelopt.certify.evidence import check_scores

    val = resnet20_workload.splits["val"]
    monkeypatch.setitem(resnet20_workload.splits, "val", dataclasses.replace(val, y=(val.base_pred + 1) % 10))
    with pytest.raises(ConfigError, match=r"gets none of the [\d,]+ val images right \(0 % top-1\), so there is no "
                                          r"accuracy to retain: wrong or missing weights"):
        check_scores(resnet20_workload, "val")
    with pytest.raises(ConfigError, match="gets none of the"):
        modelopt.optimize(resnet20_workload, budget=2, out=tmp_path / "r", progress=False, report=False,
                          compressors=["quantize"], reconstruct=False)
    assert not (tmp_path / "r").exists()


@SHARES_FINISHED
def test_a_run_with_a_confirm_split_reports_only_what_confirmation_held(finished):
    result = finished
    conf = result.summary.confirmation
    assert conf.split == "confirm" and conf.usable
    if result.best is not None:
        best = result.summary.best
        assert best is not None and best.confirmed is True and best.confirm is not None
        assert result.best_confirm is not None and result.best_confirm.split == "confirm"
        lo = best.confirm.retention_lower
        assert lo is not None and lo >= 0.9  # confirmed: the confirm split's bound clears the floor
        tested = [f.plan_key for f in conf.finalists]
        assert result.best.plan.key in tested


def test_a_changed_floor_on_resume_is_refused_before_anything_loads(tmp_path, monkeypatch):
    """What a resumed run's settings say without its model (floor, seed, strategy, ...) is compared with run.json
    before the model and data load: one line naming the setting, nothing built."""
    from modelopt import api
    from modelopt.config.run_config import RunConfig

    run = tmp_path / "run"
    run.mkdir()
    RunConfig().write(run)

    def no_build(*args, **kwargs):
        raise AssertionError("the model and data were loaded before the settings were compared")

    monkeypatch.setattr(api, "build", no_build)
    with pytest.raises(ConfigError, match=r"it was run with min_retention=0\.99, not 0\.95"):
        api.run(RunConfig.read(run).replace(min_retention=0.95), out=run, resume=True, progress=False)
