"""A run's parts from names and options: its compressors and the tool's defaults for them, and the
extra images early-exit heads are fitted on. `modelopt.config.run_config.RunConfig` builds runs from these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modelopt.compressors import COMPRESSORS, Compressor
from modelopt.data.readers import read_npz
from modelopt.errors import ConfigError, LoadError
from modelopt.model.workload import Workload

# Full val evaluations a run may spend when the user does not say: 100 keeps the default run (2,000 JPEG val
# images, 7,154 to confirm) under three minutes on 2 CPU cores; more budget can still pay (--budget).
DEFAULT_BUDGET = 100.0
# How the quantizer picks codes when the user does not say: GPTQ (calibrated, error feedback).
# Measured on ResNet-20, bundled sample, test split: uniform INT3 per-channel 78.6 % retention
# nearest, 100.8 % GPTQ; INT2 group-64 36.9 % / 92.0 % (modelopt.compressors.gptq).
DEFAULT_ROUNDING: tuple[str, ...] = ("gptq",)
# Batch-norm statistics re-estimated on this many calib images for plans with a layer at 4 bits or
# fewer (`Quantize(norm_images=...)`): INT2 group-64 confirm agreement 88.5 -> 94.9 % (GPTQ).
DEFAULT_NORM_IMAGES = 64
# INT3 is offered by default: with GPTQ, uniform INT3 per channel keeps 99.8 % of ResNet-56's accuracy on
# 4,000 JPEG test images (94 % agreement), and the plans that beat uniform INT4 mix it in.
DEFAULT_BITS: tuple[int, ...] = (8, 4, 3)
DEFAULT_GRANULARITY: tuple[str, ...] = ("per_channel", "group")


def default_options() -> dict[str, dict[str, Any]]:
    """The tool's compressor options where the user gives none (the classes' own defaults are the
    older behaviour, so run records written before a default changed rebuild as they ran)."""
    return {"quantize": {"bits": list(DEFAULT_BITS), "granularity": list(DEFAULT_GRANULARITY),
                         "rounding": list(DEFAULT_ROUNDING), "norm_images": DEFAULT_NORM_IMAGES}}


def default_compressors(objective: str = "size", model: nn.Module | None = None) -> list[str]:
    """The registered compressors that can lower `objective` (and, given a model, can handle it).

    Example:
        >>> default_compressors("size"), default_compressors("macs")
        (['prune', 'quantize'], ['early_exit', 'prune'])
    """
    names = []
    for name in COMPRESSORS.names():
        cls = COMPRESSORS.get(name)
        if objective not in cls.reduces:
            continue
        if model is not None:
            try:
                cls.model_options(model)
            except ConfigError:
                continue  # e.g. early exit on a model it cannot cut into blocks
        names.append(name)
    return names


def build_compressors(
    names: Sequence[str] | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
    model: nn.Module | None = None,
) -> list[Compressor]:
    """Instantiates compressors by registry name with per-compressor options.

    Args:
        names: Registry names; None: quantize alone.
        options: Per-compressor constructor options; None: the tool's defaults (`default_options`).
            Saved run records pass theirs: a record without `rounding` predates it and means
            nearest, the class default.
        model: The model they will compress: options a compressor derives from it
            (`Compressor.model_options`, e.g. early exit's candidate exits) fill in what
            `options` leaves out.
    """
    if options is None:
        options = default_options()
    for name in options:
        COMPRESSORS.get(name)
    out = []
    for n in ("quantize",) if names is None else names:
        cls = COMPRESSORS.get(n)
        derived = cls.model_options(model) if model is not None else {}
        out.append(cls(**{**derived, **dict(options.get(n, {}))}))
    return out


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
