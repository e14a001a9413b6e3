"""Early exit's options record (`modelopt.compressors.early_exit.compressor.EarlyExit` takes it): one default each.

Where exits may sit depends on the model: `exits`, `blocks` and `classes` left None are derived from it when the
run has one (`EarlyExit.model_options`), else every convolution ends a block of a 10-class model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from modelopt.compressors._options import Options, option
from modelopt.compressors._surface import SettingKind
from modelopt.errors import ConfigError

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

    @property
    def exit_patterns(self) -> tuple[str, ...]:
        """The layers exits may follow: `exits`, or every convolution (``*``) when None."""
        return ("*",) if self.exits is None else self.exits

    def check(self) -> None:
        for check in _CHECKS:
            check(self)


def threshold_error(value: object) -> str | None:
    """Why `value` is not a confidence threshold (a number in (0, 1]); None when it is one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 < value <= 1.0
                                                                              and math.isfinite(value)):
        return f"early_exit threshold must be a number in (0, 1]; got {value!r}"
    return None


def _check_thresholds(o: EarlyExitOptions) -> None:
    if not o.thresholds:
        raise ConfigError("early_exit needs at least one threshold")
    for t in o.thresholds:
        if (why := threshold_error(t)) is not None:
            raise ConfigError(why)


def _check_blocks(o: EarlyExitOptions) -> None:
    exits, blocks = o.exit_patterns, o.blocks
    if blocks is not None and (len(blocks) != len(exits) or not all(isinstance(b, str) for b in blocks)):
        raise ConfigError(f"early_exit: blocks must name one block per exit ({len(exits)}); got {blocks!r}")


def _check_classes(o: EarlyExitOptions) -> None:
    if o.classes is not None and (not isinstance(o.classes, int) or isinstance(o.classes, bool) or o.classes < 1):
        raise ConfigError(f"early_exit: classes must be a positive integer, got {o.classes!r}")


def _check_exit_data(o: EarlyExitOptions) -> None:
    if o.exit_data is not None and (not isinstance(o.exit_data, str) or not o.exit_data):
        raise ConfigError(f"early_exit: exit_data must be the path of an .npz of images, got {o.exit_data!r}")
    if not isinstance(o.exit_images, int) or isinstance(o.exit_images, bool) or o.exit_images < 1:
        raise ConfigError(f"exit_images must be a positive number of images, got {o.exit_images!r}")


_CHECKS: tuple[Callable[[EarlyExitOptions], None], ...] = (_check_thresholds, _check_blocks, _check_classes,
                                                          _check_exit_data)
