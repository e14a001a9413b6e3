"""The quantize compressor against hand-computed oracles: codes, scales, packing and bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from modelopt.compressors import COMPRESSORS, Granularity, Quantize, QuantSpec
from modelopt.compressors.contract import Precision, pack_codes, unpack_codes
from modelopt.compressors.quantize.compressor import (
    SUPPORTED_BITS,
    dequantize,
    error_p,
    n_scales,
    quantize,
)
from modelopt.compressors.quantize.options import QuantizeOptions
from modelopt.errors import ConfigError
from modelopt.model.layers import Layer, LayerKind

PC, PT, GR = Granularity.PER_CHANNEL, Granularity.PER_TENSOR, Granularity.GROUP

# fan_in: 27 (< a group), 64 (one group), 100 (one and a bit), 288 (4.5 groups)
STEM = Layer("stem", LayerKind.CONV, (16, 3, 3, 3), 1, False)
FC = Layer("fc", LayerKind.LINEAR, (10, 64), 1, True)
ODD = Layer("odd", LayerKind.LINEAR, (6, 100), 1, True)
WIDE = Layer("wide", LayerKind.CONV, (64, 32, 3, 3), 1, False)
LAYERS = (STEM, FC, ODD, WIDE)


def weight(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


# ---- the hand-written oracle -----------------------------------------------------------------


def stored(x: float) -> float:
    """A scale as the export stores it: IEEE half precision."""
    return float(np.float16(x))


def oracle_row(row: list[float], bits: int) -> tuple[list[int], float]:
    """The grid search written out: 36 clip ratios 0.30, 0.32, ..., 1.00 of max|w|; the least
    sum of |error / max|w||^p wins (p = 3 from 4 bits up, 6 at 2 and 3 bits)."""
    p = 3.0 if bits >= 4 else 6.0
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    amax = max(abs(x) for x in row)
    best_err, best_codes, best_scale = math.inf, None, None
    for i in range(36):
        ratio = 0.30 + 0.02 * i
        s = stored(ratio * amax / qmax)
        codes = []
        for x in row:
            q = round(x / s)  # Python rounds half to even, as torch.round does
            codes.append(min(max(q, qmin), qmax))
        err = sum((abs(q * s - x) / amax) ** p for q, x in zip(codes, row, strict=True))
        if err < best_err:  # strict: the smaller ratio wins a tie
            best_err, best_codes, best_scale = err, codes, s
    return best_codes, best_scale


W24 = torch.tensor([[0.83, -0.41, 0.12, 0.27], [-0.9, 0.05, 0.6, -0.33]])


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_per_channel_matches_hand_oracle(bits):
    rows = [[float(x) for x in r] for r in W24]  # the float32 values, exactly
    expected = [oracle_row(r, bits) for r in rows]
    codes, scales = quantize(W24, QuantSpec(bits, PC))
    assert codes.dtype == torch.int8 and codes.shape == W24.shape
    assert codes.tolist() == [c for c, _ in expected]
    assert scales.float().tolist() == [s for _, s in expected]
    deq = dequantize(codes, scales, QuantSpec(bits, PC))
    hand = [[q * s for q in c] for c, s in expected]
    assert torch.allclose(deq, torch.tensor(hand), rtol=1e-6, atol=0)


def test_int4_literal_codes():
    # Row 0 keeps max-scaling (0.83 -> 7); row 1 clips to ratio 0.90, so -0.9 takes the code -8.
    codes, scales = quantize(W24, QuantSpec(4, PC))
    assert codes.tolist() == [[7, -3, 1, 2], [-8, 0, 5, -3]]
    assert scales.float().tolist() == [stored(0.83 / 7), stored(0.90 * 0.9 / 7)]


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("gran", [PT, PC, GR])
def test_codes_stay_in_signed_range(bits, gran):
    codes, _ = quantize(weight((64, 256), seed=bits) * 3, QuantSpec(bits, gran))
    assert -(2 ** (bits - 1)) <= int(codes.min()) and int(codes.max()) <= 2 ** (bits - 1) - 1


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("gran", [PC, GR])
def test_full_signed_range_used(bits, gran):
    # Not symmetric [-qmax, qmax]: with 64+ clipped units, both ends of [-2^(b-1), 2^(b-1)-1] occur.
    # (From 5 bits up the |error|^3 search rarely clips Gaussian weights, so -2^(b-1) need not occur.)
    codes, _ = quantize(weight((64, 256), seed=bits), QuantSpec(bits, gran))
    assert int(codes.min()) == -(2 ** (bits - 1)) and int(codes.max()) == 2 ** (bits - 1) - 1


def test_int4_codes_are_minus8_to_7():
    codes, _ = quantize(weight((32, 128)), QuantSpec(4, PC))
    assert set(codes.unique().tolist()) == set(range(-8, 8))


@pytest.mark.parametrize(
    "layer, gran, expected",
    [
        (WIDE, PT, 1),
        (WIDE, PC, 64),
        (WIDE, GR, 64 * 5),  # 288 = 4 full groups + one of 32
        (ODD, GR, 6 * 2),
        (FC, GR, 10),  # exactly one group per channel
        (STEM, GR, 16),
    ],
)
def test_scale_counts(layer, gran, expected):
    spec = QuantSpec(4, gran, 64)
    _, scales = quantize(weight(layer.weight_shape), spec)
    assert scales.numel() == expected
    assert n_scales(layer, spec) == expected


def test_last_group_is_zero_padded():
    # fan_in 100 = a group of 64 and a group of 36 padded with 28 zeros: zeros cost no error, so
    # each group quantizes exactly as its own real weights would as one channel.
    w = weight((6, 100), seed=3)
    w[:, 64:] *= 1e-3  # small enough that any nonzero padding would move the last group's scale
    codes, scales = quantize(w, QuantSpec(4, GR, 64))
    first, first_s = quantize(w[:, :64].contiguous(), QuantSpec(4, PC))
    last, last_s = quantize(w[:, 64:].contiguous(), QuantSpec(4, PC))
    assert codes.shape == w.shape
    assert torch.equal(codes[:, :64], first) and torch.equal(codes[:, 64:], last)
    assert torch.equal(scales.reshape(6, 2)[:, 0], first_s) and torch.equal(scales.reshape(6, 2)[:, 1], last_s)
    deq = dequantize(codes, scales, QuantSpec(4, GR, 64))
    assert deq.shape == w.shape
    assert torch.equal(deq[:, 64:], dequantize(last, last_s, QuantSpec(4, PC)))


def test_all_zero_unit_quantizes_to_zero():
    w = torch.zeros(3, 8)
    w[1] = torch.linspace(-1, 1, 8)
    codes, scales = quantize(w, QuantSpec(4, PC))
    assert torch.isfinite(scales.float()).all() and (scales.float() > 0).all()
    assert codes[0].eq(0).all() and codes[2].eq(0).all()
    assert torch.equal(dequantize(codes, scales, QuantSpec(4, PC))[0], torch.zeros(8))


def _unit_errors(w: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared error per scale unit: the module's quantizer vs plain max-scaling (ratio 1.0), same storage."""
    qmin, qmax = -(2 ** (spec.bits - 1)), 2 ** (spec.bits - 1) - 1
    codes, scales = quantize(w, spec)
    deq = dequantize(codes, scales, spec)
    if spec.granularity is PT:
        units, dunits = w.reshape(1, -1), deq.reshape(1, -1)
    elif spec.granularity is PC:
        units, dunits = w.reshape(w.shape[0], -1), deq.reshape(w.shape[0], -1)
    else:
        units, dunits = w.reshape(-1, spec.group_size), deq.reshape(-1, spec.group_size)  # fan_in % 64 == 0 here
    s = (units.abs().amax(dim=1, keepdim=True) / qmax).half().float()
    plain = torch.clamp(torch.round(units / s), qmin, qmax) * s
    p = error_p(spec.bits)  # the criterion the search minimises
    return ((dunits - units).abs() ** p).sum(dim=1), ((plain - units).abs() ** p).sum(dim=1)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("gran", [PT, PC, GR])
