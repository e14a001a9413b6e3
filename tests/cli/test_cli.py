"""The CLI through typer's CliRunner, bad input included: one line, no traceback, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import modelopt
from modelopt.cli.app import app
from modelopt.testing.cli import assert_one_line_error as _one_line_error

runner = CliRunner()
SAMPLE = Path(modelopt.__file__).parent / "zoo" / "assets" / "cifar10_sample.npz"


def _run(*args):
    return runner.invoke(app, list(map(str, args)))




def test_list():
    result = _run("list", "--json")
    assert result.exit_code == 0
    items = json.loads(result.stdout.strip().splitlines()[-1])
    assert "cifar10_resnet20" in items["models"] and "random" in items["strategies"]
    assert "quantize" in items["compressors"] and "cifar10-sample" in items["data"]


@pytest.mark.slow
def test_optimize_json_last_line(tmp_path, small_data):
    # Rounded to nearest, 8 or 4 bits per channel: the JSON line and the tables are the CLI's, not GPTQ's.
    args = ["optimize", "--reconstruct", "off", "--budget", 4, "--compressors", "quantize", "--data", small_data,
            "--min-retention", 0.9, "--out", tmp_path / "r", "--no-progress", "--json", "--latency-batch", 2,
            "--latency-threads", 1, "--bits", "8,4", "--granularity", "per_channel", "--rounding", "nearest"]
    result = runner.invoke(app, list(map(str, args)), env={"COLUMNS": None})  # as a shell's pipe: no COLUMNS
    assert result.exit_code == 0, result.output
    spec = json.loads((tmp_path / "r" / "run.json").read_text())["latency"]
    assert (spec["backend"], spec["batch_size"], spec["threads"]) == ("torch", 2, 1)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    # 4 budget units buy the INT8 anchor and more plans after it.
    assert out["n_trials"] >= 3 and out["budget_used"] >= 4 and out["run_dir"] == str(tmp_path / "r")
    assert list(out)[:7] == ["run_dir", "n_trials", "budget_used", "baseline", "best_plan", "best_test", "best_confirm"]
    if out["best_val"] is not None:
        assert out["best_test"]["split"] == "test" and "default" in out["best_plan"]
        assert "Best plan" in result.stdout
        # Not a terminal: the result table keeps its own headers whole (rich assumed 80 columns: "retent…").
        assert "retention" in result.stdout and "retent…" not in result.stdout
        # What is stored and what is run: the file's bytes, the decoded containers', and bits a weight per layer.
        assert " stored, " in result.stdout and " decoded (float " in result.stdout
        assert "bits / weight" in result.stdout
        assert out["best_test"]["decoded_bytes"] >= out["best_test"]["size_bytes"]


@pytest.mark.slow
def test_evaluate_a_hand_written_plan(tmp_path, small_data):
    plan = tmp_path / "p.yaml"
    plan.write_text("default: {quantize: {bits: 8}}\nlayers:\n  linear: {quantize: null}\n")
    result = _run("evaluate", "--plan", plan, "--data", small_data, "--split", "test", "--json")
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout.strip().splitlines()[-1])
    assert m["split"] == "test" and m["n_samples"] == 339
    assert m["retention"] >= 0.99 and 3.8 < m["compression"] < 4.6  # INT8 codes take about 7.3 bits once coded


def test_latency_timing_flags_need_an_engine():
    _one_line_error(_run("optimize", "--reconstruct", "off", "--latency", "none", "--latency-batch", 4),
                    "--latency-batch and --latency-threads set how the latency engine times", "--latency torch")


def test_missing_plan_file(tmp_path):
    _one_line_error(_run("evaluate", "--plan", tmp_path / "nope.yaml"), "nope.yaml", "does not exist")


def test_an_export_input_is_checked_before_the_run_loads(tmp_path):
    _one_line_error(_run("export", tmp_path, "--input", "uint8"), "--input applies only to --format onnx")
    _one_line_error(_run("export", tmp_path, "--format", "onnx", "--input", "rgb"), "image_input 'rgb'", "uint8")


def test_unknown_model():
    _one_line_error(_run("evaluate", "--model", "cifar10_resnet21"), "unknown model 'cifar10_resnet21'",
                    "cifar10_resnet20")


@pytest.mark.slow
def test_unknown_layer_in_plan(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("layers:\n  conv99: {quantize: {bits: 8}}\n")
    _one_line_error(_run("evaluate", "--plan", plan, "--data", "cifar10-exact-sample"), "unknown layer 'conv99'",
                    "layer1.0.conv1")


@pytest.mark.slow
def test_bit_width_not_offered(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("default: {quantize: {bits: 16}}\n")
    _one_line_error(_run("evaluate", "--plan", plan, "--data", "cifar10-exact-sample"), "bits 16",
                    "2, 3, 4, 5, 6, 7, 8")


def test_a_mean_that_is_not_numbers_is_answered_with_a_mean_like_example():
    _one_line_error(_run("evaluate", "--mean", "a,b,c"), "--mean", "like 0.485,0.456,0.406")


def test_malformed_plan_yaml(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("default:\n  quantize: {bits: 8\nlayers: [\n")
    _one_line_error(_run("evaluate", "--plan", plan), "not valid YAML", "line")


def test_unknown_strategy(tmp_path):
    _one_line_error(_run("optimize", "--reconstruct", "off", "--strategy", "annealing", "--out", tmp_path / "r"),
                    "unknown strategy 'annealing'", "random")


def test_missing_data_path():
    _one_line_error(_run("evaluate", "--data", "/no/such/data.npz"), "/no/such/data.npz", "does not exist")


def test_missing_weights_file():
    _one_line_error(_run("evaluate", "--model", "cifar10_resnet56", "--weights", "/no/r56.th"), "/no/r56.th")


def test_data_that_does_not_fit_the_model(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "big.npz"
    np.savez(path, x=rng.integers(0, 255, (30, 48, 48, 3), dtype=np.uint8), y=rng.integers(0, 10, 30))
    _one_line_error(_run("evaluate", "--data", path), "48x48", "32x32")


@pytest.mark.slow
def test_bad_floors_are_one_line_naming_the_value(tmp_path):
    _one_line_error(_run("optimize", "--floors", "0.99,high", "--out", tmp_path / "r"), "--floors", "0.995,0.99")
    _one_line_error(_run("optimize", "--floors", "0.99,1.5", "--out", tmp_path / "r"), "floor 1.5")


def test_bad_bits_option(tmp_path):
    _one_line_error(_run("optimize",
        "--reconstruct", "off", "--bits", "8,four", "--out", tmp_path / "r"), "--bits", "8,four")
    _one_line_error(_run("optimize", "--reconstruct", "off", "--bits", "8,1", "--out", tmp_path / "r"), "bits 1")


def test_bad_rounding_is_refused_before_the_model_loads(tmp_path):
    _one_line_error(_run("optimize", "--reconstruct", "off", "--rounding", "gptq,adaround", "--out", tmp_path / "r"),
                    "rounding 'adaround' not offered", "nearest, gptq")
    _one_line_error(_run("evaluate", "--rounding", "best"), "rounding 'best' not offered")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_evaluate_rounds_plan_entries_by_gptq_unless_told(tmp_path, small_data):
    plan = tmp_path / "int2.yaml"
    plan.write_text("default: {quantize: {bits: 2, granularity: group}}\n")
    got = {}
    for rounding in ("gptq", "nearest"):
        result = _run("evaluate", "--plan", plan, "--data", small_data, "--split", "test",
                      "--rounding", rounding, "--reconstruct", "off", "--json")
        assert result.exit_code == 0, result.output
        got[rounding] = json.loads(result.stdout.strip().splitlines()[-1])
    # As many codes and scales stored; their coded bytes differ by what each rounding's codes carry.
    assert got["gptq"]["compression"] == pytest.approx(got["nearest"]["compression"], rel=0.05)
    assert got["gptq"]["agreement"] > got["nearest"]["agreement"] + 0.1  # measured: 92.3 % vs 65.2 % (339 test images)
    # GPTQ's calib pass (all 169 calib images, fewer than its 256 / 169 val) is charged on top of both plans'
    # BN re-estimation.
    assert got["gptq"]["prep_cost"] == pytest.approx(got["nearest"]["prep_cost"] + 169 / 169)


def test_resume_needs_a_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_error(_run("optimize", "--reconstruct", "off", "--resume"), "--resume", "runs")


def test_python_dash_m_works():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "modelopt", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "optimize" in done.stdout


@pytest.mark.slow
def test_resnet56_from_shared_weights(shared_dir, tmp_path):
    weights = shared_dir / "models" / "cifar10" / "resnet56-4bfd9763.th"
    data = shared_dir / "data" / "cifar10" / "cifar10_exact_test.npz"
    result = _run("evaluate", "--model", "cifar10_resnet56", "--weights", weights, "--data", data, "--split", "all",
                  "--json")
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout.strip().splitlines()[-1])
    assert m["n_samples"] == 846 - 2 * round(846 * 0.2) and m["retention"] == 1.0  # calib and confirm take 20 % each
    assert m["split"] == "all" and m["splits"] == ["val", "test"]  # the JSON says which images "all" is, as the title


def test_once_a_command_is_done_sigterm_ends_the_process_quietly():
    """The handler that turns SIGTERM into an unwind is dropped when the command returns: raised during
    interpreter shutdown it printed "Exception ignored ... _Terminated" after the files were complete."""
    import signal

    from modelopt.cli.app import _friendly, _on_sigterm

    before = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        assert _friendly(lambda: 7)() == 7
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_warnings_are_one_line_without_a_source_line():
    from modelopt.cli.app import _one_line_warning

    text = _one_line_warning(UserWarning("the run finished but its report was not written (OSError: [Errno 28] "
                                         "No space left on device); retry with `modelopt report runs/r`"),
                             UserWarning, "/x/api.py", 10, "    warnings.warn(...)")
    assert text.count("\n") == 1 and text.startswith("warning: the run finished") and "api.py" not in text


def test_a_bad_latency_setting_in_run_json_is_refused_before_loading(tmp_path):
    """run.json's latency.batch_size 0 was refused only when the first plan was timed (114 s of loading later)
    and without naming the file; now reading the settings refuses it, in one line naming run.json."""
    from modelopt.config.run_config import RunConfig

    run = tmp_path / "run"
    run.mkdir()
    RunConfig().write(run)
    doc = json.loads((run / "run.json").read_text())
    doc["latency"]["batch_size"] = 0
    (run / "run.json").write_text(json.dumps(doc))
    _one_line_error(_run("optimize", "--reconstruct", "off", "--resume", "--out", run, "--no-progress"), "run.json",
                    "batch_size must be an integer >= 1, got 0")


@pytest.mark.slow
def test_evaluate_a_run_folder_on_its_own_splits(tmp_path, small_data):
    """`modelopt evaluate RUN_DIR` rebuilds the run's model, data, splits and compressors from run.json: its best
    plan reads on test what the run's summary says, and any trial can be scored by number."""
    run, unlabeled = tmp_path / "r", tmp_path / "unlabeled.npz"
    np.savez(unlabeled, x=np.load(SAMPLE)["calib_x"][:300])
    # Unlabeled images change the splits; the run reconstructs its finalists, and evaluate reads them back.
    # 8 or 4 bits per channel rounded to nearest: what is read back is the run's record, not GPTQ's codes, and a
    # third of the menu's priors and none of GPTQ's passes (three workloads here) cost a third of the time.
    args = ["optimize", "--budget", 4, "--compressors", "quantize", "--data", small_data, "--min-retention", 0.9,
            "--out", run, "--no-progress", "--unlabeled", unlabeled, "--latency", "none", "--bits", "8,4",
            "--granularity", "per_channel", "--rounding", "nearest"]
    assert _run(*args).exit_code == 0
    summary = json.loads((run / "summary.json").read_text())
    result = _run("evaluate", run, "--split", "test", "--json")
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["best"] is not None and any((run / "reconstructed").iterdir())  # evaluate reads a refit back
    best = summary["best"]["test"]
    assert (m["n_samples"], m["retention"], m["size_bytes"]) == (best["n_samples"], best["retention"],
                                                                 best["size_bytes"])
    trial0 = json.loads(_run("evaluate", run, "--plan", 0, "--split", "test", "--json").stdout.splitlines()[-1])
    int8 = next(a for a in summary["anchors"] if a["trial"] == 0)["test"]
    assert (trial0["retention"], trial0["n_samples"]) == (int8["retention"], int8["n_samples"])
    _one_line_error(_run("evaluate", run, "--model", "cifar10_resnet56"), "evaluate RUN_DIR scores",
                    "leave out --model")


