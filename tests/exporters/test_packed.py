"""The packed checkpoint against the evaluator: its bytes are size_bytes, its reload is the scored model."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch
from _norms import assert_norms_run_on_cuda
from torch import nn

from modelopt.api import build_compressors, build_workload
from modelopt.compressors import QuantSpec
from modelopt.errors import LoadError, StorageError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters import export_packed, load
from modelopt.exporters.packed import CONTAINER_BYTES
from modelopt.model.layers import compressible_modules
from modelopt.plan.space import SearchSpace
from modelopt.testing.env import child_env

PLANS = ("int8_per_channel", "int4_per_channel", "int4_group", "mixed_2_3_4")


@pytest.mark.parametrize("name", PLANS)
def test_file_size_is_size_bytes(r20_evaluator, r20_plans, tmp_path, name):
    plan = r20_plans[name]
    path = export_packed(r20_evaluator, plan, tmp_path / f"{name}.pt")
    size, accounted = os.path.getsize(path), r20_evaluator.plan_cost(plan).size_bytes
    # The file holds every accounted byte plus the zip/pickle framing, the index and the plan text.
    assert accounted <= size <= accounted + CONTAINER_BYTES, (name, size, accounted)


@pytest.mark.parametrize("name", ("int4_group", "mixed_2_3_4"))
def test_reload_is_the_evaluated_model(r20_evaluator, r20_plans, tmp_path, name):
    plan = r20_plans[name]
    wl = r20_evaluator.workload
    net = load(export_packed(r20_evaluator, plan, tmp_path / "m.pt"))  # rebuilt from the zoo by name
    assert net is not wl.model and not net.training
    assert_norms_run_on_cuda(net)
    expected = r20_evaluator.states.compressed_weights(plan)
    layers = compressible_modules(net)
    assert set(expected) == set(layers)
    for lname, w in expected.items():
        assert torch.equal(layers[lname].weight, w), lname  # bit-identical dequantized weights
    x = wl.split("val").x[:128]
    with torch.inference_mode():
        got = net(x)
    with wl.weights(expected):
        want = wl.logits(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # BN folded: same map, other rounding
    assert torch.equal(got.argmax(1), want.argmax(1))


def test_float_layers_and_pickled_files(r20_evaluator, r20_plans, tmp_path):
    space = r20_evaluator.space
    plan = space.parse_plan({"default": {"quantize": {"bits": 4}}, "layers": {"linear": {"quantize": None}}})
    path = export_packed(r20_evaluator, plan, tmp_path / "m.pt")
    net = load(path)
    assert torch.equal(net.linear.weight, r20_evaluator.workload.original["linear"])
    assert os.path.getsize(path) <= r20_evaluator.plan_cost(plan).size_bytes + CONTAINER_BYTES
    # Loading never unpickles objects: a file with one is refused, not executed.
    torch.save({"format": "modelopt.packed", "version": 1, "x": nn.ReLU()}, tmp_path / "evil.pt")
    with pytest.raises(LoadError, match="cannot read"):
        load(tmp_path / "evil.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(LoadError, match="not a modelopt packed checkpoint"):
        load(tmp_path / "other.pt")


class SmallNet(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_load_onto_a_skeleton_for_models_outside_the_zoo(tmp_path):
    torch.manual_seed(0)
    src = SmallNet()
    with torch.no_grad():  # non-trivial statistics, so folding the norm matters
        src.bn.running_mean.uniform_(-1, 1)
        src.bn.running_var.uniform_(0.5, 2)
        src.bn.weight.uniform_(0.5, 1.5)
        src.bn.bias.uniform_(-1, 1)
    wl = build_workload(src.eval(), "cifar10-exact-sample", device="cpu")
    space = SearchSpace(wl.layers, build_compressors())
    ev = Evaluator(wl, space)
    plan = space.uniform("quantize", QuantSpec(8))
    path = export_packed(ev, plan, tmp_path / "small.pt")
    with pytest.raises(LoadError, match="cannot be rebuilt by name"):
        load(path)
    net = load(path, model=SmallNet())
    assert_norms_run_on_cuda(net)
    x = wl.split("val").x[:64]
    with wl.weights(ev.states.compressed_weights(plan)):
        want = wl.logits(x)
    with torch.inference_mode():
        torch.testing.assert_close(net(x), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(LoadError, match="does not fit"):
        load(path, model=SmallNet(width=4))


@pytest.mark.parametrize("weights", ({"bits": 8}, {"bits": 4, "granularity": "group"}))
def test_quantized_inputs_are_stored_counted_and_reloaded(r20_evaluator, tmp_path, weights):
    plan = r20_evaluator.space.parse_plan({"default": {"quantize": {**weights, "activations": 8}}})
    wl = r20_evaluator.workload
    path = export_packed(r20_evaluator, plan, tmp_path / "a8.pt")
    size, accounted = os.path.getsize(path), r20_evaluator.plan_cost(plan).size_bytes
    assert accounted <= size <= accounted + CONTAINER_BYTES, (size, accounted)
    weight_only = r20_evaluator.space.parse_plan({"default": {"quantize": weights}})
    # a float32 scale and a uint8 zero point per layer with quantized inputs
    assert accounted == r20_evaluator.plan_cost(weight_only).size_bytes + 5 * len(wl.layers)
    net = load(path)
    assert_norms_run_on_cuda(net)
    # The reloaded model quantizes each layer's input with exactly the evaluator's scale and zero point.
    expected, _ = r20_evaluator.states.input_qparams(plan)
    layers = compressible_modules(net)
    got = {n: [h.qparams for h in m._forward_pre_hooks.values()] for n, m in layers.items()}
    assert got == {n: [qp] for n, qp in expected.items()}
    x = wl.split("val").x[:128]
    with torch.inference_mode():
        out = net(x)
    want = r20_evaluator.states.logits(plan, x)
    # Folded norms round differently, which can move an input across a code boundary: close, same top-1.
    assert (out.argmax(1) == want.argmax(1)).float().mean() >= 0.99
    assert (out - want).abs().mean() < 0.01


@pytest.mark.parametrize("affine", (True, False))
def test_folded_norms_keep_a_positive_eps_and_compute_the_fold(tmp_path, affine):
    """CUDA's batch norm refuses eps 0, so the folded x * scale + shift is stored with a positive eps."""
    torch.manual_seed(1)
    src = SmallNet()
    src.bn = nn.BatchNorm2d(8, affine=affine)
    with torch.no_grad():
        src.bn.running_mean.uniform_(-1, 1)
        src.bn.running_var.uniform_(1e-3, 50)  # wide: scales from ~0.14 to ~30
        if affine:
            src.bn.weight.uniform_(-2, 2)
            src.bn.bias.uniform_(-1, 1)
    wl = build_workload(src.eval(), "cifar10-exact-sample", device="cpu")
    space = SearchSpace(wl.layers, build_compressors())
    ev = Evaluator(wl, space)
    net = load(export_packed(ev, space.plan(), tmp_path / "float.pt"), model=SmallNet())
    assert_norms_run_on_cuda(net)
    bn = src.bn
    scale = torch.rsqrt(bn.running_var + bn.eps) * (bn.weight if affine else 1)
    shift = (bn.bias if affine else 0) - bn.running_mean * scale
    x = torch.randn(4, 8, 5, 5)
    with torch.inference_mode():
        want = x * scale[:, None, None] + shift[:, None, None]
        got = net.bn(x)
    if affine:  # variance + eps is exactly 1: the norm multiplies by the stored scale itself
        assert torch.equal(net.bn.running_var + net.bn.eps, torch.ones(8))
        assert torch.equal(net.bn.running_mean, torch.zeros(8))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_failed_write_leaves_the_old_checkpoint_whole(r20_evaluator, r20_plans, tmp_path, monkeypatch):
    path = export_packed(r20_evaluator, r20_plans["int8_per_channel"], tmp_path / "m.pt")
    old = path.read_bytes()

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(StorageError, match=r"cannot write .*m\.pt.*No space left"):
        export_packed(r20_evaluator, r20_plans["int4_group"], path)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["m.pt"]  # no half zip, no temporary
    monkeypatch.undo()
    assert load(path) is not None


