"""How well label-free agreement on other image pools predicts a plan's drop on clean test images.

Issue 11 asks whether unlabeled images can vouch for a plan. Agreement with the float model needs
no label, but the drop it can bound is P(float right, plan wrong) <= P(disagree), and only images
like the test images vouch for test. This script scores seeded random quantization plans of
ResNet-20 on the 846 exact CIFAR-10 test images (the reference) and on two label-free pools:
training images the model was fitted on (exact pixels) and held-out test images re-encoded as JPEG,
and prints, per pool, the correlation of disagreement with the reference's, their median ratio,
how often the pool's disagreement is at least the reference's (a conservative proxy), and the
retention a label-free floor would certify (1 - disagreement upper bound / accuracy).

    python benchmarks/agreement_pools.py [--plans 30] [--shared ../shared]

Measured (2-core CPU, 30 plans of bits {8,4,3,2} x {per-channel, group-64}, seed 0):
see the closing note of issue 11; in short, training-image disagreement is ~0.55x the test
images' (optimistic: never a safe certificate), JPEG's ~2.2x (pessimistic), and a label-free
floor certifies 99 % only for plans that disagree on under ~0.9 % of images, while plans of 5x
and more disagree on 4-7 %.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from exit_files import heldout_indices, read_images  # this folder's sibling: the study's image pools

from modelopt.api import build_compressors, build_workload
from modelopt.confidence import PairedCounts, binom_upper
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=30)
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    ap.add_argument("--pool-images", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = args.shared / "data" / "cifar10"
    wl = build_workload("cifar10_resnet20", "cifar10-sample", device="cpu")
    comps = build_compressors(["quantize"],
                              {"quantize": {"bits": [8, 4, 3, 2], "granularity": ["per_channel", "group"],
                                            "rounding": ["nearest"], "norm_images": 0}})
    space = SearchSpace(wl.layers, comps)
    ev = Evaluator(wl, space)
    rng = np.random.default_rng(0)
    held = heldout_indices(data / "cifar10_exact_test.npz", data / "cifar10_jpeg_test.npz")
    train_idx = np.sort(rng.choice(4660, min(args.pool_images, 4660), replace=False))
    jpeg_idx = np.sort(rng.choice(held, args.pool_images, replace=False))
    pools = {"exact train (fitted on)": read_images(data / "cifar10_exact_train.npz", train_idx),
             "JPEG test (held out)": read_images(data / "cifar10_jpeg_test.npz", jpeg_idx)}
    ref = wl.split("all")
    xs = {"clean test (846)": ref.x, **{k: wl.prepare(torch.from_numpy(v[0])) for k, v in pools.items()}}
    base = {k: wl.predict(x) for k, x in xs.items()}
    ys = {"clean test (846)": ref.y, **{k: torch.from_numpy(v[1]) for k, v in pools.items()}}
    dis: dict[str, list[float]] = {k: [] for k in xs}
    drop: list[float] = []
    t0 = time.perf_counter()
    for _ in range(args.plans):
        choice = {d.name: d.choices[int(rng.integers(len(d.choices)))] for d in space.decisions}
        plan = space.plan(choice)
        state, _ = ev.states.compressed_state(plan)
        with wl.state(state):
            for k, x in xs.items():
                pred = wl.predict(x)
                dis[k].append(float((pred != base[k]).float().mean()))
                if k == "clean test (846)":
                    br = base[k] == ys[k]
                    drop.append(float((br & (pred != ys[k])).sum() - (~br & (pred == ys[k])).sum()) / len(pred))
    print(f"{args.plans} random plans scored in {time.perf_counter() - t0:.0f} s")
    r = np.array(dis["clean test (846)"])
    print(f"clean test: disagreement median {np.median(r):.2%} (range {r.min():.2%}-{r.max():.2%}), "
          f"accuracy drop median {statistics.median(drop):.2%}")
    acc = float((base["clean test (846)"] == ys["clean test (846)"]).float().mean())
    for k in pools:
        p = np.array(dis[k])
        ratio = np.median(r / np.maximum(p, 1e-4))
        n = len(ys[k])
        certified = [1 - binom_upper(round(d * n), n, 0.05) / acc for d in p]
        print(f"{k}: corr with clean disagreement {np.corrcoef(r, p)[0, 1]:.2f}; clean / pool disagreement "
              f"median {ratio:.2f}; pool >= clean for {np.mean(p >= r):.0%} of plans; label-free floor certifies "
              f"{max(certified):.2%} at best (99 % needs pool disagreement under "
              f"{(1 - 0.99) * acc * 100:.2f} % minus its bound's width)")
    zero = PairedCounts(846, round(acc * 846), 0, 0).retention_lower(0.95)
    print(f"for scale: all 846 clean images, perfect agreement, certify {zero:.2%} at 95 %")


if __name__ == "__main__":
    main()
