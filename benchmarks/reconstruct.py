"""Reconstruction on a plan's own inputs: answers changed and retention on test, before and after, per plan.

Each row is one plan applied to every layer it fits (the first and last layer INT8), scored on the data's test split
against the float model as the search composes it (GPTQ, SparseGPT and the least-squares refit, each fitted on the
float model's inputs) and again after `modelopt.reconstruct` refitted it on its own compressed inputs (what
`modelopt optimize` confirms, tests and exports). No labels are read but the test split's.

    python benchmarks/reconstruct.py                                   # bundled ResNet-20, CIFAR-10 JPEG test
    python benchmarks/reconstruct.py --model cifar10_resnet56 --weights ../shared/models/cifar10/resnet56-4bfd9763.th
    python benchmarks/reconstruct.py --model cifar10_mobilenetv2 --weights models/cifar10_mobilenetv2.pt
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from modelopt.api import build_compressors, build_workload
from modelopt.compressors.contract import ChannelAnalysis
from modelopt.evaluation.evaluator import Evaluator
from modelopt.model.workload import Workload
from modelopt.plan.space import SearchSpace
from modelopt.reconstruct import IMAGES
from modelopt.reconstruct.store import Refits

SHARED = Path(__file__).resolve().parents[2] / "shared"
JPEG_TEST = SHARED / "data" / "cifar10" / "cifar10_jpeg_test.npz"
COMPRESSORS = {"prune": {"kind": ["unstructured", "structured"], "repair_images": 256, "sparse_images": 256},
               "quantize": {"bits": [8, 4, 3, 2], "granularity": ["per_channel", "group"], "group_size": 32,
                            "rounding": ["gptq"]}}


def _quant(wl: Workload, bits: int, granularity: str = "per_channel") -> dict[str, dict[str, Any]]:
    """`bits` on every layer but the first and the last (INT8 there)."""
    names = [x.name for x in wl.layers]
    return {n: {"bits": 8, "granularity": "per_channel"} if n in (names[0], names[-1])
            else {"bits": bits, "granularity": granularity} for n in names}


def plans(wl: Workload) -> list[tuple[str, dict[str, Any]]]:
    """(label, plan document) per row: the rows of issue 42's table."""
    inner = [x.name for x in wl.layers[1:-1] if x.in_channels >= 4 or x.kind.value == "linear"]
    roots = [x.name for x in wl.layers.analysed(ChannelAnalysis) if ChannelAnalysis.of(x).members]
    rows: list[tuple[str, dict[str, Any]]] = []
    for label, bits, gran in (("INT4 per-channel GPTQ", 4, "per_channel"), ("INT3 per-channel GPTQ", 3, "per_channel"),
                              ("INT3 group-wise (32) GPTQ", 3, "group"), ("INT2 per-channel GPTQ", 2, "per_channel")):
        rows.append((label, {"layers": {n: {"quantize": c} for n, c in _quant(wl, bits, gran).items()}}))
    sparse = {n: {"prune": {"sparsity": 0.5, "kind": "unstructured"}} for n in inner}
    q4 = _quant(wl, 4)
    rows.append(("50 % unstructured (SparseGPT) + INT4 GPTQ",
                 {"layers": {n: {**sparse.get(n, {}), "quantize": c} for n, c in q4.items()}}))
    rows.append(("25 % of every channel group removed, refitted",
                 {"layers": {n: {"prune": {"sparsity": 0.25, "kind": "structured"}} for n in roots}}))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cifar10_resnet20", help="a zoo name")
    ap.add_argument("--weights", default=None, help="checkpoint (default: the bundled one)")
    ap.add_argument("--data", default=str(JPEG_TEST), help="labelled images (default: CIFAR-10 JPEG test)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--images", type=int, default=IMAGES, help="calibration images the refit reads")
    ap.add_argument("--rows", default=None, help="comma-separated row numbers (1-based) to run (default: all)")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    torch.manual_seed(0)
    wl = build_workload(args.model, args.data, weights=args.weights, device=args.device)
    space = SearchSpace(wl.layers, build_compressors(["prune", "quantize"], COMPRESSORS))
    n = len(wl.split(args.split).y)
    print(f"{args.model} on {Path(args.data).name}, split {args.split} ({n} images), float top-1 "
          f"{100 * wl.baseline_accuracy(args.split):.2f} %, device {wl.device}, threads {torch.get_num_threads()}, "
          f"refit on {args.images} calibration images")
    print("| plan | compression | retention: composed | reconstructed | answers changed: composed | reconstructed "
          "| held-out check (calibration images): composed -> refitted | refit seconds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    chosen = None if args.rows is None else {int(r) for r in args.rows.split(",")}
    for i, (label, doc) in enumerate(plans(wl), 1):
        if chosen is not None and i not in chosen:
            continue
        ev = Evaluator(wl, space)  # a fresh evaluator per row: each row's composed figures are its own
        plan = ev.space.parse_plan(doc)
        before = ev.scorer.evaluate(plan, split=args.split)
        t0 = time.perf_counter()
        refits = Refits(ev, images=args.images)
        fitted = refits(plan)  # as `modelopt optimize` runs it, held-out check and all
        seconds = time.perf_counter() - t0
        after = ev.scorer.evaluate(ev.realise(plan, fitted), split=args.split)  # the plan as it runs once refitted
        record = refits.tried.get(plan.key)
        check = "-" if record is None or record.held_out is None else "{} images: {} -> {}".format(*record.held_out[:3])
        if record is not None and not record.chosen:
            check += ", dropped: runs as composed"
        print(f"| {label} | {after.compression:.2f}x | {100 * before.retention:.2f} % | {100 * after.retention:.2f} % "
              f"| {100 * (1 - before.agreement):.2f} % | {100 * (1 - after.agreement):.2f} % | {check} "
              f"| {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
