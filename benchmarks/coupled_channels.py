"""Coupled channel groups in a CIFAR ResNet: what removing residual-stream channels saves in ONNX Runtime, and
what it costs in answers without fine-tuning.

A stage's stream channels are shared by every block of the stage (each block's second conv writes them, its
shortcut carries them, the next stage's first conv and shortcut read them), so removing one takes it out of the
stem or the stage's shortcut and of every block's second conv at once (DFPC's "coupled channels"). Torch-Pruning's
dependency graph does not trace the option-A shortcut (a channel Pad): it ties all three stages into one group,
whose check fails, so the search never offers these groups on the CIFAR ResNets; this script measures whether
they would pay.

1. Speed: ResNet-20-shaped networks (random weights, option-A shortcuts as the strided 1x1 convs `modelopt export`
   writes) with narrower streams or inner convs, each quantized by ORT's `quantize_static` (QDQ, per-channel int8
   weights, uint8 activations) and timed in plain sessions (1 thread, batch 1 and 64, best of alternated rounds).
2. Answers: the bundled ResNet-20 with the k stream channels of a stage that carry the least energy on the
   calibration images removed (zeroed at every writer: the exact simulation of removing them), then repaired as
   the search repairs a plan: batch-norm statistics re-estimated on the calibration images, then each reader of
   the stage (the later blocks' first convs, the next stage's first conv or the classifier) refitted by least
   squares to the float model's outputs on the pruned model's own inputs. Test retention and agreement with the
   float model's answers.

    python benchmarks/coupled_channels.py [--rounds 5] [--data cifar10-exact-sample]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from torch import nn

from modelopt.api import build_workload
from modelopt.data.split import Split

SHAPES = {  # label: (stream widths per stage, inner widths per stage)
    "ResNet-20 (16/32/64)": ((16, 32, 64), (16, 32, 64)),
    "stream 16/32/48": ((16, 32, 48), (16, 32, 64)),
    "stream 16/24/48": ((16, 24, 48), (16, 24, 48)),
    "stream 12/24/48": ((12, 24, 48), (12, 24, 48)),
    "stream 16/32/32": ((16, 32, 32), (16, 32, 32)),
    "inner 16/32/48": ((16, 32, 64), (16, 32, 48)),
}
REMOVALS = ((3, 8), (3, 16), (3, 32), (2, 8), (2, 16), (1, 4))  # (stage, stream channels removed)


class _Block(nn.Module):
    def __init__(self, cin: int, inner: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(cin, inner, 3, stride, 1), nn.Conv2d(inner, cout, 3, 1, 1)
        self.sc = nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.c2(F.relu(self.c1(x))) + self.sc(x))


def _shaped(stream: tuple[int, ...], inner: tuple[int, ...]) -> nn.Module:
    blocks: list[nn.Module] = []
    cin = stream[0]
    for s in range(3):
        for b in range(3):
            blocks.append(_Block(cin, inner[s], stream[s], 2 if s and not b else 1))
            cin = stream[s]
    return nn.Sequential(nn.Conv2d(3, stream[0], 3, 1, 1), nn.ReLU(), *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(cin, 10)).eval()


def _quantized(model: nn.Module, folder: Path, label: str, calib: np.ndarray) -> ort.InferenceSession:
    path, qpath = folder / f"{len(list(folder.iterdir()))}.onnx", folder / f"{label}.q.onnx".replace("/", "-")
    torch.onnx.export(model, torch.randn(1, 3, 32, 32), str(path), input_names=["x"], dynamo=False, opset_version=17,
                      dynamic_axes={"x": {0: "n"}})
    rows = iter([{"x": calib[i : i + 1]} for i in range(len(calib))])

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(rows, None)

    quantize_static(str(path), str(qpath), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    return ort.InferenceSession(str(qpath), opts, providers=["CPUExecutionProvider"])


def speed(calib: np.ndarray, x: np.ndarray, rounds: int) -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {k: _quantized(_shaped(*v), Path(tmp), k, calib[:64]) for k, v in SHAPES.items()}
        best = {(k, b): float("inf") for k in sessions for b in (1, 64)}
        for _ in range(rounds):
            for k, s in sessions.items():
                for b in (1, 64):
                    rows = [x[i : i + b] for i in range(0, len(x) - b + 1, b)][: 300 // b or 4]
                    for r in rows[:10]:
                        s.run(None, {"x": r})
                    t = time.perf_counter()
                    for r in rows:
                        s.run(None, {"x": r})
                    best[k, b] = min(best[k, b], (time.perf_counter() - t) / len(rows) * 1e3)
    base = next(iter(SHAPES))
    print(f"W8A8 (ORT {ort.__version__} quantize_static), 1 thread, best of {rounds} alternated rounds")
    print("| network | batch 1 ms | speed-up | batch 64 ms | speed-up |\n| --- | ---: | ---: | ---: | ---: |")
    for k in SHAPES:
        print(f"| {k} | {best[k, 1]:.3f} | {best[base, 1] / best[k, 1]:.2f}x | {best[k, 64]:.2f} "
              f"| {best[base, 64] / best[k, 64]:.2f}x |")


def _stage_energy(model: nn.Module, x: torch.Tensor, stage: int) -> torch.Tensor:
    energy: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda m, i, o: energy.append(o.pow(2).mean((0, 2, 3))))
             for b in getattr(model, f"layer{stage}")]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return torch.stack(energy).sum(0)


def _reestimate(model: nn.Module, x: torch.Tensor) -> None:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for i in range(0, len(x), 256):
            model(x[i : i + 256])
    model.eval()


def _refit(model: nn.Module, reference: nn.Module, module: str, x: torch.Tensor) -> None:
    """Least-squares refit of `module` (a conv or the classifier) to the reference's outputs on the pruned
    model's own inputs (ridge 1e-3 of the mean diagonal)."""
    layer, ref = model.get_submodule(module), reference.get_submodule(module)
    got: dict[str, torch.Tensor] = {}
    hooks = [layer.register_forward_hook(lambda m, i, o: got.__setitem__("x", i[0])),
             ref.register_forward_hook(lambda m, i, o: got.__setitem__("y", o))]
    with torch.no_grad():
        model(x)
        reference(x)
    for h in hooks:
        h.remove()
    if isinstance(layer, nn.Conv2d):
        a = F.unfold(got["x"], layer.kernel_size, padding=layer.padding, stride=layer.stride)
        a = a.transpose(1, 2).reshape(-1, a.shape[1])
        y = got["y"].flatten(2).transpose(1, 2).reshape(-1, layer.out_channels)
    else:
        a, y = torch.cat([got["x"], torch.ones(len(x), 1)], 1), got["y"]
    g = a.T @ a
    g += 1e-3 * g.diagonal().mean() * torch.eye(len(g))
    w = torch.linalg.solve(g, a.T @ y).T
    with torch.no_grad():
        if isinstance(layer, nn.Conv2d):
            layer.weight.copy_(w.reshape(layer.weight.shape))
        else:
            layer.weight.copy_(w[:, :-1])
            layer.bias.copy_(w[:, -1])


