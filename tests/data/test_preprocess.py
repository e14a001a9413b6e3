"""Images at another size than the model's: --resize and --crop bring them to it as they are decoded, recorded in
run.json; bad sizes are refused in one line before anything loads."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image

import modelopt
from modelopt.config.run_config import RunConfig
from modelopt.data.dataset import load_data
from modelopt.data.preprocess import Preprocess
from modelopt.errors import ConfigError


def _accuracy(wl) -> float:
    """Float top-1 over every image the workload holds (the union of its splits)."""
    right = sum(int(wl.split(n).base_correct.sum()) for n in wl.splits)
    return right / sum(len(wl.split(n).y) for n in wl.splits)


def test_a_64_pixel_png_folder_resized_to_32_gives_the_exact_pixels_accuracy(tmp_path):
    exact = load_data("cifar10-exact-sample", seed=0)
    x = np.concatenate([exact.val.x.numpy(), exact.test.x.numpy()])[:400]
    y = np.concatenate([exact.val.y.numpy(), exact.test.y.numpy()])[:400]
    folder = tmp_path / "png64"
    for i, (image, label) in enumerate(zip(x, y, strict=True)):
        (folder / f"class{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).resize((64, 64), Image.Resampling.BICUBIC).save(folder / f"class{label}" / f"{i}.png")
    npz = tmp_path / "exact32.npz"
    np.savez(npz, x=x, y=y)
    assert set(y) == set(range(10))  # every class present: folder labels are the sorted class folders
    want = _accuracy(modelopt.build_workload("cifar10_resnet20", str(npz), device="cpu"))
    got = _accuracy(modelopt.build_workload("cifar10_resnet20", str(folder), device="cpu",
                                            preprocess=Preprocess(resize=32)))
    assert abs(got - want) <= 0.01, (got, want)
    with pytest.raises(Exception, match="32x32"):  # without --resize the 64-pixel images do not fit
        modelopt.build_workload("cifar10_resnet20", str(folder), device="cpu")


def test_resize_then_centre_crop_keeps_the_aspect():
    prep = Preprocess(resize=256, crop=224)
    image = np.zeros((480, 640, 3), np.uint8)
    image[:, 300:340] = 255  # a bar in the middle survives the crop, the edges do not
    out = prep.apply(image)
    assert out.shape == (224, 224, 3) and out[:, 112].min() == 255 and out[:, 0].max() == 0
    assert Preprocess(resize=32).apply(np.zeros((64, 96, 3), np.uint8)).shape == (32, 48, 3)
    assert Preprocess().to_json() is None and Preprocess.from_json(prep.to_json()) == prep


@pytest.mark.parametrize(("kwargs", "needle"), [({"resize": 0}, "--resize must be a positive"),
                                                ({"crop": -3}, "--crop must be a positive"),
                                                ({"resize": 2.5}, "--resize must be a positive")])
def test_bad_sizes_are_refused(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        Preprocess(**kwargs)
    with pytest.raises(ConfigError, match=needle):
        modelopt.evaluate("no-such-model", data="no-such-data", **kwargs)  # before anything loads


def test_the_sizes_are_recorded_in_run_json(tmp_path):
    from modelopt.config.run_config import RunConfig

    cfg = RunConfig(resize=36, crop=32)
    cfg.write(tmp_path)
    raw = json.loads((tmp_path / "run.json").read_text())
    assert (raw["resize"], raw["crop"]) == (36, 32)
    assert RunConfig.read(tmp_path).preprocess == Preprocess(36, 32)


@pytest.mark.slow
def test_mean_and_std_replace_the_model_s_own_and_are_recorded(tmp_path, small_data):
    """--mean/--std normalise in place of the model's values: its own given explicitly change nothing, others change
    what the model sees; they are checked in one line and recorded in run.json."""
    from modelopt.config.run_config import RunConfig

    plain = modelopt.evaluate("cifar10_resnet20", data=str(small_data), split="all", device="cpu")
    same = modelopt.evaluate("cifar10_resnet20", data=str(small_data), split="all", device="cpu",
                             mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    raw = modelopt.evaluate("cifar10_resnet20", data=str(small_data), split="all", device="cpu",
                            mean=(0, 0, 0), std=(1, 1, 1))
    assert same.accuracy == plain.accuracy > 0.9 and raw.accuracy < plain.accuracy - 0.1
    for bad, needle in [({"std": (0.2, 0.0, 0.2)}, "--std must be three positive numbers"),
                        ({"mean": (0.5, 0.5)}, "--mean must be three numbers"),
                        # The 0-255 scale (torchvision's figures times 255): every input would be wrecked, silently.
                        ({"mean": (123.675, 116.28, 103.53)}, r"--mean 123.675,116.28,103.53 is on the 0-255 scale.*"
                                                              r"give 0.485,0.456,0.406"),
                        ({"std": (58.395, 57.12, 57.375)}, r"--std .* is on the 0-255 scale.*give 0.229,0.224,0.225")]:
        with pytest.raises(ConfigError, match=needle):
            modelopt.evaluate("no-such-model", data="no-such-data", **bad)
    RunConfig(mean=[0.5, 0.5, 0.5], std=(0.25, 0.25, 0.25)).write(tmp_path)
    assert json.loads((tmp_path / "run.json").read_text())["mean"] == [0.5, 0.5, 0.5]
    assert RunConfig.read(tmp_path).preprocess.std == (0.25, 0.25, 0.25)


def test_library_weights_are_read_as_their_authors_read_images(tmp_path):
    """torchvision: the weights enum member whose file the weights are (its transforms); timm: its pretrained config.
    Random weights, or the user's own --resize/--crop, keep what is given."""
    import torch
    import torchvision

    from modelopt.model.loader import load_model, read_with

    state = torchvision.models.mobilenet_v2(num_classes=10).state_dict()
    for name, resize in (("mobilenet_v2-b0353104.pth", 256), ("mobilenet_v2-7ebf99e0.pth", 232)):
        torch.save(state, tmp_path / name)
        assert load_model("torchvision:mobilenet_v2", tmp_path / name).preprocess == Preprocess(resize, 224, "bilinear")
    loaded = load_model("torchvision:mobilenet_v2", tmp_path / "mobilenet_v2-7ebf99e0.pth")
    model, prep = read_with(loaded, Preprocess(crop=32, mean=(0.5, 0.5, 0.5)))
    assert prep == Preprocess(None, 32, mean=(0.5, 0.5, 0.5)) and model.mean == (0.5, 0.5, 0.5)
    assert model.std == loaded.std
    assert read_with(loaded, Preprocess(), decoded=False)[1] == Preprocess()  # a DataLoader's tensors are as given
    assert load_model("torchvision:mobilenet_v2").preprocess == Preprocess()
    timm = pytest.importorskip("timm")
    net = timm.create_model("resnet10t", num_classes=10)
    torch.save(net.state_dict(), tmp_path / "t.pt")
    size, pct = net.pretrained_cfg["input_size"][-1], net.pretrained_cfg["crop_pct"]  # 176 and 0.875
    assert load_model("timm:resnet10t", tmp_path / "t.pt").preprocess == Preprocess(int(size / pct), size, "bicubic")


