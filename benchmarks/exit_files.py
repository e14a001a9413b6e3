"""What the early-exit benchmarks read and write: image archives, the held-out JPEG pool, cached
backbone features and saved heads (benchmarks/early_exit.py, benchmarks/agreement_pools.py).

The JPEG copy of the CIFAR-10 test set (../shared/data) holds the exact-pixel test images too,
re-encoded and in another order; fitting or calibrating on those would leak val/test images.
`heldout_indices` finds each exact image's JPEG copy (nearest neighbour in pixel space among
images of the same label) and returns the others: test-set images the model never trained on
and the val/test splits do not contain.

Features and heads are stored as tensors and strings only, so they load back with
`torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from modelopt._files import save_atomic
from modelopt.compressors.early_exit.features import Features
from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec
from modelopt.compressors.early_exit.policy import ExitPolicy
from modelopt.data.readers import read_npz
from modelopt.errors import LoadError

__all__ = ["cached_features", "heads_state", "heldout_indices", "load_early_exit", "normalise", "read_images"]


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


def heldout_indices(exact: str | Path, pool: str | Path) -> np.ndarray:
    """Indices of the images of `pool` that are not copies of any image of `exact`.

    Args:
        exact: `.npz` of the images to keep out (e.g. the exact test sample that val/test come from).
        pool: `.npz` of candidate images (e.g. the JPEG test set), pixels or JPEG bytes.

    Returns:
        Sorted int64 indices into `pool`.

    Example:
        >>> held = heldout_indices("cifar10_exact_test.npz", "cifar10_jpeg_test.npz")
        >>> len(held)
        9154
    """
    xe, ye = read_images(exact)
    xp, yp = read_images(pool)
    a = xe.reshape(len(xe), -1).astype(np.float32)
    b = xp.reshape(len(xp), -1).astype(np.float32)
    b2 = (b**2).sum(1)
    taken = set()
    for i in range(len(a)):
        same = np.flatnonzero(yp == ye[i])
        d = b2[same] - 2 * b[same] @ a[i]
        taken.add(int(same[int(np.argmin(d))]))
    return np.setdiff1d(np.arange(len(yp)), np.fromiter(taken, dtype=np.int64))


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


def heads_state(heads: Mapping[str, ExitHead], policy: ExitPolicy | None = None) -> dict[str, object]:
    """Heads (and optionally the policy) as tensors and strings only, for `torch.save`.

    Example:
        >>> torch.save(heads_state(heads, policy), "exits.pt")
        >>> heads, policy = load_early_exit("exits.pt")
    """
    out: dict[str, object] = {"version": 1, "exits": ",".join(heads)}
    for name, head in heads.items():
        for k, t in head.state_dict().items():
            out[f"{name}/{k}"] = t
    if policy is not None:
        out["policy_exits"] = ",".join(policy.exits)
        out["policy_thresholds"] = torch.tensor(policy.thresholds, dtype=torch.float64)
    return out


def load_early_exit(path: str | Path) -> tuple[dict[str, ExitHead], ExitPolicy | None]:
    """Reads what `heads_state` saved, with `torch.load(weights_only=True)`."""
    d = torch.load(path, weights_only=True)
    heads = {}
    for name in filter(None, str(d["exits"]).split(",")):
        heads[name] = ExitHead.from_state_dict({k.split("/", 1)[1]: v for k, v in d.items()
                                                if k.startswith(name + "/")})
    policy = None
    if "policy_exits" in d:
        exits = tuple(filter(None, str(d["policy_exits"]).split(",")))
        policy = ExitPolicy(exits, tuple(float(t) for t in d["policy_thresholds"]))
    return heads, policy
