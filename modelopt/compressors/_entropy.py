"""Entropy-coded storage of integer codes and masks: the bytes a layer's codes really need.

A fixed-rate code spends `bits` on every weight whatever it carries; GPTQ's INT4 codes carry about 3.3 bits of
information a weight, its INT3 codes about 2.5 (docs/compressors.md#measured). Each layer's codes are coded here
with their own probability model (the layer's code histogram, stored with them) by an ANS coder
(`constriction`, a maintained Rust implementation), and a layer keeps the smaller of that and its bit-packed form:
a small layer whose histogram would outweigh what coding saves stays packed.

A segment is self-describing, one leading byte saying which:

- ``RAW`` (0): the bit-packed bytes (`pack_codes`; a mask: `encode_mask`), as format version 4 stored them;
- ``CODED`` (1): the lowest symbol (int16), the number of symbols K (uint16), K uint16 frequencies, then the
  ANS coder's uint32 words, little-endian.

The frequencies are the histogram scaled to a maximum of 65535 (a symbol that occurs keeps at least 1), and the
coder's probabilities are those integers over their sum, in float64: the same arithmetic on every machine, so a
file decodes to the same codes wherever it is read (tests/compressors/test_entropy.py checks it in a new process).
The segment's length is what `size_bytes` counts for the layer's codes (`coded_code_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import constriction
import numpy as np
import torch

from modelopt.compressors._packing import WeightForm, decode_mask, encode_mask, pack_codes, unpack_codes

__all__ = ["CODED", "RAW", "coded_code_bytes", "coded_mask_bytes", "decode_codes", "decode_mask_segment",
           "encode_codes", "encode_mask_segment", "form_bytes", "kept_codes"]

RAW, CODED = 0, 1
_FREQ_MAX = 65535
_HEADER = np.dtype([("lo", "<i2"), ("k", "<u2")])


def _model(freqs: np.ndarray) -> object:
    p = freqs.astype(np.float64)
    return constriction.stream.model.Categorical(p / p.sum(), perfect=False)


def _coded(symbols: np.ndarray) -> np.ndarray | None:
    """The CODED segment of non-negative int `symbols` offset by their minimum; None when there are none."""
    if symbols.size == 0:
        return None
    lo = int(symbols.min())
    sym = (symbols - lo).astype(np.int32)
    counts = np.bincount(sym, minlength=2)  # the coder's models need two symbols at least
    freqs = np.where(counts > 0, np.maximum(1, np.round(counts * (_FREQ_MAX / counts.max()))), 0).astype("<u2")
    coder = constriction.stream.stack.AnsCoder()
    coder.encode_reverse(sym, _model(freqs))
    words = np.asarray(coder.get_compressed(), dtype="<u4")
    head = np.array([(lo, freqs.size)], dtype=_HEADER)
    return np.concatenate([np.array([CODED], np.uint8), head.view(np.uint8), freqs.view(np.uint8),
                           words.view(np.uint8)])


def _decoded(segment: np.ndarray, n: int) -> np.ndarray:
    """The `n` symbols of a CODED segment, as int32."""
    head = segment[1 : 1 + _HEADER.itemsize].view(_HEADER)[0]
    lo, k = int(head["lo"]), int(head["k"])
    start = 1 + _HEADER.itemsize
    freqs = segment[start : start + 2 * k].copy().view("<u2")
    words = segment[start + 2 * k :].copy().view("<u4").astype(np.uint32)
    coder = constriction.stream.stack.AnsCoder(words)
    return np.asarray(coder.decode(_model(freqs), n), dtype=np.int32) + lo


def _smaller(raw: np.ndarray, coded: np.ndarray | None) -> np.ndarray:
    raw_segment = np.concatenate([np.array([RAW], np.uint8), raw])
    return raw_segment if coded is None or coded.size >= raw_segment.size else coded


def encode_codes(codes: torch.Tensor, bits: int) -> np.ndarray:
    """The segment storing signed `bits`-bit `codes` (flattened): entropy-coded or bit-packed, the smaller."""
    flat = codes.detach().reshape(-1).cpu().numpy().astype(np.int32)
    return _smaller(pack_codes(codes, bits), _coded(flat))


def decode_codes(segment: np.ndarray, bits: int, shape: Sequence[int]) -> torch.Tensor:
    """The int8 codes of shape `shape` a segment of `encode_codes` stores."""
    if int(segment[0]) == RAW:
        return unpack_codes(segment[1:], bits, shape)
    n = math.prod(shape)
    return torch.from_numpy(_decoded(segment, n).astype(np.int8)).reshape(tuple(shape))


def coded_code_bytes(codes: torch.Tensor, bits: int) -> int:
    """Bytes `encode_codes` writes for `codes` (what size_bytes counts for them)."""
    return int(encode_codes(codes, bits).size)


def encode_mask_segment(mask: torch.Tensor) -> np.ndarray:
    """The segment storing which weights a sparse layer keeps: its bits entropy-coded, or `encode_mask`'s bytes."""
    bits = mask.detach().reshape(-1).cpu().numpy().astype(np.int32)
    return _smaller(encode_mask(mask), _coded(bits))


def decode_mask_segment(segment: np.ndarray, shape: Sequence[int], kept: int) -> torch.Tensor:
    """The boolean mask of shape `shape` (`kept` True) a segment of `encode_mask_segment` stores."""
    if int(segment[0]) == RAW:
        return decode_mask(segment[1:], shape, kept)
    return torch.from_numpy(_decoded(segment, math.prod(shape)).astype(bool)).reshape(tuple(shape))


def coded_mask_bytes(mask: torch.Tensor) -> int:
    """Bytes `encode_mask_segment` writes for `mask`."""
    return int(encode_mask_segment(mask).size)


def kept_codes(form: WeightForm) -> torch.Tensor:
    """The codes a packed file stores for an integer `form`: all of them, or the kept weights' under a mask."""
    q = form.integer
    assert q is not None
    return q.codes if form.mask is None else q.codes[form.mask.to(q.codes.device)]


def form_bytes(form: WeightForm) -> int | None:
    """Bytes the packed file's segments take for a layer's stored weight values (not its scales): an integer
    form's code segment, a sparse float form's kept float32 values, and a sparse form's mask segment; None for
    a dense float weight (its float32 values are counted as they are)."""
    if form.integer is None and form.mask is None:
        return None
    mask = 0 if form.mask is None else coded_mask_bytes(form.mask)
    if form.integer is None:
        assert form.mask is not None
        return int(form.mask.sum()) * 4 + mask
    return coded_code_bytes(kept_codes(form), form.integer.bits) + mask
