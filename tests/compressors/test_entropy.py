"""Entropy-coded segments: exact round trips, never more than a byte over the fixed rate, and the same codes
decoded in another process (the probabilities are integer frequencies, the arithmetic the same everywhere)."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from modelopt.compressors.contract import (
    Granularity,
    IntegerWeight,
    WeightForm,
    code_range,
    decode_codes,
    decode_mask_segment,
    encode_codes,
    encode_mask_segment,
    form_bytes,
    pack_codes,
)
from modelopt.testing.env import child_env


def _codes(n: int, bits: int, spread: float, seed: int = 0) -> torch.Tensor:
    lo, hi = code_range(bits)
    g = torch.Generator().manual_seed(seed)
    return torch.clamp(torch.round(torch.randn(n, generator=g) * spread), lo, hi).to(torch.int8)


@pytest.mark.parametrize(("bits", "n", "spread"), [(2, 1000, 0.7), (3, 5000, 1.2), (4, 20000, 2.0), (8, 40000, 25.0),
                                                   (4, 1, 1.0), (8, 300, 40.0), (4, 10000, 0.0)])
def test_codes_round_trip(bits, n, spread):
    codes = _codes(n, bits, spread).reshape(-1, 1)
    segment = encode_codes(codes, bits)
    assert torch.equal(decode_codes(segment, bits, codes.shape), codes)
    # The smaller of coded and bit-packed: never more than the one byte saying which.
    assert segment.size <= pack_codes(codes, bits).size + 1


def test_coding_takes_the_information_not_the_bits():
    """Gaussian INT4 codes of spread 2 carry about 3.05 bits; coded they take within 1 % of that (and the
    layer's histogram), against 4 bits bit-packed."""
    codes = _codes(200_000, 4, 2.0)
    p = torch.bincount(codes.long() + 8).double() / codes.numel()
    entropy = float(-(p[p > 0] * p[p > 0].log2()).sum())
    coded_bits = encode_codes(codes, 4).size * 8 / codes.numel()
    assert entropy <= coded_bits <= entropy * 1.01 + 0.01
    assert coded_bits < 3.2


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.75, 0.95, 1.0])
def test_masks_round_trip(sparsity):
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(32, 16, 3, 3, generator=g) >= sparsity
    segment = encode_mask_segment(mask)
    assert torch.equal(decode_mask_segment(segment, mask.shape, int(mask.sum())), mask)
    assert segment.size <= math.ceil(mask.numel() / 8) + 1


def test_form_bytes_counts_codes_and_mask():
    codes = _codes(4096, 4, 2.0).reshape(64, 64)
    mask = codes != 0
    integer = IntegerWeight(codes * mask, torch.ones(64, dtype=torch.float16), 4, Granularity.PER_CHANNEL)
    form = WeightForm(integer.dequantize(), mask, integer)
    assert form_bytes(form) == encode_codes(codes[mask], 4).size + encode_mask_segment(mask).size
    assert form_bytes(WeightForm(torch.zeros(3, 3))) is None  # dense float: counted at 4 bytes a value


def test_a_new_process_decodes_the_same_codes(tmp_path):
    codes = _codes(100_000, 3, 1.1, seed=3)
    segment = encode_codes(codes, 3)
    assert int(segment[0]) == 1  # coded, not bit-packed
    np.save(tmp_path / "segment.npy", segment)
    script = ("import sys, hashlib, numpy as np; from modelopt.compressors.contract import decode_codes; "
              "s = np.load(sys.argv[1]); print(hashlib.sha256(decode_codes(s, 3, (100000,)).numpy().tobytes())"
              ".hexdigest())")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "segment.npy")], env=child_env(),
                         capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert out == hashlib.sha256(codes.numpy().tobytes()).hexdigest()
