"""Random `.npz` contents (keys, dtypes, shapes, damaged archives) and random bytes named `.npz`: each
loads as a sane dataset or is one `ModeloptError` line; never another exception (a traceback on the CLI)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import torch
from _props import FAST
from hypothesis import event, example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from modelopt.compressors.early_exit.pools import load_exit_images
from modelopt.data.dataset import load_data
from modelopt.errors import ModeloptError

SMALL = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
DTYPES = st.one_of(hnp.scalar_dtypes(), hnp.byte_string_dtypes(max_len=3), hnp.unicode_string_dtypes(max_len=3),
                   st.just(np.dtype(object)))


@st.composite
def any_array(draw, dtype=DTYPES, shape=SMALL):
    dt, shp = draw(dtype), draw(shape)
    if dt == np.dtype(object):
        return np.array([draw(st.integers()) for _ in range(draw(st.integers(0, 3)))] + [None], dtype=object)
    return draw(hnp.arrays(dt, shp))


LABEL_DTYPES = st.sampled_from([np.int64, np.int32, np.uint8, np.int8, np.uint64, np.int16, np.float32, bool])


@st.composite
def labels(draw, n: int):
    """Mostly valid labels for `n` images; now and then too many, negative, huge, 2-D or float."""
    kind = draw(st.integers(0, 9))
    dt = np.dtype(draw(LABEL_DTYPES))
    if kind == 0:
        return draw(any_array())
    if kind == 1:
        n = draw(st.integers(0, n + 2))
    info = np.iinfo(dt) if dt.kind in "iu" else None
    hi = 9 if kind > 2 or info is None else int(info.max)
    lo = 0 if kind != 3 or info is None else int(info.min)
    y = draw(hnp.arrays(dt, (n,), elements=st.integers(lo, hi) if info is not None else None))
    return y.reshape(-1, 1) if kind == 4 and n else y


@st.composite
def pixel_npz(draw) -> dict[str, np.ndarray]:
    n = draw(st.integers(0, 40))
    h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    c = draw(st.sampled_from([3, 3, 3, 1, 4]))
    dt = draw(st.sampled_from([np.uint8] * 6 + [np.float32, np.int64, np.uint16]))
    x = draw(hnp.arrays(np.dtype(dt), (n, h, w, c)))
    return {"x": x, "y": draw(labels(n))}


def _jpeg(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG")
    return buf.getvalue()


@st.composite
def jpeg_npz(draw) -> dict[str, np.ndarray]:
    n = draw(st.integers(0, 12))
    blobs = [_jpeg(draw(hnp.arrays(np.uint8, (draw(st.integers(1, 6)), draw(st.integers(1, 6)), 3))))
             if draw(st.integers(0, 7)) else draw(st.binary(max_size=20)) for _ in range(n)]
    offsets = np.cumsum([0] + [len(b) for b in blobs])
    kind = draw(st.integers(0, 7))
    if kind == 0:  # random offsets: negative, decreasing, past the end, any dtype
        offsets = draw(any_array(shape=st.just((n + 1,))))
    elif kind == 1:
        offsets = offsets.astype(draw(st.sampled_from([np.float64, np.int8, np.uint8, np.int32])))
    elif kind == 2:
        offsets = offsets[:-1]
    data = np.frombuffer(b"".join(blobs), np.uint8)
    if draw(st.integers(0, 7)) == 0:
        data = data.astype(draw(st.sampled_from([np.float32, np.int64])))
    return {"jpeg": data, "offsets": offsets, "y": draw(labels(n))}


KEYS = st.sampled_from(["x", "y", "jpeg", "offsets", "X", "labels", "arr_0"])
RANDOM_NPZ = st.dictionaries(KEYS, any_array(), max_size=4)
NPZ = st.integers(0, 4).flatmap(lambda i: pixel_npz() if i < 2 else jpeg_npz() if i < 4 else RANDOM_NPZ)


def _clean(exc: ModeloptError) -> None:
    assert str(exc) and "\n" not in str(exc), repr(str(exc))
    assert "allow_pickle" not in str(exc)  # never numpy's advice to load it unsafely
    event(f"refused: {type(exc).__name__}")


def _sane(data, n: int) -> None:
    splits = [data.calib, data.val, data.test] + ([data.confirm] if data.confirm is not None else [])
    assert sum(len(s) for s in splits) == n
    for s in splits:
        assert s.x.dtype == torch.uint8 and s.x.ndim == 4 and s.x.shape[-1] == 3 and s.y.dtype == torch.int64
        if len(s.y):  # labels are class indices of the dataset
            assert 0 <= int(s.y.min()) and int(s.y.max()) < data.num_classes
    index = np.concatenate([s.index.numpy() for s in splits])
    assert len(set(index.tolist())) == len(index)
    event("loaded")


def _write(folder, arrays: dict[str, np.ndarray], compressed: bool):
    path = folder / "data.npz"
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


@FAST
@given(arrays=NPZ, compressed=st.booleans(), seed=st.integers(0, 3), max_samples=st.none() | st.integers(1, 30))
# What this test found: uint64 labels wrapped to negative ones (a silent wrong answer); float or timedelta
# offsets and timedelta labels were TypeError tracebacks.
@example(arrays={"x": np.zeros((10, 2, 2, 3), np.uint8), "y": np.full(10, 2**63, np.uint64)}, compressed=False,
         seed=0, max_samples=None)
@example(arrays={"jpeg": np.zeros(4, np.uint8), "offsets": np.array([0.0, 2.0, 4.0]), "y": np.zeros(2, np.int64)},
         compressed=False, seed=0, max_samples=None)
@example(arrays={"jpeg": np.zeros(4, np.uint8), "offsets": np.array([0, 2, 4], "m8[s]"), "y": np.zeros(2, np.int64)},
         compressed=False, seed=0, max_samples=None)
@example(arrays={"x": np.zeros((10, 2, 2, 3), np.uint8), "y": np.arange(10).astype("m8[s]")}, compressed=False,
         seed=0, max_samples=None)
def test_a_random_npz_loads_as_a_sane_dataset_or_is_one_clean_error(tmp_path_factory, arrays, compressed, seed,
                                                                    max_samples):
    path = _write(tmp_path_factory.mktemp("npz"), arrays, compressed)
    try:
        data = load_data(path, seed=seed, max_samples=max_samples)
    except ModeloptError as exc:
        _clean(exc)
        return
    n = len(arrays["y"])
    _sane(data, n if max_samples is None else min(n, max_samples))


@FAST
@given(arrays=NPZ, cut=st.integers(0, 400), flip=st.integers(0, 400), raw=st.binary(max_size=80))
# Found: a zip whose signature is damaged got numpy's "load it unsafely" advice; one with a damaged
# version field was a NotImplementedError traceback from zipfile.
@example(arrays={}, cut=0, flip=2, raw=b"")
@example(arrays={"x": np.zeros((0, 4, 4, 4), np.uint8), "y": np.array(False)}, cut=0, flip=255, raw=b"")
def test_a_damaged_npz_or_random_bytes_is_one_clean_error(tmp_path_factory, arrays, cut, flip, raw):
    folder = tmp_path_factory.mktemp("npz")
    good = _write(folder, arrays, compressed=True).read_bytes()
    damaged = bytearray(good[: max(len(good) - cut, 0)])
    if damaged:
        damaged[flip % len(damaged)] ^= 0xFF
    for name, content in (("damaged.npz", bytes(damaged)), ("random.npz", raw), ("zip.npz", b"PK\x03\x04" + raw)):
        (folder / name).write_bytes(content)
        try:
            data = load_data(folder / name)
        except ModeloptError as exc:
            _clean(exc)
            continue
        _sane(data, len(data.calib) + len(data.val) + len(data.test) + (len(data.confirm) if data.confirm else 0))


@FAST
@given(arrays=NPZ, n=st.integers(-1, 50))
# Found: an archive without labels (KeyError), with 0-d labels (TypeError) or no images (IndexError).
@example(arrays={"x": np.zeros((4, 2, 2, 3), np.uint8)}, n=2)
@example(arrays={"x": np.zeros((4, 2, 2, 3), np.uint8), "y": np.array(1)}, n=2)
@example(arrays={"x": np.zeros((0, 1, 1, 3), np.uint8), "y": np.zeros(0, np.int64)}, n=2)
def test_random_exit_images_load_or_are_one_clean_error(tmp_path_factory, arrays, n):
    path = _write(tmp_path_factory.mktemp("npz"), arrays, compressed=False)
    wl = SimpleNamespace(data=SimpleNamespace(source="cifar10-sample"), prepare=lambda x: x)
    try:
        x = load_exit_images(wl, path, n)
    except ModeloptError as exc:
        _clean(exc)
        return
    assert x.ndim == 4 and x.shape[-1] == 3 and 1 <= len(x) <= n
    event("loaded")
