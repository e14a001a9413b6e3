"""Prints how close the evaluator sits to the floor: a bare float forward pass over val.

For ResNet-20 (bundled sample) and ResNet-56 (../shared checkpoint and exact test images):
50 seeded random plans from the quantizer menu bits {8, 4, 3, 2} x {per_channel, group},
each scored on the whole val split. Each plan's evaluation is timed right after a bare
forward pass of the float model over the same samples (same resident model, same batch
size), so both see the same machine load; the ratio is per plan, and the median is
reported. Plans per minute count the evaluator's wall time (compressed tensors cached per
(layer, choice), as in a search; the first plans pay for quantizing their choices, shown
apart as "cold"). Peak memory is the process's maximum resident set (and CUDA's peak
allocation on a GPU).

    python benchmarks/evaluator_speed.py [--plans 50] [--models resnet20,resnet56]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from modelopt.api import build_workload
from modelopt.compressors import Quantize
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MODELS = {
    "resnet20": ("cifar10_resnet20", None, "cifar10-sample"),
    "resnet56": ("cifar10_resnet56", SHARED / "models/cifar10/resnet56-4bfd9763.th",
                 SHARED / "data/cifar10/cifar10_exact_test.npz"),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _paired_pass(ev: Evaluator, plans: list) -> tuple[list[float], list[float], list[float]]:
    """Per plan: a bare float forward over val, then the plan's evaluation. Returns (bare s, eval s, ratio)."""
    wl, x = ev.workload, ev.workload.split("val").x.tensor()
    bare_s, eval_s, ratios = [], [], []
    for plan in plans:
        _sync(wl.device)
        t0 = time.perf_counter()
        wl.logits(x)
        _sync(wl.device)
        t1 = time.perf_counter()
        ev.scorer.evaluate(plan, "val")
        _sync(wl.device)
        t2 = time.perf_counter()
        bare_s.append(t1 - t0)
        eval_s.append(t2 - t1)
        ratios.append((t2 - t1) / (t1 - t0))
    return bare_s, eval_s, ratios


def bench(key: str, n_plans: int, device: str) -> None:
    name, weights, data = MODELS[key]
    wl = build_workload(name, str(data), weights=weights, device=device)
    space = SearchSpace(wl.layers, [Quantize(bits=(8, 4, 3, 2), granularity=("per_channel", "group"),
                                             rounding=("nearest",), norm_images=0)])
    ev = Evaluator(wl, space)
    x = wl.split("val").x.tensor()
    rng = np.random.default_rng(0)
    plans = [space.plan({d.name: d.choices[int(rng.integers(len(d.choices)))] for d in space.decisions})
             for _ in range(n_plans)]
    wl.logits(x)  # warm-up
    bare_s, eval_s, ratios = _paired_pass(ev, plans)
    # Warm pass: the same plans scored by a fresh evaluator (no cached results); the compressed
    # tensors live on the workload, so they are already there, as in a search.
    _, warm_s, warm_ratios = _paired_pass(Evaluator(wl, space), plans)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cuda = (f", CUDA peak {torch.cuda.max_memory_allocated(wl.device) / 2**20:.0f} MiB"
            if wl.device.type == "cuda" else "")
    print(f"{key}: {len(x)} val images, batch {wl.batch_size}, device {wl.device}, torch threads "
          f"{torch.get_num_threads()}, {n_plans} random plans")
    print(f"  bare float forward over val: median {statistics.median(bare_s) * 1000:.1f} ms")
    print(f"  cold (first use of each choice): median {statistics.median(eval_s) * 1000:.1f} ms/plan, "
          f"ratio to bare {statistics.median(ratios):.3f}x, {60 / statistics.mean(eval_s):.0f} plans/min")
    print(f"  warm (choices cached, as in a search): median {statistics.median(warm_s) * 1000:.1f} ms/plan, "
          f"ratio to bare {statistics.median(warm_ratios):.3f}x, {60 / statistics.mean(warm_s):.0f} plans/min")
    print(f"  peak memory: {peak_mb:.0f} MiB resident (process){cuda}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=50)
    parser.add_argument("--models", default="resnet20,resnet56")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    for key in args.models.split(","):
        if key not in MODELS:
            sys.exit(f"unknown model {key!r}; valid: {', '.join(MODELS)}")
        if MODELS[key][1] is not None and not Path(MODELS[key][1]).exists():
            print(f"{key}: skipped, needs {MODELS[key][1]}")
            continue
        bench(key, args.plans, args.device)


if __name__ == "__main__":
    main()
