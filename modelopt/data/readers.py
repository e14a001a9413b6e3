"""Readers for the data sources: .npz (raw or JPEG bytes), CIFAR10 batches, image folders, DataLoaders.

Each returns uint8 NHWC images (or preprocessed floats for a DataLoader) with int64 labels (the images decoded by
`modelopt.data.decode`); `modelopt.data.dataset` splits them.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader

from modelopt.data.decode import Stacker, decode_jpegs, rgb
from modelopt.data.preprocess import Preprocess
from modelopt.errors import LoadError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")

logger = logging.getLogger("modelopt.data.dataset")
# Separate seeded streams: the subset kept and the split drawn never share random numbers.
_SUBSET_STREAM, _SPLIT_STREAM = 1, 2


def _permutation(n: int, seed: int) -> np.ndarray:
    # numpy's PCG64 stream is stable across versions and platforms, unlike torch.randperm's.
    return np.random.default_rng([_SPLIT_STREAM, seed]).permutation(n)


def _subset(n: int, max_samples: int | None, seed: int) -> np.ndarray:
    """Sorted positions of a seeded subset of `max_samples` out of `n` (all if None or >= n)."""
    if max_samples is None or max_samples >= n:
        return np.arange(n)
    rng = np.random.default_rng([_SUBSET_STREAM, seed])
    return np.sort(rng.choice(n, size=max_samples, replace=False))


def _check_images(x: np.ndarray, where: str) -> None:
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise LoadError(
            f"x in {where} must be uint8 (N, H, W, 3) RGB images; got {x.dtype} {tuple(x.shape)}"
        )


def _check_labels(y: np.ndarray, n: int | None, where: str) -> np.ndarray:
    """`y` as int64 labels of `n` images (None: as many as `y` holds)."""
    if y.ndim != 1 or y.dtype.kind not in "iu":  # not issubdtype(integer): timedelta64 is one to numpy
        raise LoadError(f"y in {where} must be a 1-D integer array of labels; got {y.dtype} {tuple(y.shape)}")
    if n is not None and len(y) != n:
        raise LoadError(f"x and y in {where} differ in length: {n} images but {len(y)} labels")
    if len(y) == 0:
        raise LoadError(f"{where} holds no samples")
    if y.min() < 0:
        raise LoadError(f"y in {where} must be labels >= 0; found {int(y.min())}")
    if int(y.max()) > np.iinfo(np.int64).max:  # uint64: astype(int64) would wrap it to a negative label
        raise LoadError(f"y in {where} must be class indices; found {int(y.max())}")
    return y.astype(np.int64)


def _check_jpeg_index(data: np.ndarray, offsets: np.ndarray, n: int, where: str) -> None:
    """`data` is the JPEG files end to end and image i is data[offsets[i]:offsets[i + 1]]."""
    if data.dtype != np.uint8 or data.ndim != 1:
        raise LoadError(f"jpeg in {where} must be the files' bytes end to end, uint8 (N,); got {data.dtype} "
                        f"{tuple(data.shape)}")
    if offsets.ndim != 1 or len(offsets) != n + 1:
        raise LoadError(f"offsets in {where} must hold len(y) + 1 = {n + 1} entries; got {offsets.dtype} "
                        f"{tuple(offsets.shape)}")
    if offsets.dtype.kind not in "iu":
        raise LoadError(f"offsets in {where} must be integer byte positions; got {offsets.dtype}")
    if int(offsets[0]) < 0:
        raise LoadError(f"offsets in {where} must start at a byte position >= 0; offsets[0] is {int(offsets[0])}")
    if int(offsets[-1]) > len(data):
        raise LoadError(f"offsets in {where} must end within the {len(data)} bytes of jpeg; offsets[{n}] is "
                        f"{int(offsets[-1])}")
    falls = np.flatnonzero(np.diff(offsets.astype(np.int64)) < 0)
    if falls.size:
        i = int(falls[0]) + 1
        raise LoadError(f"offsets in {where} must not fall (image i is jpeg[offsets[i]:offsets[i + 1]]); offsets[{i}] "
                        f"is {int(offsets[i])}, below offsets[{i - 1}] = {int(offsets[i - 1])}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class NpzArchive:
    """An .npz archive opened without unpickling. Its errors name the file and what is wrong, never
    numpy's advice to load it unsafely (modelopt does not unpickle data).

    Example:
        >>> with NpzArchive("data.npz") as f:
        ...     x, y = f["x"], f["y"]
    """

    def __init__(self, path: str | Path) -> None:
        self.where = repr(str(path))
        try:
            with open(path, "rb") as fh:
                head = fh.read(4)
        except OSError as e:
            raise LoadError(f"could not read {self.where}: {e.strerror or e}") from None
        if head not in (b"PK\x03\x04", b"PK\x05\x06"):  # every .npz is a zip archive (numpy unpickles the rest)
            kind = "a single .npy array" if head.startswith(b"\x93NUM") else "not a zip archive"
            raise LoadError(f"{self.where} is not an .npz archive ({kind}); write one with "
                            "numpy.savez(path, x=images, y=labels)")
        try:
            self._f = np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001 -- a damaged zip: zipfile raises many kinds (NotImplementedError too)
            raise LoadError(f"could not read {self.where} as an .npz archive: {_one_line(e)}") from None

    @property
    def files(self) -> list[str]:
        return list(self._f.files)

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._f.files:
            raise LoadError(f"{self.where} has no array {key!r}; it has {sorted(self._f.files)}")
        try:
            return self._f[key]
        except ValueError as e:
            if "allow_pickle" in str(e):
                raise LoadError(f"array {key!r} in {self.where} holds Python objects; modelopt reads only numeric "
                                "arrays (object arrays would need unpickling)") from None
            raise LoadError(f"array {key!r} in {self.where} is damaged: {_one_line(e)}") from None
        except Exception as e:  # noqa: BLE001 -- a damaged member: zipfile and zlib raise many kinds
            raise LoadError(f"array {key!r} in {self.where} is damaged: {_one_line(e)}") from None

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_npz(path: str | Path, pick: Callable[[int], np.ndarray],
             labeled: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 (N, H, W, 3) RGB images, their int64 labels and positions from an `.npz` of pixels (`x`, `y`)
    or of JPEG files end to end (`jpeg`, `offsets`, `y`), checked as `load_data` checks them.

    Args:
        path: The archive.
        pick: Given the archive's sample count, the positions to read (only those JPEGs are decoded).
        labeled: False reads images alone (`x`, or `jpeg` and `offsets`): labels, if any, are not
            read, and every label returned is -1.

    Raises:
        LoadError: the archive or an array in it is malformed; the message names the file and what is wrong.

    Example:
        >>> x, y, keep = read_npz("train.npz", lambda n: np.arange(min(n, 100)))
    """
    where = repr(str(path))
    with NpzArchive(path) as f:
        keys = set(f.files)
        need = set() if labeled else {"y"}  # images alone: y is neither needed nor read
        if {"x", "y"} - need <= keys:
            x = f["x"]
            _check_images(x, where)
            y = _check_labels(f["y"], len(x), where) if labeled else np.full(len(x), -1, dtype=np.int64)
            keep = _picked(pick, len(y), where)
            return np.ascontiguousarray(x[keep]), y[keep], keep
        if {"jpeg", "offsets", "y"} - need <= keys:
            data, offsets = f["jpeg"], f["offsets"]
            labels = f["y"] if labeled else None
        else:
            wanted = "'x' and 'y', or 'jpeg', 'offsets' and 'y'" if labeled else "'x', or 'jpeg' and 'offsets'"
            raise LoadError(f"{where} has arrays {sorted(keys)}; expected {wanted}")
    if labels is None:
        if getattr(offsets, "ndim", 0) != 1 or len(offsets) < 1:
            raise LoadError(f"offsets in {where} must be a 1-D array of JPEG start positions")
        y = np.full(len(offsets) - 1, -1, dtype=np.int64)
    else:
        y = _check_labels(labels, None, where)
    _check_jpeg_index(data, offsets, len(y), where)
    keep = _picked(pick, len(y), where)
    return decode_jpegs(data, offsets, where, keep), y[keep], keep