def test_a_weights_file_that_is_not_torchvision_s_keeps_the_data_s_size_and_says_so(tmp_path, caplog):
    """A user's own 10-class state dict for torchvision:mobilenet_v2 was read "resized to 232, centre-cropped to 224
    (bilinear), as its weights were trained": every 32-pixel image upsampled seven times, a 14-minute budget-4 run."""
    import logging

    import torch
    import torchvision

    from modelopt.model.loader import load_model

    torch.save(torchvision.models.mobilenet_v2(num_classes=10).state_dict(), tmp_path / "mb2.pt")
    with caplog.at_level(logging.WARNING):
        assert load_model("torchvision:mobilenet_v2", tmp_path / "mb2.pt").preprocess == Preprocess()
    said = [r.getMessage() for r in caplog.records if "mb2.pt" in r.getMessage()]
    assert len(said) == 1 and "none of torchvision's published files" in said[0]
    assert "their own size" in said[0] and "--resize 232 --crop 224" in said[0]


@pytest.mark.parametrize("source", ["npz", "folder", "named"])
def test_a_resize_that_cannot_fit_in_memory_is_refused_before_decoding(tmp_path, monkeypatch, source):
    """--resize 4000 ended in a MemoryError after decoding: the decoded size (images x 3 x side^2 bytes, uint8) is
    checked against the memory the process can still take before any image is decoded, in one line naming the size
    and a resize that fits."""
    import modelopt.data.memory
    import modelopt.data.readers

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8), np.arange(20) % 2
    if source == "npz":
        path: object = tmp_path / "d.npz"
        np.savez(path, x=x, y=y)
    elif source == "folder":
        path = tmp_path / "folder"
        for i, (image, label) in enumerate(zip(x, y, strict=True)):
            (path / f"c{label}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(path / f"c{label}" / f"{i}.png")
    else:
        path = "cifar10-exact-sample"
    monkeypatch.setattr(modelopt.data.memory, "available_bytes", lambda: 100 * 2**20)

    def decoded(*args, **kwargs):
        raise AssertionError("an image was decoded before the size was checked")

    monkeypatch.setattr(Preprocess, "apply", decoded)
    monkeypatch.setattr(modelopt.data.readers.Image, "open", decoded)
    n = {"npz": 20, "folder": 20, "named": 2846}[source]
    with pytest.raises(ConfigError) as info:
        load_data(path, preprocess=Preprocess(resize=4000))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--resize 4000 makes the {n} images")
    assert f"({n} x 3 x 4000^2 bytes), more than the 100 MiB" in message
    fits = int(message.rsplit("pass --resize ", 1)[1].removesuffix(" or smaller"))
    assert n * 3 * fits**2 <= 50 * 2**20 < n * 3 * (fits + 8) ** 2  # leaves half the memory to the model's work


def test_a_crop_is_the_size_held_and_a_size_that_fits_is_not_refused(monkeypatch):
    import modelopt.data.memory

    monkeypatch.setattr(modelopt.data.memory, "available_bytes", lambda: 3 * 100 * 64 * 64)
    Preprocess(resize=4000, crop=64).check_memory(100)  # exactly fits: the crop is what is held
    # 101 x 3 x 40^2 bytes fit in half the memory, 101 x 3 x 48^2 do not
    refused = r"^--crop 64 makes the 101 images 64x64 pixels: .*; pass --crop 40 or smaller$"
    with pytest.raises(ConfigError, match=refused):
        Preprocess(resize=4000, crop=64).check_memory(101)
    monkeypatch.setattr(modelopt.data.memory, "available_bytes", lambda: None)  # unknown: nothing refused
    Preprocess(resize=4000).check_memory(10**6)


def test_run_json_records_how_the_images_were_read(tmp_path):
    """What was applied is recorded, not only what was asked: a published weights file's transforms, the user's
    --resize/--crop, or the images as stored."""
    import torch
    import torchvision

    from modelopt.config.build import load_workload

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (40, 8, 8, 3), dtype=np.uint8), y=np.arange(40) % 10)
    weights = tmp_path / "mobilenet_v2-7ebf99e0.pth"  # the file name of a published torchvision weights file
    torch.save(torchvision.models.mobilenet_v2(num_classes=10).state_dict(), weights)
    cfg = RunConfig(model="torchvision:mobilenet_v2", weights=str(weights), data=str(tmp_path / "d.npz"))
    authors = load_workload(cfg).read_as
    assert authors["by"] == "the weights' authors"
    assert (authors["resize"], authors["crop"], authors["interpolation"]) == (232, 224, "bilinear")
    assert authors["mean"] == pytest.approx([0.485, 0.456, 0.406])
    users = load_workload(dataclasses.replace(cfg, resize=12, crop=8, mean=(0.5, 0.5, 0.5))).read_as
    assert users == {"resize": 12, "crop": 8, "interpolation": "bicubic", "mean": [0.5] * 3,
                     "std": pytest.approx([0.229, 0.224, 0.225]), "by": "--resize/--crop"}
    stored = load_workload(dataclasses.replace(cfg, weights=None)).read_as
    assert stored["by"] == "as stored" and stored["resize"] is None and stored["interpolation"] is None
    raw = json.loads(json.dumps(RunConfig(read_as=authors).to_json()))
    assert raw["read_as"]["by"] == "the weights' authors" and RunConfig.from_json(raw).read_as == raw["read_as"]
