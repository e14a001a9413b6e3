from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from modelopt.errors import LoadError, ModeloptError, UnknownNameError
from modelopt.model.checkpoint import load_weights
from modelopt.model.loader import IMAGENET_MEAN, LoadedModel, list_models, load_model
from modelopt.zoo.cifar_resnet import resnet20, resnet32

SHARED_R20 = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "cifar10" / "resnet20-12fca82f.th"


@pytest.fixture(autouse=True)
def _helper_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))  # tests/, where _models_helper.py is


def _assert_same_weights(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    for k, v in module.state_dict().items():
        if k in state:
            assert torch.equal(v, state[k]), k


def _ready(loaded: LoadedModel) -> None:
    assert not loaded.module.training
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in loaded.module.parameters())


def test_default_is_resnet20_with_bundled_weights():
    loaded = load_model()
    _ready(loaded)
    assert (loaded.name, loaded.input_size, loaded.num_classes) == ("cifar10_resnet20", (32, 32), 10)
    assert loaded.mean == (0.485, 0.456, 0.406) and loaded.std == (0.229, 0.224, 0.225)
    if SHARED_R20.is_file():
        _assert_same_weights(loaded.module, load_weights(SHARED_R20))
    else:  # at least not a fresh init
        assert not torch.equal(loaded.module.conv1.weight, resnet20().conv1.weight)


def test_list_models_filters_by_pattern():
    assert "cifar10_resnet56" in list_models()
    assert list_models("cifar10_resnet2*") == ["cifar10_resnet20"]


@pytest.mark.parametrize("nest", [None, "state_dict", "model", "model_state_dict"])
def test_zoo_model_takes_weights_in_any_checkpoint_form(tmp_path, nest):
    state = {f"module.{k}": v for k, v in resnet32().state_dict().items()}
    torch.save(state if nest is None else {nest: state, "epoch": 3}, tmp_path / "w.pt")
    loaded = load_model("cifar10_resnet32", tmp_path / "w.pt")
    _ready(loaded)
    _assert_same_weights(loaded.module, {k.removeprefix("module."): v for k, v in state.items()})


def test_torchvision_resnet18_loads_saved_weights_and_infers_classes(tmp_path):
    tv = pytest.importorskip("torchvision")
    ref = tv.models.resnet18(num_classes=10).eval()
    torch.save(ref.state_dict(), tmp_path / "r18.pth")
    loaded = load_model("torchvision:resnet18", str(tmp_path / "r18.pth"))
    _ready(loaded)
    assert (loaded.name, loaded.num_classes, loaded.mean) == ("torchvision:resnet18", 10, IMAGENET_MEAN)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.module(x), ref(x))


def test_factory_source():
    loaded = load_model("_models_helper:tiny_net")
    _ready(loaded)
    assert type(loaded.module).__name__ == "TinyNet"
    assert (loaded.name, loaded.input_size, loaded.num_classes) == ("_models_helper:tiny_net", None, None)


def test_module_is_used_as_is():
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 2)).train()
    loaded = load_model(net)
    assert loaded.module is net and not net.training
    assert (loaded.mean, loaded.input_size, loaded.num_classes) == (IMAGENET_MEAN, None, None)


def test_pickled_module_needs_allow_pickle(tmp_path):
    from _models_helper import TinyNet

    torch.save(TinyNet(), tmp_path / "net.pt")
    with pytest.raises(LoadError, match=r"pickled.*arbitrary code.*--allow-pickle") as err:
        load_model(tmp_path / "net.pt")
    assert "net.pt" in str(err.value)
    loaded = load_model(tmp_path / "net.pt", allow_pickle=True)
    _ready(loaded)
    assert type(loaded.module).__name__ == "TinyNet" and loaded.name == str(tmp_path / "net.pt")


