"""Data sources and the calib/val/test split.

`load_data` turns whatever the user has (the bundled CIFAR-10 sample, an `.npz`, a torchvision
CIFAR10 root, an image folder, a `DataLoader`) into a frozen `Dataset` of three splits:
`calib` feeds calibration and fitting (activation ranges, exit heads), `val` scores trials
during the search, `confirm` re-scores the search's finalists (the images that select a plan are
not the ones that vouch for it), `test` is held out for the final report. Each split is in seeded shuffled
order, so any prefix of it is a random sample (the evaluator's low-fidelity runs use prefixes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch
from torch.utils.data import DataLoader

from modelopt._registry import Registry
from modelopt.data.preprocess import Preprocess
from modelopt.data.readers import (
    NpzArchive,
    _check_labels,
    _permutation,
    _read_cifar_batch,
    _read_image_folder,
    _read_loader,
    _read_npz,
    _subset,
    class_folders,
    read_unlabeled,
)
from modelopt.data.split import Split, check_split
from modelopt.errors import ConfigError, LoadError

__all__ = ["SPLIT_NAMES", "Dataset", "SplitArrays", "list_data_sources", "load_data", "peek_num_classes"]


SPLIT_NAMES = tuple(Split)
DEFAULT_VAL_FRACTION = 0.2
DEFAULT_CONFIRM_FRACTION = 0.2
# With unlabeled images for calibration every labeled image is evidence: val 20 %, confirm 50 % (the claim is
# certified there alone), test 30 % (what each certifies and measures: docs/models-and-data.md#measured).
UNLABELED_FRACTIONS = (0.0, 0.20, 0.50)
UNLABELED_IMAGES = 2000  # calibration images kept from `unlabeled` (GPTQ reads 256, batch norms 512)
MIN_UNLABELED = 256  # GPTQ's second moments and the one-pass sensitivities read this many


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no truth value; identity hash is what caches want
class SplitArrays:
    """One part of a dataset.

    Attributes:
        name: which split (`Split`).
        x: uint8 (N, H, W, 3) RGB images, or float (N, C, H, W) already preprocessed.
        y: int64 (N,) labels.
        index: int64 (N,) position of each sample in its source pool (the file, folder or
            loader; for the bundled sample, the calib pool is the training images and the
            val/test pool the test images), or None when unknown.
    """

    name: str
    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"split {self.name!r}: {len(self.x)} inputs but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True, eq=False)
class Dataset:
    """A data source cut into calib / val / test splits.

    Attributes:
        source: What the user passed, for reports.
        calib: Calibration / fitting data.
        val: Scores trials during the search.
        test: Held out for the final report.
        confirm: Re-scores the search's finalists before any claim (None: the source has none;
            the run then reports its best plan as unconfirmed).
        preprocessed: True when x is float NCHW already preprocessed (a user DataLoader);
            otherwise x is uint8 NHWC RGB.
        num_classes: Max label + 1 over all splits.
        seed: The seed that chose the split.
    """

    source: str
    calib: SplitArrays
    val: SplitArrays
    test: SplitArrays
    preprocessed: bool
    num_classes: int
    seed: int
    confirm: SplitArrays | None = None

    def split(self, name: str) -> SplitArrays:
        """Return a split by name.

        Args:
            name: a `Split` (or its name); ALL is val and test together, in source order.

        Returns:
            The split.

        Raises:
            ConfigError: `name` is not one of `SPLIT_NAMES`, or is CONFIRM and the dataset has none.

        Example:
            >>> load_data().split("all").x.shape
            torch.Size([846, 32, 32, 3])
        """
        name = check_split(name)
        if name is Split.CONFIRM and self.confirm is None:
            raise ConfigError(f"data {self.source!r} has no confirm split; load it with confirm_fraction > 0")
        if name is not Split.ALL:
            return getattr(self, name)
        x = torch.cat([self.val.x, self.test.x])
        y = torch.cat([self.val.y, self.test.y])
        if self.val.index is None or self.test.index is None:
            return SplitArrays(Split.ALL, x, y)
        index = torch.cat([self.val.index, self.test.index])
        order = torch.argsort(index)
        return SplitArrays(Split.ALL, x[order], y[order], index[order])


SourceLoader = Callable[..., Dataset]
SOURCES: Registry[SourceLoader] = Registry("data source")


def list_data_sources() -> list[str]:
    """Names `load_data` accepts besides paths and DataLoaders.

    Returns:
        Sorted names, e.g. ["cifar10-sample"].

    Example:
        >>> list_data_sources()
        ['cifar10-sample']
    """
    return SOURCES.names()


def load_data(
    source: str | Path | DataLoader = "cifar10-sample",
    *,
    seed: int = 0,
    calib_fraction: float = 0.2,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    confirm_fraction: float = DEFAULT_CONFIRM_FRACTION,
    max_samples: int | None = None,
    unlabeled: str | Path | DataLoader | None = None,
    preprocess: Preprocess | None = None,
) -> Dataset:
    """Load a data source and split it into calib / val / test by a seeded permutation.

    Sources: a name from `list_data_sources()`; an `.npz` with `x` (N, H, W, 3) uint8 and
    `y`, or with `jpeg`, `offsets`, `y` (JPEG bytes end to end); a torchvision CIFAR10 root
    (a folder holding `cifar-10-batches-py/`; its test batch is used, read with a
    restricted unpickler that accepts only the arrays, lists and dicts the official
    files contain); an image folder `root/<class>/*.png|jpg|jpeg|bmp` (classes sorted,
    labels 0..K-1); a `DataLoader` yielding already-preprocessed (x, y) float batches.

    Args:
        source: The data source.
        seed: Chooses the subset and the split; the same seed always gives the same split.
        calib_fraction: Share of the samples for calib. For "cifar10-sample" calib is the
            bundled 1,000 training images and this only matters with `max_samples`.
        val_fraction: Share for val (scored by the search).
        confirm_fraction: Share for confirm (re-scores the search's finalists); test gets the
            rest. For "cifar10-sample" the 846 test images are cut val : confirm : test in the
            ratio val_fraction : confirm_fraction : (1 - all three); with the default fractions
            its test images are cut 423 val / 423 test and it confirms on its own 1,000
            training images that the search never scores (see `modelopt.zoo.make_sample`).
        max_samples: If given, first keep a seeded subset of this many samples in total
            (only those are decoded).
        unlabeled: Images without labels for calib (an `.npz` of `x` or of `jpeg` and `offsets`, an
            image folder at any depth, or a DataLoader; labels in them are ignored): a seeded subset
            of `UNLABELED_IMAGES` of them becomes the calib split, and the labeled images are cut
            val / confirm / test only (20 / 50 / 30 % unless the fractions are given).
        preprocess: each decoded image (labelled or not) resized and centre-cropped (`Preprocess`).

    Returns:
        The split dataset.

    Raises:
        LoadError: The path does not exist or its content is malformed.
        UnknownNameError: `source` looks like a name but is not a known one.
        ConfigError: Bad fractions, or too few samples for non-empty splits.

    Example:
        >>> data = load_data("cifar10-sample", seed=0)
        >>> len(data.calib), len(data.val), len(data.confirm), len(data.test)
        (1000, 423, 1000, 423)
    """
    _check_options(seed, calib_fraction, val_fraction, confirm_fraction, max_samples)
    if unlabeled is not None:
        calib_x, pre = read_unlabeled(unlabeled, UNLABELED_IMAGES, seed, preprocess)
        named = isinstance(source, str) and source in SOURCES  # a named source keeps its own cut
        if not named and (calib_fraction, val_fraction, confirm_fraction) == (0.2, DEFAULT_VAL_FRACTION,
                                                                                 DEFAULT_CONFIRM_FRACTION):
            calib_fraction, val_fraction, confirm_fraction = UNLABELED_FRACTIONS
        labeled = load_data(source, seed=seed, calib_fraction=calib_fraction, val_fraction=val_fraction,
                            confirm_fraction=confirm_fraction, max_samples=max_samples, preprocess=preprocess)
        return _with_calib(labeled, calib_x, pre, unlabeled)
    opts = _SplitOptions(seed=seed, calib_fraction=calib_fraction, val_fraction=val_fraction,
                         confirm_fraction=confirm_fraction)
    if isinstance(source, DataLoader):
        if preprocess is not None and preprocess.active:
            raise ConfigError("--resize and --crop apply to decoded images; resize a DataLoader's in its transforms")
        x, y = _read_loader(source)
        keep = torch.from_numpy(_subset(len(y), max_samples, seed))
        name = f"DataLoader({type(source.dataset).__name__})"
        return _split_pool(name, x[keep], y[keep], keep, preprocessed=True, **opts)
    if not isinstance(source, (str, Path)):
        raise ConfigError(
            f"data source must be a path, a DataLoader or one of {list_data_sources()}; "
            f"got {type(source).__name__}"
        )
    if isinstance(source, str) and source in SOURCES:
        return _preprocessed(SOURCES.get(source)(max_samples=max_samples, **opts), preprocess)
    return _load_path(source, max_samples, opts, preprocess)


def peek_num_classes(source: object) -> int | None:
    """The `num_classes` `load_data(source)` would give, where it is cheap to read without decoding an image: an
    `.npz`'s labels array alone, an image folder's class folders (the last holding images); None for other
    sources (named, a CIFAR10 root, a DataLoader: reading them is their loading). A malformed source raises the
    LoadError `load_data` would.

    Example:
        >>> peek_num_classes("../shared/data/cifar10/cifar10_jpeg_test.npz")
        10
    """
    if isinstance(source, Dataset):
        return source.num_classes
    if not isinstance(source, (str, Path)) or (isinstance(source, str) and source in SOURCES):
        return None
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() == ".npz":
        with NpzArchive(path) as f:
            if "y" not in f.files:
                return None
            return int(_check_labels(f["y"], None, repr(str(path))).max()) + 1
    if path.is_dir() and not ((path / "cifar-10-batches-py").is_dir() or path.name == "cifar-10-batches-py"):
        return max(label for label, (_, files) in enumerate(class_folders(path)) if files) + 1
    return None


def _preprocessed(data: Dataset, preprocess: Preprocess | None) -> Dataset:
    """`data` with every split's images resized and cropped (`preprocess`; None: as they are)."""
    if preprocess is None or not preprocess.active:
        return data
    parts = {name: sp for name in (Split.CALIB, Split.VAL, Split.TEST, Split.CONFIRM)
             if (sp := getattr(data, name)) is not None}
    preprocess.check_memory(sum(map(len, parts.values())), repr(data.source))  # all of them, before one is resized
    splits = {name: dataclasses.replace(sp, x=torch.from_numpy(preprocess.apply_all(sp.x.numpy())))
              for name, sp in parts.items()}
    return dataclasses.replace(data, **splits)


class _SplitOptions(TypedDict):
    seed: int
    calib_fraction: float
    val_fraction: float
    confirm_fraction: float


def _load_path(source: str | Path, max_samples: int | None, opts: _SplitOptions,
               preprocess: Preprocess | None = None) -> Dataset:
    """An .npz file, a torchvision CIFAR10 root or an image folder, split."""
    path = Path(source).expanduser()
    seed = opts["seed"]
    if not path.exists():
        if isinstance(source, str) and "/" not in source and "\\" not in source and not path.suffix:
            SOURCES.get(source)  # raises UnknownNameError listing the named sources
        raise LoadError(
            f"data source path {str(path)!r} does not exist; pass an .npz file, an image "
            f"folder, a CIFAR10 root, or one of {list_data_sources()}"
        )
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise LoadError(f"data source file {str(path)!r} is not an .npz; pass an .npz or a folder")
        x, y, keep = _read_npz(path, max_samples, seed, preprocess)
        x = x if preprocess is None else preprocess.apply_all(x)
    elif (path / "cifar-10-batches-py").is_dir() or path.name == "cifar-10-batches-py":
        x, y = _read_cifar_batch(path)
        keep = _subset(len(y), max_samples, seed)
        x, y = x[keep], y[keep]
        x = x if preprocess is None else preprocess.apply_all(x)
    else:
        x, y, keep = _read_image_folder(path, max_samples, seed, preprocess=preprocess)
    return _split_pool(
        str(source), torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(keep),
        preprocessed=False, **opts,
    )



def _check_options(seed: int, calib_fraction: float, val_fraction: float, confirm_fraction: float,
                   max_samples: int | None) -> None:
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer; got {seed!r}")
    if not 0.0 <= calib_fraction < 1.0:
        raise ConfigError(f"calib_fraction must be in [0, 1); got {calib_fraction!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in (0, 1); got {val_fraction!r}")
    if not 0.0 <= confirm_fraction < 1.0:
        raise ConfigError(f"confirm_fraction must be in [0, 1); got {confirm_fraction!r}")
    if (total := calib_fraction + val_fraction + confirm_fraction) >= 1.0:
        raise ConfigError(
            f"calib_fraction + val_fraction + confirm_fraction must be < 1 to leave a test split; got "
            f"{calib_fraction} + {val_fraction} + {confirm_fraction} = {total:g}"
        )
    if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 1):
        raise ConfigError(f"max_samples must be a positive integer or None; got {max_samples!r}")


