"""Shared fixtures for the export tests: ResNet-20's evaluator and reference plans."""

from __future__ import annotations

import pytest

from modelopt.api import build_compressors
from modelopt.compressors import Granularity, QuantSpec
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace


@pytest.fixture(scope="session")
def r20_evaluator(resnet20_workload) -> Evaluator:
    comps = build_compressors(["quantize"], {"quantize": {"bits": [8, 4, 3, 2],
                                                          "granularity": ["per_channel", "group", "per_tensor"],
                                                          "rounding": ["nearest"], "norm_images": 0}})
    return Evaluator(resnet20_workload, SearchSpace(resnet20_workload.layers, comps))


@pytest.fixture(scope="session")
def r20_plans(r20_evaluator):
    space = r20_evaluator.space
    names = list(space.layers)
    # Every layer a different mix of 2/3/4 bits and granularities (first/last layers included).
    mixed = space.parse_plan({
        "default": {"quantize": {"bits": 3, "granularity": "group"}},
        "layers": {n: {"quantize": {"bits": (2, 3, 4)[i % 3], "granularity": ("group", "per_channel")[i % 2]}}
                   for i, n in enumerate(names)},
    })
    return {
        "int8_per_channel": space.uniform("quantize", QuantSpec(8)),
        "int4_per_channel": space.uniform("quantize", QuantSpec(4)),
        "int4_group": space.uniform("quantize", QuantSpec(4, Granularity.GROUP)),
        "mixed_2_3_4": mixed,
    }