def answers(data: str) -> None:
    wl = build_workload("cifar10_resnet20", data, device="cpu")
    test = wl.split(Split.TEST)
    calib, x, y = wl.split(Split.CALIB).x.tensor(), test.x.tensor(), test.y
    float_model = wl.model.cpu().eval()
    with torch.no_grad():
        want = float_model(x).argmax(1)
    base = float((want == y).float().sum())
    print(f"\nResNet-20, stream channels removed (least energy on {len(calib)} calibration images); {len(x)} test "
          f"images of {data}")
    print("| stage | removed | zeroed only | + batch-norm re-estimated | + readers refitted |\n| ---: | ---: | ---: "
          "| ---: | ---: |")
    for stage, k in REMOVALS:
        model = copy.deepcopy(float_model)
        layer = getattr(model, f"layer{stage}")
        mask = torch.ones(len(layer[0].bn2.weight))
        mask[torch.argsort(_stage_energy(float_model, calib[:512], stage))[:k]] = 0
        writers = [b.bn2 for b in layer] + [model.bn1 if stage == 1 else layer[0].shortcut]
        for w in writers:
            w.register_forward_hook(lambda m, i, o, keep=mask: o * keep.view(1, -1, 1, 1))
        cells = []
        for step in ("zeroed", "bn", "refit"):
            if step == "bn":
                _reestimate(model, calib)
            if step == "refit":
                readers = [f"layer{stage}.{b}.conv1" for b in range(1, len(layer))]
                readers.append(f"layer{stage + 1}.0.conv1" if stage < 3 else "linear")
                for r in readers:
                    _refit(model, float_model, r, calib)
            with torch.no_grad():
                got = model(x).argmax(1)
            cells.append(f"{100 * float((got == y).float().sum()) / base:.2f} % "
                         f"({100 * float((got == want).float().mean()):.1f} % agree)")
        print(f"| {stage} | {k} of {len(mask)} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", default="cifar10-exact-sample")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((400, 3, 32, 32)).astype(np.float32)  # speed only: values do not change int8 timing
    speed(images[:64], images[64:], args.rounds)
    answers(args.data)


if __name__ == "__main__":
    main()
