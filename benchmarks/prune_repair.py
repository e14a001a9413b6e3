"""Pruning with and without repair: test retention and answers changed, per plan, for any zoo model.

Each row is one plan applied to every layer it fits, scored on the data's test split against the float model
(batch norms re-estimated on 512 calibration images, as the tool does), once as pruning was before repair
(magnitude masks, L1 channels, nothing refitted) and once with the tool's defaults (unstructured: SparseGPT's mask
and error feedback on 256 calibration images; structured: the readers of removed channels refitted by least squares
on 256; `--criterion output` also picks the channels by the refit's cost). No labels are read but the test split's.

    python benchmarks/prune_repair.py                                   # bundled ResNet-20, CIFAR-10 JPEG test
    python benchmarks/prune_repair.py --model cifar10_resnet56 --weights ../shared/models/cifar10/resnet56-4bfd9763.th
    python benchmarks/prune_repair.py --model cifar10_mobilenetv2 --weights models/cifar10_mobilenetv2.pt
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

SHARED = Path(__file__).resolve().parents[2] / "shared"
JPEG_TEST = SHARED / "data" / "cifar10" / "cifar10_jpeg_test.npz"
QUANT = {"bits": [8, 4], "rounding": ["gptq"], "norm_images": 0}


def _int4(wl: Workload) -> dict[str, Any]:
    """INT4 per-channel on every layer but the first and the last (INT8 there), as a quantize decision per layer."""
    names = [x.name for x in wl.layers]
    return {n: {"bits": 8 if n in (names[0], names[-1]) else 4, "granularity": "per_channel"} for n in names}


def _plans(wl: Workload, sparsity: float, shares: tuple[float, ...]) -> list[tuple[str, dict[str, Any]]]:
    """(label, plan document) per row."""
    inner = [x.name for x in wl.layers[1:-1] if x.in_channels >= 4 or x.kind.value == "linear"]
    roots = [x.name for x in wl.layers.analysed(ChannelAnalysis) if ChannelAnalysis.of(x).members]
    q = _int4(wl)
    sparse = {n: {"prune": {"sparsity": sparsity, "kind": "unstructured"}} for n in inner}
    rows: list[tuple[str, dict[str, Any]]] = [("INT4 per-channel GPTQ (first and last layer INT8)",
                                               {"layers": {n: {"quantize": c} for n, c in q.items()}})]
    rows.append((f"{sparsity:.0%} unstructured on every inner layer, float", {"layers": sparse}))
    both = {n: {**sparse.get(n, {}), "quantize": c} for n, c in q.items()}
    rows.append(("the same + INT4 GPTQ", {"layers": both}))
    for share in shares:
        rows.append((f"{share:.0%} of every channel group removed, float",
                     {"layers": {n: {"prune": {"sparsity": share, "kind": "structured"}} for n in roots}}))
    return rows


def _score(wl: Workload, doc: dict[str, Any], prune: dict[str, Any], split: str) -> tuple[float, float]:
    """(retention %, answers changed %) of the plan on `split`."""
    comps = build_compressors(["prune", "quantize"], {"prune": {"kind": ["unstructured", "structured"], **prune},
                                                      "quantize": QUANT})
    ev = Evaluator(wl, SearchSpace(wl.layers, comps))
    m = ev.scorer.evaluate(ev.space.parse_plan(doc), split=split)
    return 100 * m.retention, 100 * (1 - m.agreement)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cifar10_resnet20", help="a zoo name")
    ap.add_argument("--weights", default=None, help="checkpoint (default: the bundled one)")
    ap.add_argument("--data", default=str(JPEG_TEST), help="labelled images (default: CIFAR-10 JPEG test)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--sparsity", type=float, default=0.5, help="unstructured share")
    ap.add_argument("--shares", default="0.25,0.5", help="structured shares, comma-separated")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    torch.manual_seed(0)
    wl = build_workload(args.model, args.data, weights=args.weights, device=args.device)
    shares = tuple(float(s) for s in args.shares.split(","))
    before = {"repair_images": 0, "sparse_images": 0, "criterion": "l1"}
    after = {"repair_images": 256, "sparse_images": 256, "criterion": "l1"}
    output = {**after, "criterion": "output"}
    n = len(wl.split(args.split).y)
    print(f"{args.model} on {Path(args.data).name}, split {args.split} ({n} images), float top-1 "
          f"{100 * wl.baseline_accuracy(args.split):.2f} %, device {wl.device}; retention % (answers changed %)")
    print("| plan | no repair | repaired (L1 channels) | repaired, channels by output |")
    print("| --- | ---: | ---: | ---: |")
    for label, doc in _plans(wl, args.sparsity, shares):
        t0 = time.perf_counter()
        cells = []
        structured = "channel group" in label
        for opts in (before, after, output) if structured else (before, after):
            r, c = _score(wl, doc, opts, args.split)
            cells.append(f"{r:.2f} ({c:.1f})")
        if not structured:
            cells.append("")
        print(f"| {label} | {' | '.join(cells)} |  <!-- {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
