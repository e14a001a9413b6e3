"""`timm:NAME` as a model source: random weights with the head sized to the data, weights from a file with the head
sized by the checkpoint, timm's own normalisation; quantization and both kinds of pruning apply to a few families and
score what the plan says."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import modelopt
from modelopt.api import build_compressors
from modelopt.compressors.contract import ChannelAnalysis
from modelopt.errors import UnknownNameError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.model.loader import load_model
from modelopt.plan.space import SearchSpace

timm = pytest.importorskip("timm")

FAMILIES = ("resnet10t", "efficientnet_b0", "convnext_atto")


@pytest.fixture(scope="module")
def few_images(tmp_path_factory, small_data):
    path = tmp_path_factory.mktemp("timm") / "cifar10_200.npz"
    with np.load(small_data) as f:
        np.savez(path, x=f["x"][:200], y=f["y"][:200])
    return path


def test_a_timm_model_loads_with_its_config_and_a_checkpoint_sizes_its_head(tmp_path):
    loaded = load_model("timm:resnet10t")
    assert loaded.random_head and loaded.num_classes == 1000
    assert loaded.mean == tuple(timm.create_model("resnet10t").pretrained_cfg["mean"])
    torch.manual_seed(0)
    trained = timm.create_model("resnet10t", num_classes=7)
    path = tmp_path / "w.pt"
    torch.save(trained.state_dict(), path)
    again = load_model("timm:resnet10t", path)
    assert again.num_classes == 7 and not again.random_head
    assert torch.equal(again.module.state_dict()["fc.weight"], trained.state_dict()["fc.weight"])
    with pytest.raises(UnknownNameError, match="timm model"):
        load_model("timm:resnet_no_such")


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_every_compressor_applies_to_a_timm_family(name, few_images):
    # Random weights, seeded: unseeded, a ConvNeXt's random head answered one class for all 40 val images in some
    # test orders, and a float model that gets no image right is refused (there is no accuracy to retain).
    torch.manual_seed(0)
    plan = {"default": {"quantize": {"bits": 8}}}
    # Quantize alone here (its plan uses no other): with prune in the menu `evaluate` ran the channel analysis of
    # its own workload, which the workload below runs again (half the test, in torch-pruning's copies of the
    # model). Rounded to nearest, scored as composed: this checks the size the plan says, not GPTQ (its solves on
    # grouped and depthwise convolutions: tests/compressors/test_gptq.py, tests/model/test_torchvision_models.py)
    # or the refit (tests/reconstruct), which were three quarters of the rest.
    m = modelopt.evaluate(f"timm:{name}", plan, str(few_images), split="val", device="cpu",
                          compressors=["quantize"], rounding=["nearest"], reconstruct=False)
    # INT8 weights, float norms and biases: 4x at 8 bits a code, more as the file codes them (random weights' codes
    # carry fewer bits than trained ones': up to 10x on a ResNet)
    assert m.n_samples > 0 and 3.5 < m.compression < 32 / 2
    wl = modelopt.build_workload(f"timm:{name}", str(few_images), device="cpu")
    assert wl.num_outputs == 10
    roots = [x.name for x in wl.layers.analysed(ChannelAnalysis) if ChannelAnalysis.of(x).members]
    assert roots, f"{name}: no channel group torch-pruning could trace and check"
    # Both compressors in one space on this family (what `evaluate` above was offered): one channel analysis.
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize", "prune"], {
        "prune": {"repair_images": 64, "sparse_images": 0}, "quantize": {"rounding": ["nearest"]}})))
    plan = ev.space.parse_plan({"layers": {roots[-1]: {"prune": {"sparsity": 0.5, "kind": "structured"}}}})
    pruned = ev.scorer.evaluate(plan, split="val")
    assert pruned.macs < pruned.float_macs  # physically fewer channels
    small = ev.states.physical_model(plan)
    x = wl.split("val").x[:8]
    state, _ = ev.states.compressed_state(plan)
    with torch.inference_mode(), wl.state(state):
        want = wl.logits(x)
    with torch.inference_mode():
        torch.testing.assert_close(small(x), want, rtol=1e-4, atol=1e-4)  # the smaller model is what was scored


@pytest.fixture(scope="module")
def images_224(tmp_path_factory, small_data):
    """40 CIFAR-10 images scaled up to 224 pixels (bicubic): 8 val and 8 confirm images certify the floor of 50 %
    (every pass over them at 224 pixels is a ResNet-18's or ViT's full-size forward)."""
    from PIL import Image

    with np.load(small_data) as f:
        x = np.stack([np.asarray(Image.fromarray(a).resize((224, 224), Image.Resampling.BICUBIC))
                      for a in f["x"][:40]])
    return x


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "vit_tiny_patch16_224"])
def test_optimize_runs_every_compressor_that_applies_on_a_224_pixel_timm_model(name, images_224, tmp_path):
    """`optimize` on a 224-pixel timm model with weights from a file (read as its pretrained config says), with the
    compressors the tool picks for it. The weights are random, so the labels are the model's own answers: its float
    accuracy is 100 % and retention means something."""
    torch.manual_seed(0)
    weights = tmp_path / f"{name}.pt"
    torch.save(timm.create_model(name, num_classes=10).state_dict(), weights)
    blank = tmp_path / "blank.npz"
    np.savez(blank, x=images_224, y=np.arange(len(images_224)) % 10)
    wl = modelopt.build_workload(f"timm:{name}", str(blank), weights=weights, device="cpu")
    assert wl.split("val").x.shape[1:] == (3, 224, 224)
    labels = np.zeros(len(images_224), dtype=np.int64)
    for split in ("calib", "val", "confirm", "test"):
        labels[wl.data.split(split).index.numpy()] = wl.split(split).base_pred.numpy()
    data = tmp_path / "own.npz"
    np.savez(data, x=images_224, y=labels)
    # Round-to-nearest and unrepaired pruning: GPTQ's and SparseGPT's solves on 4,608-wide layers take minutes on
    # a 2-core CPU (benchmarks/full_size.py), and what this checks is that each compressor applies; latency none:
    # timing the final plans at 224 pixels was a quarter of the call (tests/latency times plans). A short menu
    # (two bit widths, per channel) and a short clipping search: the search's priors compute every choice's codes
    # of every layer before the first trial, which at the default menu and 36 clipping ratios was half the test.
    result = modelopt.optimize(f"timm:{name}", str(data), weights=str(weights), budget=3, device="cpu",
                               out=tmp_path / "run", progress=False, report=False, min_retention=0.5,
                               rounding=["nearest"], sparse_images=0, repair_images=0, reconstruct=False,
                               latency=None, bits=[8, 4], granularity=["per_channel"],
                               options={"quantize": {"clip_ratios": [0.8, 0.9, 1.0]}})
    used = set(json.loads((tmp_path / "run" / "run.json").read_text())["compressors"])
    assert {"quantize", "prune"} <= used, used
    assert result.trials and all(t.ok for t in result.trials), [t.error for t in result.trials if not t.ok]
    assert result.best is not None and result.best.metrics.compression > 1.5