def test_searched_scale_never_worse_than_max_scaling(bits, gran):
    for seed in range(3):
        w = weight((32, 128), seed) * (1 + seed)
        w[0, 0] = 6.0 * (1 + seed)  # an outlier, where clipping pays most
        opt, plain = _unit_errors(w, QuantSpec(bits, gran))
        assert (opt <= plain * (1 + 1e-5) + 1e-12).all()


@pytest.mark.parametrize("gran", [PT, PC, GR])
def test_searched_scale_strictly_better_in_aggregate_at_4_bits(gran):
    opt, plain = _unit_errors(weight((64, 256), seed=11), QuantSpec(4, gran))
    # Gaussian weights: the MSE-optimal clip sits well inside max|w| at 4 bits.
    assert opt.sum() < 0.9 * plain.sum()


# ---- packing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 100, 1001])
def test_pack_round_trip_and_length(bits, n):
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    g = torch.Generator().manual_seed(n * 10 + bits)
    codes = torch.randint(qmin, qmax + 1, (n,), generator=g, dtype=torch.int8)
    codes[0] = qmin
    codes[-1] = qmax if n > 1 else qmin
    packed = pack_codes(codes, bits)
    assert packed.dtype == np.uint8
    assert len(packed) == math.ceil(n * bits / 8)
    assert torch.equal(unpack_codes(packed, bits, (n,)), codes)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_pack_round_trip_every_code_shaped(bits):
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    codes = torch.arange(qmin, qmax + 1, dtype=torch.int8).repeat(3)[: 3 * 2**bits - 1]
    shaped = codes[: (len(codes) // 3) * 3].reshape(-1, 3)
    assert torch.equal(unpack_codes(pack_codes(shaped, bits), bits, shaped.shape), shaped)


def test_int4_packs_two_per_byte_low_nibble_first():
    # Codes are stored offset by 8: -8 -> 0x0, 7 -> 0xF, 0 -> 0x8, -1 -> 0x7.
    packed = pack_codes(torch.tensor([-8, 7, 0, -1, 3], dtype=torch.int8), 4)
    assert packed.tolist() == [0xF0, 0x78, 0x0B]


def test_int8_is_one_byte_per_code_offset_128():
    assert pack_codes(torch.tensor([-128, 0, 127], dtype=torch.int8), 8).tolist() == [0, 128, 255]


# ---- size accounting -------------------------------------------------------------------------


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("gran", [PT, PC, GR])
def test_weight_bytes_equal_packed_codes_plus_scales(layer, bits, gran):
    q = Quantize(bits=(bits,), granularity=(gran,), rounding=("nearest",), norm_images=0)
    spec = q.parse({"bits": bits, "granularity": gran.value}, layer)
    codes, scales = quantize(weight(layer.weight_shape), spec)
    written = len(pack_codes(codes, bits)) + scales.numel() * scales.element_size()
    assert q.weight_bytes(layer, spec) == written


def test_weight_bytes_by_hand():
    # wide: 18432 weights; int4 -> 9216 bytes; 64*5 float16 group scales -> 640 bytes.
    q = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    assert q.weight_bytes(WIDE, QuantSpec(4, GR, 64)) == 9216 + 64 * 5 * 2
    assert q.weight_bytes(WIDE, QuantSpec(8, PC)) == 18432 + 64 * 2
    assert q.weight_bytes(WIDE, QuantSpec(3, PT)) == math.ceil(18432 * 3 / 8) + 2
    assert q.weight_bytes(WIDE, None) == 18432 * 4


@pytest.mark.parametrize("spec", [QuantSpec(4, GR, 64), QuantSpec(3, PC), QuantSpec(8, PT)], ids=str)
def test_apply_equals_what_the_packed_form_decodes(spec):
    # The weight the evaluator runs with is exactly what export's loader rebuilds from the bytes.
    w = weight(WIDE.weight_shape, seed=5)
    codes, scales = quantize(w, spec)
    loaded = unpack_codes(pack_codes(codes, spec.bits), spec.bits, codes.shape)
    nearest = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    assert torch.equal(nearest.apply(w, spec), dequantize(loaded, scales, spec))


# ---- menus, canonical choices, parsing -------------------------------------------------------


@pytest.mark.parametrize("layer, expect_group", [(STEM, False), (FC, False), (ODD, True), (WIDE, True)])
def test_group_canonicalised_to_per_channel_when_one_group_covers_a_channel(layer, expect_group):
    q = Quantize(bits=(8, 4), granularity=("per_channel", "group"), rounding=("nearest",), norm_images=0)
    menu = q.menu(layer)
    has_group = any(c is not None and c.granularity is GR for c in menu)
    assert has_group == expect_group
    assert len(menu) == (5 if expect_group else 3)  # None + 2 bits x (1 or 2) granularities
    parsed = q.parse({"bits": 4, "granularity": "group"}, layer)
    assert parsed == (QuantSpec(4, GR, 64) if expect_group else QuantSpec(4, PC))
    assert q.weight_bytes(layer, parsed) == q.weight_bytes(layer, q.parse({"bits": 4, "granularity": "group",
                                                                           "group_size": 64}, layer))


def test_group_only_menu_on_small_layer_offers_per_channel():
    q = Quantize(bits=(4,), granularity=("group",), rounding=("nearest",), norm_images=0)
    assert q.menu(STEM) == (None, QuantSpec(4, PC))
    assert q.menu(WIDE) == (None, QuantSpec(4, GR, 64))


def test_group_size_is_not_part_of_a_non_group_choice():
    q = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    assert q.parse({"bits": 8, "granularity": "per_channel", "group_size": 32}, WIDE) == QuantSpec(8, PC)
    assert q.parse({"bits": 8, "granularity": "group", "group_size": 32}, WIDE) == QuantSpec(8, GR, 32)
    assert q.dump(QuantSpec(8, PC)) == {"bits": 8, "granularity": "per_channel"}
    assert q.dump(QuantSpec(4, GR, 32)) == {"bits": 4, "granularity": "group", "group_size": 32}


def test_registered_and_defaults():
    assert COMPRESSORS.get("quantize") is Quantize
    q = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    assert q.bits == (8, 4) and q.granularity == (PC, GR) and q.group_size == 64
    assert q.precision(None) == Precision(32, 32) and q.precision(QuantSpec(3)) == Precision(3, 32)
    assert q.options() == QuantizeOptions(bits=(8, 4), rounding=("nearest",), norm_images=0).to_json()
    assert q.options()["version"] == QuantizeOptions.version and q.options()["bits"] == [8, 4]


VALID_BITS = "2, 3, 4, 5, 6, 7, 8"


@pytest.mark.parametrize(
    "raw, names, lists",
    [
        ({"bits": 16}, "16", VALID_BITS),
        ({"bits": 1}, "1", VALID_BITS),
        ({"bits": "4"}, "'4'", VALID_BITS),
        ({"bits": True}, "True", VALID_BITS),
        ({"granularity": "per_channel"}, "'bits'", VALID_BITS),
        ({"bits": 4, "bitz": 3}, "'bitz'", "bits, granularity, group_size"),
        ({"bits": 4, "granularity": "per_row"}, "'per_row'", "per_tensor, per_channel, group"),
        ({"bits": 4, "granularity": "group", "group_size": 0}, "0", "positive integer"),
        ({"bits": 4, "granularity": "group", "group_size": 2.5}, "2.5", "positive integer"),
        (4, "4", "{bits: 4}"),
        ("int4", "'int4'", "{bits: 4}"),
        ([4], "[4]", "{bits: 4}"),
    ],
)
def test_parse_errors_name_bad_value_and_valid_ones(raw, names, lists):
    with pytest.raises(ConfigError) as exc:
        Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0).parse(raw, WIDE)
    msg = str(exc.value)
    assert names in msg and lists in msg and "\n" not in msg


@pytest.mark.parametrize("bits", [1, 9, 0, 16])
def test_constructor_rejects_unsupported_bits(bits):
    with pytest.raises(ConfigError, match=rf"bits {bits}\b.*valid: {VALID_BITS}"):
        Quantize(bits=(8, bits), rounding=("nearest",), norm_images=0)


def test_constructor_rejects_bad_granularity_and_group_size():
    with pytest.raises(ConfigError, match=r"'per_row'.*per_tensor, per_channel, group"):
        Quantize(granularity=("per_row",), bits=(8, 4), rounding=("nearest",), norm_images=0)
    with pytest.raises(ConfigError, match=r"group_size.*0"):
        Quantize(group_size=0, bits=(8, 4), rounding=("nearest",), norm_images=0)


def test_constructor_deduplicates_options():
    q = Quantize(bits=(4, 4, 8), granularity=("group", Granularity.GROUP), rounding=("nearest",), norm_images=0)
    assert q.bits == (4, 8) and q.granularity == (GR,)


# ---- quantized input activations (W8A8) ------------------------------------------------------


def test_activations_cross_every_weight_choice_and_cost_their_qparams():
    from modelopt.compressors.quantize import ActQuantSpec

    q = Quantize(bits=(8, 4), granularity=("per_channel",), activations=(None, 8), rounding=("nearest",), norm_images=0)
    assert q.menu(WIDE) == (None, QuantSpec(8), ActQuantSpec(8), QuantSpec(4), ActQuantSpec(4))
    for spec in q.menu(WIDE)[1:]:
        a8 = spec.activations == 8
        assert q.precision(spec) == Precision(spec.bits, 8 if a8 else 32)
        assert (q.calibration(spec).input_ranges is not None) == a8  # ranges measured for quantized inputs only
        # float32 input scale + uint8 zero point on top of the weight's codes and float16 scales
        assert q.weight_bytes(WIDE, spec) == WIDE.params * spec.bits // 8 + 64 * 2 + (5 if a8 else 0)
    assert q.precision(None).activation == 32
    plain = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    assert plain.menu(WIDE) == Quantize(plain.opts, activations=(None,)).menu(WIDE)  # the default offers none
    assert str(QuantSpec(4, GR, 32).with_activations(8)) == "int4/g32/a8"


def test_conformance_with_activations_offered():
    from modelopt.testing.compressors import check_compressor

    check_compressor(Quantize(bits=(8, 4), activations=(None, 8), rounding=("nearest",), norm_images=0))
    check_compressor(Quantize(bits=(8,), activations=(8,), act_calibration="minmax", rounding=("nearest",),
                              norm_images=0))


def test_weight_only_plans_keep_their_keys_and_files():
    from modelopt.plan.plan import Plan

    # Key computed before activations existed (commit 811b4a1): journals and studies stay valid.
    plan = Plan((("conv1/quantize", QuantSpec(8)), ("fc/quantize", QuantSpec(4, GR, 32)), ("x/quantize", None)))
    assert plan.key == "a081d47cf3724098"
    nearest = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    assert nearest.dump(QuantSpec(8)) == {"bits": 8, "granularity": "per_channel"}
    # A run record without a version (written before records had one) rebuilds the quantizer it ran.
    assert Quantize(QuantizeOptions.from_json({"bits": [8, 4], "granularity": ["per_channel", "group"],
                                               "group_size": 64})).opts == nearest.opts
    w8a8 = Plan((("conv1/quantize", QuantSpec(8).with_activations(8)),))
    assert w8a8.key != Plan((("conv1/quantize", QuantSpec(8)),)).key


def test_plan_yaml_round_trip_with_activations(tmp_path):
    import yaml

    from modelopt.plan.space import SearchSpace

    space = SearchSpace(LAYERS, [Quantize(activations=(None, 8), bits=(8, 4), rounding=("nearest",), norm_images=0)])
    doc = {"default": {"quantize": {"bits": 8, "granularity": "per_channel", "activations": 8}},
           "layers": {"fc": {"quantize": {"bits": 4, "granularity": "group", "activations": None}}}}
    plan = space.parse_plan(doc)
    assert plan["wide/quantize"] == QuantSpec(8).with_activations(8)
    assert plan["fc/quantize"] == QuantSpec(4)  # fan_in 64: one group is per-channel; float inputs
    space.save_plan(plan, tmp_path / "plan.yaml")
    text = (tmp_path / "plan.yaml").read_text()
    assert yaml.safe_load(text)["default"]["quantize"]["activations"] == 8
    assert space.load_plan(tmp_path / "plan.yaml") == plan
    assert space.plan_from_flat(plan.to_flat()) == plan  # the journal's form


@pytest.mark.parametrize("bad", [5, 4, 16, True, "int8"])
def test_unsupported_activation_bits_are_one_line_config_errors(bad):
    with pytest.raises(ConfigError) as exc:
        Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0).parse({"bits": 8, "activations": bad}, WIDE)
    msg = str(exc.value)
    assert f"activations {bad!r} not offered; valid: 8 or null" in msg and "wide" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match=r"activations .* not offered; valid: 8"):
        Quantize(activations=(None, bad), bits=(8, 4), rounding=("nearest",), norm_images=0)


