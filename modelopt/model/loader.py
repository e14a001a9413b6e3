"""Model sources: the zoo, torchvision, `package.module:factory`, saved files, live modules.

Weight files are read by `modelopt.model.checkpoint` (safely, unless the caller opts into unpickling).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import re
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from modelopt.data.preprocess import INTERPOLATIONS, Preprocess
from modelopt.errors import LoadError, UnknownNameError
from modelopt.model.attention import unfuse_attention
from modelopt.model.checkpoint import (
    WEIGHT_SUFFIXES,
    apply_weights,
    first_line,
    load_weights,
    read_checkpoint,
    state_dict_of,
)
from modelopt.zoo import MODELS, ZooEntry, asset

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "LoadedModel", "list_models", "load_model"]

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to evaluate, with what its inputs must look like.

    Attributes:
        module: The network, in eval mode, on CPU, float32.
        name: Where it came from: a zoo name, ``"torchvision:NAME"``, ``"pkg.mod:factory"``,
            a file path, or the class name of a module passed in.
        mean: Per-channel mean subtracted from [0, 1] RGB inputs.
        std: Per-channel std the centred inputs are divided by.
        input_size: (height, width) it expects, or None when any size works or it is unknown.
        num_classes: Number of outputs, or None when unknown.
        random_head: A torchvision architecture with random weights: its head may be sized to the data's classes
            (`sized_to`), as a checkpoint's head sizes it.
        preprocess: How its authors brought images to its size (resize, crop, interpolation): a torchvision
            weights enum's transforms, a timm model's pretrained config; nothing for random weights or the zoo.
    """

    module: nn.Module
    name: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    input_size: tuple[int, int] | None
    num_classes: int | None
    random_head: bool = False
    preprocess: Preprocess = dataclasses.field(default_factory=Preprocess)

    def sized_to(self, classes: int) -> LoadedModel:
        """This model with a head of `classes` outputs where its weights are random (`random_head`) and its head has
        another size; itself otherwise. A 1000-class random head on 10-class data gets nothing right."""
        if not self.random_head or self.num_classes in (None, classes):
            return self
        log.warning("%s has random weights: its head is sized to the data's %d classes", self.name, classes)
        module = _build_library_model(self.name, classes)
        return _ready(dataclasses.replace(self, module=module, num_classes=classes))


def read_with(model: LoadedModel, given: Preprocess, decoded: bool = True) -> tuple[LoadedModel, Preprocess]:
    """The model normalising as `given` says where it says so (--mean, --std), and how its images are read: the
    user's resize and crop when given, else, for images the tool decodes (`decoded`; not a DataLoader's tensors),
    its authors' (`LoadedModel.preprocess`, said in the log)."""
    prep = given.over(model.preprocess if decoded else Preprocess())
    if not given.active and prep.active:
        log.warning("%s: images %s, as its weights were trained (pass --resize and --crop to read them otherwise)",
                    model.name, prep.describe())
    if prep.mean is not None or prep.std is not None:
        model = dataclasses.replace(model, mean=prep.mean or model.mean, std=prep.std or model.std)
    return model, prep


def list_models(pattern: str = "*") -> list[str]:
    """Names of the zoo models matching a shell-style pattern.

    Args:
        pattern: fnmatch pattern, e.g. ``"cifar10_*"``.

    Returns:
        Sorted registered names (built-in and from the ``modelopt.model.loader`` entry point).

    Example:
        >>> list_models("cifar10_resnet2*")
        ['cifar10_resnet20']
    """
    return MODELS.names(pattern)


def load_model(
    source: str | Path | nn.Module = "cifar10_resnet20",
    weights: str | Path | None = None,
    *,
    allow_pickle: bool = False,
) -> LoadedModel:
    """Builds or reads a model and loads its weights.

    Args:
        source: A zoo name (see `list_models`), ``"torchvision:NAME"``, ``"timm:NAME"``, ``"package.module:factory"``
            (a callable taking no arguments that returns an ``nn.Module``), a path to a saved
            module, or an ``nn.Module`` (used as is; it is put in eval mode on CPU in float32).
        weights: A checkpoint to load into the architecture: a state dict, or a dict holding one
            under ``state_dict``/``model_state_dict``/``model``; a ``module.`` prefix is stripped.
            Zoo models default to their bundled weights.
        allow_pickle: Allow unpickling arbitrary objects (a whole saved module). Only for trusted files.

    Returns:
        The module with its name, input normalisation, input size and class count.

    Raises:
        LoadError: A file is missing, unreadable, pickled without ``allow_pickle``, or its
            weights do not fit the architecture; a factory cannot be imported or called.
        UnknownNameError: ``source`` names no zoo model or torchvision model.

    Example:
        >>> m = load_model("cifar10_resnet20")
        >>> m.input_size, m.num_classes
        ((32, 32), 10)
    """
    if isinstance(source, nn.Module):
        loaded = LoadedModel(source, type(source).__name__, IMAGENET_MEAN, IMAGENET_STD, None, None)
    elif isinstance(source, Path) or _looks_like_path(source):
        loaded = _from_file(Path(source), allow_pickle)
    elif source.startswith(("torchvision:", "timm:")):
        return _from_library(source, weights, allow_pickle)
    elif ":" in source:
        loaded = _from_factory(source)
    else:
        return _from_zoo(source, weights, allow_pickle)
    if weights is not None:
        apply_weights(loaded.module, load_weights(weights, allow_pickle=allow_pickle), weights, loaded.name)
    return _ready(loaded)