def test_evaluate_run_dir_names_the_flags_it_refuses(tmp_path):
    """`evaluate RUN_DIR --rounding gptq` said "leave out settings" and named an `evaluate --run` flag that does
    not exist: the line names each flag given and how to score a plan with them. Refused before anything loads."""
    result = _run("evaluate", tmp_path, "--rounding", "gptq", "--resize", 32, "--data", "elsewhere.npz")
    _one_line_error(result, "evaluate RUN_DIR scores the run's plans with the model, data, compressors and settings "
                    f"in '{tmp_path / 'run.json'}'", "leave out --data, --resize, --rounding (",
                    f"pass it as a file without RUN_DIR: --plan {tmp_path / 'best_plan.yaml'} with the run's --model")
    assert "evaluate --run" not in result.output and "settings;" not in result.output


def test_evaluate_on_a_run_folder_still_loading_says_it_is_in_use(tmp_path):
    """A run that is loading holds its folder but has written no run.json yet: evaluate and export said "not a
    modelopt run folder", report "neither a run folder nor a sweep folder"; they say it is in use, as --resume
    does."""
    from modelopt.run.lock import lock_run_folder

    with lock_run_folder(tmp_path / "run"):  # held by "another process": flock conflicts across open files
        for verb in ("evaluate", "export", "report"):
            result = _run(verb, tmp_path / "run")
            _one_line_error(result, f"run folder '{tmp_path / 'run'}' is in use by another modelopt process (pid ",
                            "still loading and has not written its run.json yet")
            assert "not a modelopt run folder" not in result.output
    _one_line_error(_run("evaluate", tmp_path / "run"), "is not a modelopt run folder (no run.json)")  # released


