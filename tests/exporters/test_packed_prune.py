"""The packed checkpoint of pruned plans: sparse encoding and smaller blocks, within 5 % of size_bytes."""

from __future__ import annotations

import os

import pytest
import torch
from _norms import assert_norms_run_on_cuda

from modelopt.api import build_compressors
from modelopt.compressors.contract import ChannelAnalysis
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters import export_packed, load
from modelopt.exporters.packed import CONTAINER_BYTES
from modelopt.model.layers import compressible_modules
from modelopt.plan.space import SearchSpace


@pytest.fixture(scope="session")
def ev(resnet20_workload) -> Evaluator:
    # A short clip search and few calibration images keep it quick; export uses the same options.
    options = {"prune": {"bn_samples": 64, "sparse_images": 0, "repair_images": 0},
               "quantize": {"clip_ratios": [0.8, 0.9, 1.0], "bits": [8, 4], "rounding": ["nearest"], "norm_images": 0}}
    comps = build_compressors(["quantize", "prune"], options)
    return Evaluator(resnet20_workload, SearchSpace(resnet20_workload.layers, comps))


@pytest.fixture(scope="session")
def ev_repaired(resnet20_workload) -> Evaluator:
    # SparseGPT's masks and error feedback, readers of removed channels refitted, 2:4 offered.
    options = {"prune": {"bn_samples": 64, "sparse_images": 64, "repair_images": 64,
                         "kind": ["unstructured", "structured", "2:4"]},
               "quantize": {"clip_ratios": [0.8, 0.9, 1.0], "rounding": ["gptq"], "calib_images": 64}}
    comps = build_compressors(["quantize", "prune"], options)
    return Evaluator(resnet20_workload, SearchSpace(resnet20_workload.layers, comps))


def _plan(ev: Evaluator, name: str):
    convs = [x.name for x in ev.workload.layers if x.name not in ("conv1", "linear")]
    blocks = [x.name for x in ev.space.layers.values() if ChannelAnalysis.of(x).members]
    docs = {
        # Half of every conv's weights pruned, then INT4 (bitmask + 4-bit kept codes).
        "sparse50_int4": {"default": {"quantize": {"bits": 4}},
                          "layers": {n: {"prune": {"sparsity": 0.5}} for n in convs}},
        # Float kept values; the fc at 97 % takes the index-list encoding.
        "sparse_float": {"layers": {**{n: {"prune": {"sparsity": 0.75}} for n in convs[::2]},
                                    "linear": {"prune": {"sparsity": 0.97}}}},
        # Half the internal channels removed, the rest INT4 group-wise; some blocks also sparse.
        "semi_int4": {"default": {"quantize": {"bits": 4, "rounding": "gptq"}},
                      "layers": {n: {"prune": {"sparsity": 0.5, "kind": "2:4"}} for n in convs}},
        "channels50_int4": {"default": {"quantize": {"bits": 4, "granularity": "group"}},
                            "layers": {**{n: {"prune": {"sparsity": 0.5, "kind": "structured"}} for n in blocks},
                                       **{n: {"prune": {"sparsity": 0.5}} for n in convs if n.endswith("conv2")}}},
    }
    return ev.space.parse_plan(docs[name])


@pytest.mark.slow
@pytest.mark.parametrize(("repaired", "name"), [(False, "sparse50_int4"), (False, "sparse_float"),
                                               (False, "channels50_int4"), (True, "sparse50_int4"),
                                               (True, "semi_int4"), (True, "channels50_int4")])
def test_file_is_size_bytes_and_reloads_the_evaluated_model(ev, ev_repaired, tmp_path, repaired, name):
    ev = ev_repaired if repaired else ev
    plan = _plan(ev, name)
    wl = ev.workload
    path = export_packed(ev, plan, tmp_path / f"{name}.pt")
    size, accounted = os.path.getsize(path), ev.plan_cost(plan).size_bytes
    assert accounted <= size <= accounted + CONTAINER_BYTES, (name, size, accounted)
    payload = torch.load(path, weights_only=True)
    stored = sum(payload[k].numel() * payload[k].element_size() for k in ("codes", "scales", "floats", "masks")
                 if k in payload)
    assert stored == accounted  # every accounted byte is a stored byte, and no more
    net = load(path)
    assert_norms_run_on_cuda(net)
    layers = compressible_modules(net)
    slices = ev.realise(plan).slices
    expected = ev.states.compressed_weights(plan)
    for lname, w in expected.items():
        rows, cols = slices.get(lname, (None, None))
        if rows is not None:
            w = w[rows]
        if cols is not None:
            w = w[:, cols]
        assert torch.equal(layers[lname].weight, w), lname  # bit-identical, at the physical shape
    x = wl.split("val").x[:64]
    with torch.inference_mode():
        got = net(x)
    state, _ = ev.states.compressed_state(plan)
    with wl.state(state):
        want = wl.logits(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(1), want.argmax(1))
