"""The benchmarks' threshold chooser on tables whose best policy is known."""

from __future__ import annotations

import torch
from exit_simulate import ExitTable, simulate
from exit_thresholds import ChooserConfig, choose_thresholds


def _table(n: int = 200, seed: int = 0) -> ExitTable:
    # Exit "early" is right exactly when its confidence is > 0.8; exit "late" is always right.
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    conf_early = torch.rand(n, generator=g)
    early_pred = torch.where(conf_early > 0.8, labels, (labels + 1) % 10)
    return ExitTable(
        exits=("early", "late"),
        head_pred=torch.stack([early_pred, labels]),
        confidence=torch.stack([conf_early, torch.full((n,), 0.9)]),
        head_macs=(1, 1),
        point_macs=(100, 600),
        full_pred=labels.clone(),
        labels=labels,
        total_macs=1000,
    )


def test_chooser_finds_the_separating_thresholds():
    table = _table()
    policy = choose_thresholds(table, ChooserConfig(floor=1.0))
    m = simulate(table, policy)
    assert m.retention == 1.0
    # Best: every sample with confidence > 0.8 leaves early, all the others at "late".
    assert policy.exits == ("early", "late")
    assert 0.8 - 0.01 < policy.thresholds[0] <= 0.8 + 0.01
    n_early = int((table.confidence[0] > 0.8).sum())
    assert m.exit_counts == (n_early, len(table) - n_early, 0)


def test_looser_floor_saves_more_and_floor_holds():
    # Early exit right with probability conf**2: a concave saving-vs-loss frontier with many vertices.
    table = _table(seed=1)
    g = torch.Generator().manual_seed(5)
    right = torch.rand(len(table), generator=g) < table.confidence[0] ** 2
    early = torch.where(right, table.labels, (table.labels + 1) % 10)
    table = ExitTable(table.exits, torch.stack([early, table.head_pred[1]]), table.confidence, table.head_macs,
                      table.point_macs, table.full_pred, table.labels, table.total_macs)
    savings = []
    for floor in (1.0, 0.97, 0.9):
        m = simulate(table, choose_thresholds(table, ChooserConfig(floor=floor)))
        assert m.retention >= floor - 1e-9
        savings.append(m.saving)
    assert savings[0] < savings[1] < savings[2]


def test_label_free_shape_then_one_number_on_val():
    shape = _table(n=2000, seed=2)
    shape = ExitTable(shape.exits, shape.head_pred, shape.confidence, shape.head_macs, shape.point_macs,
                      shape.full_pred, None, shape.total_macs)  # the held-out pool has no labels
    val = _table(seed=3)
    policy = choose_thresholds(val, ChooserConfig(floor=1.0), shape=shape)
    m = simulate(val, policy)
    assert m.retention == 1.0 and m.saving > 0.3


def test_agreement_floor_and_head_cost():
    table = _table(seed=4)
    m = simulate(table, choose_thresholds(table, ChooserConfig(floor=1.0, agreement=True)))
    assert m.agreement == 1.0
    # A head costing more than any exit could save is never worth evaluating.
    policy = choose_thresholds(table, ChooserConfig(floor=1.0, head_cost=2.0))
    assert policy.exits == ()
    assert simulate(table, policy).saving == 0.0