def test_settings_that_leave_nothing_to_search_are_refused_naming_them(tmp_path, small_data):
    """A channel multiple no group can meet left MCTS with no decision (a `max()` traceback) and random with one
    pointless trial; it is one line naming the settings."""
    result = _run("optimize", "--data", small_data, "--compressors", "prune", "--kind", "structured",
                  "--channel-multiple", 999, "--budget", 2, "--out", tmp_path / "r", "--no-progress")
    _one_line_error(result, "nothing to search", "channel_multiple=999")


def test_ctrl_c_in_a_verb_without_a_journal_does_not_advise_resume(monkeypatch, tmp_path):
    """Ctrl-C during export said "finished trials are in the journal; rerun with --resume": export has neither."""
    import modelopt.cli.app as cli_app

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_app, "do_export", interrupted)
    (tmp_path / "run.json").write_text("{}")
    result = _run("export", tmp_path)
    assert result.exit_code == 130
    assert "--resume" not in result.output and "export did not finish" in result.output, result.output
    assert "each file it wrote is whole" in result.output
    # evaluate writes nothing: its line said "each file it wrote is whole ... an exported exit folder may lack files"
    monkeypatch.setattr(cli_app.api, "evaluate", interrupted)
    result = _run("evaluate")
    assert result.exit_code == 130
    assert "evaluate did not finish; it writes nothing" in result.output and "file" not in result.output, result.output


