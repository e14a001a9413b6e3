"""A plan's Linear layers as bitsandbytes modules, and how closely they follow the QDQ evaluation.

`to_bitsandbytes` copies the workload's model with the plan's weights (`Evaluator.physical_model`:
pruning, re-estimated batch norms and quantize-dequantized weights included) and swaps each
``nn.Linear`` the plan quantizes to 8 or 4 bits for a bitsandbytes module:

- INT8 -> ``bnb.nn.Linear8bitLt`` (``has_fp16_weights=False``, ``threshold=0.0``: no fp16 outlier
  path; a subclass whose int8 state follows the model's ``.to(device)``). Per-channel and
  per-tensor plans load *our* int8 codes as its ``CB`` and our float16
  scales as its row statistics (``SCB = scale * 127``), so its weight is exactly the one the
  evaluator scored. bitsandbytes also quantizes each input row to int8 (absmax, via float16),
  which the QDQ evaluation does not: that is where the two differ. Group-wise scales do not fit
  its one-scale-per-row format; there bitsandbytes quantizes the layer's weight itself.
- INT4 -> ``bnb.nn.Linear4bit`` (nf4 or fp4, blocks of 64). Its 4-bit codebooks are not our
  uniform INT4 grid, so it quantizes the layer's weight (after any pruning, before our quantizer)
  in its own format, and `bitsandbytes_agreement` measures what that costs.

Other bit widths, unquantized Linear layers and every Conv2d (bitsandbytes has no convolution)
keep their QDQ weights in float. Early-exit choices change no weight and are not part of the copy.
bitsandbytes is optional (``pip install 'modelopt[gpu]'``) and imported only here, on first use.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from modelopt.compressors.contract import Granularity, IntegerWeight
from modelopt.data.split import Split
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.model.layers import LayerKind
from modelopt.plan.plan import Plan

if TYPE_CHECKING:  # annotations only: bitsandbytes is imported on first use (`_bnb`)
    import bitsandbytes

__all__ = ["BitsandbytesAgreement", "LinearConversion", "bitsandbytes_agreement", "to_bitsandbytes"]

QUANT_TYPES = ("nf4", "fp4")
BLOCKSIZE = 64
# Older releases run Linear8bitLt/Linear4bit on the CPU wrongly or not at all (checked on the CPU: the releases
# tried are in docs/export-and-latency.md#measured).
MIN_CPU_VERSION = (0, 47)
# bitsandbytes' packed AVX512-BF16 CPU kernel for 4-bit needs out_features divisible by this.
_CPU_PACK_BLOCK_N = 32


@dataclass(frozen=True)
class LinearConversion:
    """One Linear layer swapped for a bitsandbytes module.

    `codes`: ``"modelopt"`` when it holds the codes and scales the evaluator scored,
    ``"bitsandbytes"`` when bitsandbytes quantized the weight in its own format.
    """

    layer: str
    spec: str  # the plan's choice, e.g. "int8/per_channel"
    module: str  # "Linear8bitLt", "Linear4bit/nf4"
    codes: str


@dataclass(frozen=True)
class BitsandbytesAgreement:
    """The bitsandbytes model against the QDQ evaluation of the same plan on one split."""

    split: str
    n_samples: int
    device: str
    bnb_accuracy: float  # top-1 accuracy of the bitsandbytes model
    qdq_accuracy: float  # `Evaluator.evaluate(plan, split).accuracy`
    agreement: float  # fraction of samples whose top-1 class is the same in both
    max_abs_logit_diff: float
    converted: tuple[LinearConversion, ...]
    bnb_version: str


def to_bitsandbytes(evaluator: Evaluator, plan: Plan | Realised, *, quant_type: str = "nf4") -> nn.Module:
    """A copy of the workload's model running the plan's INT8/INT4 Linear layers in bitsandbytes.

    Args:
        evaluator: the evaluator that scores `plan` (its workload's model and device are used).
        plan: the plan; Linear layers it stores as 8- or 4-bit integers are converted.
        quant_type: bitsandbytes' 4-bit format for INT4 layers, ``"nf4"`` or ``"fp4"``.

    Returns:
        The model in eval mode on the workload's device; Conv2d layers stay float (QDQ weights).

    Raises:
        ConfigError: bitsandbytes is not installed, `quant_type` is unknown, or the workload is
            on the CPU and the installed bitsandbytes cannot run there.

    Example:
        >>> net = to_bitsandbytes(ev, plan_int8)
        >>> type(net.fc).__name__
        'Linear8bitLt'
    """
    return _convert(evaluator, plan, quant_type)[0]


def bitsandbytes_agreement(
    evaluator: Evaluator, plan: Plan | Realised, split: str = Split.VAL, *, quant_type: str = "nf4"
) -> BitsandbytesAgreement:
    """Runs `to_bitsandbytes(evaluator, plan)` on `split` and compares it with the QDQ evaluation.

    Example:
        >>> a = bitsandbytes_agreement(ev, plan_int8)
        >>> a.agreement, a.max_abs_logit_diff
    """
    r = evaluator.realise(plan)
    model, converted = _convert(evaluator, r, quant_type)
    wl = evaluator.workload
    data = wl.split(split)
    state = evaluator.state(r)
    with wl.state(state):
        qdq = wl.logits(data.x)
    with _quiet(), torch.inference_mode():
        out = torch.cat([model(wl.laid_out(data.x[i : i + wl.batch_size]))  # as the simulation ran them
                         for i in range(0, data.x.shape[0], wl.batch_size)])
    out = out.float()
    pred = out.argmax(dim=1)
    return BitsandbytesAgreement(
        split=split,
        n_samples=int(data.x.shape[0]),
        device=str(wl.device),
        bnb_accuracy=float((pred == data.y).float().mean()),
        qdq_accuracy=evaluator.evaluate(r, split).accuracy,
        agreement=float((pred == qdq.argmax(dim=1)).float().mean()),
        max_abs_logit_diff=float((out - qdq).abs().max()),
        converted=converted,
        bnb_version=_bnb().__version__,
    )


# ---- conversion ---------------------------------------------------------------------------


def _bnb() -> ModuleType:
    try:
        import bitsandbytes
    except ImportError:
        raise ConfigError("running Linear layers in bitsandbytes needs it: pip install 'modelopt[gpu]'") from None
    return bitsandbytes


def _check_device(bnb: ModuleType, device: torch.device) -> None:
    if device.type != "cpu":
        return
    version = tuple(int(p) for p in bnb.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_CPU_VERSION:
        need = ".".join(map(str, MIN_CPU_VERSION))
        raise ConfigError(
            f"bitsandbytes {bnb.__version__} cannot run on the CPU; use a CUDA device or "
            f"pip install 'bitsandbytes>={need}'"
        )


def _convert(evaluator: Evaluator, plan: Plan | Realised, quant_type: str
             ) -> tuple[nn.Module, tuple[LinearConversion, ...]]:
    bnb = _bnb()
    if quant_type not in QUANT_TYPES:
        raise ConfigError(f"bitsandbytes quant_type {quant_type!r} not offered; valid: {', '.join(QUANT_TYPES)}")
    device = evaluator.workload.device
    _check_device(bnb, device)
    r = evaluator.realise(plan)
    model = evaluator.physical_model(r)
    modules = dict(model.named_modules())
    converted = []
    for layer in evaluator.workload.layers:
        if layer.kind is not LayerKind.LINEAR:
            continue
        steps = r.steps[layer.name]
        # The integer form and the weight it was encoded from (after any pruning): what was scored.
        first = next((i for i, step in enumerate(steps) if step.form.integer is not None), None)
        integer = steps[-1].form.integer
        if first is None or integer is None or integer.bits not in (8, 4):
            continue
        linear = modules[layer.name]
        assert isinstance(linear, nn.Linear)
        pre = steps[first - 1].form.weight
        if integer.bits == 8:
            new, codes = _int8_linear(bnb, linear, pre, integer)
            kind = "Linear8bitLt"
        else:
            new, codes = _4bit_linear(bnb, linear, pre, quant_type, device), "bitsandbytes"
            kind = f"Linear4bit/{quant_type}"
        parent, _, attr = layer.name.rpartition(".")
        setattr(modules[parent] if parent else model, attr, new)
        converted.append(LinearConversion(layer.name, str(steps[first].choice), kind, codes))
    return model.to(device).eval(), tuple(converted)


def _int8_linear(bnb: ModuleType, linear: nn.Linear, pre: torch.Tensor, integer: IntegerWeight
                 ) -> tuple[nn.Module, str]:
    new = _linear8bitlt(bnb)(linear.in_features, linear.out_features, bias=linear.bias is not None,
                             has_fp16_weights=False, threshold=0.0)
    if linear.bias is not None:
        new.bias = nn.Parameter(linear.bias.detach().float().cpu().clone(), requires_grad=False)
    if integer.granularity is not Granularity.GROUP:
        # The plan's own codes and scales (`Compressor.pack`), when they are what the copy holds.
        if torch.equal(integer.dequantize().to(linear.weight.dtype), linear.weight.data):
            codes = integer.codes.cpu().contiguous()
            scb = (integer.scales.float().cpu() * 127.0).expand(linear.out_features).contiguous()
            new.weight = bnb.nn.Int8Params(codes, requires_grad=False, has_fp16_weights=False, CB=codes, SCB=scb)
            return new, "modelopt"
    # One scale per row cannot hold group-wise scales: bitsandbytes quantizes the weight (on `.to`).
    new.weight = bnb.nn.Int8Params(pre.detach().float().cpu().clone(), requires_grad=False, has_fp16_weights=False)
    return new, "bitsandbytes"


def _linear8bitlt(bnb: ModuleType) -> type[nn.Module]:
    """bitsandbytes' Linear8bitLt whose int8 state moves with it (`Module.to` of a parent included).

    A parent's ``.to(device)`` runs ``Module._apply``, which swaps each parameter's ``.data`` but
    not the ``CB``/``SCB`` attributes bitsandbytes keeps on the weight (and, after the first call,
    in ``state``), and never calls the child's own ``to``: a model built on the CPU and moved to
    CUDA then fails with "Expected a cuda device, but got: cpu". This subclass applies the same
    move to them.
    """
    cls = _CLASSES.get("Linear8bitLt")
    if cls is None:

        def _apply(self: bitsandbytes.nn.Linear8bitLt, fn: Any, recurse: bool = True) -> nn.Module:
            bnb.nn.Linear8bitLt._apply(self, fn, recurse)
            w = self.weight
            # The weight is an Int8Params (nn.Linear types it Tensor): CB/SCB are bitsandbytes' attributes.
            holders: tuple[Any, ...] = (w, self.state)
            for holder in holders:
                if getattr(holder, "CB", None) is not None:
                    holder.CB = w.data  # the codes are the weight's data (bitsandbytes aliases them)
                scb = getattr(holder, "SCB", None)
                if scb is not None:
                    holder.SCB = fn(scb).to(scb.dtype)  # a device move; the statistics stay float32
            return self

        cls = type("Linear8bitLt", (bnb.nn.Linear8bitLt,), {"_apply": _apply, "__module__": __name__,
                                                             "__doc__": _linear8bitlt.__doc__})
        _CLASSES["Linear8bitLt"] = cls
    return cls


_CLASSES: dict[str, type[nn.Module]] = {}


def __getattr__(name: str) -> Any:
    # Pickle finds the subclass by name here, building it on first use (bitsandbytes stays lazy).
    if name == "Linear8bitLt":
        return _linear8bitlt(_bnb())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _4bit_linear(bnb: ModuleType, linear: nn.Linear, pre: torch.Tensor, quant_type: str, device: torch.device
                 ) -> nn.Module:
    new = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                            compute_dtype=torch.float32, compress_statistics=False, quant_type=quant_type)
    if linear.bias is not None:
        new.bias = nn.Parameter(linear.bias.detach().float().cpu().clone(), requires_grad=False)
    # Quantized by bitsandbytes when the module moves to its device.
    new.weight = bnb.nn.Params4bit(pre.detach().float().cpu().clone(), requires_grad=False, blocksize=BLOCKSIZE,
                                   compress_statistics=False, quant_type=quant_type, module=new)
    if device.type == "cpu" and linear.out_features % _CPU_PACK_BLOCK_N:
        new.support_avx512bf16_for_cpu = False  # its packed kernel would fail; the generic path runs
    return new


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silences bitsandbytes' per-call notices (float32 inputs cast to float16 for INT8, and the like)."""
    logger = logging.getLogger("bitsandbytes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
