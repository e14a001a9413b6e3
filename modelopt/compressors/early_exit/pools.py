"""Which images heads may be fitted and calibrated on without touching the val/test sample, and the
extra images (`EarlyExit(exit_data=...)`) they are fitted on.

The JPEG copy of the CIFAR-10 test set (../shared/data) holds the exact-pixel test images too,
re-encoded and in another order; fitting or calibrating on those would leak val/test images.
`heldout_indices` finds each exact image's JPEG copy (nearest neighbour in pixel space among
images of the same label) and returns the others: test-set images the model never trained on
and the val/test splits do not contain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from modelopt.compressors.early_exit.features import read_images
from modelopt.data.readers import read_npz
from modelopt.errors import ConfigError, LoadError
from modelopt.model.workload import Workload

__all__ = ["heldout_indices", "load_exit_images"]


def load_exit_images(wl: Workload, path: str | Path, n: int = 10000, seed: int = 0) -> torch.Tensor:
    """A seeded subset of `n` images from an `.npz` (pixels or JPEG bytes), normalised for `wl`'s
    model: extra unlabeled images that early-exit heads are fitted on. They must be images the
    search never scores (e.g. the training set), never the val or test images.

    Example:
        >>> x = load_exit_images(wl, "../shared/data/cifar10/cifar10_jpeg_train.npz", 10000)
    """
    p = Path(path)
    if not p.is_file():
        raise LoadError(f"exit data {str(p)!r} is not a file; pass an .npz of images such as "
                        "../shared/data/cifar10/cifar10_jpeg_train.npz")
    if str(wl.data.source) in (str(path), str(p.resolve())):
        raise ConfigError(f"exit data {str(p)!r} is the data the search scores; fitting heads on val or test "
                          "images would leak them: pass other images (e.g. the training set)")
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"exit_images must be a positive number of images, got {n!r}")
    x, _, _ = read_npz(p, lambda total: np.sort(np.random.default_rng(seed).permutation(total)[: min(n, total)]))
    return wl.prepare(torch.from_numpy(x))


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
