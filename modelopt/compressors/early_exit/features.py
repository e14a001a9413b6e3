"""One backbone pass over a set of images, keeping each exit point's pooled features and the logits.

Fitting heads never reruns the backbone: it works on these features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from modelopt.compressors.early_exit.heads import HeadSpec, pool_features
from modelopt.model.backbone import Backbone
from modelopt.model.images import Images

__all__ = ["Features", "extract_features"]


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
