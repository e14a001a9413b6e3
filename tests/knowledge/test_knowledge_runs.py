"""Runs with a knowledge store, end to end on the bundled ResNet-20: a damaged store is refused in one
line by the CLI; a warm-started run differs from a cold one only in the plans it asks, and its
journal resumes to the very trials an uninterrupted warm run makes."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

import modelopt
from modelopt.cli.app import app
from modelopt.knowledge import read_store
from modelopt.testing.cli import assert_one_line_error

# What the priors choose among, at the least cost per run: no latency timing of the finalists, rounding to nearest
# (no GPTQ pass): neither is what these runs compare, and together they were half of each run's time.
SMALL = {"compressors": ["quantize"], "bits": (8, 4, 2), "progress": False, "report": False, "min_retention": 0.9,
         "latency": None, "rounding": ["nearest"], "reconstruct": False}


def _trials(run_dir):
    out = []
    for line in (run_dir / "trials.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("seconds", None)
        if r.get("metrics"):
            r["metrics"].pop("eval_seconds", None)
        out.append(r)
    return out


@pytest.mark.slow
def test_cli_refuses_a_damaged_store_in_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "modelopt-knowledge", "version": 1, "runs": {"x": ')
    result = CliRunner().invoke(app, ["optimize",
        "--reconstruct", "off", "--knowledge", str(bad), "--budget", "2", "--out",
                                      str(tmp_path / "r"), "--no-progress", "--compressors", "quantize"])
    assert_one_line_error(result, "bad.json", "not valid JSON")
    assert not (tmp_path / "r" / "trials.jsonl").exists()


@pytest.mark.slow
def test_warm_run_differs_only_through_priors_and_resumes(tmp_path, small_workload):
    """One workload for all four runs (the priors, not the build, are under test)."""
    store = tmp_path / "store.json"
    # No store yet: the cold run, which writes one (what it learned is what the warm runs start from). Past the
    # anchors and INT4's two hedges (the first 5 trials), so the priors choose some plans.
    cold = modelopt.optimize(small_workload, budget=7, out=tmp_path / "cold", knowledge=store, **SMALL)
    assert len(read_store(store).runs) == 1
    shutil.copy(store, tmp_path / "a.json")
    shutil.copy(store, tmp_path / "b.json")

    whole = modelopt.optimize(small_workload, budget=7, out=tmp_path / "whole", knowledge=tmp_path / "a.json", **SMALL)
    modelopt.optimize(small_workload, budget=5.5, out=tmp_path / "part", knowledge=tmp_path / "b.json", **SMALL)
    assert len(read_store(tmp_path / "b.json").runs) == 2  # the store changed before the resume...
    modelopt.optimize(small_workload, budget=7, out=tmp_path / "part", knowledge=tmp_path / "b.json", resume=True,
                      **SMALL)
    assert _trials(tmp_path / "part") == _trials(tmp_path / "whole")  # ...yet the resumed run kept its priors

    # The evaluator and the budget's accounting are the cold run's: a plan both runs scored has the
    # same metrics and cost; only which plans were asked differs.
    cold_by_key = {t["plan_key"]: t for t in _trials(tmp_path / "cold")}
    shared = [t for t in _trials(tmp_path / "whole") if t["plan_key"] in cold_by_key]
    assert shared and all(t == {**cold_by_key[t["plan_key"]], "number": t["number"]} for t in shared)
    for result in (cold, whole):
        assert result.budget_used == pytest.approx(sum(t.cost for t in result.trials))
    assert [t.plan.key for t in cold.trials] != [t.plan.key for t in whole.trials]