def test_activation_options_are_recorded_only_when_used():
    q = Quantize(activations=(None, 8), act_calibration="minmax", act_percentile=99.9, act_calibration_images=128,
                 bits=(8, 4), rounding=("nearest",), norm_images=0)
    opts = q.options()
    assert opts["activations"] == [None, 8] and opts["act_calibration"] == "minmax"
    assert opts["act_percentile"] == 99.9 and opts["act_calibration_images"] == 128
    with pytest.raises(ConfigError, match="calibration 'mse' not offered; valid: minmax, percentile"):
        Quantize(act_calibration="mse", bits=(8, 4), rounding=("nearest",), norm_images=0)


@pytest.mark.parametrize("changes, needle", [
    ({"bits": (8, 1)}, "bits 1 not offered"),
    ({"granularity": ("per_row",)}, "'per_row'"),
    ({"group_size": 0}, "group_size must be a positive integer, got 0"),
    ({"activations": ()}, "activations must offer at least one"),
    ({"activations": (4,)}, "activations 4 not offered"),
    ({"rounding": ("stochastic",)}, "'stochastic'"),
    ({"clip_ratios": (1.5,)}, "clip_ratios must be fractions in (0, 1]"),
    ({"calib_images": 0}, "calib_images must be a positive integer"),
    ({"norm_images": -1}, "norm_images must be a non-negative integer"),
    ({"act_calibration": "entropy"}, "'entropy'"),
    ({"act_percentile": 40.0}, "activation percentile must be in (50, 100]"),
])
def test_the_options_record_refuses_a_bad_value_when_it_is_built(changes, needle):
    """The record checks its own fields (a run.json read back, a sweep cell, a keyword): the compressor built on it
    only reads them."""
    with pytest.raises(ConfigError) as err:
        QuantizeOptions(**changes)
    assert needle in str(err.value)
    with pytest.raises(ConfigError):
        QuantizeOptions().replace(**changes)
    with pytest.raises(ConfigError):
        Quantize(**changes)