def _looks_like_path(source: str) -> bool:
    p = Path(source)
    if p.exists():
        return True
    if _FACTORY.match(source) or source.startswith("torchvision:"):
        return False
    return "/" in source or "\\" in source or p.suffix in WEIGHT_SUFFIXES


def _from_zoo(name: str, weights: str | Path | None, allow_pickle: bool) -> LoadedModel:
    entry = MODELS.get(name)
    if not isinstance(entry, ZooEntry):  # a third-party entry point may register a bare factory
        entry = ZooEntry(name, entry, IMAGENET_MEAN, IMAGENET_STD, None, None, None, name)
    module = entry.factory()
    with ExitStack() as stack:
        if weights is None:
            if entry.weights is None:
                raise LoadError(
                    f"zoo model {name!r} has no bundled weights; pass --weights FILE, a state dict or "
                    f"{{'state_dict': ...}} checkpoint ({entry.description})"
                )
            weights = stack.enter_context(resources.as_file(asset(entry.weights)))
        apply_weights(module, load_weights(weights, allow_pickle=allow_pickle), weights, name)
    return _ready(LoadedModel(module, name, entry.mean, entry.std, entry.input_size, entry.num_classes))


def _build_library_model(source: str, num_classes: int | None = None) -> nn.Module:
    """The architecture `source` names (``torchvision:NAME`` or ``timm:NAME``), random weights, with `num_classes`
    outputs (None: its own default); LoadError when the library is missing, UnknownNameError for a bad name."""
    library, arch = source.split(":", 1)
    extra = {"torchvision": "vision", "timm": "timm"}[library]
    try:
        lib = importlib.import_module(library)
    except ImportError:
        raise LoadError(f"{source!r} needs {library}; install it with pip install 'modelopt[{extra}]'") from None
    sized = {} if num_classes is None else {"num_classes": num_classes}
    if library == "timm":
        valid = lib.list_models()
        if arch not in valid:
            raise UnknownNameError("timm model", arch, valid)
        return lib.create_model(arch, pretrained=False, **sized)
    valid = lib.models.list_models()
    if arch not in valid:
        raise UnknownNameError("torchvision model", arch, valid)
    return lib.models.get_model(arch, weights=None, **sized)


def _from_library(source: str, weights: str | Path | None, allow_pickle: bool) -> LoadedModel:
    """A torchvision or timm architecture with weights from a file (no hub is reached): the head sized by the
    checkpoint's; without weights, random, its head sized later to the data (`LoadedModel.sized_to`). Normalisation:
    timm's pretrained config, ImageNet's for torchvision."""
    module = _build_library_model(source)
    if weights is None:
        log.warning("%s has random weights; pass --weights FILE to load trained ones", source)
    else:
        state = load_weights(weights, allow_pickle=allow_pickle)
        classes = _head_size(module, state)
        if classes is not None and classes != _head_size(module, module.state_dict()):
            module = _build_library_model(source, classes)
        apply_weights(module, state, weights, source)
    cfg = getattr(module, "pretrained_cfg", None) or {}
    mean = tuple(float(v) for v in cfg.get("mean", IMAGENET_MEAN))
    std = tuple(float(v) for v in cfg.get("std", IMAGENET_STD))
    num_classes = _head_size(module, module.state_dict())
    authors = Preprocess() if weights is None else _authors_preprocess(source, module, Path(weights).name)
    return _ready(LoadedModel(module, source, mean, std, None, num_classes, weights is None, authors))


