"""One cost accounting (modelopt.evaluation.cost): what the report shows per layer, computed from the layer table and
the journal's plan alone (no weights, no model), sums to exactly the evaluator's size_bytes, for random
plans mixing every compressor (quantize, prune both kinds, early exit) on the bundled ResNet-20."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from modelopt.compressors import EarlyExit, Prune, PruneKind, Quantize
from modelopt.evaluation.cost import CostModel
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace
from modelopt.reports.layer_map import layer_map
from modelopt.run.run_folder import RunFolder


def _compressors(wl):
    return [Quantize(bits=(8, 4, 2), granularity=("per_channel", "group", "per_tensor"), activations=(None, 8),
                     rounding=("nearest",), norm_images=0),
            Prune(sparsity=(0.25, 0.5, 0.9), sparse_images=0, repair_images=0),
            EarlyExit(**EarlyExit.model_options(wl.model))]


@pytest.fixture(scope="session")
def r20(small_workload):
    wl = small_workload  # sizes depend on the layers alone: the 846-image sample's workload, built once a session
    space = SearchSpace(wl.layers, _compressors(wl))
    # The report's side: a space rebuilt from the layer table and the compressors' saved options, as
    # a run folder rebuilds it (run.json, layers.json), and the float size the journal records.
    report_space = SearchSpace(wl.layers, [type(c)(type(c).record.from_json(c.options())) for c in _compressors(wl)])
    return wl, space, Evaluator(wl, space), report_space


def _random_plans(space, n, seed):
    rng = random.Random(seed)
    for _ in range(n):
        p = rng.random()  # from mostly float to mostly compressed, so every mix shows up
        yield space.plan({d.name: rng.choice(d.choices[1:]) if rng.random() < p else None for d in space.decisions})


def _coded(ev, plan):
    """The bytes each layer's stored values take coded, as the scorer writes them into a trial's metrics."""
    return {x.layer.name: x.storage.coded for x in ev.plan_cost(plan).layers if x.storage.coded is not None}


def _report_run(wl, report_space, plan):
    """What RunFolder.layer_bytes reads of a run folder: its layer table, its space, the record's plan."""
    flat = plan.to_flat()  # the journal's form
    run = SimpleNamespace(layers=wl.layers, space=report_space, float_size_bytes=wl.float_size_bytes,
                          plan=lambda record: report_space.plan_from_flat(record.plan))
    run.plan_cost = lambda record: RunFolder.plan_cost(run, record)  # type: ignore[arg-type]
    run.layer_bits = lambda record: RunFolder.layer_bits(run, record)  # type: ignore[arg-type]
    return run, flat


@pytest.mark.slow
def test_report_layer_bytes_sum_to_the_evaluators_size_bytes_for_random_plans(r20):
    wl, space, ev, report_space = r20
    other = wl.float_size_bytes - 4 * sum(x.params for x in wl.layers)  # what a run folder knows
    kinds = set()
    for plan in _random_plans(space, 60, seed=0):
        run, flat = _report_run(wl, report_space, plan)
        record = SimpleNamespace(plan=flat, metrics=SimpleNamespace(coded=_coded(ev, plan)))  # as a trial records it
        per_layer = RunFolder.layer_bytes(run, record)  # type: ignore[arg-type]
        assert set(per_layer) == {x.name for x in wl.layers}
        assert other + sum(per_layer.values()) == ev.plan_cost(plan).size_bytes, plan.key
        kinds |= {(name.rsplit("/", 1)[1], getattr(c, "kind", None)) for name, c in plan.choices if c is not None}
    assert {k for k, _ in kinds} == {"quantize", "prune", "early_exit"}
    assert ("prune", PruneKind.STRUCTURED) in kinds  # structured pruning among them


def test_layer_map_rows_and_other_bytes_make_the_plan_size(r20):
    wl, space, ev, report_space = r20
    for plan in _random_plans(space, 10, seed=1):
        run, flat = _report_run(wl, report_space, plan)
        run.layer_bytes = lambda record, run=run: RunFolder.layer_bytes(run, record)  # type: ignore[arg-type]
        record = SimpleNamespace(plan=flat, metrics=SimpleNamespace(size_bytes=ev.plan_cost(plan).size_bytes,
                                                                    coded=_coded(ev, plan)))
        lmap = layer_map(run, record)  # type: ignore[arg-type]
        assert lmap.has_sizes
        assert lmap.other_bytes + sum(r.plan_bytes for r in lmap.rows) == lmap.size_bytes


def test_each_compressor_shows_in_its_layers_bytes(r20):
    """The cases "last compressor wins" got wrong: an exit adds its head to the layer it follows, and
    pruning under quantization stores only the kept codes (plus their positions)."""
    wl, space, _, _ = r20
    costs = CostModel(space, wl.other_bytes)
    conv = next(x for x in wl.layers if x.name == "layer3.0.conv2")
    int8 = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0).parse({"bits": 8}, conv)
    alone = costs.cost(space.plan({"layer3.0.conv2/quantize": int8})).layer_bytes()[conv.name]
    sparse = costs.cost(space.plan({"layer3.0.conv2/quantize": int8,
                                    "layer3.0.conv2/prune": Prune().parse({"sparsity": 0.5}, conv)}))
    assert sparse.layer_bytes()[conv.name] < alone
    exit_ = EarlyExit(**EarlyExit.model_options(wl.model)).parse({"threshold": 0.9}, conv)
    with_exit = costs.cost(space.plan({"layer3.0.conv2/quantize": int8, "layer3.0.conv2/early_exit": exit_}))
    # The head: linear over 64 channels avg-pooled on 1x1, 2x2, 4x4 and max-pooled on 1x1, 2x2 grids,
    # 10 classes, its bias and temperature, float32.
    assert with_exit.layer_bytes()[conv.name] == alone + ((64 * (1 + 4 + 16) + 64 * (1 + 4)) * 10 + 10 + 1) * 4


def test_decoded_bytes_are_the_fixed_rate_containers_and_never_fewer_than_the_coded_file(r20):
    """INT4 codes take half a byte each once decoded, whatever the coder saved in the file."""
    wl, space, ev, _ = r20
    plan = space.plan({d.name: next(c for c in d.choices if getattr(c, "bits", None) == 4
                                    and getattr(c, "granularity", None) == "per_channel" and c.activations is None)
                       for d in space.decisions if d.compressor == "quantize"})
    cost = ev.plan_cost(plan)
    fixed = sum(math.ceil(x.storage.numel * 4 / 8) + x.storage.extra_bytes for x in cost.layers)
    assert cost.decoded_bytes == wl.other_bytes + fixed
    assert cost.size_bytes < cost.decoded_bytes  # the coder saves on INT4's codes
    assert ev.evaluate(plan).decoded_bytes == cost.decoded_bytes


def test_a_layers_bits_per_weight_are_its_stored_bytes_over_its_float_weights(r20):
    wl, space, ev, report_space = r20
    plan = next(_random_plans(space, 1, seed=3))
    run, flat = _report_run(wl, report_space, plan)
    record = SimpleNamespace(plan=flat, metrics=SimpleNamespace(coded=_coded(ev, plan)))
    bits = RunFolder.layer_bits(run, record)  # type: ignore[arg-type]
    cost = ev.plan_cost(plan)
    for layer in wl.layers:
        assert bits[layer.name] == pytest.approx(8 * cost.layer(layer.name).storage.bytes / layer.params)
