"""Sweeps on Ray (`--workers N`): the same journals and table as the serial sweep, resuming a partial
cell, and the settings that are refused in one line (`--workers 0`, a bad `workers_per_cell`)."""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cell_reports import cells_without_reports  # tests/sweep is on sys.path (pytest prepends a test file's folder)
from typer.testing import CliRunner

from modelopt.cli.app import app
from modelopt.errors import ConfigError
from modelopt.sweep import cell_run, load_sweep, on_ray, run_sweep
from modelopt.sweep import run as sweep_run
from modelopt.testing.cli import assert_one_line_error
from modelopt.testing.env import child_env

HERE = Path(__file__).resolve().parent
runner = CliRunner()

# A one-choice menu (int8 per-channel or float per layer, nearest rounding: no GPTQ pass in the driver or in each
# worker) on the bundled ResNet-20 keeps each cell a few seconds.
MINI = """\
name: t
out: results
models:
  - name: resnet20
    model: cifar10_resnet20
    data: cifar10-exact-sample
strategies: [random]
budgets: [2]
seeds: [0, 1]
device: cpu
bits: [8]
granularity: [per_channel]
rounding: [nearest]
compressors: [quantize]
reconstruct: false
latency: none
"""
WALL = {"seconds", "eval_seconds"}  # wall times: the one thing a journal may differ in


def _write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "s.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def _no_wall(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_wall(v) for k, v in value.items() if k not in WALL}
    if isinstance(value, list):
        return [_no_wall(v) for v in value]
    return value


def _journals(out: Path) -> dict[str, list[dict[str, Any]]]:
    return {str(p.relative_to(out)): [_no_wall(json.loads(line)) for line in p.read_text().splitlines()]
            for p in sorted(out.glob("runs/*/*/*/trials.jsonl"))}


def _start_partial(path: Path, workload: Any) -> bytes:
    """Seed 1's cell started and killed after one trial; its journal's bytes."""
    import modelopt

    partial = load_sweep(path).cell_dir("resnet20", "random", 1)
    modelopt.optimize(workload, strategy="random", budget=1, out=partial, seed=1, bits=[8], device="cpu",
                      granularity=["per_channel"], progress=False, compressors=["quantize"], rounding=["nearest"],
                      reconstruct=False, min_retention=load_sweep(path).config.min_retention,
                      report=False)  # killed runs write no report
    (partial / "summary.json").unlink()  # killed before it finished
    return (partial / "trials.jsonl").read_bytes()


SWEEP_IMAGES = 300  # split 20/20/20/40 %: calib, val and confirm 60 images each, test 120


