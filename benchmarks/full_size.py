"""What a 224-pixel model costs the tool: seconds per trial, preparation seconds and peak resident memory, beside
the model's bare forward pass over the same images, at 1,000 and 8,000 images.

The images are CIFAR-10's JPEG test images scaled up to 224x224 (bicubic) and written as JPEG files in class
folders, once, under `--cache`. Models come from torchvision with random weights (their heads sized to the 10
classes); nothing here reads accuracy. Each (model, image count) runs in a fresh process, so its peak resident
memory (ru_maxrss) is its own:

- build: decoding the folder and the float model's predictions on every split (`Workload`);
- forward: the bare float model over the val images, batch by batch as the scorer feeds it;
- prep: GPTQ's second moments (256 calibration images, every layer's inputs) and INT4 GPTQ weights for every layer;
- trial: one trial as the search scores it, uniform INT8 per-channel weights on the val split (weights built, then
  the val pass).

    python benchmarks/full_size.py                                      # all four models, 1,000 and 8,000 images
    python benchmarks/full_size.py --models resnet18 --images 1000,8000 --device cuda
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

SHARED = Path(__file__).resolve().parents[2] / "shared"
JPEG_TEST = SHARED / "data" / "cifar10" / "cifar10_jpeg_test.npz"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def make_folder(root: Path, n: int, size: int = 224) -> Path:
    """`n` CIFAR-10 JPEG test images (a seeded sample) scaled to `size` pixels, as root/<class>/<i>.jpg (kept once
    written)."""
    done = root / f".done-{n}-{size}"
    if done.exists():
        return root
    with np.load(JPEG_TEST) as f:
        data, offsets, labels = f["jpeg"], f["offsets"], f["y"]
    for c in CLASSES:
        (root / c).mkdir(parents=True, exist_ok=True)
    # The file is sorted by class: a seeded sample of it, so any prefix holds every class.
    for i in np.random.default_rng(0).permutation(len(labels))[:n]:
        im = Image.open(io.BytesIO(data[offsets[i] : offsets[i + 1]].tobytes())).convert("RGB")
        im.resize((size, size), Image.Resampling.BICUBIC).save(root / CLASSES[labels[i]] / f"{i:05d}.jpg", quality=90)
    done.touch()
    return root


def measure(model_name: str, folder: Path, images: int, device: str) -> dict[str, float | int | str]:
    """One model on `images` images of `folder`: the figures the table prints."""
    from modelopt.api import build_compressors
    from modelopt.data.dataset import load_data
    from modelopt.evaluation.evaluator import Evaluator
    from modelopt.model.loader import load_model
    from modelopt.model.workload import Workload
    from modelopt.plan.space import SearchSpace

    torch.manual_seed(0)
    t0 = time.perf_counter()
    wl = Workload(load_model(f"torchvision:{model_name}"), load_data(folder, max_samples=images), device=device)
    build = time.perf_counter() - t0
    val = wl.split("val")
    t0 = time.perf_counter()
    wl.logits(val.x)
    forward = time.perf_counter() - t0
    comps = build_compressors(["quantize"], {"quantize": {"bits": [8, 4], "rounding": ["gptq"], "norm_images": 0}})
    ev = Evaluator(wl, SearchSpace(wl.layers, comps))
    int4 = ev.space.parse_plan({"default": {"quantize": {"bits": 4, "granularity": "per_channel"}}})
    t0 = time.perf_counter()
    ev.states.compressed_state(int4)
    prep = time.perf_counter() - t0
    int8 = ev.space.parse_plan({"default": {"quantize": {"bits": 8, "granularity": "per_channel",
                                                         "rounding": "nearest"}}})
    t0 = time.perf_counter()
    ev.scorer.evaluate(int8, "val")
    trial = time.perf_counter() - t0
    widest = max(layer.fan_in for layer in wl.layers)
    return {"model": model_name, "images": images, "val": len(val), "device": str(wl.device),
            "build_s": build, "forward_s": forward, "prep_s": prep, "trial_s": trial, "widest": widest,
            "streamed": not val.x.resident,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,vit_b_16")
    ap.add_argument("--images", default="1000,8000", help="image counts, comma-separated")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "modelopt-full-size"),
                    help="where the 224-pixel folder is written once")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "IMAGES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    counts = [int(n) for n in args.images.split(",")]
    folder = make_folder(Path(args.cache), max(counts))
    if args.one:
        print(json.dumps(measure(args.one[0], folder, int(args.one[1]), args.device)))
        return
    print(f"{'model':<14} {'images':>6} {'val':>5} {'build s':>8} {'forward s':>9} {'prep s':>7} {'trial s':>8} "
          f"{'trial/fwd':>9} {'peak MB':>8}  device, widest layer input")
    for name in args.models.split(","):
        peaks = []
        for n in counts:
            run = subprocess.run([sys.executable, __file__, "--one", name, str(n), "--device", args.device,
                                  "--cache", args.cache, "--images", args.images],
                                 capture_output=True, text=True, check=False)
            if run.returncode != 0:
                print(f"{name:<14} {n:>6}  failed: {run.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            peaks.append(r["peak_mb"])
            print(f"{name:<14} {n:>6} {r['val']:>5} {r['build_s']:>8.1f} {r['forward_s']:>9.1f} {r['prep_s']:>7.1f} "
                  f"{r['trial_s']:>8.1f} {r['trial_s'] / r['forward_s']:>9.2f} {r['peak_mb']:>8.0f}  {r['device']}, "
                  f"{r['widest']}{', streamed' if r['streamed'] else ''}", flush=True)
        if len(peaks) == 2:
            print(f"{name:<14} peak at {counts[1]:,} / at {counts[0]:,} images: {peaks[1] / peaks[0]:.2f}x")


if __name__ == "__main__":
    main()
