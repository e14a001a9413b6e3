"""Structured pruning: MACs, parameters, measured CPU latency of the physically smaller model, retention.

Every prunable channel group (torch-pruning's dependency graph, checked exact: a residual block's inner
channels, a MobileNetV2 block's expanded depthwise channels, a ViT block's MLP hidden units) loses the same
share of its channels (smallest L1 norm over the group); the evaluator's simulation (zeroed channels) is
checked against the smaller model, which is timed against the unpruned one (batch 64, fixed threads, median of
20 runs after warm-up). Retention is top-1 on `--split all` (the 846 exact CIFAR-10 test images) relative to
the float model, with batch-norm statistics re-estimated on 512 calibration images and without.

    python benchmarks/structured_prune_latency.py [--threads 1] [--sparsity 0.3]
    python benchmarks/structured_prune_latency.py --model cifar10_mobilenetv2 --weights models/cifar10_mobilenetv2.pt

On a shared machine the unpruned model is timed before and after the pruned one (both printed).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from modelopt.api import build_compressors, build_workload
from modelopt.compressors.contract import ChannelAnalysis
from modelopt.evaluation.evaluator import Evaluator
from modelopt.latency import torch_latency
from modelopt.plan.space import SearchSpace

WEIGHTS = Path(__file__).resolve().parents[2] / "shared" / "models" / "cifar10" / "resnet56-4bfd9763.th"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cifar10_resnet56", help="a zoo name")
    ap.add_argument("--weights", default=None, help="checkpoint (default: the shared ResNet-56 for cifar10_resnet56)")
    ap.add_argument("--sparsity", type=float, default=0.3, help="share of each block's internal channels removed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--split", default="all")
    args = ap.parse_args()
    torch.manual_seed(0)
    weights = args.weights or (str(WEIGHTS) if args.model == "cifar10_resnet56" else None)
    wl = build_workload(args.model, "cifar10-sample", weights=weights, device="cpu")
    blocks = [x.name for x in wl.layers.analysed(ChannelAnalysis) if ChannelAnalysis.of(x).members]
    if not blocks:
        refused = wl.analyses.get(ChannelAnalysis).refused
        raise SystemExit(f"{args.model} has no prunable channel group: {refused or 'none was exact'}")
    doc = {"layers": {n: {"prune": {"sparsity": args.sparsity, "kind": "structured"}} for n in blocks}}
    rows = []
    for bn_samples in (512, 0):
        comps = build_compressors(["prune"], {"prune": {"kind": ["structured"], "bn_samples": bn_samples,
                                                        "repair_images": 0}})
        ev = Evaluator(wl, SearchSpace(wl.layers, comps))
        plan = ev.space.parse_plan(doc)
        m = ev.scorer.evaluate(plan, split=args.split)
        rows.append((bn_samples, m))
    m = rows[0][1]
    options = {"prune": {"kind": ["structured"], "repair_images": 0}}
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["prune"], options)))
    plan = ev.space.parse_plan(doc)
    small = ev.states.physical_model(plan)
    x = wl.split("val").x[: args.batch]
    state, _ = ev.states.compressed_state(plan)
    with wl.state(state), torch.inference_mode():
        simulated = wl.model(x)
    with torch.inference_mode():
        gap = float((small(x) - simulated).abs().max())
    full = torch_latency(wl.model, x, batch_size=args.batch, threads=args.threads, repeats=args.repeats)
    pruned = torch_latency(small, x, batch_size=args.batch, threads=args.threads, repeats=args.repeats)
    again = torch_latency(wl.model, x, batch_size=args.batch, threads=args.threads, repeats=args.repeats)
    params = sum(p.numel() for p in small.parameters())
    print(f"{args.model}, {len(blocks)} channel groups pruned by {args.sparsity:.0%} (L1 norm over each group)")
    print(f"  MACs/sample  {m.float_macs / 1e6:8.2f} M -> {m.macs / 1e6:8.2f} M  "
          f"({1 - m.macs / m.float_macs:.1%} fewer)")
    print(f"  parameters   {sum(p.numel() for p in wl.model.parameters()):,} -> {params:,}; "
          f"size {m.float_size_bytes:,} -> {m.size_bytes:,} bytes")
    print(f"  latency (torch, cpu, batch {args.batch}, {args.threads} threads, median of {args.repeats}): "
          f"{full.median_ms:.2f} ms (again after: {again.median_ms:.2f} ms) -> {pruned.median_ms:.2f} ms  "
          f"({min(full.median_ms, again.median_ms) / pruned.median_ms:.2f}x against the faster)")
    print(f"  physical vs simulated logits: max |diff| {gap:.2e}")
    if m.baseline_accuracy == 0:
        print(f"  retention: none to measure (the float model gets none of the {m.n_samples} images right: random "
              "weights?)")
        rows = []
    for bn_samples, mm in rows:
        how = f"BN re-estimated on {bn_samples} calib images" if bn_samples else "BN statistics as trained"
        print(f"  retention on {args.split} ({mm.n_samples} images), {how}: {mm.retention:.2%} "
              f"(top-1 {mm.accuracy:.2%} vs {mm.baseline_accuracy:.2%}); budget for re-estimation {mm.prep_cost:.2f}")


if __name__ == "__main__":
    main()
