"""Bad input that needs no model fails before the model and data load: one line, exit 2, no file left."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import modelopt.api
from modelopt.cli.app import app
from modelopt.run.lock import lock_run_folder
from modelopt.testing.cli import assert_one_line_error
from modelopt.testing.env import child_env

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, list(map(str, args)))


@pytest.fixture
def no_loading(monkeypatch):
    """Loading the model fails the test: each case below must be refused before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model and data were loaded before the bad input was refused")

    monkeypatch.setattr(modelopt.api, "build_workload", refuse)


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf", "0", "-3"])
def test_a_budget_that_is_not_a_positive_number(tmp_path, no_loading, budget):
    assert_one_line_error(_run("optimize", "--reconstruct", "off", "--budget", budget, "--out", tmp_path / "r"),
                          "budget must be a positive number", budget.lstrip("-") if budget != "0" else "0")
    assert os.listdir(tmp_path) == []  # no folder, no run.json.tmp


def test_an_unwritable_out(tmp_path, no_loading):
    if Path("/proc/self").is_dir():  # refuses files even to root
        assert_one_line_error(_run("optimize",
            "--reconstruct", "off", "--out", "/proc/modelopt/run"), "cannot write to run folder",
                              "/proc/modelopt/run")
    if os.geteuid() != 0:  # root writes into a read-only-mode folder anyway (and so would the run)
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            assert_one_line_error(_run("optimize",
                "--reconstruct", "off", "--out", ro / "run"), "cannot write to run folder", str(ro))
        finally:
            ro.chmod(0o755)
    (tmp_path / "file").write_text("x")
    assert_one_line_error(_run("optimize",
        "--reconstruct", "off", "--out", tmp_path / "file"), "is a file; pass a folder to --out")


def test_a_busy_out(tmp_path, no_loading):
    with lock_run_folder(tmp_path / "r"):
        assert_one_line_error(_run("optimize",
            "--reconstruct", "off", "--out", tmp_path / "r"), f"run folder '{tmp_path / 'r'}' is in use")


def test_evaluate_checks_split_and_plan_file_first(tmp_path, no_loading):
    assert_one_line_error(_run("evaluate", "--split", "valid"), "unknown split 'valid'", "calib, val")
    assert_one_line_error(_run("evaluate", "--plan", tmp_path / "none.yaml"), "none.yaml", "does not exist")
    (tmp_path / "bad.yaml").write_text("default: [unclosed\n")
    assert_one_line_error(_run("evaluate", "--plan", tmp_path / "bad.yaml"), "bad.yaml", "not valid YAML")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    assert_one_line_error(_run("evaluate", "--plan", tmp_path / "list.yaml"), "list.yaml", "not a plan")
    (tmp_path / "bin.yaml").write_bytes(os.urandom(64) + b"\xff\xfe")
    result = _run("evaluate", "--plan", tmp_path / "bin.yaml")
    assert_one_line_error(result, "bin.yaml")


def test_resume_and_export_check_the_run_folder_first(tmp_path, no_loading):
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "run.json").write_bytes(b"\x00garbage")
    for args in (("optimize", "--reconstruct", "off", "--resume", "--out"), ("export",)):
        assert_one_line_error(_run(*args, tmp_path / "damaged"), "damaged", "run.json")
        assert_one_line_error(_run(*args, tmp_path / "nothing"), "nothing", "not a modelopt run folder")


def test_random_bytes_as_weights_never_advise_unpickling(tmp_path):
    path = tmp_path / "w.pt"
    for content in (os.urandom(4096), b"", b"not a checkpoint\n", b"\x00" * 64):
        path.write_bytes(content)
        result = _run("evaluate", "--weights", path)
        assert_one_line_error(result, "w.pt", "neither a torch.save zip archive nor a pickle")
        assert "pickle" not in result.stderr.replace("nor a pickle", "")
    torch.save(torch.nn.ReLU(), path)  # a real pickled object: that one is told about --allow-pickle
    assert_one_line_error(_run("evaluate", "--weights", path), "pickled reference to torch.nn.modules.activation.ReLU",
                          "--allow-pickle")


