from __future__ import annotations

import numpy as np
import pytest
import torch

from modelopt.api import build_workload
from modelopt.errors import ConfigError, LoadError
from modelopt.model.workload import resolve_device


def test_workload_holds_splits_on_device_with_baseline(resnet20_workload):
    wl = resnet20_workload
    assert [len(wl.split(s)) for s in ("calib", "val", "test", "all")] == [1000, 423, 423, 846]
    assert wl.split("val").x.dtype == torch.float32 and wl.split("val").x.shape[1:] == (3, 32, 32)
    assert len(wl.layers) == 20 and wl.layers[0].name == "conv1" and wl.layers[-1].name == "linear"
    # val and test are disjoint sets of images
    v, t = wl.split("val").x.tensor().flatten(1), wl.split("test").x.tensor().flatten(1)
    assert not any(torch.equal(v[i], t[j]) for i in range(20) for j in range(len(t)))


def test_unknown_split_is_a_clear_error(resnet20_workload):
    with pytest.raises(ConfigError, match="unknown split 'train'"):
        resnet20_workload.split("train")


def test_data_of_the_wrong_size_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "big.npz"
    np.savez(path, x=rng.integers(0, 255, (40, 64, 64, 3), dtype=np.uint8), y=rng.integers(0, 10, 40))
    with pytest.raises(LoadError, match="64x64 but model 'cifar10_resnet20' expects 32x32"):
        build_workload("cifar10_resnet20", path, device="cpu")


def test_data_that_does_not_fit_a_model_without_known_input_size(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.integers(0, 255, (40, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 40))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(100, 10))
    with pytest.raises(LoadError, match=r"data of shape \(3, 32, 32\) does not fit model"):
        build_workload(model, path, device="cpu")


def test_labels_beyond_the_model_outputs_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.integers(0, 255, (40, 32, 32, 3), dtype=np.uint8), y=np.arange(40) % 20)
    with pytest.raises(LoadError, match="labels up to 19"):
        build_workload("cifar10_resnet20", path, device="cpu")


def test_devices():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="unknown device 'gpu9'"):
        resolve_device("gpu9")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_workload_on_gpu_matches_cpu(resnet20_workload):
    gpu = build_workload("cifar10_resnet20", "cifar10-exact-sample", device="cuda")
    assert gpu.split("val").x.tensor().is_cuda
    agree = (gpu.split("test").base_pred.cpu() == resnet20_workload.split("test").base_pred).float().mean()
    assert agree >= 0.995


def test_a_random_torchvision_head_is_sized_to_the_data_s_classes(tmp_path):
    """torchvision:NAME without --weights has a 1000-class head; on 10-class data it would get nothing right: its
    head gets the data's classes, as a checkpoint's would size it. A checkpoint's head is never changed."""
    from modelopt.model.loader import load_model

    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.integers(0, 255, (60, 32, 32, 3), dtype=np.uint8), y=np.arange(60) % 10)
    loaded = load_model("torchvision:mobilenet_v3_small")
    assert loaded.random_head and loaded.num_classes == 1000
    wl = build_workload("torchvision:mobilenet_v3_small", path, device="cpu")
    assert wl.num_outputs == 10 and wl.source.num_classes == 10
    weights = tmp_path / "w.pt"
    torch.save(loaded.module.state_dict(), weights)
    trained = load_model("torchvision:mobilenet_v3_small", weights)
    assert not trained.random_head and trained.sized_to(10) is trained


