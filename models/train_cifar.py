"""Trains the zoo's non-ResNet CIFAR-10 models on the 50,000 CIFAR-10 training images (the JPEG copies in
../shared/data/cifar10/cifar10_jpeg_train.npz) and writes their weights and how they were made.

    python models/train_cifar.py cifar10_mobilenetv2 --epochs 10
    python models/train_cifar.py cifar10_vit --epochs 4

Each run writes models/<name>.pt (a state dict under `state_dict`, with `accuracy`, `epochs`, `seed`, `recipe`)
and prints its top-1 on the 10,000 JPEG test images and on the 846 exact-pixel test images. Inputs are scaled
to [0, 1] and normalised with the zoo's mean and std (`modelopt.zoo.cifar_mobile`), as every modelopt workload
feeds them. Augmentation: random crop with 4-pixel padding and horizontal flips. MobileNetV2: SGD (Nesterov,
momentum 0.9, weight decay 5e-4 on weights, none on norms and biases), one-cycle learning rate up to 0.2, label
smoothing 0.1. ViT: AdamW (weight decay 0.05 on matrices), one-cycle up to 2e-3, label smoothing 0.1. Batch 128,
seed 0, 2 CPU threads (the figures in models/README.md were made so).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.nn import functional as F

from modelopt.zoo import MODELS

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10"
HERE = Path(__file__).resolve().parent


def _decode(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(N, 32, 32, 3) uint8 images and labels from a pixel or a JPEG `.npz`."""
    z = np.load(path)
    if "x" in z:
        return z["x"], z["y"]
    jpeg, off = z["jpeg"], z["offsets"]
    x = np.stack([np.asarray(Image.open(io.BytesIO(jpeg[off[i]:off[i + 1]].tobytes())).convert("RGB"))
                  for i in range(len(off) - 1)])
    return x, z["y"]


def _normalise(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (x.permute(0, 3, 1, 2).float() / 255.0 - mean) / std


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random 32x32 crops of the 4-pixel zero-padded images, half of them mirrored (NHWC uint8)."""
    n = x.shape[0]
    padded = F.pad(x.permute(0, 3, 1, 2), (4, 4, 4, 4))
    dx, dy = torch.randint(0, 9, (n,), generator=gen), torch.randint(0, 9, (n,), generator=gen)
    rows = (dy[:, None] + torch.arange(32))[:, :, None]
    cols = (dx[:, None] + torch.arange(32))[:, None, :]
    out = padded[torch.arange(n)[:, None, None], :, rows, cols]  # advanced indices first: N, 32, 32, C
    flip = torch.rand(n, generator=gen) < 0.5
    out[flip] = out[flip].flip(2)
    return out


def _groups(model: nn.Module, decay: float) -> list[dict[str, object]]:
    """Weight decay on weight matrices and kernels only (not norms, biases, embeddings' positions)."""
    on, off = [], []
    for name, p in model.named_parameters():
        (on if p.dim() > 1 and "pos_embedding" not in name and "class_token" not in name else off).append(p)
    return [{"params": on, "weight_decay": decay}, {"params": off, "weight_decay": 0.0}]


def _accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, mean: torch.Tensor, std: torch.Tensor) -> float:
    model.eval()
    right = 0
    with torch.inference_mode():
        for i in range(0, len(x), 500):
            logits = model(_normalise(torch.from_numpy(x[i:i + 500]), mean, std))
            right += int((logits.argmax(1).numpy() == y[i:i + 500]).sum())
    return right / len(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=["cifar10_mobilenetv2", "cifar10_vit"])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    entry = MODELS.get(args.name)
    mean, std = torch.tensor(entry.mean).view(1, 3, 1, 1), torch.tensor(entry.std).view(1, 3, 1, 1)
    x, y = _decode(SHARED / "cifar10_jpeg_train.npz")
    xt, yt = _decode(SHARED / "cifar10_jpeg_test.npz")
    xe, ye = _decode(SHARED / "cifar10_exact_test.npz")
    model = entry.factory()
    vit = args.name == "cifar10_vit"
    peak = 2e-3 if vit else 0.2
    optim = (torch.optim.AdamW(_groups(model, 0.05), lr=peak, betas=(0.9, 0.999)) if vit else
             torch.optim.SGD(_groups(model, 5e-4), lr=peak, momentum=0.9, nesterov=True))
    steps = args.epochs * (len(x) // 128)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=peak, total_steps=steps, pct_start=0.15)
    gen = torch.Generator().manual_seed(args.seed)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y).long()
    t0 = time.time()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for b in range(len(x) // 128):
            idx = order[b * 128:(b + 1) * 128]
            inputs = _normalise(_augment(xs[idx], gen), mean, std)
            loss = F.cross_entropy(model(inputs), ys[idx], label_smoothing=0.1)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            sched.step()
            total += loss.item()
        print(f"epoch {epoch + 1}/{args.epochs}: loss {total / (len(x) // 128):.3f}, {time.time() - t0:.0f} s",
              flush=True)
    jpeg, exact = _accuracy(model, xt, yt, mean, std), _accuracy(model, xe, ye, mean, std)
    recipe = {"epochs": args.epochs, "seed": args.seed, "batch": 128, "optimizer": "AdamW" if vit else "SGD",
              "peak_lr": peak, "schedule": "one-cycle", "label_smoothing": 0.1, "seconds": round(time.time() - t0)}
    out = HERE / f"{args.name}.pt"
    torch.save({"state_dict": model.state_dict(), "accuracy": {"jpeg_test": jpeg, "exact_test": exact},
                "recipe": recipe}, out)
    print(json.dumps({"model": args.name, "jpeg_test": jpeg, "exact_test": exact, **recipe}))


if __name__ == "__main__":
    main()
