"""How a layer's weight is stored: bit-packed codes, kept-weight masks, scales, and the stored form's records.

Export asks each compressor of a layer's chain, in order, for its part of the stored form
(`Compressor.pack` -> `WeightForm`): pruning adds the kept-weight mask, quantization the integer
codes and scales (`IntegerWeight`). The writers (`modelopt.exporters`) store those forms and never
ask which compressor made them. Size accounting (`Storage`, `Compressor.stored`) counts the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import torch

__all__ = ["SCALE_BYTES", "SCALE_DTYPE", "Granularity", "IntegerWeight", "Storage", "WeightForm", "code_range",
           "decode_mask", "encode_mask", "index_bytes_per_entry", "pack_codes", "scale_units", "sparse_encoding",
           "sparse_index_bytes", "to_scale_dtype", "unpack_codes"]

SCALE_BYTES = 2  # float16 scales
SCALE_DTYPE = torch.float16
_MIN_SCALE = 2.0**-24  # smallest positive float16 (subnormal): a scale never rounds to zero


def index_bytes_per_entry(numel: int) -> int:
    """Bytes of one position in an index list over `numel` weights (smallest unsigned int that fits)."""
    return 1 if numel <= 2**8 else 2 if numel <= 2**16 else 4


def sparse_index_bytes(numel: int, kept: int) -> int:
    """Bytes saying which of `numel` weights are kept: the cheaper of a bitmask and an index list."""
    return min(math.ceil(numel / 8), kept * index_bytes_per_entry(numel))


def sparse_encoding(numel: int, kept: int) -> str:
    """``mask`` (one bit per weight) or ``index`` (kept positions), whichever is smaller."""
    return "index" if kept * index_bytes_per_entry(numel) < math.ceil(numel / 8) else "mask"


def encode_mask(mask: torch.Tensor) -> np.ndarray:
    """The bytes saying which weights are kept: packed bits or little-endian positions."""
    flat = mask.reshape(-1).cpu().numpy()
    if sparse_encoding(flat.size, int(flat.sum())) == "mask":
        return np.packbits(flat, bitorder="little")
    width = index_bytes_per_entry(flat.size)
    return np.flatnonzero(flat).astype(f"<u{width}").view(np.uint8)


def decode_mask(buf: np.ndarray, shape: Sequence[int], kept: int) -> torch.Tensor:
    """Inverse of `encode_mask` (reads exactly `sparse_index_bytes(numel, kept)` bytes)."""
    numel = math.prod(shape)
    if sparse_encoding(numel, kept) == "mask":
        flat = np.unpackbits(buf[: math.ceil(numel / 8)], bitorder="little")[:numel].astype(bool)
    else:
        width = index_bytes_per_entry(numel)
        pos = buf[: kept * width].view(f"<u{width}").astype(np.int64)
        flat = np.zeros(numel, dtype=bool)
        flat[pos] = True
    return torch.from_numpy(flat).reshape(tuple(shape))


class Granularity(str, Enum):
    """Which weights share one scale: the tensor, an output channel, or `group_size` consecutive
    input weights of one output channel."""

    PER_TENSOR = "per_tensor"
    PER_CHANNEL = "per_channel"
    GROUP = "group"


def code_range(bits: int) -> tuple[int, int]:
    """The signed codes of `bits` bits: [-2^(bits-1), 2^(bits-1) - 1]."""
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def to_scale_dtype(s: torch.Tensor) -> torch.Tensor:
    """Rounds scales to what is stored (float16), returned as float32 for arithmetic."""
    return s.clamp(min=_MIN_SCALE, max=65504.0).to(SCALE_DTYPE).float()


def scale_units(weight: torch.Tensor, granularity: Granularity, group_size: int = 64) -> torch.Tensor:
    """The weight as (scale units, unit length), zero-padded for the last group."""
    w = weight.detach().float().reshape(weight.shape[0], -1)
    if granularity is Granularity.PER_TENSOR:
        return w.reshape(1, -1)
    if granularity is Granularity.PER_CHANNEL:
        return w
    n_groups = math.ceil(w.shape[1] / group_size)
    pad = n_groups * group_size - w.shape[1]
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(-1, group_size)


def pack_codes(codes: torch.Tensor, bits: int) -> np.ndarray:
    """Bit-packs signed codes into ceil(n * bits / 8) bytes (INT4: two per byte)."""
    offset = 2 ** (bits - 1)
    u = (codes.reshape(-1).cpu().to(torch.int16) + offset).numpy().astype(np.uint8)
    if bits == 8:
        return u
    bitplanes = np.unpackbits(u[:, None], axis=1, bitorder="little")[:, :bits]
    return np.packbits(bitplanes.reshape(-1), bitorder="little")


def unpack_codes(packed: np.ndarray, bits: int, shape: Sequence[int]) -> torch.Tensor:
    """Inverse of `pack_codes`."""
    n = int(np.prod(shape))
    offset = 2 ** (bits - 1)
    if bits == 8:
        u = packed[:n].astype(np.int16)
    else:
        bitplanes = np.unpackbits(packed, bitorder="little")[: n * bits].reshape(n, bits)
        u = (bitplanes.astype(np.int16) << np.arange(bits, dtype=np.int16)).sum(axis=1)
    return torch.from_numpy((u - offset).astype(np.int8)).reshape(tuple(shape))


@dataclass(frozen=True)
class IntegerWeight:
    """A weight stored as signed `bits`-bit codes times float16 scales (symmetric, zero point 0).

    The one integer layout every writer knows: the packed checkpoint stores the codes bit-packed
    with the scales and its `tag`; ONNX stores them behind a DequantizeLinear.
    """

    codes: torch.Tensor  # int8, the weight's (stored) shape
    scales: torch.Tensor  # float16: 1, one per output channel, or one per group of each channel
    bits: int
    granularity: Granularity = Granularity.PER_CHANNEL
    group_size: int = 64  # read only for GROUP

    @property
    def tag(self) -> str:
        """The layout as the packed index writes it: ``4/per_channel``, ``8/per_tensor``, ``4/g64``."""
        tail = f"g{self.group_size}" if self.granularity is Granularity.GROUP else self.granularity.value
        return f"{self.bits}/{tail}"

    @staticmethod
    def layout(tag: str) -> tuple[int, Granularity, int]:
        """(bits, granularity, group size) from a `tag`."""
        bits, tail = tag.split("/")
        if tail.startswith("g"):
            return int(bits), Granularity.GROUP, int(tail[1:])
        return int(bits), Granularity(tail), 64

    @staticmethod
    def n_scales(shape: Sequence[int], granularity: Granularity, group_size: int = 64) -> int:
        """Scales a weight of `shape` has under `granularity`."""
        if granularity is Granularity.PER_TENSOR:
            return 1
        if granularity is Granularity.PER_CHANNEL:
            return shape[0]
        return shape[0] * math.ceil(math.prod(shape[1:]) / group_size)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight: each code times its unit's scale."""
        codes = self.codes
        units = scale_units(codes.float(), self.granularity, self.group_size)
        flat = (units * self.scales.float().unsqueeze(1)).reshape(codes.shape[0], -1)
        return flat[:, : codes[0].numel()].reshape(codes.shape)


