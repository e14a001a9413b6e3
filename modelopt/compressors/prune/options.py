"""Pruning's options record (`modelopt.compressors.prune.Prune` takes it): one default each, the tool's.

The record refuses a value `Prune` cannot use when it is built (a keyword, a sweep cell, run.json read back), so
`Prune` only reads it; its fields keep the values as given (run.json writes them), and `shares`, `kinds` and
`ranking` are what the search is offered, in the types plans use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from modelopt.compressors._options import Options, option
from modelopt.compressors._surface import SettingKind
from modelopt.errors import ConfigError

__all__ = ["DEFAULT_BN_SAMPLES", "DEFAULT_REPAIR_IMAGES", "DEFAULT_SPARSITY", "Criterion", "PruneKind",
           "PruneOptions", "prune_kind", "sparsity_share"]

DEFAULT_SPARSITY = (0.25, 0.5, 0.75)
DEFAULT_BN_SAMPLES = 512
DEFAULT_REPAIR_IMAGES = 256  # the calibration images GPTQ measures too: one float pass serves both


class PruneKind(str, Enum):
    UNSTRUCTURED = "unstructured"
    STRUCTURED = "structured"
    SEMI = "2:4"  # two of every four consecutive weights of a row kept (GPU sparse tensor cores); sparsity 0.5


class Criterion(str, Enum):
    L1 = "l1"
    L2 = "l2"
    # The channels whose removal costs their reader's refitted output least (`least_squares.output_kept`), where a
    # group has one plain reader and repair is on; L1 elsewhere.
    OUTPUT = "output"


@dataclass(frozen=True)
class PruneOptions(Options):
    """What `Prune` offers the search and how it calibrates (the fields are its keywords; see `Prune`)."""

    # 2: SparseGPT masks and the refit of removed channels' readers became the defaults (version 1: magnitude
    # masks, no repair).
    version: ClassVar[int] = 2
    left_out: ClassVar[dict[int, dict[str, Any]]] = {1: {
        "sparsity": DEFAULT_SPARSITY, "kind": ("unstructured", "structured"), "criterion": "l1",
        "bn_samples": DEFAULT_BN_SAMPLES, "repair_images": 0, "channel_multiple": 1, "sparse_images": 0,
    }}

    sparsity: tuple[float, ...] = option(DEFAULT_SPARSITY, SettingKind.FLOATS, "Shares of weights (unstructured) "
                                         "or channels (structured) pruning offers per layer, e.g. 0.25,0.5,0.75.")
    # In ONNX Runtime's integer kernels a stage cut below 16 channels ran slower than whole, cuts to multiples of 16
    # faster (measured: docs/compressors.md#measured).
    channel_multiple: int = option(1, SettingKind.INT, "Structured choices keep a multiple of this many channels "
                                   "(default 1: any; 16 for --objective latency, what integer kernels run fast).",
                                   {"latency": 16})
    sparse_images: int = option(DEFAULT_REPAIR_IMAGES, SettingKind.INT, "Calibration images unstructured (and 2:4) "
                                "pruning chooses which weights go on and pushes their loss onto the weights kept "
                                "(SparseGPT; default 256; 0: magnitude alone).")
    repair_images: int = option(DEFAULT_REPAIR_IMAGES, SettingKind.INT, "Calibration images the layers reading "
                                "removed channels are refitted on by least squares, to give the float output from "
                                "the channels left (default 256; 0: no repair).")
    # Unstructured sparsity leaves the multiply-accumulates of a dense kernel in place: for latency only channels
    # are offered.
    kind: tuple[str, ...] = option(("unstructured", "structured"), SettingKind.NAMES, "Pruning kinds offered: "
                                   "unstructured, structured (channels), 2:4 (two of every four weights, what GPU "
                                   "sparse tensor cores run); default unstructured and structured, structured alone "
                                   "for --objective latency.", {"latency": ("structured",)})
    criterion: str = option("l1")
    bn_samples: int = option(DEFAULT_BN_SAMPLES)

    def check(self) -> None:
        for check in _CHECKS:
            check(self)

    # What the search is offered, in the types plans use: each offer once, in the order given (the fields keep
    # what was given, which run.json writes).
    @property
    def shares(self) -> tuple[float, ...]:
        """The sparsities offered."""
        return tuple(dict.fromkeys(float(s) for s in self.sparsity))

    @property
    def kinds(self) -> tuple[PruneKind, ...]:
        """The pruning kinds offered."""
        return tuple(dict.fromkeys(PruneKind(k) for k in self.kind))

    @property
    def ranking(self) -> Criterion:
        """How structured pruning ranks channels."""
        return Criterion(self.criterion)


def sparsity_share(value: object, where: str) -> float:
    """`value` as a share of weights or channels pruned, in (0, 1); ConfigError naming `where` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:  # no float(): 10**400
        raise ConfigError(f"{where}: sparsity {value!r} is not a share in (0, 1); e.g. 0.5 removes half")
    return float(value)


def prune_kind(value: object) -> PruneKind:
    """`value` as a pruning kind; ConfigError listing the kinds otherwise."""
    try:
        return PruneKind(value)
    except ValueError:
        raise ConfigError(f"prune: kind {value!r} not offered; valid: unstructured, structured, 2:4") from None


def _whole(name: str, value: object, least: int, meaning: str = "") -> None:
    """Refuses `value` unless it is an integer >= `least`, naming the option."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"prune: {name} must be an integer >= {least}{meaning}, got {value!r}")


def _check_sparsity(o: PruneOptions) -> None:
    if not o.sparsity:
        raise ConfigError("prune: sparsity is empty; offer shares in (0, 1) such as 0.25,0.5,0.75")
    for s in o.sparsity:
        sparsity_share(s, "prune")


def _check_kind(o: PruneOptions) -> None:
    for k in o.kind:
        prune_kind(k)
    if not o.kind:
        raise ConfigError("prune: kind is empty; valid: unstructured, structured, 2:4")


def _check_criterion(o: PruneOptions) -> None:
    try:
        Criterion(o.criterion)
    except ValueError:
        raise ConfigError(f"prune: criterion {o.criterion!r} not offered; valid: output, l1, l2") from None


def _check_counts(o: PruneOptions) -> None:
    _whole("bn_samples", o.bn_samples, 0, " (0: no re-estimation)")
    _whole("repair_images", o.repair_images, 0, " (0: no repair)")
    _whole("sparse_images", o.sparse_images, 0, " (0: magnitude)")
    _whole("channel_multiple", o.channel_multiple, 1)


_CHECKS: tuple[Callable[[PruneOptions], None], ...] = (_check_sparsity, _check_kind, _check_criterion, _check_counts)
