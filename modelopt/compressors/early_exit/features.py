"""One backbone pass over a set of images, keeping each exit point's pooled features and the logits.

Fitting heads and choosing thresholds never rerun the backbone: they work on these features.
`read_images` decodes an `.npz` of exact pixels (`x`) or JPEG bytes (`jpeg`, `offsets`), and
`cached_features` stores one pass in a file so benchmarks and experiments reuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from modelopt._files import save_atomic
from modelopt.compressors.early_exit.backbone import Backbone
from modelopt.compressors.early_exit.heads import HeadSpec, pool_features
from modelopt.data.readers import read_npz
from modelopt.errors import LoadError
from modelopt.model.images import Images

__all__ = ["Features", "cached_features", "extract_features", "normalise", "read_images"]


@dataclass(frozen=True, eq=False)
class Features:
    """Pooled features at exit points and the full model's logits, for N images.

    Attributes:
        spec: The pooling the features were made with (heads may use a subset, see `select`).
        points: Exit point names, in backbone order.
        feats: One (N, spec.features(C)) float tensor per point.
        logits: (N, classes) logits of the full model.
        labels: (N,) int64 labels, or None when unknown.
    """

    spec: HeadSpec
    points: tuple[str, ...]
    feats: tuple[torch.Tensor, ...]
    logits: torch.Tensor
    labels: torch.Tensor | None

    def __len__(self) -> int:
        return int(self.logits.shape[0])

    def at(self, point: str) -> torch.Tensor:
        return self.feats[self.points.index(point)]

    def select(self, point: str, spec: HeadSpec) -> torch.Tensor:
        """The columns of `point`'s features that `spec` (a sub-set of this pooling) would give."""
        feats = self.at(point)
        channels = feats.shape[1] // sum(g * g for g in (*self.spec.avg_grids, *self.spec.max_grids))
        cols, start = [], 0
        for kind, grids in (("avg", self.spec.avg_grids), ("max", self.spec.max_grids)):
            for g in grids:
                width = channels * g * g
                if g in (spec.avg_grids if kind == "avg" else spec.max_grids):
                    cols.append((kind, g, start, start + width))
                start += width
        order = [c for kind in ("avg", "max") for g in getattr(spec, f"{kind}_grids")
                 for c in cols if c[0] == kind and c[1] == g]
        if len(order) != len(spec.avg_grids) + len(spec.max_grids):
            raise ValueError(f"features pooled with {self.spec} do not contain {spec}")
        return torch.cat([feats[:, a:b] for _, _, a, b in order], dim=1)

    def subset(self, index: torch.Tensor) -> Features:
        return Features(self.spec, self.points, tuple(f[index] for f in self.feats), self.logits[index],
                        None if self.labels is None else self.labels[index])


def read_images(path: str | Path, indices: Sequence[int] | np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """uint8 (N, H, W, 3) images and int64 labels from an `.npz` of pixels or of JPEG bytes.

    Args:
        path: The archive (see ../shared/data/README.md for the layouts).
        indices: Which images (all when None).

    Raises:
        LoadError: the archive is malformed, or `indices` name images it does not hold.

    Example:
        >>> x, y = read_images("../shared/data/cifar10/cifar10_jpeg_test.npz", range(846, 1846))
    """
    x, y, _ = read_npz(path, lambda n: np.arange(n) if indices is None else np.asarray(indices, dtype=np.int64))
    return x, y


def normalise(x: np.ndarray | torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 NHWC RGB -> float NCHW scaled to [0, 1] and normalised (as `Workload` prepares inputs)."""
    t = torch.as_tensor(x).permute(0, 3, 1, 2).float().div_(255)
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return ((t - m) / s).contiguous()


def extract_features(
    backbone: Backbone,
    x: torch.Tensor | Images,
    spec: HeadSpec | None = None,
    points: Sequence[str] | None = None,
    labels: torch.Tensor | None = None,
    *,
    batch_size: int = 256,
    flip: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Features:
    """Runs the backbone once over `x` (normalised NCHW) and pools every requested exit point.

    Args:
        backbone: The cut model.
        x: Inputs, already normalised.
        spec: Pooling to keep (heads fitted later may use any subset of its grids); `HeadSpec()` when None.
        points: Exit point names (all when None).
        labels: Labels to carry along.
        batch_size: Images per backbone call.
        flip: Mirror the images left-right first (a label-preserving augmentation).
        dtype: Storage type of the pooled features (float16 halves the memory of large sets).

    Example:
        >>> f = extract_features(split_backbone(model), wl.split("calib").x)
    """
    spec = spec or HeadSpec()
    names = tuple(p.name for p in backbone.points) if points is None else tuple(points)
    for n in names:
        backbone.point(n)
    want = {n: i for i, n in enumerate(names)}
    feats: list[list[torch.Tensor]] = [[] for _ in names]
    logits = []
    with torch.inference_mode():
        for i in range(0, x.shape[0], batch_size):
            h = x[i : i + batch_size]
            if flip:
                h = h.flip(3)
            h = backbone.stem(h)
            for name, block in backbone.blocks:
                h = block(h)
                if name in want:
                    feats[want[name]].append(pool_features(h, spec).to(dtype))
            logits.append(backbone.tail(h))
    return Features(spec, names, tuple(torch.cat(f) for f in feats), torch.cat(logits), labels)


def cached_features(path: str | Path, make: Callable[[], Features] | None) -> Features:
    """`make()` once, stored at `path` (torch.save of tensors and strings); later calls load the file
    with `weights_only=True` (`make` may then be None)."""
    path = Path(path)
    if path.exists():
        d = torch.load(path, weights_only=True)
        spec = HeadSpec(tuple(d["avg_grids"].tolist()), tuple(d["max_grids"].tolist()))
        points = tuple(d["points"].split(","))
        labels = d["labels"] if d["labels"].numel() else None
        return Features(spec, points, tuple(d[f"f:{p}"] for p in points), d["logits"], labels)
    if make is None:
        raise LoadError(f"no cached features at {str(path)!r} and nothing to make them with")
    f = make()
    d = {f"f:{p}": t for p, t in zip(f.points, f.feats, strict=True)}
    d.update(avg_grids=torch.tensor(f.spec.avg_grids), max_grids=torch.tensor(f.spec.max_grids),
             points=",".join(f.points), logits=f.logits,
             labels=f.labels if f.labels is not None else torch.empty(0, dtype=torch.int64))
    path.parent.mkdir(parents=True, exist_ok=True)
    # Atomic: a killed pass leaves no half file that a later call would load. Not fsynced: a cache.
    save_atomic(path, lambda buf: torch.save(d, buf), durable=False)
    return f