def test_an_npz_that_is_not_one_never_repeats_numpys_unsafe_hint(tmp_path):
    path = tmp_path / "d.npz"
    cases = {"not a zip archive": b"hello\n", "a single .npy array": None, "holds Python objects": None}
    for needle in cases:
        if needle == "not a zip archive":
            path.write_bytes(b"hello\n")
        elif needle == "a single .npy array":
            with open(path, "wb") as f:
                np.save(f, np.zeros(3))
        else:
            np.savez(path, x=np.array([{"a": 1}] * 4, dtype=object), y=np.arange(4))
        result = _run("evaluate", "--data", path)
        assert_one_line_error(result, "d.npz", needle)
        assert "unsafely" not in result.stderr and "allow_pickle" not in result.stderr


@pytest.mark.parametrize("seed", ["-1", "-100"])
def test_a_negative_seed_is_refused_before_loading(tmp_path, no_loading, seed):
    # numpy's generators refuse it: a ValueError traceback after the model had loaded.
    assert_one_line_error(_run("optimize",
        "--reconstruct", "off", "--seed", seed, "--out", tmp_path / "r"), "seed must be a non-negative",
                          seed)


def _old_run(run: Path, journal: bytes) -> None:
    run.mkdir(parents=True)
    (run / "run.json").write_text('{"model": "cifar10_resnet20"}')  # a run.json naming no model is no run at all
    (run / "trials.jsonl").write_bytes(journal)


def test_a_folder_holding_a_run_without_resume_is_refused_before_loading(tmp_path, no_loading):
    run = tmp_path / "r"
    _old_run(run, b'{"number": 0}\n{"number": 1}\n')
    assert_one_line_error(_run("optimize",
        "--reconstruct", "off", "--out", run), f"run folder '{run}' already holds a run (2 trials)",
                          "--resume")


def test_a_damaged_journal_is_refused_before_loading_with_the_way_out(tmp_path, no_loading):
    run = tmp_path / "r"
    _old_run(run, b'{"number": 0}\n{"numb\x00\n{"number": 2}\n')
    assert_one_line_error(_run("optimize", "--reconstruct", "off", "--out", run, "--resume"), "damaged at line 2",
                          "the 1 trials before it are intact", f"head -n 1 {run / 'trials.jsonl'}", "another --out")
    assert (run / "trials.jsonl").read_bytes().count(b"\n") == 3  # untouched


def test_exit_data_without_early_exit_is_refused(tmp_path, no_loading):
    assert_one_line_error(_run("optimize",
        "--reconstruct", "off", "--out", tmp_path / "r", "--exit-data", tmp_path / "x.npz"),
                          "setting of compressor 'early_exit', which this run does not use (compressors: prune, "
                          "quantize)", "drop --exit-data")
    assert os.listdir(tmp_path) == []


def test_a_second_process_is_refused_at_once_while_the_first_loads(tmp_path):
    """The first process takes the lock before it loads anything: a second one on the same --out, fresh or
    resuming, is refused within seconds, and `.lock` names the first (the one that holds the run)."""
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "r"
    env = child_env(OMP_NUM_THREADS="1")
    first = subprocess.Popen([sys.executable, "-m", "modelopt", "optimize", "--out", str(run), "--budget", "1",
                              "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not ((run / ".lock").is_file() and (run / ".lock").read_text() == str(first.pid)):
            assert first.poll() is None, first.communicate()[1]
            assert time.time() < t0 + 600, f"waited 600 s for {run / '.lock'} to name pid {first.pid}"
            time.sleep(0.05)
        assert not (run / "trials.jsonl").exists()  # still loading: no trial yet
        for extra in ([], ["--resume"]):
            t1 = time.time()
            result = _run("optimize", "--reconstruct", "off", "--out", run, *extra)
            assert_one_line_error(result, f"run folder '{run}' is in use by another modelopt process (pid {first.pid})")
            assert time.time() - t1 < 30
        assert (run / ".lock").read_text() == str(first.pid)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()


def test_bad_onnx_export_options_are_refused_before_the_run_loads(tmp_path, monkeypatch):
    import modelopt.run.export
    from modelopt.config.run_config import RunConfig

    def refuse(*args, **kwargs):
        raise AssertionError("the run's model and data were loaded before the bad option was refused")

    monkeypatch.setattr(modelopt.run.export, "load_workload", refuse)
    run = tmp_path / "run"
    run.mkdir()
    RunConfig().write(run)
    (run / "best_plan.yaml").write_text("default: {quantize: {bits: 8}}\n")
    assert_one_line_error(_run("export", run, "--format", "onnx", "--activations", "bad"),
                          "unknown activations 'bad'", "plan, all, none")
    assert_one_line_error(_run("export", run, "--format", "onnx", "--calibration", "median"),
                          "unknown calibration 'median'", "minmax")
