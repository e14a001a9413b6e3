"""Every registered strategy passes the conformance suite (parametrised over the registry)."""

from __future__ import annotations

import pytest

from modelopt.compressors import Quantize
from modelopt.model.layers import Layer, LayerKind
from modelopt.plan.space import SearchSpace
from modelopt.search import STRATEGIES
from modelopt.testing.strategies import check_strategy

LAYERS = [
    Layer("a", LayerKind.CONV, (16, 16, 3, 3), 1000, False),
    Layer("b", LayerKind.CONV, (32, 16, 3, 3), 2000, False),
    Layer("c", LayerKind.LINEAR, (10, 64), 640, True),
]


def score(plan):
    # Fewer bits: smaller and less accurate; a known trade-off with no model involved.
    bits = [32 if c is None else c.bits for _, c in plan.choices]
    return 1.0 - 0.004 * sum(32 - b for b in bits) / 4, 100 * sum(bits)


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_strategy_conformance(name):
    space = SearchSpace(LAYERS, [Quantize(bits=(8, 4), granularity=("per_channel",), rounding=("nearest",),
                                          norm_images=0)])
    check_strategy(STRATEGIES.get(name), space, score)
