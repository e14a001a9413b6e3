"""A workload: the model resident on its device, its compressible layers, data splits and baseline."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from modelopt.data.dataset import Dataset, peek_num_classes
from modelopt.data.split import Split, check_split
from modelopt.errors import ConfigError, LoadError
from modelopt.model.analysis import Analyses, Layers, ModelView
from modelopt.model.images import Images
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.layers import LayerKind, compressible_modules, discover_layers
from modelopt.model.loader import LoadedModel

# Splits whose prepared images together fit in this many bytes are held prepared (every CIFAR-10 set fits; measured:
# docs/models-and-data.md#measured); larger ones stay uint8 and are prepared batch by batch as they are read.
RESIDENT_BYTES = 256 * 2**20
# A batch's prepared input at most this big (a pass's peak memory grows with it; measured:
# docs/models-and-data.md#measured): batches of large images are smaller.
PREPARE_BYTES = 32 * 2**20  # images converted at a time
BATCH_BYTES = {"cpu": 32 * 2**20, "cuda": 256 * 2**20}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """'auto' is CUDA when present, else the CPU; an unavailable device is a clear error."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown device {device!r}; valid: auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for but no CUDA device is available; use --device cpu or auto")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r} is not supported; valid: auto, cpu, cuda, cuda:N")
    return dev


def check_head(model: LoadedModel, data: object) -> None:
    """Refuses a model whose head cannot answer `data`'s labels before the data are decoded (minutes for a large
    JPEG set), where both are cheap to know (`LoadedModel.num_classes`, `peek_num_classes`); `Workload` checks the
    decoded data's labels against the model's outputs in any case."""
    if model.num_classes is None or model.random_head:  # unknown, or sized to the data's classes when built
        return
    classes = peek_num_classes(data)
    if classes is not None and classes > model.num_classes:
        source = data.source if isinstance(data, Dataset) else str(data)
        raise LoadError(_labels_beyond(source, classes, model.name, model.num_classes))


def _labels_beyond(source: str, classes: int, name: str, outputs: int) -> str:
    return f"data {source!r} has labels up to {classes - 1} but model {name!r} has {outputs} outputs"


@dataclass(frozen=True)
class SplitData:
    """One split on the evaluator's device, with the uncompressed model's predictions."""

    x: Images  # float NCHW, normalised, prepared as read (x[a:b] is a tensor)
    y: torch.Tensor  # int64
    base_pred: torch.Tensor  # top-1 of the uncompressed model

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def base_correct(self) -> torch.Tensor:
        return self.base_pred == self.y