def check_counts(source: str, n: int, n_calib: int, n_val: int, n_test: int, calib_fraction: float) -> None:
    if n_val < 1 or n_test < 1 or (calib_fraction > 0 and n_calib < 1):
        raise ConfigError(
            f"too few samples in data source {source!r}: {n} give calib={n_calib}, val={n_val}, "
            f"test={n_test}; val and test (and calib when calib_fraction > 0) need at least one "
            f"each: use more samples or change the fractions"
        )


def _split_pool(
    source: str,
    x: torch.Tensor,
    y: torch.Tensor,
    index: torch.Tensor,
    *,
    preprocessed: bool,
    seed: int,
    calib_fraction: float,
    val_fraction: float,
    confirm_fraction: float,
) -> Dataset:
    n = len(y)
    n_calib, n_val, n_conf = round(n * calib_fraction), round(n * val_fraction), round(n * confirm_fraction)
    check_counts(source, n, n_calib, n_val, n - n_calib - n_val - n_conf, calib_fraction)
    order = _permutation(n, seed)
    perm = torch.from_numpy(order)
    a, b, c = n_calib, n_calib + n_val, n_calib + n_val + n_conf
    parts = {Split.CALIB: (0, a), Split.VAL: (a, b), Split.CONFIRM: (b, c), Split.TEST: (c, n)}
    x = _permuted_in_place(x, order)  # each split a view of it: the images are never held twice
    splits = {k: SplitArrays(k, x[s:e], y[perm[s:e]], index[perm[s:e]]) for k, (s, e) in parts.items()}
    confirm = splits.pop(Split.CONFIRM) if n_conf > 0 else None
    splits.pop(Split.CONFIRM, None)
    return Dataset(
        source=source, **splits, preprocessed=preprocessed, num_classes=int(y.max()) + 1, seed=seed, confirm=confirm
    )


