"""The export / reload / report path on CUDA: a run on the GPU, its packed checkpoint reloaded and
moved there, and every kind of plan's reload against the evaluator's CUDA logits. gpu-marked:
skipped without a device (the CPU twins are test_packed*.py, test_export.py and test_runtime.py)."""

from __future__ import annotations

import pytest
import torch
from _norms import assert_norms_run_on_cuda

import modelopt
from modelopt.api import build_compressors, build_workload
from modelopt.compressors import ExitChoice, QuantSpec
from modelopt.compressors.contract import ChannelAnalysis
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters import export_packed, load
from modelopt.plan.space import SearchSpace

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_a_cuda_run_exports_reloads_and_reports(tmp_path):
    result = modelopt.optimize(budget=3, strategy="random", min_retention=0.0, out=tmp_path / "run",
                               progress=False, device="cuda", compressors=["prune", "quantize"], reconstruct=False)
    assert result.best is not None
    assert (result.run_dir / "report.md").is_file() and (result.run_dir / "report.html").is_file()
    modelopt.report(result.run_dir)  # rewritten from the folder alone
    path = modelopt.export(result.run_dir, device="cuda")
    net = load(path)
    assert_norms_run_on_cuda(net)
    net.to("cuda")
    wl = build_workload(device="cuda")
    x, y = wl.split("val").x.tensor(), wl.split("val").y
    with torch.inference_mode():
        pred = torch.cat([net(x[i : i + 256]) for i in range(0, len(y), 256)]).argmax(1)
    assert pred.is_cuda
    if result.best.metrics.n_samples == len(y):  # scored on the whole val split
        # Folded norms round differently from the evaluator's: at most a few images may flip.
        assert float((pred == y).float().mean()) == pytest.approx(result.best.metrics.accuracy, abs=3 / len(y))


@pytest.fixture(scope="module")
def cuda_ev():
    wl = build_workload("cifar10_resnet20", "cifar10-exact-sample", device="cuda")
    comps = build_compressors(["quantize", "prune", "early_exit"],
                              {"prune": {"bn_samples": 64, "sparse_images": 0, "repair_images": 0},
                               "quantize": {"bits": [8, 4], "activations": [None, 8], "rounding": ["nearest"],
                                            "norm_images": 0}}, model=wl.model)
    return Evaluator(wl, SearchSpace(wl.layers, comps))


def _plan(ev: Evaluator, name: str):
    blocks = [x.name for x in ev.space.layers.values() if ChannelAnalysis.of(x).members]
    convs = [x.name for x in ev.workload.layers if x.name not in ("conv1", "linear")]
    docs = {
        "int8": {"default": {"quantize": {"bits": 8}}},
        "int4_group_w8a8": {"default": {"quantize": {"bits": 4, "granularity": "group", "activations": 8}}},
        "channels50_sparse_int4": {"default": {"quantize": {"bits": 4}},
                                   "layers": {**{n: {"prune": {"sparsity": 0.5, "kind": "structured"}} for n in blocks},
                                              **{n: {"prune": {"sparsity": 0.5}} for n in convs
                                                 if n.endswith("conv2")}}},
    }
    return ev.space.parse_plan(docs[name])


@pytest.mark.parametrize("name", ["int8", "int4_group_w8a8", "channels50_sparse_int4"])
def test_every_plan_kind_reloads_on_cuda_as_scored(cuda_ev, tmp_path, name):
    ev, wl = cuda_ev, cuda_ev.workload
    plan = _plan(ev, name)
    net = load(export_packed(ev, plan, tmp_path / f"{name}.pt"))
    assert_norms_run_on_cuda(net)
    net.to("cuda")
    x = wl.split("val").x[:512]
    with torch.inference_mode():
        got = net(x)
    want = ev.states.logits(plan, x)
    assert got.is_cuda
    assert float((got.argmax(1) == want.argmax(1)).float().mean()) >= 0.99
    assert float((got - want).abs().mean()) < 0.01


def test_an_exit_plan_reloads_on_cuda_and_stops_early(cuda_ev, tmp_path):
    ev, wl = cuda_ev, cuda_ev.workload
    exits = {f"{layer}/early_exit": ExitChoice(t)
             for layer, t in {"layer1.2.conv2": 0.97, "layer2.1.conv2": 0.9, "layer3.0.conv2": 0.8}.items()}
    q = {d.name: QuantSpec(8) for d in ev.space.decisions if d.compressor == "quantize"}
    plan = ev.space.plan({**q, **exits})
    m = ev.scorer.evaluate(plan)
    net = load(export_packed(ev, plan, tmp_path / "ee.pt"))
    assert type(net).__name__ == "EarlyExitNet"
    assert_norms_run_on_cuda(net)
    net.to("cuda")
    val = wl.split("val")
    with torch.inference_mode():
        logits, exit_at = net.forward_with_exits(val.x.tensor())
    assert logits.is_cuda
    n = len(val.y)
    # Confidences that sit on a threshold may round to the other side on another kernel: a few images.
    assert float((logits.argmax(1) == val.y).double().mean()) == pytest.approx(m.accuracy, abs=3 / n)
    assert float((exit_at < len(net.policy.exits)).double().mean()) == pytest.approx(m.exited, abs=3 / n)
