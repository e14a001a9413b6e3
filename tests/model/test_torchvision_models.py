"""The models people bring (issue 26): eight torchvision classifiers (residual, inverted residual with
depthwise convolutions and squeeze-excitation, grouped, channel-shuffled, ConvNeXt with LayerNorm, and a vision
transformer), random weights, on 200 real CIFAR-10 images. Three are torchvision's own classes built narrower and
shallower than their published sizes (`SMALL`): what is checked is how the tool reads each kind of block, and at
their full sizes their per-layer solves and exports were most of the suite's slowest tests. Each runs
`modelopt.optimize` with every compressor that applies (early exit on every one but the transformer, whose blocks
give tokens: it says so in one line); a plan exports to the packed form and reloads with the logits that were scored
(a plan with an exit as the net that stops early), and to ONNX, which ONNX Runtime runs with the same answers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import modelopt
from modelopt.compressors.contract import ChannelAnalysis
from modelopt.config.build import make_evaluator
from modelopt.config.run_config import RunConfig
from modelopt.errors import ConfigError
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.onnx_run import run_onnx
from modelopt.exporters.packed import export_packed
from modelopt.model.layers import compressible_modules
from modelopt.run.journal import read_records

torchvision = pytest.importorskip("torchvision")

# GPTQ, SparseGPT and the repair of pruned channels' readers where the layers are small enough for CI's time (grouped
# and depthwise convolutions included); the two largest round to nearest, prune by magnitude and leave readers as they
# are (their second-order solvers' column sweeps and readers' refits were two thirds of these tests' time;
# tests/compressors and tests/evaluation/test_evaluator_prune.py check the solvers and the repair).
NEAREST = ("resnet18", "convnext")
MODELS = ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet", "regnet_x", "shufflenet_v2_x0_5",
          "convnext", "vit")


def _small(name: str) -> torch.nn.Module:
    """torchvision's EfficientNet (B0's blocks at half width and depth), RegNetX (3 stages, groups of 8) and ConvNeXt
    (two blocks a stage at a third of tiny's widths), 0.3-1.6 M parameters where the published sizes have 4-28 M."""
    from functools import partial

    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig
    from torchvision.models.regnet import BlockParams, RegNet

    if name == "efficientnet":
        mb = partial(MBConvConfig, width_mult=0.5, depth_mult=0.5)
        return EfficientNet([mb(1, 3, 1, 32, 16, 1), mb(6, 3, 2, 16, 24, 2), mb(6, 5, 2, 24, 40, 2),
                             mb(6, 3, 2, 40, 80, 3), mb(6, 5, 1, 80, 112, 3), mb(6, 5, 2, 112, 192, 4),
                             mb(6, 3, 1, 192, 320, 1)], 0.2, num_classes=10)
    if name == "regnet_x":
        return RegNet(BlockParams.from_init_params(depth=8, w_0=24, w_a=24.48, w_m=2.54, group_width=8),
                      num_classes=10, stem_width=16)
    return ConvNeXt([CNBlockConfig(32, 64, 2), CNBlockConfig(64, 128, 2), CNBlockConfig(128, 256, 2),
                     CNBlockConfig(256, None, 2)], num_classes=10)


SMALL = ("efficientnet", "regnet_x", "convnext")

# Three clipping ratios for the scale search where the default tries 36 (tests/compressors checks the search).
SHORT_CALIBRATION = {"quantize": {"clip_ratios": [0.8, 0.9, 1.0]}}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "vit":
        from torchvision.models import VisionTransformer

        return VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128,
                                 num_classes=10)
    if name in SMALL:
        return _small(name)
    return torchvision.models.get_model(name, weights=None, num_classes=10)


