"""Prints what multi-fidelity scoring saves on the MCTS search benchmark.

MCTS on the bundled ResNet-20, quantizer menu bits {8, 4, 3, 2} x {per_channel, group},
99 % retention floor, budget 100, run with every plan scored on the whole val split
(full) and with multi-fidelity (the default). For each seed: the best feasible val
compression each finds, the images each scored in all, and the images each had scored
when its best-so-far first reached the full-fidelity run's best (the issue's measure:
the same best plan for fewer images).

    python benchmarks/multi_fidelity.py [--seeds 0,1,2] [--budget 100]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from modelopt.api import build_workload, optimize
from modelopt.evaluation.fidelity import Fidelity
from modelopt.run.runner import RunResult


def _images_to_reach(result: RunResult, target: float) -> int | None:
    """Images scored (cumulative) when the best feasible compression first reached `target`."""
    images = 0
    for t in result.trials:
        images += 0 if t.metrics is None else t.metrics.n_samples
        if t.feasible and t.metrics is not None and t.metrics.compression >= target * (1 - 1e-9):
            return images
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budget", type=float, default=100)
    parser.add_argument("--strategy", default="mcts")
    parser.add_argument("--stages", default="0.25,0.5", help="val fractions after which to check the bound")
    parser.add_argument("--dominated", action="store_true", help="also stop plans that cannot beat the best")
    args = parser.parse_args()
    wl = build_workload("cifar10_resnet20", "cifar10-sample")
    n_val = len(wl.split("val"))
    print(f"ResNet-20, {args.strategy}, budget {args.budget:g}, val {n_val} images, device {wl.device}")
    print(f"{'seed':>4s} {'mode':>6s} {'trials':>6s} {'best val x':>10s} {'val ret':>8s} {'images':>7s} "
          f"{'images to full best':>19s} {'stopped':>8s}")
    fidelity = Fidelity(tuple(float(s) for s in args.stages.split(",")), dominated=args.dominated)
    print(f"multi-fidelity: {fidelity}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            runs: dict[str, RunResult] = {}
            for mode, fid in (("full", None), ("multi", fidelity)):
                runs[mode] = optimize(wl, strategy=args.strategy, budget=args.budget, seed=seed,
                                      bits=(8, 4, 3, 2), compressors=["quantize"], out=Path(tmp) / f"{mode}-{seed}",
                                      progress=False, fidelity=fid)
            target = runs["full"].best.metrics.compression if runs["full"].best else 1.0
            reach = {}
            for mode, r in runs.items():
                images = sum(t.metrics.n_samples for t in r.trials if t.metrics is not None)
                reach[mode] = _images_to_reach(r, target)
                stopped = sum(t.metrics is not None and t.metrics.stopped is not None for t in r.trials)
                best = r.best.metrics if r.best else None
                print(f"{seed:4d} {mode:>6s} {len(r.trials):6d} {best.compression if best else 1.0:9.2f}x "
                      f"{best.retention if best else 1.0:8.2%} {images:7d} {reach[mode]!s:>19s} {stopped:8d}")
            if reach["multi"]:
                ratios.append(reach["full"] / reach["multi"])
                print(f"     images to reach the full run's best: {reach['full'] / reach['multi']:.2f}x fewer")
            else:
                print("     multi-fidelity did not reach the full run's best within the budget")
    if ratios:
        print(f"median saving where reached: {sorted(ratios)[len(ratios) // 2]:.2f}x over {len(ratios)} seeds")


if __name__ == "__main__":
    main()