def _picked(pick: Callable[[int], np.ndarray], n: int, where: str) -> np.ndarray:
    keep = np.asarray(pick(n), dtype=np.int64)
    if keep.ndim != 1 or (len(keep) and (keep.min() < 0 or keep.max() >= n)):
        raise LoadError(f"{where} holds {n} samples; positions {keep.min()} .. {keep.max()} were asked for")
    return keep


def _read_npz(
    path: Path, max_samples: int | None, seed: int, preprocess: Preprocess | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    def pick(n: int) -> np.ndarray:
        keep = _subset(n, max_samples, seed)
        if preprocess is not None:  # before the JPEGs are decoded
            preprocess.check_memory(len(keep), repr(str(path)))
        return keep

    return read_npz(path, pick)


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles only what the official CIFAR batches hold: dicts, lists, bytes and numpy arrays."""

    _ALLOWED = {
        (mod, name)
        for pkg in ("numpy.core", "numpy._core")  # numpy 1 and numpy 2 names
        for mod in (f"{pkg}.multiarray", f"{pkg}.numeric")
        for name in ("_reconstruct", "_frombuffer", "scalar")
    } | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}  # protocol-2 bytes

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _read_cifar_batch(root: Path) -> tuple[np.ndarray, np.ndarray]:
    folder = root if root.name == "cifar-10-batches-py" else root / "cifar-10-batches-py"
    path = folder / "test_batch"
    where = repr(str(path))
    if not path.is_file():
        raise LoadError(f"CIFAR10 root {str(root)!r} has no test batch; expected the file {where}")
    try:
        with path.open("rb") as fh:
            batch = _BatchUnpickler(fh, encoding="bytes").load()
        batch = {(k.decode() if isinstance(k, bytes) else k): v for k, v in batch.items()}
        data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"])
    except (pickle.UnpicklingError, EOFError, AttributeError, KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{where} is not an official CIFAR-10 batch (dict with data, labels): {e}") from None
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise LoadError(f"data in {where} must be uint8 (N, 3072); got {data.dtype} {tuple(data.shape)}")
    x = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return x, _check_labels(labels, len(x), where)


def class_folders(root: Path) -> list[tuple[Path, list[Path]]]:
    """The class folders of an image folder root/<class>/* (sorted: label i is the i-th) with their image files.

    Raises:
        LoadError: no images at all, or images in only one class folder (every image would get label 0).
    """
    where = repr(str(root))
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    found = [(folder, sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES))
             for folder in classes]
    holding = [folder.name for folder, files in found if files]
    if not holding:
        raise LoadError(f"no images in {where}; expected an image folder root/<class_name>/*"
                        f"{{{','.join(IMAGE_SUFFIXES)}}} (or an .npz, or a CIFAR10 root)")
    if len(holding) < 2:
        raise LoadError(f"image folder {where} has images in one class folder only ({holding[0]!r}): labels are the "
                        "class folders, so at least two class folders are needed, root/<class_name>/* for each class")
    return found


def _read_image_folder(
    root: Path, max_samples: int | None, seed: int, labeled: bool = True, preprocess: Preprocess | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images of root/<class>/* (labels: the classes in sorted order); with `labeled=False` every image
    under `root`, at any depth, with label -1. `preprocess`: each image resized and cropped as it is decoded."""
    where = repr(str(root))
    files: list[Path] = []
    labels: list[int] = []
    if labeled:
        for label, (folder, found) in enumerate(class_folders(root)):
            if not found:
                logger.warning("class folder %s holds no images; label %d gets no samples", folder, label)
            files += found
            labels += [label] * len(found)
    else:
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        labels = [-1] * len(files)
        if not files:
            raise LoadError(f"no images in {where}; expected an image folder root/**/*"
                            f"{{{','.join(IMAGE_SUFFIXES)}}} (or an .npz, or a CIFAR10 root)")
    keep = _subset(len(files), max_samples, seed)
    if preprocess is not None:
        preprocess.check_memory(len(keep), where)  # before anything is decoded
    images = Stacker(len(keep), where)
    for i in keep:
        try:
            with Image.open(files[i]) as im:
                image = rgb(im, f"image {str(files[i])!r}")
            images.add(image if preprocess is None else preprocess.apply(image))
        except Image.DecompressionBombError as e:  # not an OSError: Pillow refuses it before decoding
            raise LoadError(f"image {str(files[i])!r} is too large to decode safely ({e}); shrink or remove it"
                            ) from None
        except (UnidentifiedImageError, OSError) as e:
            raise LoadError(f"could not read image {str(files[i])!r}: {e}") from None
    return images.stacked(), np.asarray(labels, dtype=np.int64)[keep], keep



