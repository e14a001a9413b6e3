"""Pruning's options record (`modelopt.compressors.prune.Prune` takes it): one default each, the tool's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from modelopt.compressors._options import Options, option
from modelopt.compressors._surface import SettingKind

__all__ = ["DEFAULT_BN_SAMPLES", "DEFAULT_REPAIR_IMAGES", "DEFAULT_SPARSITY", "PruneOptions"]

DEFAULT_SPARSITY = (0.25, 0.5, 0.75)
DEFAULT_BN_SAMPLES = 512
DEFAULT_REPAIR_IMAGES = 256  # the calibration images GPTQ measures too: one float pass serves both


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
    # Measured in ONNX Runtime (ResNet-20, W8A8, batch 1): a 16-channel stage cut to 12, 8 or 4 channels ran slower
    # than whole (0.394 / 0.382 / 0.373 against 0.355 ms); 32 -> 16 and 64 -> 48 / 32 / 16 faster.
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