@dataclass(frozen=True)
class WeightForm:
    """One layer's weight as export stores it, built by the layer's compressors in order (`Compressor.pack`)."""

    weight: torch.Tensor  # the float weight the evaluator runs, at the stored shape (structured pruning sliced)
    mask: torch.Tensor | None = None  # bool, the weights unstructured sparsity keeps (the rest are 0); None: dense
    integer: IntegerWeight | None = None  # the codes `weight` dequantizes from; None: stored in float32


@dataclass(frozen=True)
class Storage:
    """How a layer's weight is stored once a chain of compressors has run (docs/certification.md, size_bytes).

    Each compressor of the chain maps the storage left by the ones before it to its own
    (`Compressor.stored`), so pruning then quantizing stores the kept values at the quantizer's bits.
    """

    shape: tuple[int, ...]  # the stored weight's shape (structured pruning shrinks it)
    kept: int | None = None  # values kept by unstructured sparsity; None: dense
    value_bits: int = 32  # bits per stored value
    extra_bytes: int = 0  # scales, zero points, or an opaque encoding's whole size
    # The values' and index's bytes as the packed file codes them (`modelopt.compressors._entropy.form_bytes`),
    # measured on the real codes; None: the fixed-rate count (values x value_bits, and the index).
    coded: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def index_bytes(self) -> int:
        return 0 if self.kept is None else sparse_index_bytes(self.numel, self.kept)

    @property
    def bytes(self) -> int:
        if self.coded is not None:
            return self.coded + self.extra_bytes
        return self.decoded_bytes

    @property
    def decoded_bytes(self) -> int:
        """The bytes once decoded, as a runtime holds them: each value in its fixed-rate container (INT4 two to a
        byte, a rate grid's codes one int8 each), the sparse index, the scales."""
        values = self.numel if self.kept is None else self.kept
        return math.ceil(values * self.value_bits / 8) + self.index_bytes + self.extra_bytes
