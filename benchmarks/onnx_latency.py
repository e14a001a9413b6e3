"""Prints ONNX Runtime latency of ResNet-20: float vs uniform INT8 QDQ (vs the PyTorch float model).

Batch 1 and 64 on the CPU with a fixed thread count (median of repeated runs after warm-up), then
how often ONNX Runtime's top-1 agrees with the PyTorch evaluation of the same plan on the val
split (and on test), for uniform INT8 and INT4 per-channel plans, and which kernels ORT runs.

    python benchmarks/onnx_latency.py [--threads 2] [--repeats 50]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from modelopt.api import build_compressors, build_workload
from modelopt.compressors import QuantSpec
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters import export_packed
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.onnx_run import fused_op_counts, run_onnx
from modelopt.latency import onnx_latency, torch_latency
from modelopt.plan.space import SearchSpace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()

    wl = build_workload("cifar10_resnet20", "cifar10-sample", device="cpu")
    options = {"quantize": {"bits": [8, 4], "rounding": ["nearest"], "norm_images": 0}}
    space = SearchSpace(wl.layers, build_compressors(["quantize"], options))
    ev = Evaluator(wl, space)
    plans = {"float": space.plan(), "int8": space.uniform("quantize", QuantSpec(8)),
             "int4": space.uniform("quantize", QuantSpec(4))}
    tmp = Path(tempfile.mkdtemp())
    files = {
        "onnx float": export_onnx(ev, plans["float"], tmp / "float.onnx", activations=False).path,
        "onnx int8 QDQ": export_onnx(ev, plans["int8"], tmp / "int8.onnx").path,
        "onnx int4 QDQ": export_onnx(ev, plans["int4"], tmp / "int4.onnx").path,
        "onnx int4->int8": export_onnx(ev, plans["int4"], tmp / "int4w.onnx", widen_int4=True).path,
    }
    x = wl.split("val").x.tensor()
    print(f"ResNet-20, CPU ({os.cpu_count()} cores), {args.threads} threads, median of {args.repeats} runs "
          f"after {args.warmup} warm-up; torch {torch.__version__}")
    print(f"{'model':16s} {'file':>10s} {'batch 1 ms':>11s} {'batch 64 ms':>12s} {'img/s @64':>10s}")
    rows = [("torch float", None, wl.model)] + [(k, v, v) for k, v in files.items()]
    for label, path, model in rows:
        cells = []
        for bs in (1, 64):
            if path is None:
                rec = torch_latency(model, x, batch_size=bs, threads=args.threads, warmup=args.warmup,
                                    repeats=args.repeats)
            else:
                rec = onnx_latency(model, x, batch_size=bs, threads=args.threads, warmup=args.warmup,
                                   repeats=args.repeats)
            cells.append(rec.median_ms)
        size = "-" if path is None else f"{path.stat().st_size / 1024:.0f} KiB"
        print(f"{label:16s} {size:>10s} {cells[0]:11.3f} {cells[1]:12.3f} {64e3 / cells[1]:10.0f}")

    print("\nORT top-1 agreement with the PyTorch evaluation of the same plan (weights-only fake quant):")
    for name, key in (("int8", "onnx int8 QDQ"), ("int4", "onnx int4 QDQ"), ("int4", "onnx int4->int8")):
        plan = plans[name]
        with wl.weights(ev.states.compressed_weights(plan)):
            ref = {s: wl.predict(wl.split(s).x.tensor()).numpy() for s in ("val", "test")}
        path = files[key]
        agree = {s: float(np.mean(run_onnx(path, wl.split(s).x.tensor()).argmax(1) == ref[s])) for s in ref}
        acc = float(np.mean(run_onnx(path, x).argmax(1) == wl.split("val").y.numpy()))
        m = ev.scorer.evaluate(plan, "val")
        print(f"  {key}, uniform {name} per-channel: val {agree['val']:.2%} ({len(ref['val'])} images), "
              f"test {agree['test']:.2%}; val top-1 ORT {acc:.2%} vs PyTorch {m.accuracy:.2%}")
        ops = fused_op_counts(path)
        print(f"    ORT runs: {', '.join(f'{k} x{v}' for k, v in sorted(ops.items()))}")
    packed = export_packed(ev, plans["int8"], tmp / "int8.pt")
    size = ev.plan_cost(plans["int8"]).size_bytes
    print(f"\npacked INT8 checkpoint {packed.stat().st_size} bytes vs size_bytes {size}")


if __name__ == "__main__":
    main()
