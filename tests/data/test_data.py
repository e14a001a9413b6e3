from __future__ import annotations

import io
import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from modelopt.data.dataset import SPLIT_NAMES, Dataset, list_data_sources, load_data
from modelopt.data.sample import SAMPLE_PATH
from modelopt.errors import ConfigError, LoadError, ModeloptError, UnknownNameError

CIFAR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "cifar10"
needs_shared = pytest.mark.skipif(not CIFAR.is_dir(), reason=f"needs real CIFAR-10 files in {CIFAR}")
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@pytest.fixture(scope="module")
def exact() -> tuple[np.ndarray, np.ndarray]:
    if not CIFAR.is_dir():
        pytest.skip(f"needs real CIFAR-10 files in {CIFAR}")
    with np.load(CIFAR / "cifar10_exact_test.npz") as f:
        return f["x"], f["y"]


def assert_partition(data: Dataset, n: int, x: np.ndarray, y: np.ndarray) -> None:
    """The splits are disjoint, cover positions 0..n-1, and carry the source's samples."""
    splits = [data.calib, data.val, data.test] + ([data.confirm] if data.confirm is not None else [])
    idx = torch.cat([s.index for s in splits]).numpy()
    assert sorted(idx.tolist()) == list(range(n))
    for s in splits:
        np.testing.assert_array_equal(s.x.numpy(), x[s.index.numpy()])
        np.testing.assert_array_equal(s.y.numpy(), y[s.index.numpy()])
        assert s.y.dtype == torch.int64


# --- the bundled sample (no shared/ needed) ---


def test_bundled_exact_sample_sizes_and_partition() -> None:
    data = load_data("cifar10-exact-sample")
    assert list_data_sources() == ["cifar10-exact-sample", "cifar10-sample"]
    assert (len(data.calib), len(data.val), len(data.confirm), len(data.test)) == (1000, 423, 1000, 423)
    assert data.source == "cifar10-exact-sample" and data.num_classes == 10 and not data.preprocessed
    assert data.val.x.dtype == torch.uint8 and tuple(data.val.x.shape[1:]) == (32, 32, 3)
    with np.load(SAMPLE_PATH) as f:
        test_x, test_y, calib_x, calib_y = f["test_x"], f["test_y"], f["calib_x"], f["calib_y"]
    held = torch.cat([data.val.index, data.test.index]).numpy()
    assert sorted(held.tolist()) == list(range(846))  # disjoint and covering
    for s in (data.val, data.test):
        np.testing.assert_array_equal(s.x.numpy(), test_x[s.index.numpy()])
        np.testing.assert_array_equal(s.y.numpy(), test_y[s.index.numpy()])
    np.testing.assert_array_equal(data.calib.x.numpy(), calib_x)
    np.testing.assert_array_equal(data.calib.y.numpy(), calib_y)
    everything = data.split("all")  # val + test in the original order
    np.testing.assert_array_equal(everything.x.numpy(), test_x)
    np.testing.assert_array_equal(everything.y.numpy(), test_y)
    assert data.split("val") is data.val


@pytest.mark.slow
def test_split_is_seeded() -> None:
    a, b, c = load_data(seed=0), load_data(seed=0), load_data(seed=1)
    assert torch.equal(a.val.index, b.val.index) and torch.equal(a.test.index, b.test.index)
    assert not torch.equal(a.val.index, c.val.index)
    assert set(a.val.index.tolist()) != set(c.val.index.tolist())
    assert c.seed == 1


def test_bundled_exact_sample_max_samples_and_fractions() -> None:
    data = load_data("cifar10-exact-sample", max_samples=100)
    assert (len(data.calib), len(data.val), len(data.test)) == (20, 40, 40)
    data = load_data("cifar10-exact-sample", calib_fraction=0.2, val_fraction=0.6, confirm_fraction=0.0)
    assert (len(data.calib), len(data.val), len(data.test)) == (1000, 634, 212) and data.confirm is None
    # confirm cut from the test images instead
    data = load_data("cifar10-exact-sample", val_fraction=0.3, confirm_fraction=0.1)
    assert (len(data.calib), len(data.val), len(data.confirm), len(data.test)) == (1000, 317, 106, 423)