@pytest.fixture(scope="module")
def sweep_data(small_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first SWEEP_IMAGES of `small_data`'s real CIFAR-10 images (test order: every class about equally): each
    cell's Ray worker loads its own copy, scores the float model on all of them and each plan on val and confirm."""
    import numpy as np

    path = tmp_path_factory.mktemp("sweep_data") / f"cifar10_{SWEEP_IMAGES}.npz"
    with np.load(small_data) as f:
        np.savez(path, x=f["x"][:SWEEP_IMAGES], y=f["y"][:SWEEP_IMAGES])
    return path


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """One local cluster for the module: run_sweep uses a running one and leaves it up. Its workers run their cells
    without reports (`_cell_reports.off`, importable through PYTHONPATH, as this checkout), as the serial sweep here."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as env:  # the cluster's processes inherit it; this process's is restored
        env.setenv("PYTHONPATH", f"{HERE}{os.pathsep}{child_env()['PYTHONPATH']}")
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 runtime_env={"worker_process_setup_hook": "_cell_reports.off"})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # the test process that runs the other Ray clusters (tests/executors/test_ray.py)
def test_workers_give_the_serial_journals_and_table_and_resume_a_partial_cell(tmp_path, sweep_data, ray_cluster):
    # The 300-image file (each Ray worker builds its own workload from it), at a floor its 60 val images can certify.
    from modelopt.api import build_workload

    small = MINI.replace("cifar10-exact-sample", str(sweep_data)) + "min_retention: 0.9\n"
    workload = build_workload("cifar10_resnet20", str(sweep_data), device="cpu")
    serial, ray_sweep = _write(tmp_path / "serial", small), _write(tmp_path / "ray", small)
    _start_partial(serial, workload)
    first_trial = _start_partial(ray_sweep, workload)
    assert [c.status for c in load_sweep(ray_sweep).cells()] == ["todo", "partial"]
    with cells_without_reports():  # the journals and tables are what is compared
        want = run_sweep(serial, progress=False, workloads={"resnet20": workload})
    got = run_sweep(ray_sweep, progress=False, workers=2, workloads={"resnet20": workload})  # the table's
    assert ray_cluster.is_initialized()  # not started by the sweep, so not shut down by it
    assert [(c.strategy, c.seed) for c in got.ran] == [("random", 0), ("random", 1)]
    partial = got.sweep.cell_dir("resnet20", "random", 1) / "trials.jsonl"
    assert partial.read_bytes().startswith(first_trial)  # resumed, not restarted
    journals = _journals(got.sweep.out)
    assert len(journals) == 2 and all(len(records) == 2 for records in journals.values())
    assert journals == _journals(want.sweep.out)
    assert (got.table_csv.read_text() == want.table_csv.read_text()) and got.rows == want.rows
    assert [c.status for c in load_sweep(ray_sweep).cells()] == ["done", "done"]  # a rerun has nothing to do


def test_workers_per_cell_is_read_and_passed_to_each_run_in_turn(tmp_path, monkeypatch):
    assert load_sweep(_write(tmp_path / "plain", MINI)).workers_per_cell == 1
    path = _write(tmp_path, MINI + "workers_per_cell: 3\n")
    assert load_sweep(path).workers_per_cell == 3 and load_sweep(path).to_json()["workers_per_cell"] == 3
    calls: list[dict[str, Any]] = []

    def optimize(wl, **kw):
        calls.append(kw)
        raise RuntimeError("no run in this test")  # a failed cell: said, and the grid goes on

    monkeypatch.setattr(cell_run, "optimize", optimize)
    monkeypatch.setattr(sweep_run, "make_table", lambda *a, **k: [])
    monkeypatch.setattr(sweep_run, "_write_sweep_report", lambda out: None)
    clusters: list[tuple[int, str | None]] = []  # one for every cell's evaluations, not one per run
    monkeypatch.setattr(on_ray, "start_ray", lambda ray, cpus, address: clusters.append((cpus, address)))
    (path.parent / "results").mkdir()
    (path.parent / "results" / "table.md").write_text("")
    result = run_sweep(path, progress=False, workloads={"resnet20": object()}, ray_address="ray://head:10001")
    assert result.ran == ()  # both failed, neither stopped the other
    assert [(kw["seed"], kw["workers"], kw["ray_address"]) for kw in calls] == [
        (0, 3, "ray://head:10001"), (1, 3, "ray://head:10001")]
    if importlib.util.find_spec("ray") is not None:
        assert clusters == [(max(3, os.cpu_count() or 1), "ray://head:10001")]


@pytest.mark.parametrize(("value", "needle"), [("0", "0"), ("two", "'two'"), ("1.5", "1.5"), ("true", "True"),
                                               ("4097", "4097"), ("1" + "0" * 400, "an integer too large for a float")])
def test_cli_refuses_a_bad_workers_per_cell_in_one_line(tmp_path, value, needle):
    path = _write(tmp_path, MINI + f"workers_per_cell: {value}\n")
    for args in (["sweep", str(path)], ["sweep", str(path), "--dry-run"]):
        assert_one_line_error(runner.invoke(app, args), "line 17", "'workers_per_cell'",
                              "a number of Ray workers per cell from 1 to 4096", needle)
    assert not (tmp_path / "results").exists()


def test_cli_refuses_workers_0_and_workers_with_workers_per_cell_in_one_line(tmp_path):
    path = _write(tmp_path, MINI)
    assert_one_line_error(runner.invoke(app, ["sweep", str(path), "--workers", "0"]), "--workers", "got 0")
    # a 400-digit count reached Ray, whose traceback printed every digit
    assert_one_line_error(runner.invoke(app, ["sweep", str(path), "--workers", "1" + "0" * 400]),
                          "--workers must be a number of cells run at once from 1 to 4096", "too large for a float")
    both = _write(tmp_path / "both", MINI + "workers_per_cell: 2\n")
    assert_one_line_error(runner.invoke(app, ["sweep", str(both), "--workers", "2"]), "workers_per_cell: 2",
                          "use one of the two")
    assert not (tmp_path / "results").exists() and not (tmp_path / "both" / "results").exists()


def test_workers_without_ray_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    real = sweep_run.importlib.util.find_spec
    monkeypatch.setattr(sweep_run.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name))
    path = _write(tmp_path, MINI)
    assert_one_line_error(runner.invoke(app, ["sweep", str(path), "--workers", "2"]),
                          "--workers needs Ray: pip install 'modelopt[distributed]'")
    with pytest.raises(ConfigError, match="needs Ray"):
        run_sweep(path, progress=False, workers=2)
    assert not (tmp_path / "results").exists()
