"""Runs of any strategy as Optuna studies: an MCTS run exported, reloaded with optuna.load_study."""

from __future__ import annotations

import json
import shutil

import pytest

import modelopt
from modelopt.errors import ConfigError
from modelopt.run.optuna_storage import NUMBER_ATTR, export_run

optuna = pytest.importorskip("optuna")


@pytest.mark.slow
def test_an_mcts_run_is_exported_with_every_trial_and_reexport_adds_nothing(tmp_path, fewer_workload):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    # 400 images (a 90 % floor, which their 80 val images can certify), rounded to nearest, no latency timing: the
    # export reads the journal and run.json, whatever figures they hold. The report is written (it is checked below).
    result = modelopt.optimize(fewer_workload, strategy="mcts", budget=1, seed=3, out=tmp_path / "r20",
                               progress=False, storage=url, compressors=["quantize"], reconstruct=False,
                               min_retention=0.9, rounding=["nearest"], latency=None)
    journal = [json.loads(line) for line in (tmp_path / "r20" / "trials.jsonl").read_text().splitlines()]
    assert (tmp_path / "r20" / "report.html").is_file()
    study = optuna.load_study(study_name="r20", storage=url)
    trials = study.get_trials()
    assert len(trials) == len(journal) == len(result.trials)
    space_names = {name for name, _ in result.trials[0].plan.choices}
    for t, rec in zip(sorted(trials, key=lambda t: t.user_attrs[NUMBER_ATTR]), journal, strict=True):
        assert t.user_attrs[NUMBER_ATTR] == rec["number"] and t.user_attrs["plan_key"] == rec["plan_key"]
        assert t.state == optuna.trial.TrialState.COMPLETE
        m = rec["metrics"]
        assert t.values == pytest.approx([m["compression"], m["retention"]])
        assert t.user_attrs["size_bytes"] == m["size_bytes"] and t.user_attrs["strategy"] == "mcts"
        assert t.user_attrs["seed"] == 3 and t.user_attrs["feasible"] == rec["feasible"]
        assert set(t.params) == space_names
        for name, raw in rec["plan"].items():  # the choice's string form, e.g. int4/g64 or float
            want = "float" if raw is None else f"int{raw['bits']}/"
            assert t.params[name].startswith(want)
    assert study.user_attrs["strategy"] == "mcts" and study.user_attrs["min_retention"] == 0.9
    again = export_run(tmp_path / "r20", url)
    assert (again.added, again.skipped) == (0, len(journal))
    assert len(optuna.load_study(study_name="r20", storage=url).trials) == len(journal)


@pytest.mark.slow
def test_failed_trials_are_fail_and_a_longer_run_adds_only_its_new_trials(tmp_path, small_run):
    run = tmp_path / "seed0"
    run.mkdir()
    shutil.copy(small_run / "run.json", run)
    lines = (small_run / "trials.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) >= 12, "the small run is too short for this test"
    records = [json.loads(line) for line in lines[:12]]
    records[5].update(status="failed", metrics=None, reward=None, feasible=False, error="TrialError: NaN")
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:8]))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = export_run(run, url, study_name="grow")
    assert (first.added, first.skipped) == (8, 0)
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    second = export_run(run, url, study_name="grow")
    assert (second.added, second.skipped) == (4, 8)
    trials = sorted(optuna.load_study(study_name="grow", storage=url).trials, key=lambda t: t.user_attrs[NUMBER_ATTR])
    assert [t.user_attrs[NUMBER_ATTR] for t in trials] == list(range(12))
    assert trials[5].state == optuna.trial.TrialState.FAIL and trials[5].values is None
    assert trials[5].user_attrs["error"] == "TrialError: NaN"
    assert trials[6].state == optuna.trial.TrialState.COMPLETE
    # Another run under the same study name is refused, not mixed in.
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(small_run / "run.json", other)
    later = [json.loads(line) for line in lines[8:11]]
    for i, r in enumerate(later):  # numbers the study already has, with other plans
        r["number"] = i
    (other / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))
    with pytest.raises(ConfigError, match="holds another run"):
        export_run(other, url, study_name="grow")


def test_a_bad_storage_is_refused_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="not a database URL"):
        modelopt.optimize(budget=1, out=tmp_path / "r", progress=False, storage="studies.db", reconstruct=False)
    assert not (tmp_path / "r").exists()


def test_a_storage_that_cannot_be_opened_is_one_line_naming_the_folder(tmp_path):
    """SQLAlchemy's message goes on with a second line linking its docs; the dashboard printed both."""
    from modelopt.run.optuna_storage import check_storage

    with pytest.raises(ConfigError) as err:
        check_storage(f"sqlite:///{tmp_path / 'no' / 'such'}/studies.db")
    assert f"folder '{tmp_path / 'no' / 'such'}' does not exist" in str(err.value)
    (tmp_path / "studies.db").mkdir()  # a folder where the database file would be: the driver's own error
    with pytest.raises(ConfigError) as err:
        check_storage(f"sqlite:///{tmp_path / 'studies.db'}")
    assert "\n" not in str(err.value) and "Background on this error" not in str(err.value), str(err.value)