def _read_loader(loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    for batch in loader:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise LoadError(f"the DataLoader must yield (x, y) batches; got {type(batch).__name__}")
        x, y = (torch.as_tensor(t) for t in batch)
        if not x.is_floating_point() or x.ndim != 4:
            raise LoadError(
                "the DataLoader must yield preprocessed float (N, C, H, W) inputs; "
                f"got {x.dtype} {tuple(x.shape)}"
            )
        if y.ndim != 1 or y.is_floating_point() or y.is_complex() or len(y) != len(x):
            raise LoadError(
                f"the DataLoader must yield integer labels of shape ({len(x)},); "
                f"got {y.dtype} {tuple(y.shape)}"
            )
        xs.append(x.detach().cpu())
        ys.append(y.detach().cpu().long())
    if not xs:
        raise LoadError("the DataLoader yielded no batches")
    y = torch.cat(ys)
    if y.min() < 0:
        raise LoadError(f"the DataLoader's labels must be >= 0; found {int(y.min())}")
    return torch.cat(xs), y


def read_unlabeled(source: str | Path | DataLoader, n: int, seed: int,
                   preprocess: Preprocess | None = None) -> tuple[torch.Tensor, bool]:
    """At most `n` images (a seeded subset) from an `.npz` (`x`, or `jpeg` and `offsets`; labels in it are
    ignored), an image folder (any depth) or a DataLoader (of preprocessed float batches, or (x, y)
    batches whose y is ignored). Returns the images (uint8 NHWC, or float NCHW) and whether they are
    preprocessed; LoadError in one line naming the source and what is wrong.

    Example:
        >>> x, pre = read_unlabeled("../shared/data/cifar10/cifar10_jpeg_train.npz", 2000, seed=0)
    """
    if isinstance(source, DataLoader):
        xs = [torch.as_tensor(b[0] if isinstance(b, (tuple, list)) else b).detach().cpu() for b in source]
        if not xs:
            raise LoadError("the unlabeled DataLoader yielded no batches")
        x = torch.cat(xs)
        if not x.is_floating_point() or x.ndim != 4:
            raise LoadError(f"the unlabeled DataLoader must yield preprocessed float (N, C, H, W) images; got "
                            f"{x.dtype} {tuple(x.shape)}")
        return x[torch.from_numpy(_subset(len(x), n, seed))], True
    path = Path(source).expanduser()
    where = repr(str(source))
    if not path.exists():
        raise LoadError(f"unlabeled images {where} do not exist; pass an .npz (x, or jpeg and offsets) or an "
                        "image folder")
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise LoadError(f"unlabeled images {where} are not an .npz or a folder of "
                            f"{'/'.join(IMAGE_SUFFIXES)} images")
        with NpzArchive(path) as f:
            if "y" in f.files:
                logger.warning("the labels (y) in %s are ignored: unlabeled images only calibrate", path)
        images, _, _ = read_npz(path, lambda total: _subset(total, n, seed), labeled=False)
        images = images if preprocess is None else preprocess.apply_all(images)
    elif path.is_dir():
        images, _, _ = _read_image_folder(path, n, seed, labeled=False, preprocess=preprocess)
    else:
        raise LoadError(f"unlabeled images {where} are neither a file nor a folder")
    return torch.from_numpy(images), False