def test_state_dict_file_as_source_asks_for_architecture(tmp_path):
    torch.save(resnet20().state_dict(), tmp_path / "sd.pt")
    with pytest.raises(LoadError, match=r"sd\.pt.*--model ARCH --weights FILE"):
        load_model(str(tmp_path / "sd.pt"))


def _save(tmp_path: Path, name: str, obj: object) -> Path:
    path = tmp_path / name
    if isinstance(obj, bytes):
        path.write_bytes(obj)
    else:
        torch.save(obj, path)
    return path


# (source, weights file contents or None, error type, text the message must contain)
ERRORS = [
    ("resnet20", None, UnknownNameError, "'resnet20'"),
    ("cifar10_resnet56", None, LoadError, "--weights FILE"),
    ("torchvision:resnet81", None, UnknownNameError, "'resnet81'"),
    ("missing/model.pt", None, LoadError, "missing/model.pt"),
    ("no_such_pkg.mod:factory", None, LoadError, "no_such_pkg.mod"),
    ("_models_helper:absent", None, LoadError, "absent"),
    ("_models_helper:not_a_model", None, LoadError, "_models_helper:not_a_model"),
    ("_models_helper:needs_args", None, LoadError, "needs_args"),
    ("cifar10_resnet20", b"not a checkpoint", LoadError, "w.pt"),
    ("cifar10_resnet20", {"epoch": 3}, LoadError, "w.pt"),
    ("cifar10_resnet20", {"state_dict": {"linear.weight": torch.zeros(5, 64)}}, LoadError, "linear.weight"),
    ("cifar10_resnet20", {"conv9.weight": torch.zeros(1)}, LoadError, "conv9.weight"),
]


@pytest.mark.parametrize(("source", "weights", "kind", "text"), ERRORS)
def test_errors_are_one_line_and_name_the_bad_value(tmp_path, source, weights, kind, text):
    path = None if weights is None else _save(tmp_path, "w.pt", weights)
    with pytest.raises(kind) as err:
        load_model(source, path)
    assert isinstance(err.value, ModeloptError)
    message = str(err.value)
    assert text in message and "\n" not in message


def test_weights_mismatch_reports_first_keys(tmp_path):
    state = resnet20().state_dict()
    state["extra.weight"] = torch.zeros(1)
    del state["layer3.2.bn2.bias"]
    with pytest.raises(LoadError, match=r"missing keys layer3\.2\.bn2\.bias; unexpected keys extra\.weight"):
        load_model("cifar10_resnet20", _save(tmp_path, "w.pt", state))


def test_a_factory_that_exits_or_raises_is_one_load_error():
    with pytest.raises(LoadError, match=r"factory 'builtins:exit' called exit\(None\) instead of returning"):
        load_model("builtins:exit")
    with pytest.raises(LoadError, match=r"factory 'builtins:dict' returned a dict"):
        load_model("builtins:dict")
    with pytest.raises(LoadError, match=r"factory 'tempfile:mkdtemp' returned a str"):
        load_model("tempfile:mkdtemp")
    with pytest.raises(LoadError, match=r"^factory 'builtins:input' raised (?!.*Error: \w+Error)"):  # named once
        load_model("builtins:input")  # reads stdin, closed under pytest: OSError or EOFError


def test_a_malicious_checkpoint_is_called_refused_not_damaged(tmp_path):
    """A valid pickle that would call os.system: the safe loader refuses it, and the message says what was
    refused and that --allow-pickle is for trusted files only (not "damaged")."""
    import os
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    for protocol in (2, 4):
        path = tmp_path / f"evil{protocol}.th"
        path.write_bytes(pickle.dumps({"state_dict": Evil()}, protocol=protocol))
        with pytest.raises(LoadError) as err:
            load_model("cifar10_resnet20", weights=path)
        text = str(err.value)
        assert "refused" in text and "only for a file you trust" in text and "damaged" not in text, text
        if protocol == 2:
            assert f"pickled reference to {os.system.__module__}.system" in text