def _weights_digest(net: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(net.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.slow
def test_a_new_process_decodes_the_same_weights_and_answers(r20_evaluator, r20_plans, tmp_path):
    """Format 5's entropy-coded codes decode in a fresh interpreter to the same weights, bit for bit, and the
    same answers on the test images."""
    path = export_packed(r20_evaluator, r20_plans["mixed_2_3_4"], tmp_path / "m.pt")
    assert torch.load(path, weights_only=True)["version"] == 5
    net = load(path)
    x = r20_evaluator.workload.split("test").x.tensor()[:256]
    torch.save(x, tmp_path / "x.pt")
    with torch.inference_mode():
        answers = net(x).argmax(1)
    script = ("import sys, hashlib, torch; from modelopt.exporters import load; net = load(sys.argv[1]); "
              "h = hashlib.sha256()\nfor k, t in sorted(net.state_dict().items()):\n"
              "    h.update(k.encode()); h.update(t.detach().cpu().contiguous().numpy().tobytes())\n"
              "print(h.hexdigest())\nwith torch.inference_mode():\n"
              "    print(net(torch.load(sys.argv[2])).argmax(1).tolist())")
    out = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "x.pt")], env=child_env(),
                         capture_output=True, text=True, timeout=300, check=True).stdout.split("\n")
    assert out[0] == _weights_digest(net)
    assert out[1] == str(answers.tolist())


def test_a_version_4_file_still_loads(r20_evaluator, r20_plans, tmp_path):
    """Files written before the codes were entropy coded (bit-packed codes, no segment lengths) load as before."""
    from modelopt.compressors.contract import IntegerWeight, decode_codes, pack_codes

    plan = r20_plans["mixed_2_3_4"]
    new = load(export_packed(r20_evaluator, plan, tmp_path / "v5.pt"))
    payload = torch.load(tmp_path / "v5.pt", weights_only=True)
    index = json.loads(zlib.decompress(payload["index"]))
    codes, start, old = payload["codes"].numpy(), 0, []
    for entry in index["q"]:
        name, tag, shape, kept, n, _ = entry
        bits = IntegerWeight.layout(tag)[0]
        old.append(pack_codes(decode_codes(codes[start : start + n], bits, shape), bits))
        start += n
        entry[:] = [name, tag, shape, kept]
    payload.update(version=4, codes=torch.from_numpy(np.concatenate(old)),
                   index=zlib.compress(json.dumps(index).encode()))
    torch.save(payload, tmp_path / "v4.pt")
    assert _weights_digest(load(tmp_path / "v4.pt")) == _weights_digest(new)