def _permuted_in_place(x: torch.Tensor, order: np.ndarray) -> torch.Tensor:
    """`x[order]`, by moving rows within `x` along the permutation's cycles (one row held aside at a time)."""
    rows = x.numpy()
    done = np.zeros(len(order), dtype=bool)
    for start in range(len(order)):
        if done[start]:
            continue
        held, j = rows[start].copy(), start
        while True:
            done[j] = True
            nxt = int(order[j])
            if nxt == start:
                rows[j] = held
                break
            rows[j] = rows[nxt]
            j = nxt
    return x


def _with_calib(data: Dataset, x: torch.Tensor, preprocessed: bool, source: object) -> Dataset:
    """`data` with `x` (unlabeled images, label -1) as its calib split, checked to fit its images."""
    where = "the unlabeled DataLoader" if isinstance(source, DataLoader) else repr(str(source))
    if len(x) < MIN_UNLABELED:
        raise LoadError(f"unlabeled images {where} hold {len(x)} images; calibration needs at least {MIN_UNLABELED}")
    if preprocessed != data.preprocessed:
        kinds = ("preprocessed float tensors", "uint8 images")
        raise ConfigError(f"unlabeled images {where} are {kinds[not preprocessed]} but the data are "
                          f"{kinds[not data.preprocessed]}; pass both the same way")
    if tuple(x.shape[1:]) != tuple(data.val.x.shape[1:]):
        raise LoadError(f"unlabeled images {where} have shape {tuple(x.shape[1:])} per image but the data's are "
                        f"{tuple(data.val.x.shape[1:])}; pass images of the same size")
    calib = SplitArrays(Split.CALIB, x, torch.full((len(x),), -1, dtype=torch.int64), torch.arange(len(x)))
    return dataclasses.replace(data, calib=calib)