def test_streamed_images_score_bit_for_bit_as_resident_ones(small_data, small_workload, monkeypatch):
    """Past RESIDENT_BYTES a split stays uint8 and each batch is prepared as it is read: the same float inputs,
    predictions and scores as a workload holding every image prepared, and no prepared copy kept."""
    import modelopt.model.workload as workload
    from modelopt.compressors import Granularity, Quantize, QuantSpec
    from modelopt.evaluation.evaluator import Evaluator
    from modelopt.plan.space import SearchSpace

    monkeypatch.setattr(workload, "RESIDENT_BYTES", 0)
    # The small sample's 846 images (169 calib, 169 val, 508 val and test): every split streamed and scored twice
    # is a third of the exact sample's passes.
    streamed = build_workload("cifar10_resnet20", str(small_data), device="cpu")
    resident = small_workload
    for name in ("calib", "val", "test", "all"):
        s, r = streamed.split(name), resident.split(name)
        assert not s.x.resident and r.x.resident
        assert torch.equal(s.x.tensor(), r.x.tensor()) and torch.equal(s.base_pred, r.base_pred)
        assert torch.equal(s.x[5:77], r.x[5:77]) and torch.equal(s.x.part(10, 300)[3:9], r.x[13:19])
    assert s.x.shape == r.x.shape and s.x[:0].shape == (0, 3, 32, 32)
    with pytest.raises(TypeError, match="slices of step 1"):
        s.x[::2]
    scores = []
    for wl in (streamed, resident):
        ev = Evaluator(wl, SearchSpace(wl.layers, [Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)]))
        plan = ev.space.uniform("quantize", QuantSpec(4, Granularity("per_channel")))
        scores.append([(m.accuracy, m.agreement) for m in (ev.scorer.evaluate(plan, "val"),
                                                           ev.scorer.evaluate(plan, "all", n=500))])
    assert scores[0] == scores[1]


@pytest.mark.parametrize("kind", ["jpeg npz", "image folder"])
def test_a_head_that_cannot_answer_the_labels_is_refused_before_the_images_are_decoded(tmp_path, monkeypatch, kind):
    """Issue 46, "refused late": a checkpoint whose head does not cover the data's labels was refused after every
    image was decoded (about 100 s for the JPEG protocol). The labels are read first where that is cheap."""
    import io
    import re

    from PIL import Image

    import modelopt.config.build
    import modelopt.data.readers
    from modelopt.config.run_config import RunConfig

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(12)  # 0..11: twelve classes for ResNet-20's ten outputs
    if kind == "jpeg npz":
        files = []
        for image in images:
            buf = io.BytesIO()
            Image.fromarray(image).save(buf, format="JPEG")
            files.append(np.frombuffer(buf.getvalue(), np.uint8))
        path = tmp_path / "d.npz"
        np.savez(path, jpeg=np.concatenate(files), offsets=np.cumsum([0] + [len(f) for f in files]), y=labels)
    else:
        path = tmp_path / "folder"
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            (path / f"class{label:02d}").mkdir(parents=True)
            Image.fromarray(image).save(path / f"class{label:02d}" / f"{i}.png")

    def decoded(*args, **kwargs):
        raise AssertionError("the images were decoded before the labels were checked")

    monkeypatch.setattr(modelopt.data.readers, "decode_jpegs", decoded)
    monkeypatch.setattr(modelopt.data.readers, "rgb", decoded)
    refused = re.escape(f"data '{path}' has labels up to 11 but model 'cifar10_resnet20' has 10 outputs")
    with pytest.raises(LoadError, match=refused):
        build_workload("cifar10_resnet20", path, device="cpu")
    with pytest.raises(LoadError, match=refused):  # a run folder's settings rebuild it the same way
        modelopt.config.build.load_workload(RunConfig(data=str(path), device="cpu"))


def test_a_convolutional_network_runs_channels_last_on_the_cpu_with_the_same_answers(resnet20_workload):
    wl = resnet20_workload
    assert wl.channels_last == (wl.device.type == "cpu")
    x = wl.split("val").x[:64]
    assert wl.laid_out(x).is_contiguous(memory_format=torch.channels_last) == wl.channels_last
    assert torch.equal(wl.laid_out(x), x)  # the same values, laid out differently
    with torch.inference_mode():
        plain = wl.model(x.contiguous())
    torch.testing.assert_close(wl.logits(x), plain, rtol=1e-4, atol=1e-4)
    assert torch.equal(wl.predict(x), plain.argmax(1))


def test_a_network_of_linear_layers_is_not_laid_out_channels_last(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.integers(0, 255, (40, 8, 8, 3), dtype=np.uint8), y=rng.integers(0, 10, 40))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.Flatten(), torch.nn.Linear(256, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    wl = build_workload(model, path, device="cpu")
    assert not wl.channels_last  # the conv's 768 MACs against the linears' 17,024
    x = wl.split("val").x[:4]
    assert wl.laid_out(x).is_contiguous()