def test_unknown_split_name() -> None:
    with pytest.raises(ConfigError, match=r"'train'.*calib, val, confirm, test, all"):
        load_data().split("train")
    assert SPLIT_NAMES == ("calib", "val", "confirm", "test", "all")


# --- file and folder sources, from real images ---


@needs_shared
def test_npz(tmp_path: Path, exact: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = exact[0][:100], exact[1][:100]
    np.savez(tmp_path / "d.npz", x=x, y=y.astype(np.int32))
    data = load_data(tmp_path / "d.npz", seed=3)
    assert (len(data.calib), len(data.val), len(data.confirm), len(data.test)) == (20, 20, 20, 40)
    assert data.source == str(tmp_path / "d.npz") and data.num_classes == int(y.max()) + 1
    assert_partition(data, 100, x, y)
    again = load_data(str(tmp_path / "d.npz"), seed=3)
    assert torch.equal(data.test.index, again.test.index)
    small = load_data(tmp_path / "d.npz", max_samples=50)
    assert len(small.calib) + len(small.val) + len(small.confirm) + len(small.test) == 50
    for s in (small.calib, small.val, small.test):
        np.testing.assert_array_equal(s.x.numpy(), x[s.index.numpy()])


@needs_shared
def test_jpeg_npz_max_samples() -> None:
    path = CIFAR / "cifar10_jpeg_test.npz"
    data = load_data(path, max_samples=300, seed=0)
    assert (len(data.calib), len(data.val), len(data.confirm), len(data.test)) == (60, 60, 60, 120)
    with np.load(path) as f:
        jpeg, offsets, y = f["jpeg"], f["offsets"], f["y"]
    idx = torch.cat([data.calib.index, data.val.index, data.confirm.index, data.test.index]).numpy()
    assert len(set(idx.tolist())) == 300 and idx.max() < 10_000
    assert idx.max() > 846  # a subset of the whole file, not its head
    s = data.val
    np.testing.assert_array_equal(s.y.numpy(), y[s.index.numpy()])
    i, k = int(s.index[0]), 0
    ref = Image.open(io.BytesIO(jpeg[offsets[i] : offsets[i + 1]].tobytes())).convert("RGB")
    np.testing.assert_array_equal(s.x[k].numpy(), np.asarray(ref))
    # The file is sorted by class, so a head-of-file cut would be all airplanes.
    assert len(set(torch.cat([data.calib.y, data.val.y, data.test.y]).tolist())) == 10


def write_cifar_root(root: Path, x: np.ndarray, y: np.ndarray, legacy: bool = False) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batch = {
        b"batch_label": b"testing batch 1 of 1",
        b"labels": [int(v) for v in y],
        b"data": np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(len(x), -1)),
        b"filenames": [f"img_{i}.png".encode() for i in range(len(x))],
    }
    raw = pickle.dumps(batch, protocol=2)
    if legacy:  # the official files were written by numpy 1, whose arrays pickle under numpy.core
        raw = raw.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
        assert b"cnumpy.core.multiarray\n" in raw
    (folder / "test_batch").write_bytes(raw)


@needs_shared
@pytest.mark.parametrize("legacy", [False, True])
def test_cifar10_root(tmp_path: Path, exact: tuple[np.ndarray, np.ndarray], legacy: bool) -> None:
    x, y = exact[0][:80], exact[1][:80]
    write_cifar_root(tmp_path, x, y, legacy)
    data = load_data(tmp_path)
    assert (len(data.calib), len(data.val), len(data.confirm), len(data.test)) == (16, 16, 16, 32)
    assert_partition(data, 80, x, y)
    also = load_data(tmp_path / "cifar-10-batches-py")
    assert torch.equal(also.val.x, data.val.x)