class Workload:
    """The model, its compressible layers and the splits, all on one device.

    Example:
        >>> wl = Workload(load_model("cifar10_resnet20"), load_data("cifar10-sample"))
        >>> wl.baseline_accuracy("val")
    """

    def __init__(
        self, model: LoadedModel, data: Dataset, device: str | torch.device = "auto", batch_size: int | None = None
    ) -> None:
        model = model.sized_to(data.num_classes)  # a random torchvision head: as many outputs as the data's classes
        self.name = model.name
        self.source = model
        # How the images were read (resize, crop, mean, std and whose they are), set by whoever decoded them
        # (`modelopt.config.build.load_workload`) for the run's record; empty for a workload built otherwise.
        self.read_as: dict[str, object] = {}
        self.data = data
        self.device = resolve_device(device)
        self.batch_size = batch_size or (1024 if self.device.type == "cuda" else 128)
        self.model = model.module.to(self.device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.modules: dict[str, nn.Module] = compressible_modules(self.model)
        self.original: dict[str, torch.Tensor] = {n: m.get_parameter("weight").data for n, m in self.modules.items()}
        # (layer, compressors, choices) -> compressed weight on the device; filled by evaluators.
        self.tensor_cache: dict[tuple[object, ...], torch.Tensor] = {}
        # The same keys (and (key, refit digest)) -> the bytes the packed file's segments take for that weight (None:
        # dense float32); filled by evaluators (`modelopt.evaluation.coded`).
        self.coded_cache: dict[tuple[object, ...], int | None] = {}
        # calib images -> each layer's input second moments on them (GPTQ); filled by evaluators.
        self.input_cache: dict[int, dict[str, LayerInputs]] = {}
        names = (Split.CALIB, Split.VAL, Split.TEST) + ((Split.CONFIRM,) if data.confirm is not None else ())
        # What the model makes of two images, and whether the data's labels fit its outputs, before all are prepared.
        two = self._prepare(data.split(Split.VAL).x[:2])
        self._check_fits(two)
        self._check_labels()
        per_image = 4 * two[0].numel()
        if batch_size is None:
            self.batch_size = max(1, min(self.batch_size, BATCH_BYTES[self.device.type] // per_image))
        resident = sum(len(data.split(n)) for n in names) * per_image <= RESIDENT_BYTES
        splits = {name: Images(data.split(name).x, self._prepare, two.shape[1:], self.device, resident)
                  for name in names}
        # What compressors need to know of the model's graph beyond its layers, each analysis built the first time
        # one asks for it (a search space does, for its compressors' menus: `modelopt.model.analysis`) and kept.
        self.analyses = Analyses(ModelView(self.model, self.modules, two))
        self.layers = Layers(discover_layers(self.model, two[:1]), self.analyses)
        # Image batches run channels-last on the CPU when convolutions do most of the work: oneDNN's convolutions
        # run NHWC and reorder an NCHW input at every layer (`laid_out`); a transformer's one patch conv does not pay.
        conv = sum(x.macs for x in self.layers if x.kind is LayerKind.CONV)
        self.channels_last = self.device.type == "cpu" and 2 * conv > sum(x.macs for x in self.layers)
        self.splits: dict[str, SplitData] = {}
        for name, x in splits.items():
            y = data.split(name).y.to(self.device)
            self.splits[name] = SplitData(x, y, self.predict(x))
        self.other_bytes = _float_bytes_outside_weights(self.model, self.modules)
        self.float_size_bytes = self.other_bytes + sum(layer.params * 4 for layer in self.layers)
        self.macs = sum(layer.macs for layer in self.layers)

    # ---- data -----------------------------------------------------------------------------

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 NHWC images (as data sources hold them) -> normalised float NCHW on the device."""
        return self._prepare(x)

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        if self.data.preprocessed:
            return x.to(self.device, torch.float32)
        h, w = int(x.shape[1]), int(x.shape[2])
        if self.source.input_size is not None and (h, w) != tuple(self.source.input_size):
            ih, iw = self.source.input_size
            raise LoadError(f"data images are {h}x{w} but model {self.name!r} expects {ih}x{iw}; "
                            "pass data of that size")
        mean = torch.tensor(self.source.mean, device=self.device).view(1, -1, 1, 1)
        std = torch.tensor(self.source.std, device=self.device).view(1, -1, 1, 1)
        out = torch.empty((x.shape[0], x.shape[3], h, w), device=self.device)
        step = max(1, PREPARE_BYTES // (4 * x.shape[3] * h * w))  # the float temporaries stay small
        for i in range(0, x.shape[0], step):
            chunk = x[i : i + step].to(self.device).permute(0, 3, 1, 2).float().div_(255)
            out[i : i + step] = (chunk - mean) / std
        return out.contiguous()

    def _check_fits(self, x: torch.Tensor) -> None:
        try:
            with torch.inference_mode():
                out = self.model(x[:2])
        except Exception as exc:  # noqa: BLE001 -- any failure here means data and model do not fit
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LoadError(
                f"data of shape {tuple(x.shape[1:])} does not fit model {self.name!r}: {first}"
            ) from None
        if not isinstance(out, torch.Tensor) or out.dim() != 2:
            got = getattr(out, "shape", type(out))
            raise LoadError(f"model {self.name!r} must return (batch, classes) logits; got {got}")
        self.num_outputs = int(out.shape[1])

    def _check_labels(self) -> None:
        if self.data.num_classes > self.num_outputs:
            raise LoadError(_labels_beyond(self.data.source, self.data.num_classes, self.name, self.num_outputs))

    def fingerprints(self) -> dict[str, str]:
        """Content hashes of the loaded weights and of the val/test data: a run folder can be
        resumed only on the same model and data, wherever their files have moved since."""
        model = hashlib.sha256()
        for name, t in self.model.state_dict().items():
            model.update(name.encode())
            model.update(t.detach().cpu().contiguous().numpy().tobytes())
        data = hashlib.sha256()
        for split in (Split.VAL, Split.TEST) + ((Split.CONFIRM,) if self.data.confirm is not None else ()):
            src = self.data.split(split)
            # The arrays' own buffers: tobytes() would copy a large uint8 store whole.
            data.update(src.x.cpu().contiguous().numpy().data)
            data.update(src.y.cpu().contiguous().numpy().data)
        return {"model_sha256": model.hexdigest()[:16], "data_sha256": data.hexdigest()[:16]}

    def split(self, name: str) -> SplitData:
        if name == Split.ALL:
            v, t = self.splits[Split.VAL], self.splits[Split.TEST]
            return SplitData(Images.cat([v.x, t.x]), torch.cat([v.y, t.y]), torch.cat([v.base_pred, t.base_pred]))
        check_split(name)
        if name not in self.splits:  # CONFIRM, of a source loaded without one
            raise ConfigError(f"data {self.data.source!r} has no confirm split; load it with confirm_fraction > 0")
        return self.splits[name]

    def baseline_accuracy(self, split: str = Split.VAL) -> float:
        return float(self.split(split).base_correct.float().mean())

    # ---- running the model ----------------------------------------------------------------

    def logits(self, x: torch.Tensor | Images) -> torch.Tensor:
        with torch.inference_mode():
            return torch.cat([self.model(self.laid_out(x[i : i + self.batch_size]))
                              for i in range(0, x.shape[0], self.batch_size)])

    def laid_out(self, batch: torch.Tensor) -> torch.Tensor:
        """`batch` in the memory layout the model runs fastest in (`channels_last`): the same values, so the same
        answers to float rounding; a convolutional network's image batches channels-last on the CPU, where plans
        score faster so (measured: docs/models-and-data.md#measured); as it is otherwise."""
        if not self.channels_last or batch.dim() != 4 or not batch.is_floating_point():
            return batch
        return batch.contiguous(memory_format=torch.channels_last)

    def predict(self, x: torch.Tensor | Images) -> torch.Tensor:
        return self.logits(x).argmax(dim=1)

    @contextlib.contextmanager
    def weights(self, weights: Mapping[str, torch.Tensor]) -> Iterator[None]:
        """Swaps the given layer weights into the resident model, restoring the originals after."""
        try:
            for name, w in weights.items():
                self.modules[name].weight.data = w
            yield
        finally:
            for name in weights:
                self.modules[name].weight.data = self.original[name]

    @contextlib.contextmanager
    def state(self, tensors: Mapping[str, torch.Tensor]) -> Iterator[None]:
        """Swaps parameters and buffers by state_dict name (weights, norms, statistics), restoring after.

        Example:
            >>> with wl.state({"layer1.0.bn1.weight": w, "layer1.0.bn1.running_var": v}):
            ...     wl.predict(x)
        """
        modules = dict(self.model.named_modules())
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            for name, t in tensors.items():
                owner, _, attr = name.rpartition(".")
                cur = getattr(modules.get(owner), attr, None)
                if not isinstance(cur, torch.Tensor):
                    raise ConfigError(f"model {self.name!r} has no tensor {name!r}")
                saved.append((cur, cur.data))
                cur.data = t
            yield
        finally:
            for cur, data in reversed(saved):
                cur.data = data


def _float_bytes_outside_weights(model: nn.Module, layers: Mapping[str, nn.Module]) -> int:
    """Bytes of everything the packed export keeps in float32: biases, folded norms, other tensors."""
    total = 0
    layer_ids = {id(m) for m in layers.values()}
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            # Inference needs only the folded scale and shift per channel.
            total += 2 * mod.num_features * 4
            continue
        for pname, t in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            if id(mod) in layer_ids and pname == "weight":
                continue
            if t.is_floating_point():
                total += t.numel() * 4
    return total
