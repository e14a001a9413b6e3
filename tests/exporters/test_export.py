"""`modelopt.export` / `modelopt.load` and `modelopt export` on run folders."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _norms import assert_norms_run_on_cuda
from typer.testing import CliRunner

import modelopt
from modelopt.cli.app import app
from modelopt.compressors import QuantSpec
from modelopt.errors import ConfigError, LoadError
from modelopt.exporters.packed import CONTAINER_BYTES
from modelopt.testing.cli import assert_one_line_error


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, small_r20_evaluator, small_data):
    """A run folder laid out as the runner writes it: run.json, trials.jsonl, best_plan.yaml (its data the small
    sample: each export rebuilds the run's workload from run.json)."""
    ev = small_r20_evaluator
    space = ev.space
    folder = tmp_path_factory.mktemp("run")
    config = {"model": "cifar10_resnet20", "weights": None, "data": str(small_data), "data_seed": 0,
              "strategy": "random", "seed": 0, "compressors": {c.name: c.options() for c in space.compressors.values()},
              "device": "cpu", **ev.workload.fingerprints()}
    (folder / "run.json").write_text(json.dumps(config))
    plans = [space.uniform("quantize", QuantSpec(4)), space.uniform("quantize", QuantSpec(8))]
    records = [{"number": i, "plan": p.to_flat(), "status": "complete"} for i, p in enumerate(plans)]
    records.append({"number": 2, "plan": plans[0].to_flat(), "status": "failed", "error": "boom"})
    (folder / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    space.save_plan(plans[0], folder / "best_plan.yaml")
    return folder


@pytest.mark.slow
def test_export_best_and_trial(run_dir, small_r20_evaluator):
    path = modelopt.export(run_dir)
    assert path == run_dir / "model-best.pt"
    plan = small_r20_evaluator.space.uniform("quantize", QuantSpec(4))
    assert os.path.getsize(path) <= small_r20_evaluator.plan_cost(plan).size_bytes + CONTAINER_BYTES
    net = modelopt.load(path)
    assert_norms_run_on_cuda(net)
    assert net.conv1.weight.unique().numel() <= 16 * 16  # 16 output channels x 16 int4 codes
    p8 = modelopt.export(run_dir, plan=1, out=run_dir / "t1.pt")
    assert os.path.getsize(p8) > 1.8 * os.path.getsize(path)  # trial 1 is the INT8 plan


def test_export_errors(run_dir, small_r20_evaluator, tmp_path):
    with pytest.raises(ConfigError, match="no trial 7"):
        modelopt.export(run_dir, plan=7)
    with pytest.raises(ConfigError, match=r"trial 2 .* failed"):
        modelopt.export(run_dir, plan="2")
    with pytest.raises(ConfigError, match="unknown export format 'tflite'"):
        modelopt.export(run_dir, format="tflite")
    with pytest.raises(ConfigError, match="pass out=PATH"):
        modelopt.export(small_r20_evaluator, plan={"default": {"quantize": {"bits": 8}}})
    with pytest.raises(ConfigError, match="needs a run folder"):
        modelopt.export(small_r20_evaluator, out=tmp_path / "x.pt")
    with pytest.raises(LoadError, match="not a modelopt run folder"):
        modelopt.export(tmp_path)


def test_cli_export(run_dir, tmp_path):
    runner = CliRunner()
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["export", str(run_dir), "--plan", "1", "--format", "onnx", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file() and "Wrote" in result.stdout
    assert_one_line_error(runner.invoke(app, ["export", str(run_dir), "--plan", "99"]), "no trial 99")
    assert_one_line_error(runner.invoke(app, ["export", str(run_dir), "--format", "bin"]), "'bin'", "modelopt, onnx")
    assert_one_line_error(runner.invoke(app, ["export", str(run_dir), "--plan", str(tmp_path / "nope.yaml")]),
                          "nope.yaml")


@pytest.mark.slow
def test_a_real_run_exports_and_reloads(tmp_path, small_workload):
    # The default compressors and solvers (GPTQ, SparseGPT, repair) on short menus: before its first trial a run
    # computes every choice of every layer, which at the default six quantize and six prune choices was half of the
    # test. No report and no latency: what the export reads is the plan.
    result = modelopt.optimize(small_workload, budget=2, strategy="random", min_retention=0.0, out=tmp_path / "run",
                               progress=False, reconstruct=False, report=False, latency=None, bits=[8, 4],
                               granularity=["per_channel"], sparsity=[0.5])
    assert result.best is not None
    runner = CliRunner()
    cli = runner.invoke(app, ["export", str(result.run_dir)])
    assert cli.exit_code == 0, cli.output
    path = result.run_dir / "model-best.pt"
    assert result.best.metrics.size_bytes <= os.path.getsize(path) <= result.best.metrics.size_bytes + CONTAINER_BYTES
    net = modelopt.load(path)
    assert_norms_run_on_cuda(net)
    x, y = small_workload.split("val").x.tensor(), small_workload.split("val").y
    with torch.inference_mode():
        accuracy = (net(x).argmax(1) == y).float().mean().item()
    if result.best.metrics.n_samples == len(y):  # scored on the whole val split
        assert accuracy == pytest.approx(result.best.metrics.accuracy, abs=1e-9)