class _Evil:
    def __reduce__(self) -> tuple:
        return (os.getcwd, ())


def test_cifar10_root_refuses_foreign_pickles(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-batches-py").mkdir()
    with (tmp_path / "cifar-10-batches-py" / "test_batch").open("wb") as fh:
        pickle.dump({b"data": _Evil(), b"labels": [0]}, fh)
    with pytest.raises(LoadError, match="refusing to load"):
        load_data(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(LoadError, match="no test batch"):
        load_data(tmp_path)


@needs_shared
def test_image_folder(tmp_path: Path, exact: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = exact[0][:60], exact[1][:60]
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        (tmp_path / CLASSES[label]).mkdir(exist_ok=True)
        suffix = ".png" if i % 2 else ".BMP"  # lossless formats, so the pixels must round-trip
        Image.fromarray(img).save(tmp_path / CLASSES[label] / f"{i:03d}{suffix}")
    present = sorted({CLASSES[v] for v in y})
    data = load_data(tmp_path, seed=5)
    assert data.num_classes == len(present)
    idx = torch.cat([data.calib.index, data.val.index, data.confirm.index, data.test.index])
    assert sorted(idx.tolist()) == list(range(60))
    # Files are listed class by class (sorted), so labels are positions in the sorted class list.
    order = sorted(range(60), key=lambda i: (CLASSES[y[i]], f"{i:03d}"))
    for s in (data.calib, data.val, data.test):
        for k, pos in enumerate(s.index.tolist()):
            i = order[pos]
            np.testing.assert_array_equal(s.x[k].numpy(), x[i])
            assert present[int(s.y[k])] == CLASSES[y[i]]


def test_image_folder_mixed_sizes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(5):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(tmp_path / c / f"{i}.png")
    Image.fromarray(rng.integers(0, 255, (12, 10), dtype=np.uint8)).save(tmp_path / "b" / "gray.jpg")
    with caplog.at_level(logging.WARNING, logger="modelopt.data.dataset"):
        data = load_data(tmp_path)
    assert "1 of 11 images" in caplog.text and "resized" in caplog.text
    assert tuple(data.split("all").x.shape[1:]) == (8, 8, 3)
    assert len(data.calib) + len(data.val) + len(data.confirm) + len(data.test) == 11


def test_an_image_too_large_to_decode_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(3):
            Image.new("RGB", (8, 8)).save(tmp_path / c / f"{i}.png")
    Image.new("L", (40, 40), 128).save(tmp_path / "b" / "huge.png")
    # Pillow refuses images over twice MAX_IMAGE_PIXELS (DecompressionBombError, not an OSError): scaled down here.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 400)
    with pytest.raises(LoadError, match=r"huge\.png' is too large to decode safely.*shrink or remove it"):
        load_data(tmp_path)


def test_dataloader() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 8, 8, generator=g)
    y = torch.arange(50) % 7
    data = load_data(DataLoader(TensorDataset(x, y), batch_size=16))
    assert data.preprocessed and data.num_classes == 7
    assert data.source == "DataLoader(TensorDataset)"
    assert (len(data.calib), len(data.val), len(data.confirm), len(data.test)) == (10, 10, 10, 20)
    assert data.val.x.dtype == torch.float32
    assert_partition(data, 50, x.numpy(), y.numpy())


# --- errors: each names the bad value ---


def test_missing_path_and_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="does not exist"):
        load_data(tmp_path / "nope.npz")
    with pytest.raises(UnknownNameError, match=r"cifar10_sample.*did you mean 'cifar10-sample'"):
        load_data("cifar10_sample")
    with pytest.raises(ConfigError, match="got int"):
        load_data(3)  # type: ignore[arg-type]
    (tmp_path / "a.txt").write_text("hi")
    with pytest.raises(LoadError, match=r"not an \.npz"):
        load_data(tmp_path / "a.txt")


def test_npz_missing_keys(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", images=np.zeros((4, 8, 8, 3), np.uint8), y=np.zeros(4, np.int64))
    with pytest.raises(LoadError, match=r"\['images', 'y'\]; expected 'x' and 'y'"):
        load_data(tmp_path / "d.npz")


@pytest.mark.parametrize(
    ("x", "what"),
    [
        (np.zeros((10, 8, 8, 3), np.float32), "float32"),
        (np.zeros((10, 8, 8), np.uint8), r"\(10, 8, 8\)"),
        (np.zeros((10, 8, 8, 1), np.uint8), r"\(10, 8, 8, 1\)"),
    ],
)
def test_npz_bad_images(tmp_path: Path, x: np.ndarray, what: str) -> None:
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(10, np.int64))
    with pytest.raises(LoadError, match=f"uint8 \\(N, H, W, 3\\).*{what}"):
        load_data(tmp_path / "d.npz")


def test_npz_length_mismatch_and_empty(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((10, 8, 8, 3), np.uint8), y=np.zeros(9, np.int64))
    with pytest.raises(LoadError, match="10 images but 9 labels"):
        load_data(tmp_path / "d.npz")
    np.savez(tmp_path / "e.npz", x=np.zeros((0, 8, 8, 3), np.uint8), y=np.zeros(0, np.int64))
    with pytest.raises(LoadError, match="no samples"):
        load_data(tmp_path / "e.npz")


def test_empty_folders(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="no images in"):
        load_data(tmp_path)
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    with pytest.raises(LoadError, match="no images in"):
        load_data(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"calib_fraction": -0.1}, "calib_fraction must be in"),
        ({"calib_fraction": 1.0}, "calib_fraction must be in"),
        ({"val_fraction": 0.0}, "val_fraction must be in"),
        ({"val_fraction": float("nan")}, "val_fraction must be in"),
        ({"calib_fraction": 0.5, "val_fraction": 0.5}, "must be < 1"),
        ({"max_samples": 0}, "max_samples"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_data(**kwargs)


def test_too_few_samples(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 8, 8, 3), np.uint8), y=np.zeros(2, np.int64))
    with pytest.raises(ConfigError, match=r"too few samples.*2 give calib=0, val=0, test=2"):
        load_data(tmp_path / "d.npz")
    assert len(load_data(tmp_path / "d.npz", calib_fraction=0.0, val_fraction=0.5).test) == 1
    with pytest.raises(ConfigError, match="too few samples"):
        load_data(max_samples=1)


def test_dataloader_errors() -> None:
    with pytest.raises(LoadError, match="float \\(N, C, H, W\\)"):
        load_data(DataLoader(TensorDataset(torch.zeros(4, 8, 8, 3, dtype=torch.uint8), torch.zeros(4))))
    with pytest.raises(LoadError, match="no batches"):
        load_data(DataLoader(TensorDataset(torch.zeros(0, 3, 8, 8), torch.zeros(0, dtype=torch.long))))
    with pytest.raises(ModeloptError, match="integer labels"):
        load_data(DataLoader(TensorDataset(torch.zeros(4, 3, 8, 8), torch.zeros(4))))


def test_splits_are_cut_from_the_images_rearranged_in_place():
    """`_split_pool` moves rows along the permutation's cycles instead of copying x[perm] (which held every image
    twice): the same rows, in the same order, as fancy indexing gives."""
    from modelopt.data.dataset import _permuted_in_place

    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 500):
        x = torch.from_numpy(rng.integers(0, 255, (n, 4, 4, 3), dtype=np.uint8))
        order = rng.permutation(n)
        expected = x[torch.from_numpy(order)].clone()
        assert torch.equal(_permuted_in_place(x, order), expected)
