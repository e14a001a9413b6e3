"""Label-free output sensitivities: one probe per layer prices every choice there, as the KL of the answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from modelopt.api import build_compressors
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.output_sensitivity import _probe, output_losses
from modelopt.evaluation.priors import measure_errors
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace
from modelopt.search import STRATEGIES

IMAGES = 64
# One test process runs this module, so its evaluator and probes (session fixtures) are built once, not per worker.
pytestmark = pytest.mark.xdist_group("output_sensitivity")


@pytest.fixture(scope="session")
def evaluator(small_workload) -> Evaluator:
    comps = build_compressors(["prune", "quantize"], {"quantize": {"bits": [8, 4, 2], "rounding": ["nearest"],
                                                                   "norm_images": 0},
                                                      "prune": {"sparse_images": 0, "repair_images": 0}})
    ev = Evaluator(small_workload, SearchSpace(small_workload.layers, comps))
    measure_errors(ev)
    return ev


@pytest.fixture(scope="session")
def estimates(evaluator) -> dict[tuple[str, int], float]:
    return output_losses(evaluator, images=IMAGES)


def _kl(ev: Evaluator, choices: dict) -> float:
    """The measured KL of the float model's answers against the plan's, on the probes' calib images."""
    x = ev.workload.split("calib").x[:IMAGES]
    with torch.inference_mode():
        ref = F.log_softmax(ev.workload.logits(x), dim=1)
    logp = F.log_softmax(ev.states.logits(ev.space.plan(choices), x), dim=1)
    return float(F.kl_div(logp, ref, log_target=True, reduction="batchmean"))


def test_every_weight_changing_choice_is_priced_and_fewer_bits_cost_more(evaluator, estimates):
    for d in evaluator.space.decisions:
        for j, c in enumerate(d.choices):
            if c is not None:
                assert math.isfinite(estimates[(d.name, j)]) and estimates[(d.name, j)] >= 0, (d.name, str(c))
        if d.compressor == "quantize":
            by_bits = {c.bits: estimates[(d.name, j)] for j, c in enumerate(d.choices)
                       if c is not None and c.granularity.value == "per_channel"}
            assert by_bits[8] < by_bits[4] < by_bits[2], (d.name, by_bits)


def test_a_probed_choice_is_priced_at_its_measured_kl_and_layers_differ(evaluator, estimates):
    """The oracle: for the choice each layer was probed with, the estimate is the KL measured directly; and
    the same output error costs very different KL on different layers (what a per-weight error misses)."""
    errors = {(d.name, j): f.error for d in evaluator.space.decisions
              for j, f in enumerate(evaluator.space.features[d.name])}
    gains = []
    for layer in dict.fromkeys(d.layer for d in evaluator.space.decisions):
        probe = _probe([d for d in evaluator.space.decisions if d.layer == layer], errors)
        assert probe is not None
        d, j = probe
        gains.append(estimates[(d.name, j)] / errors[(d.name, j)])
        if len(gains) <= 3:  # three layers measured again: enough for the oracle, cheap
            assert estimates[(d.name, j)] == pytest.approx(_kl(evaluator, {d.name: d.choices[j]}), rel=1e-4)
    assert max(gains) / min(gains) > 3


def test_estimates_add_up_over_layers(evaluator, estimates):
    """KL of small independent perturbations adds: INT4 on every layer is predicted within a factor of 2."""
    choices, predicted = {}, 0.0
    for d in evaluator.space.decisions:
        if d.compressor == "quantize":
            j = next(j for j, c in enumerate(d.choices)
                     if c is not None and c.bits == 4 and c.granularity.value == "per_channel")
            choices[d.name], predicted = d.choices[j], predicted + estimates[(d.name, j)]
    measured = _kl(evaluator, choices)
    assert 0.5 < predicted / measured < 2.0, (predicted, measured)


def test_the_probes_are_charged_once_with_the_next_plan(evaluator, estimates):
    charged = evaluator.states.pre_passes[f"output_kl:{IMAGES}"]
    layers = len({d.layer for d in evaluator.space.decisions})
    assert charged >= (layers + 1) * IMAGES / len(evaluator.workload.split("val"))


def test_mcts_takes_the_estimates_as_its_prior(evaluator, estimates):
    mcts = STRATEGIES.get("mcts")(evaluator.space, Objective("size", 0.99), seed=0)
    assert mcts.loss_estimator == "output" and mcts.wants_loss_estimates
    before = mcts.model.deltas(None).copy()
    mcts.use_loss_estimates(estimates)
    after = mcts.model.deltas(None)
    assert not np.allclose(before, after)
    # The prior loss of every priced choice now follows its estimate: same order within each layer's menu,
    # and across layers too (one kappa for every decision before any trial).
    names = [d.name for d in mcts.decisions]
    keys = list(estimates)
    prior = np.array([after[names.index(name), j] for name, j in keys])
    est = np.array([estimates[k] for k in keys])
    assert np.corrcoef(np.log(prior + 1e-12), np.log(est + 1e-12))[0, 1] > 0.99
