"""Batch-norm re-estimation after low-bit quantization: when it runs, what it costs, that it helps."""

from __future__ import annotations

import pytest

from modelopt.api import build_compressors
from modelopt.compressors import Quantize, QuantSpec
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace


def test_only_plans_with_a_layer_at_4_bits_or_fewer_re_estimate():
    q = Quantize(norm_images=64, bits=(8, 4), rounding=("nearest",))
    norms = [q.calibration(c).norm_images for c in (None, QuantSpec(8), QuantSpec(5), QuantSpec(4), QuantSpec(2))]
    assert norms == [0, 0, 0, 64, 64]
    never = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    assert never.calibration(QuantSpec(2)).norm_images == 0  # 0: what run records without a version ran
    assert q.options()["norm_images"] == 64 and never.options()["norm_images"] == 0
    assert Quantize().opts.norm_images == 64  # the tool's default
    with pytest.raises(ConfigError, match="norm_images"):
        Quantize(norm_images=-1, bits=(8, 4), rounding=("nearest",))


@pytest.mark.slow
def test_it_is_charged_per_plan_and_lowers_int2_disagreement(small_workload):
    def evaluator(norm_images: int) -> Evaluator:
        comps = build_compressors(["quantize"], {"quantize": {"bits": [8, 2], "granularity": ["group"],
                                                              "rounding": ["gptq"], "calib_images": 64,
                                                              "norm_images": norm_images}})
        return Evaluator(small_workload, SearchSpace(small_workload.layers, comps))

    plain, renormed = evaluator(0), evaluator(64)
    int2 = {"default": {"quantize": {"bits": 2, "granularity": "group"}}}
    p0, p1 = plain.space.parse_plan(int2), renormed.space.parse_plan(int2)
    a0, a1 = plain.scorer.evaluate(p0, "val"), renormed.scorer.evaluate(p1, "val")
    val = len(small_workload.split("val"))
    assert a1.prep_cost == pytest.approx(a0.prep_cost + 2 * 64 / val)  # reference pass once + this plan's
    int8 = renormed.space.parse_plan({"default": {"quantize": {"bits": 8}}})
    assert renormed.scorer.evaluate(int8, "val").prep_cost == 0.0  # 8 bits: no re-estimation
    assert a1.agreement > a0.agreement + 0.02, (a0.agreement, a1.agreement)
