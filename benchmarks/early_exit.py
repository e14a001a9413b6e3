"""Prints early exit on CIFAR-10 ResNet-56 and ResNet-20: exits, thresholds, val and TEST retention,
mean-MACs saving, head fitting time, and batch-1 CPU latency of the deployable module vs the model.

Set-up (the float setup of `modelopt evaluate --model cifar10_resnetN --data cifar10_exact_test.npz`):
val and test are build_workload's split of the 846 exact test images (338 / 339, seed 0).

- Heads: one per residual block, pooled features (average 1x1, 2x2, 4x4 and max 1x1, 2x2) and a
  linear layer, fitted label-free by L-BFGS to the full model's softmax on the 4,660 exact
  training images plus a seeded subset of the JPEG training images (`--train-jpeg`).
- Temperatures and the per-exit threshold shape: on the 9,154 JPEG test images that are not in
  the exact sample (`heldout_indices`), against the full model's predictions (no labels).
- The operating point on that path: the one saving most on val with retention >= `--floor`,
  lost samples not offset by fixed ones (or, `--criterion agreement`, agreement >= `--floor`).
  `--head-cost` charges each evaluated head a share of the network's MACs while choosing (a
  head's pooling and call overhead costs batch-1 time its MACs do not show). Test is only scored.
- Fitted heads are cached in `--cache` too (plain tensors, reloaded with weights_only=True); the
  fit time printed is the one measured when they were fitted.
- Latency: each test image alone (batch 1), `--threads` intra-op threads, after warm-up; the
  figure is the median over `--repeats` passes of the mean per-image time over the test split.

Features of the fitting images are cached in `--cache` (float16), so a rerun skips the backbone.

    python benchmarks/early_exit.py [--models 56,20] [--train-jpeg 15000] [--floor 0.99]

Measured (2-core CPU shared with other jobs; R56 heads fitted in 183 s, R20 in 14 s; test = 339 images):

| config | model | val retention / saving | TEST retention / agreement / saving | batch-1 ms float -> exit |
| --- | --- | --- | --- | --- |
| default (retention floor) | R56 | 100.00 % / 35.9 % | 98.10 % / 97.64 % / 35.5 % | 5.29 -> 5.10 |
| default (retention floor) | R20 | 99.35 % / 32.1 % | 97.73 % / 96.46 % / 32.4 % | 1.79 -> 1.92 |
| --criterion agreement | R56 | 100.00 % / 31.8 % | 99.68 % / 99.12 % / 31.3 % | 4.91 -> 5.66 |
| --criterion agreement | R20 | 99.68 % / 28.6 % | 99.03 % / 97.64 % / 28.1 % | 1.78 -> 2.01 |
| --criterion agreement --head-cost 0.015 | R56 | 100.32 % / 31.3 % | 99.05 % / 98.53 % / 30.7 % | 4.97 -> 4.39 |
| --criterion agreement --head-cost 0.015 | R20 | 99.68 % / 27.9 % | 98.71 % / 97.64 % / 27.9 % | 1.82 -> 1.75 |
| --hidden 128 (MLP heads, fitted in 448 s) | R56 | 100.32 % / 39.5 % | 98.10 % / 97.64 % / 39.6 % | 6.31 -> 11.39 |
| --hidden 128 --criterion agreement | R56 | 100.00 % / 32.4 % | 99.05 % / 98.53 % / 32.3 % | 4.78 -> 5.49 |

The flags were tried after the default's test figures were seen, so their test rows are not
an untouched held-out check. None reaches the 35 % saving at >= 99 % test retention aimed for:
MLP heads (a later session, the "richer heads" lever) save more MACs at the same retention
(39.6 % vs 35.5 % at 98.10 %) but cost batch-1 time their MACs do not show (22 heads evaluated
per sample in the worst case; the latency pass shared the CPU with another job).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from exit_files import cached_features, heads_state, heldout_indices, load_early_exit, normalise, read_images
from exit_simulate import assign_exits, exit_table, simulate  # this folder's siblings: the study's code
from exit_thresholds import ChooserConfig, choose_thresholds

from modelopt.api import build_workload
from modelopt.compressors.early_exit.features import Features, extract_features
from modelopt.compressors.early_exit.fit import FitConfig, fit_exit_heads
from modelopt.compressors.early_exit.heads import HeadSpec
from modelopt.compressors.early_exit.module import EarlyExitNet
from modelopt.model.backbone import split_backbone

SHARED = Path(__file__).resolve().parents[2] / "shared"
DATA = SHARED / "data" / "cifar10"
WEIGHTS = {56: SHARED / "models" / "cifar10" / "resnet56-4bfd9763.th",
           20: SHARED / "models" / "cifar10" / "resnet20-12fca82f.th"}
SPEC = HeadSpec(avg_grids=(1, 2, 4), max_grids=(1, 2))


def _concat(parts: list[Features]) -> Features:
    f0 = parts[0]
    return Features(f0.spec, f0.points, tuple(torch.cat([p.feats[i] for p in parts]) for i in range(len(f0.points))),
                    torch.cat([p.logits for p in parts]), torch.cat([p.labels for p in parts]))  # type: ignore[misc]


def _pool(bb, lm, name: str, path: Path, idx: np.ndarray | None, cache: Path, depth: int) -> Features:
    def make() -> Features:
        x, y = read_images(path, idx)
        return extract_features(bb, normalise(x, lm.mean, lm.std), SPEC, labels=torch.from_numpy(y),
                                dtype=torch.float16)

    t0 = time.perf_counter()
    f = cached_features(cache / f"r{depth}_{name}.pt", make)
    print(f"  features {name}: {len(f)} images ({time.perf_counter() - t0:.0f} s, cached in {cache})")
    return f


def _latency(fn, xs: torch.Tensor, repeats: int, threads: int) -> float:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for i in range(min(20, len(xs))):
                fn(xs[i : i + 1])
            passes = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for i in range(len(xs)):
                    fn(xs[i : i + 1])
                passes.append((time.perf_counter() - t0) * 1e3 / len(xs))
    finally:
        torch.set_num_threads(old)
    return statistics.median(passes)


def run(depth: int, args: argparse.Namespace) -> None:
    print(f"\n== ResNet-{depth} ==")
    wl = build_workload(f"cifar10_resnet{depth}", DATA / "cifar10_exact_test.npz", weights=WEIGHTS[depth], device="cpu")
    lm = wl.source
    bb = split_backbone(wl.model)
    exits = [p.name for p in bb.points]
    cache = Path(args.cache)
    rng = np.random.default_rng(args.seed)
    train_idx = np.sort(rng.permutation(50000)[: args.train_jpeg])
    held = heldout_indices(DATA / "cifar10_exact_test.npz", DATA / "cifar10_jpeg_test.npz")
    fit = _concat([_pool(bb, lm, "exact_train", DATA / "cifar10_exact_train.npz", None, cache, depth),
                   _pool(bb, lm, f"jpeg_train{args.train_jpeg}s{args.seed}", DATA / "cifar10_jpeg_train.npz",
                         train_idx, cache, depth)])
    calib = _pool(bb, lm, "jpeg_heldout", DATA / "cifar10_jpeg_test.npz", held, cache, depth)
    val_x, test_x = wl.split("val").x.tensor(), wl.split("test").x.tensor()
    val = extract_features(bb, val_x, SPEC, labels=wl.split("val").y)  # float32: what the module computes
    test = extract_features(bb, test_x, SPEC, labels=wl.split("test").y)

    spec = HeadSpec(SPEC.avg_grids, SPEC.max_grids, hidden=args.hidden)
    config = FitConfig(spec, l2=args.l2, seed=args.seed)
    tag = f"_h{args.hidden}" if args.hidden else ""
    heads_file = cache / f"r{depth}_heads_jt{args.train_jpeg}_l2{args.l2:g}_s{args.seed}{tag}.pt"
    if heads_file.exists():  # saved by an earlier run: plain tensors, read with weights_only=True
        heads, _ = load_early_exit(heads_file)
        fit_s = float(torch.load(heads_file, weights_only=True)["fit_seconds"])
    else:
        t0 = time.perf_counter()
        heads = fit_exit_heads(fit, exits, config, calibrate=calib)
        fit_s = time.perf_counter() - t0
        torch.save({**heads_state(heads), "fit_seconds": torch.tensor(fit_s)}, heads_file)
    t0 = time.perf_counter()
    chooser = ChooserConfig(floor=args.floor, count_gains=False, agreement=args.criterion == "agreement",
                            head_cost=args.head_cost)
    policy = choose_thresholds(exit_table(heads, val, bb), chooser, shape=exit_table(heads, calib, bb))
    choose_s = time.perf_counter() - t0
    mv = simulate(exit_table(heads, val, bb), policy)
    test_table = exit_table(heads, test, bb)
    mt = simulate(test_table, policy)

    print(f"  heads: {len(exits)} candidate exits, {spec}, label-free fit on {len(fit)} images: "
          f"{fit_s:.1f} s (incl. temperatures on {len(calib)} held-out); thresholds chosen in {choose_s:.1f} s "
          f"(val floor {args.floor:.0%} on {args.criterion}, head cost {args.head_cost:.1%} of the network)")
    used = ", ".join(f"{e}@{t:.4f}" for e, t in zip(policy.exits, policy.thresholds, strict=True))
    print(f"  exits used ({len(policy.exits)}): {used}")
    for name, m in (("val ", mv), ("TEST", mt)):
        print(f"  {name}: n={m.n} accuracy {m.accuracy:.2%} (float {m.base_accuracy:.2%}) retention {m.retention:.2%} "
              f"agreement {m.agreement:.2%} mean MACs {m.mean_macs / 1e6:.2f} M of {m.total_macs / 1e6:.2f} M "
              f"-> saving {m.saving:.1%}; leaving per exit (last = full network): {m.exit_counts}")

    net = EarlyExitNet(bb, heads, policy).eval()
    _, sim_pred, _ = assign_exits(test_table, policy)
    with torch.inference_mode():
        one = torch.cat([net(test_x[i : i + 1]) for i in range(len(test_x))]).argmax(1)
    mismatch = int((one != sim_pred).sum())
    print(f"  deployable module, batch 1, vs one-pass evaluator on test: {mismatch} of {len(test_x)} "
          "predictions differ")
    lat_float = _latency(wl.model, test_x, args.repeats, args.threads)
    lat_ee = _latency(net, test_x, args.repeats, args.threads)
    print(f"  batch-1 CPU latency over the {len(test_x)} test images ({args.threads} thread(s), median of "
          f"{args.repeats} passes): float {lat_float:.2f} ms, early exit {lat_ee:.2f} ms "
          f"({1 - lat_ee / lat_float:+.1%} saved)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="56,20")
    ap.add_argument("--train-jpeg", type=int, default=15000, help="JPEG training images added to the fitting set")
    ap.add_argument("--floor", type=float, default=0.99, help="val retention floor")
    ap.add_argument("--criterion", choices=("retention", "agreement"), default="retention",
                    help="what the val floor holds: retention (lost samples) or agreement with the model")
    ap.add_argument("--head-cost", type=float, default=0.0,
                    help="per-head overhead while choosing, as a share of the network's MACs (latency)")
    ap.add_argument("--l2", type=float, default=1e-2)
    ap.add_argument("--hidden", type=int, default=0, help="units of a hidden ReLU layer in each head (0: linear)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", default="/tmp/modelopt_early_exit_cache")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    for depth in (int(d) for d in args.models.split(",")):
        run(depth, args)


if __name__ == "__main__":
    main()
