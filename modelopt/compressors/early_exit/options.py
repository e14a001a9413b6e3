"""Early exit's options record (`modelopt.compressors.early_exit.compressor.EarlyExit` takes it): one default each.

Where exits may sit depends on the model: `exits`, `blocks` and `classes` left None are derived from it when the
run has one (`EarlyExit.model_options`), else every convolution ends a block of a 10-class model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from modelopt.compressors._options import Options, option
from modelopt.compressors._surface import SettingKind

__all__ = ["DEFAULT_THRESHOLDS", "EarlyExitOptions"]

# Confidence (max softmax of the temperature-scaled head) a sample needs to leave at an exit.
DEFAULT_THRESHOLDS = (0.8, 0.9, 0.95, 0.98, 0.99, 0.995)


@dataclass(frozen=True)
class EarlyExitOptions(Options):
    """Where `EarlyExit` offers exits, at which thresholds, and what else its heads are fitted on (see `EarlyExit`)."""

    version: ClassVar[int] = 1

    thresholds: tuple[float, ...] = option(DEFAULT_THRESHOLDS)
    exits: tuple[str, ...] | None = option(None)  # None: the model's block ends, else ("*",): every conv
    blocks: tuple[str, ...] | None = option(None)  # None: the model's, else each exit's name without its last part
    classes: int | None = option(None)  # None: the model's, else 10
    exit_data: str | None = option(None, SettingKind.PATH, "An .npz of images the search never scores (e.g. "
                                   "../shared/data/cifar10/cifar10_jpeg_train.npz): early-exit heads are also "
                                   "fitted on them.")
    exit_images: int = option(10000, SettingKind.INT, "How many --exit-data images (a seeded subset; default "
                              "10000).")
