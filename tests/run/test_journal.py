from __future__ import annotations

import dataclasses
import json

import pytest

from modelopt.config.assemble import build_compressors
from modelopt.errors import LoadError
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.trial import Trial, TrialStatus
from modelopt.plan.space import SearchSpace
from modelopt.run.journal import TRIAL_VERSION, Journal, Record, read_records, write_json_atomic
from modelopt.testing.compressors import synthetic_layers

SPACE = SearchSpace(synthetic_layers(), build_compressors(["quantize", "prune"]))
METRICS = Metrics(split="val", n_samples=100, accuracy=0.9, baseline_accuracy=0.92, retention=0.978, agreement=0.95,
                  size_bytes=1000, float_size_bytes=4000, compression=4.0, bitops=10, macs=20, eval_seconds=0.5,
                  base_right=92, lost=3, gained=1)


def _trial(number: int, ok: bool = True) -> Trial:
    # A different choice per decision and trial: quantizer specs, sparsities and "off" all go through the line.
    plan = SPACE.plan({d.name: d.choices[(number + i) % len(d.choices)] for i, d in enumerate(SPACE.decisions)})
    if ok:
        return Trial(number, plan, TrialStatus.COMPLETE, METRICS, 3.0, True, 1.0, 0.25, "random", 7, "0.1")
    return Trial(number, plan, TrialStatus.FAILED, None, None, False, 1.0, 0.1, "random", 7, "0.1", "boom")


def _record(number: int, **changes: object) -> Record:
    return dataclasses.replace(Record.of(_trial(number)), **changes)


def test_append_and_read(tmp_path):
    j = Journal(tmp_path / "t.jsonl")
    assert not j.exists() and j.records() == []
    for i in range(3):
        j.append(_record(i))
    assert [r.number for r in j.records()] == [0, 1, 2]


def test_a_torn_last_line_is_dropped_and_truncated(tmp_path):
    path = tmp_path / "t.jsonl"
    j = Journal(path)
    j.append(_record(0))
    with open(path, "a") as f:
        f.write('{"number": 1, "pla')  # killed mid-write
    assert [r.number for r in read_records(path)] == [0] and path.read_text().endswith('"pla')  # a reader: untouched
    assert [r.number for r in j.records()] == [0]
    assert path.read_text().endswith("\n")  # the writer's reader cut the torn line off
    j.append(_record(1))
    assert [r.number for r in j.records()] == [0, 1]


def test_corruption_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "t.jsonl"
    line = json.dumps(_record(0).to_json())
    path.write_text(f"{line}\nnot json\n{line}\n")
    with pytest.raises(LoadError, match="damaged at line 2"):
        Journal(path).records()
    with pytest.raises(LoadError, match="damaged at line 2"):  # every reader names it (report, export, sweeps)
        read_records(path)


@pytest.mark.parametrize(("change", "says"), [
    (lambda d: d.pop("number"), "field 'number' is missing"),
    (lambda d: d.update(number="two"), "a field is wrong"),
])
def test_a_line_that_is_json_but_not_a_record_is_named_by_its_line(tmp_path, change, says):
    """A record with a field removed or of the wrong kind ended report, resume and export in a KeyError or
    ValueError traceback; it is damage like a line that is not JSON, named by its line."""
    path = tmp_path / "t.jsonl"
    good, bad = _record(0).to_json(), _record(1).to_json()
    change(bad)
    path.write_text("".join(json.dumps(d) + "\n" for d in (good, bad, _record(2).to_json())))
    for read in (lambda: Journal(path).records(), lambda: read_records(path)):
        with pytest.raises(LoadError, match=f"damaged at line 2: {says}.*head -n 1"):
            read()


def test_nan_is_refused_not_written(tmp_path):
    j = Journal(tmp_path / "t.jsonl")
    with pytest.raises(ValueError):
        j.append(_record(0, cost=float("nan")))
    assert not j.exists()


def test_a_record_reads_back_as_the_line_the_runner_wrote(tmp_path):
    """The line format is the journal's contract: writing a trial and reading it back changes nothing,
    and the live trial comes back from the line and the space alone."""
    j = Journal(tmp_path / "t.jsonl")
    trials = [_trial(0), _trial(1, ok=False), _trial(2)]
    for t in trials:
        j.append(Record.of(t))
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [line["v"] for line in lines] == [TRIAL_VERSION] * 3
    assert list(lines[0]) == ["v", "number", "plan_key", "plan", "status", "metrics", "reward", "feasible", "cost",
                              "seconds", "strategy", "seed", "version", "error"]
    assert lines[0]["plan"] == trials[0].plan.to_flat() and lines[0]["plan_key"] == trials[0].plan.key
    assert lines[1]["status"] == "failed" and lines[1]["metrics"] is None and lines[1]["error"] == "boom"
    records = j.records()
    assert [r.to_json() for r in records] == lines  # byte-for-byte the same JSON values
    assert [Record.from_json(line) for line in lines] == records == [Record.of(t) for t in trials]
    assert [r.trial(SPACE) for r in records] == trials
    assert [r.ok for r in records] == [True, False, True]
    assert len(set(records + j.records())) == 3  # hashable (on everything but the plan, which plan_key names)


def test_an_older_line_reads_with_defaults():
    """Lines from before a field existed (no "v", no seconds or version) and a NaN reward read as the readers
    always read them."""
    old = {"number": 4, "plan_key": "abc", "plan": {"conv/quantize": None}, "status": "complete",
           "metrics": METRICS.to_dict(), "reward": float("nan"), "feasible": True, "cost": 1}
    rec = Record.from_json(old)
    assert (rec.number, rec.plan_key, rec.reward, rec.cost, rec.seconds, rec.version, rec.error) == (
        4, "abc", None, 1.0, 0.0, "", None)
    assert rec.ok and rec.metrics == METRICS
    assert rec.to_json()["v"] == TRIAL_VERSION


def test_read_records_is_by_number(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(_record(n).to_json()) + "\n" for n in (2, 0, 1)))
    assert [r.number for r in read_records(path)] == [0, 1, 2]
    assert read_records(tmp_path / "missing.jsonl") == []


def test_atomic_json(tmp_path):
    write_json_atomic(tmp_path / "s.json", {"a": 1})
    write_json_atomic(tmp_path / "s.json", {"a": 2})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 2}
    assert not list(tmp_path.glob("*.tmp"))
