"""The extra unlabeled images (`EarlyExit(exit_data=...)`) heads are fitted on besides the calib split.

Never the images the search scores: heads fitted on val or test images would leak them into the scores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from modelopt.data.readers import read_npz
from modelopt.errors import ConfigError, LoadError
from modelopt.model.workload import Workload

__all__ = ["load_exit_images"]


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