def _authors_preprocess(source: str, module: nn.Module, weights_file: str) -> Preprocess:
    """How the authors of a library model's weights read images: for torchvision, the transforms of the weights
    enum member whose file `weights_file` is (a file of another name: nothing, said in one line); for timm, its
    pretrained config (the image size over crop_pct, then the image size)."""
    library, arch = source.split(":", 1)
    if library == "timm":
        cfg = getattr(module, "pretrained_cfg", None) or {}
        size, pct = cfg.get("input_size"), cfg.get("crop_pct")
        if not size or not pct or cfg.get("crop_mode", "center") != "center":
            return Preprocess()
        crop = int(size[-1])
        return Preprocess(int(crop / float(pct)), crop, _interpolation(cfg.get("interpolation")))
    import torchvision

    try:
        enum = torchvision.models.get_model_weights(arch)
    except (ValueError, KeyError):
        return Preprocess()
    member = next((m for m in enum if m.url.rsplit("/", 1)[-1] == weights_file), None)
    authors = _transforms_preprocess(member or enum.DEFAULT)
    if member is None:  # a user's own weights (a 10-class fine-tune of 32-pixel images, say): not the authors' reading
        if authors.active:
            log.warning("%s: weights file %r is none of torchvision's published files for it: images are read at "
                        "their own size (pass --resize %s --crop %s to read them as its authors' weights were trained)",
                        source, weights_file, authors.resize, authors.crop)
        return Preprocess()
    return authors


def _transforms_preprocess(member: Any) -> Preprocess:
    """The resize, crop and interpolation of a torchvision weights enum member's transforms."""
    t = member.transforms()
    resizes, crops = getattr(t, "resize_size", None), getattr(t, "crop_size", None)
    if not resizes or not crops:
        return Preprocess()
    mode = getattr(getattr(t, "interpolation", None), "value", None)
    return Preprocess(int(resizes[0]), int(crops[0]), _interpolation(mode))


def _interpolation(name: object) -> str:
    return name if isinstance(name, str) and name in INTERPOLATIONS else "bilinear"


def _head_size(module: nn.Module, state: Mapping[str, Tensor]) -> int | None:
    """Outputs of the last Linear/Conv2d (the classifier in torchvision's layouts), read from `state`."""
    heads = [n for n, m in module.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    key = f"{heads[-1]}.weight" if heads else ""
    return int(state[key].shape[0]) if key in state else None


def _from_factory(source: str) -> LoadedModel:
    if not _FACTORY.match(source):
        raise LoadError(f"malformed model source {source!r}; expected 'package.module:factory'")
    module_name, attr = source.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except SystemExit as exc:
        raise LoadError(f"importing {module_name!r} for model source {source!r} called exit({exc.code!r})") from None
    except ImportError as exc:
        raise LoadError(
            f"cannot import {module_name!r} for model source {source!r}: {first_line(exc)}; "
            "check that it is installed or on PYTHONPATH"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise LoadError(f"{module_name!r} has no attribute {attr!r} (model source {source!r}); expected a factory")
        obj = getattr(obj, part)
    if not callable(obj):
        raise LoadError(f"{source!r} is a {type(obj).__name__}, not a callable returning an nn.Module")
    try:
        inspect.signature(obj).bind()
    except TypeError:
        raise LoadError(f"factory {source!r} needs arguments; it must be callable with none") from None
    except ValueError:  # no signature (builtins): just try it
        pass
    try:
        module = obj()
    except SystemExit as exc:  # exit() inside a factory: without this the run ended at once, exit 0, silent
        raise LoadError(f"factory {source!r} called exit({exc.code!r}) instead of returning an nn.Module") from None
    except Exception as exc:  # the user's factory failed: one line names it (the cause is chained)
        raise LoadError(f"factory {source!r} raised {first_line(exc)}") from exc
    if not isinstance(module, nn.Module):
        raise LoadError(f"factory {source!r} returned a {type(module).__name__}, not an nn.Module")
    return LoadedModel(module, source, IMAGENET_MEAN, IMAGENET_STD, None, None)


def _from_file(path: Path, allow_pickle: bool) -> LoadedModel:
    obj = read_checkpoint(path, allow_pickle)
    if isinstance(obj, nn.Module):
        return LoadedModel(obj, str(path), IMAGENET_MEAN, IMAGENET_STD, None, None)
    if state_dict_of(obj) is not None:
        raise LoadError(
            f"{str(path)!r} holds a state dict without an architecture; pass --model ARCH --weights FILE "
            "(load_model(ARCH, weights=FILE))"
        )
    raise LoadError(f"{str(path)!r} holds a {type(obj).__name__}, not a saved nn.Module or state dict")


def _ready(loaded: LoadedModel) -> LoadedModel:
    """On the CPU in float32 and eval mode, attention's projections as Linear layers (`unfuse_attention`)."""
    loaded.module.to("cpu").float().eval()
    unfuse_attention(loaded.module)
    return loaded
