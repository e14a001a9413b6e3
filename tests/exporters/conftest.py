"""Shared fixtures for the export tests: ResNet-20's evaluator and reference plans."""

from __future__ import annotations

import pytest

from modelopt.api import build_compressors
from modelopt.compressors import Granularity, QuantSpec
from modelopt.evaluation.evaluator import Evaluator
from modelopt.model.workload import Workload
from modelopt.plan.space import SearchSpace

# Every bit width and granularity, rounded to nearest, no batch-norm re-estimation.
QUANTIZE = {"quantize": {"bits": [8, 4, 3, 2], "granularity": ["per_channel", "group", "per_tensor"],
                         "rounding": ["nearest"], "norm_images": 0}}


def quantize_evaluator(workload: Workload) -> Evaluator:
    """`workload` with the export tests' quantize menu (`QUANTIZE`)."""
    return Evaluator(workload, SearchSpace(workload.layers, build_compressors(["quantize"], QUANTIZE)))


@pytest.fixture(scope="session")
def r20_evaluator(resnet20_workload) -> Evaluator:
    return quantize_evaluator(resnet20_workload)


@pytest.fixture(scope="session")
def small_r20_evaluator(small_workload) -> Evaluator:
    """The same menu on the small sample (846 images): for run folders, which an export rebuilds from run.json,
    decoding and predicting every image of the run's data again."""
    return quantize_evaluator(small_workload)


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