def test_ctrl_c_in_a_sweep_says_how_a_sweep_continues(monkeypatch, tmp_path):
    """Ctrl-C during `modelopt sweep` advised --resume, which sweep does not have."""
    import modelopt.cli.app as cli_app

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_app, "run_sweep", interrupted)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"name: s\nout: {tmp_path / 'out'}\nmodels:\n  - name: r20\n    model: cifar10_resnet20\n"
                     "strategies: [random]\nbudgets: [2]\nseeds: [0]\ncompressors: [quantize]\n")
    result = _run("sweep", sweep)
    assert result.exit_code == 130
    assert "--resume" not in result.output and "run the same sweep command again" in result.output, result.output


def test_a_target_in_a_read_only_folder_is_one_line(monkeypatch, tmp_path):
    """`export --out RO/new/m.onnx` on a read-only file system ended in an OSError traceback."""
    import errno

    import modelopt.cli.app as cli_app

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", "/ro/new")

    monkeypatch.setattr(cli_app, "do_export", read_only)
    (tmp_path / "run.json").write_text("{}")
    _one_line_error(_run("export", tmp_path, "--out", "/ro/new/m.onnx"), "cannot write /ro/new", "Read-only")


@pytest.mark.parametrize("verb", ["optimize", "evaluate"])
def test_an_interpolation_without_a_resize_is_refused_not_ignored(verb):
    _one_line_error(_run(verb, "--interpolation", "bilinear"), "--interpolation bilinear resamples a resize",
                    "--resize")


def test_evaluate_and_export_refuse_a_run_json_naming_no_model(tmp_path):
    """`{}` was read as the default settings and answered "no best_plan.yaml": it is no run folder at all."""
    (tmp_path / "run.json").write_text("{}")
    for verb in ("evaluate", "export"):
        _one_line_error(_run(verb, tmp_path), "is not a modelopt run folder (its run.json names no model)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_version_names_modelopt_and_its_engines():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"modelopt {modelopt.__version__}, torch ") and "onnxruntime" in result.stdout


@pytest.mark.slow
def test_export_takes_its_format_from_the_files_suffix_and_refuses_a_suffix_that_contradicts_it(tmp_path, small_run):
    import onnx

    result = runner.invoke(app, ["export", str(small_run), "--out", str(tmp_path / "m.onnx")])
    assert result.exit_code == 0, result.output
    onnx.checker.check_model(onnx.load(str(tmp_path / "m.onnx")))  # an ONNX model, not a checkpoint named .onnx
    _one_line_error(_run("export", small_run, "--format", "modelopt", "--out", tmp_path / "m2.onnx"),
                    "names an ONNX file but --format is 'modelopt'")


def test_a_bad_time_is_one_line_naming_it_and_the_forms(tmp_path):
    _one_line_error(_run("optimize", "--time", "soon", "--out", tmp_path / "r"), "time 'soon'", "90s, 2m")
