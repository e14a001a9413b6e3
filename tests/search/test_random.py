from __future__ import annotations

import collections

from modelopt.compressors import Quantize
from modelopt.model.layers import Layer, LayerKind
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace
from modelopt.search import RandomSearch


def test_random_search_draws_every_choice_about_uniformly():
    layers = [Layer(f"l{i}", LayerKind.CONV, (16, 16, 3, 3), 1, False) for i in range(4)]
    space = SearchSpace(layers, [Quantize(bits=(8, 4), granularity=("per_channel",), rounding=("nearest",),
                                          norm_images=0)])
    plans = RandomSearch(space, Objective(), seed=0).ask(3000)
    counts = collections.Counter(p["l2/quantize"] for p in plans)
    assert set(counts) == set(space.decision("l2/quantize").choices)
    assert all(900 < n < 1100 for n in counts.values()), counts


def test_different_seeds_give_different_plans():
    layers = [Layer(f"l{i}", LayerKind.CONV, (16, 16, 3, 3), 1, False) for i in range(6)]
    space = SearchSpace(layers, [Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)])
    a = [p.key for p in RandomSearch(space, Objective(), seed=0).ask(5)]
    b = [p.key for p in RandomSearch(space, Objective(), seed=1).ask(5)]
    assert a != b