@pytest.fixture(scope="module")
def few_images(tmp_path_factory, small_data):
    path = tmp_path_factory.mktemp("few") / "cifar10_200.npz"  # 80 val images: a random model gets some right
    with np.load(small_data) as f:
        np.savez(path, x=f["x"][:200], y=f["y"][:200])
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_a_torchvision_classifier_compresses_exports_and_reloads(name, few_images, tmp_path):
    model = _model(name).eval()
    wl = modelopt.build_workload(model, str(few_images), device="cpu")
    out = tmp_path / "run"
    compressors = ["early_exit", "prune", "quantize"]
    if name == "vit":  # early exit: one line saying why it does not apply (a transformer's blocks give tokens)
        with pytest.raises(ConfigError, match="exit heads pool") as why:
            modelopt.optimize(wl, out=tmp_path / "ee", compressors=["early_exit"], budget=1, confidence=0.0,
                              latency=None, progress=False, report=False, reconstruct=False)
        assert "\n" not in str(why.value)
        compressors = ["prune", "quantize"]
    # Weight-only (float inputs): on random weights the logits are near ties, whose argmax ORT's integer-input
    # kernels flip (93.8 % agreement on one W8A8 plan); tests/exporters covers integer inputs.
    # One sparsity (both kinds) and a short clipping search: before its first trial the search computes every
    # choice's codes and masks of every layer (GPTQ and SparseGPT included), which at three sparsities and 36
    # clipping ratios was half of the test; what is checked is that each kind of block takes each compressor.
    result = modelopt.optimize(wl, out=out, strategy="random", budget=3, confidence=0.0, min_retention=0.0,
                               objective="bitops", compressors=compressors, bits=[8, 4], granularity=["per_channel"],
                               activations=[None], sparsity=[0.5], options=SHORT_CALIBRATION,
                               rounding=["nearest" if name in NEAREST else "gptq"],
                               **({"sparse_images": 0, "repair_images": 0} if name in NEAREST else {}),
                               latency=None, progress=False, report=False, reconstruct=False)
    assert result.trials and all(t.ok for t in result.trials), [t.error for t in result.trials]
    if name == "vit":  # attention's projections are layers too (`modelopt.model.attention`)
        assert any(n.endswith("self_attention.in_proj") for n in compressible_modules(wl.model))

    ev = make_evaluator(RunConfig.read(out), wl)
    assert {d.compressor for d in ev.space.decisions} == set(compressors)  # each offers a menu
    record = read_records(out / "trials.jsonl")[-1]
    x = wl.split("val").x[:32]
    if name != "vit":  # the packed form keeps exit heads: a plan with an exit reloads as the net that stops early
        routed = ev.space.parse_plan({"early_exit": {"exits": [_exit_block(ev)], "threshold": 0.5}})
        _reloads_with_the_scored_logits(ev, routed, name, x, tmp_path / "exit.pt")
    plan = ev.space.plan_from_flat({k: v for k, v in record.plan.items() if not k.endswith("/early_exit")})
    want = _reloads_with_the_scored_logits(ev, plan, name, x, tmp_path / "m.pt")
    onnx_path = export_onnx(ev, plan, tmp_path / "m.onnx").path
    agreement = float((run_onnx(onnx_path, x).argmax(1) == want.argmax(1).numpy()).mean())
    assert agreement >= 0.99, agreement


def _exit_block(ev) -> str:
    """The block a middle exit sits after (plans name exits by block)."""
    ee = ev.space.compressors["early_exit"]
    offered = [d.layer for d in ev.space.decisions if d.compressor == "early_exit"]
    return ee.block(offered[len(offered) // 2])


def _reloads_with_the_scored_logits(ev, plan, name, x, path) -> torch.Tensor:
    want = ev.states.logits(plan, x)
    net = modelopt.load(export_packed(ev, plan, path), model=_model(name))
    with torch.inference_mode():
        got = net(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    return want


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet"])
def test_structured_pruning_makes_a_depthwise_network_physically_smaller(name, few_images, tmp_path):
    """Inverted residuals, depthwise convolutions, squeeze-excitation: every checked group pruned by half gives a
    model with fewer parameters and MACs, whose outputs are the simulated ones, and which reloads and exports."""
    wl = modelopt.build_workload(_model(name).eval(), str(few_images), device="cpu")
    roots = [x for x in wl.layers.analysed(ChannelAnalysis) if ChannelAnalysis.of(x).members]
    assert len(roots) >= 10 and any(len(ChannelAnalysis.of(x).members) > 2 for x in roots)  # depthwise, SE, streams
    options = {"prune": {"kind": ["structured"], "repair_images": 0, "sparse_images": 0}}
    ev = make_evaluator(RunConfig(compressors=("prune",), options=options), wl)
    plan = ev.space.parse_plan({"layers": {x.name: {"prune": {"sparsity": 0.5, "kind": "structured"}}
                                           for x in roots}})
    small = ev.states.physical_model(plan)
    params = sum(p.numel() for p in small.parameters())
    assert params < 0.6 * sum(p.numel() for p in wl.model.parameters())
    assert ev.plan_cost(plan).macs() < 0.6 * wl.macs
    x = wl.split("val").x[:16]
    with torch.inference_mode():
        torch.testing.assert_close(small(x), ev.states.logits(plan, x), rtol=1e-4, atol=1e-4)
    net = modelopt.load(export_packed(ev, plan, tmp_path / "m.pt"), model=_model(name))
    assert sum(p.numel() for p in net.parameters()) == params
    with torch.inference_mode():
        torch.testing.assert_close(net(x), small(x), rtol=1e-4, atol=1e-4)
    onnx_path = export_onnx(ev, plan, tmp_path / "m.onnx").path
    assert float((run_onnx(onnx_path, x).argmax(1) == small(x).argmax(1).numpy()).mean()) >= 0.99
