"""Grids at the same bytes: INT-b (clipped, 2^b levels) against the rate grid (uniform, unclipped, its step set for a
rate in bits a weight), every code entropy coded as the packed file stores it.

Each row is one grid on every layer but the first and the last (INT8 per channel there), GPTQ codes, batch norms
re-estimated as the plan asks, scored on the data's test split against the float model as the search composes it,
and again after `modelopt.reconstruct` refitted it on its own inputs (what `modelopt optimize` confirms and
exports). "bits / weight" is what those layers' codes and scales take in the packed file, per weight; "entropy" the
codes' order-0 entropy (what an ideal coder with one histogram a layer would spend on the codes alone).

    python benchmarks/rate.py                                   # bundled ResNet-20, CIFAR-10 JPEG test
    python benchmarks/rate.py --model cifar10_resnet56 --weights ../shared/models/cifar10/resnet56-4bfd9763.th
    python benchmarks/rate.py --model cifar10_mobilenetv2 --weights models/cifar10_mobilenetv2.pt
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch

from modelopt.api import build_compressors, build_workload
from modelopt.evaluation.evaluator import Evaluator
from modelopt.model.workload import Workload
from modelopt.plan.space import SearchSpace
from modelopt.reconstruct import IMAGES
from modelopt.reconstruct.store import Refits

SHARED = Path(__file__).resolve().parents[2] / "shared"
JPEG_TEST = SHARED / "data" / "cifar10" / "cifar10_jpeg_test.npz"
GRIDS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("INT4", {"bits": 4}), ("INT3", {"bits": 3}), ("INT2", {"bits": 2}),
    ("rate 4.5", {"rate": 4.5}), ("rate 3.5", {"rate": 3.5}), ("rate 3.0", {"rate": 3.0}),
    ("rate 2.5", {"rate": 2.5}), ("rate 2.0", {"rate": 2.0}),
)


def _plan(wl: Workload, grid: dict[str, Any]) -> dict[str, Any]:
    names = [x.name for x in wl.layers]
    inner = {**grid, "rounding": "gptq"}
    return {"layers": {n: {"quantize": {"bits": 8, "rounding": "gptq"} if n in (names[0], names[-1]) else inner}
                       for n in names}}


def _entropy(codes: torch.Tensor) -> float:
    """Order-0 entropy of `codes`, in bits a code."""
    p = torch.bincount(codes.reshape(-1).long() + 128).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log2()).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cifar10_resnet20", help="a zoo name")
    ap.add_argument("--weights", default=None, help="checkpoint (default: the bundled one)")
    ap.add_argument("--data", default=str(JPEG_TEST), help="labelled images (default: CIFAR-10 JPEG test)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--rows", default=None, help="comma-separated labels to run, e.g. 'INT4,rate 3.0'")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    torch.manual_seed(0)
    wl = build_workload(args.model, args.data, weights=args.weights, device=args.device)
    rates = sorted({float(g["rate"]) for _, g in GRIDS if "rate" in g})
    space = SearchSpace(wl.layers, build_compressors(["quantize"], {"quantize": {
        "bits": [8, 4, 3, 2], "granularity": ["per_channel"], "rounding": ["gptq"], "rates": rates}}))
    inner = list(wl.layers[1:-1])
    params = sum(x.params for x in inner)
    n = len(wl.split(args.split).y)
    print(f"{args.model} on {Path(args.data).name}, split {args.split} ({n} images), float top-1 "
          f"{100 * wl.baseline_accuracy(args.split):.2f} %, device {wl.device}, threads {torch.get_num_threads()}; "
          f"{len(inner)} layers at the grid ({params:,} weights), first and last INT8")
    print("| grid | bits / weight (codes + scales, coded) | entropy | compression | retention: composed | "
          "reconstructed | answers changed: composed | reconstructed | seconds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    chosen = None if args.rows is None else {r.strip() for r in args.rows.split(",")}
    for label, grid in GRIDS:
        if chosen is not None and label not in chosen:
            continue
        t0 = time.perf_counter()
        ev = Evaluator(wl, space)  # a fresh evaluator per row: each row's figures are its own
        plan = ev.space.parse_plan(_plan(wl, grid))
        before = ev.scorer.evaluate(plan, split=args.split)
        fitted = Refits(ev, images=IMAGES)(plan)  # as `modelopt optimize` runs it, held-out check and all
        r = ev.realise(plan, fitted)
        after = ev.scorer.evaluate(r, split=args.split)
        costs = ev.plan_cost(r)
        stored = sum(costs.layer(x.name).storage.bytes for x in inner)
        forms = r.forms
        # Each layer's codes against its own histogram (as the file codes them), weighted by its weights.
        entropy = sum(_entropy(forms[x.name].integer.codes.cpu()) * x.params  # type: ignore[union-attr]
                      for x in inner) / params
        seconds = time.perf_counter() - t0
        print(f"| {label} | {8 * stored / params:.2f} | {entropy:.2f} | {after.compression:.2f}x "
              f"| {100 * before.retention:.2f} % | {100 * after.retention:.2f} % "
              f"| {100 * (1 - before.agreement):.2f} % | {100 * (1 - after.agreement):.2f} % | {seconds:.1f} |",
              flush=True)
        assert math.isfinite(after.retention)


if __name__ == "__main__":
    main()
