"""The benchmarks' one-pass simulator against a hand check (exits, predictions and MACs of five samples), and
against the plugin's evaluator on the real ResNet-20: the benchmark's figures are the plugin's."""

from __future__ import annotations

import pytest
import torch
from exit_simulate import ExitTable, assign_exits, exit_table, simulate

from modelopt.api import build_compressors
from modelopt.compressors import ExitChoice
from modelopt.compressors.early_exit.features import extract_features
from modelopt.compressors.early_exit.policy import ExitPolicy
from modelopt.compressors.early_exit.runtime import RuntimeConfig
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace

# Three candidate exits (a, b, c) at backbone MACs 100, 200, 300; heads cost 1, 2, 4; full network 400.
TABLE = ExitTable(
    exits=("a", "b", "c"),
    head_pred=torch.tensor([[0, 1, 2, 3, 4], [0, 0, 2, 0, 4], [9, 1, 2, 3, 9]]),
    confidence=torch.tensor([[0.95, 0.50, 0.80, 0.20, 0.10],
                             [0.99, 0.97, 0.70, 0.30, 0.96],
                             [0.10, 0.99, 0.10, 0.20, 0.99]]),
    head_macs=(1, 2, 4),
    point_macs=(100, 200, 300),
    full_pred=torch.tensor([0, 1, 2, 3, 5]),
    labels=torch.tensor([0, 1, 2, 3, 4]),
    total_macs=400,
)


def test_exits_predictions_and_macs_by_hand():
    policy = ExitPolicy(("a", "b"), (0.9, 0.95))
    exit_at, pred, macs = assign_exits(TABLE, policy)
    # s0: a fires (0.95 >= 0.9). s1: a 0.5 no, b 0.97 fires -> predicts 0 (wrong).
    # s2: a 0.8 no, b 0.7 no -> full. s3: full. s4: b 0.96 fires -> 4 (right, where the full model says 5).
    assert exit_at.tolist() == [0, 1, 2, 2, 1]
    assert pred.tolist() == [0, 0, 2, 3, 4]
    # a: 100 + head a; b: 200 + heads a, b; full: 400 + heads a, b.
    assert macs.tolist() == [101.0, 203.0, 403.0, 403.0, 203.0]
    m = simulate(TABLE, policy)
    assert m.exit_counts == (1, 2, 2)
    assert m.mean_macs == pytest.approx((101 + 203 + 403 + 403 + 203) / 5)
    assert m.saving == pytest.approx(1 - m.mean_macs / 400)
    assert m.accuracy == pytest.approx(4 / 5) and m.base_accuracy == pytest.approx(4 / 5)
    assert m.retention == pytest.approx(1.0)  # s1 lost, s4 gained
    assert m.agreement == pytest.approx(3 / 5)  # s1 and s4 differ from the full model


def test_threshold_is_inclusive_and_inactive_exits_cost_nothing():
    m = simulate(TABLE, ExitPolicy(("c",), (0.99,)))
    assert m.exit_counts == (2, 3)  # 0.99 >= 0.99 fires for s1 and s4
    assert m.mean_macs == pytest.approx((304 * 2 + 404 * 3) / 5)
    never = simulate(TABLE, ExitPolicy(("a", "b"), (float("inf"), float("inf"))).active())
    assert never.mean_macs == 400 and never.agreement == 1.0


def test_policy_must_follow_backbone_order_and_name_heads():
    with pytest.raises(ConfigError, match="order"):
        assign_exits(TABLE, ExitPolicy(("b", "a"), (0.9, 0.9)))
    with pytest.raises(ConfigError, match="without heads"):
        assign_exits(TABLE, ExitPolicy(("z",), (0.9,)))
    with pytest.raises(ConfigError):
        ExitPolicy(("a",), ())


@pytest.mark.slow
def test_the_simulator_scores_a_plan_as_the_evaluator_does(small_workload):
    """Two implementations of one exit rule and one MAC count: the simulator on the evaluator's own heads and
    features gives the evaluator's accuracy, agreement and mean MACs. On the 846-image sample: the heads are fitted on
    its 169 calib images (and their mirrors; cifar10-exact-sample's 1,000 took ~3x as long), and its 169 val images
    scored both ways."""
    wl = small_workload
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize", "early_exit"], model=wl.model)))
    exits = {"layer1.2.conv2": 0.97, "layer2.1.conv2": 0.9, "layer3.0.conv2": 0.8}
    plan = ev.space.plan({f"{layer}/early_exit": ExitChoice(t) for layer, t in exits.items()})
    m = ev.scorer.evaluate(plan)
    heads, _ = ev.routes.routing.heads()
    policy = ev.routes.route(plan)
    backbone = ev.routes.routing.layout.backbone
    val = wl.split("val")
    ref = simulate(exit_table(heads, extract_features(backbone, val.x, RuntimeConfig().spec, labels=val.y), backbone),
                   policy)
    assert m.accuracy == pytest.approx(ref.accuracy, abs=1e-6)
    assert m.agreement == pytest.approx(ref.agreement, abs=1e-6)
    assert m.macs == round(ref.mean_macs)
    assert 0 < m.exited < 1 and ref.saving > 0
