"""The per-layer map's columns for every built-in compressor, and the one-line plan digest."""

from __future__ import annotations

from modelopt.reports.layer_map import columns_for, plan_mix


def test_each_builtin_compressor_has_readable_columns():
    q = {"bits": 4, "granularity": "group", "group_size": 64, "activations": 8}
    assert [c.name for c in columns_for("quantize")] == ["bits", "scales", "inputs"]
    assert [c.cell(q).label for c in columns_for("quantize")] == ["int4", "group 64", "a8"]
    prune = columns_for("prune")[0]
    assert prune.cell({"sparsity": 0.5, "kind": "structured"}).label == "channels 50%"
    assert prune.cell({"sparsity": 0.25, "kind": "unstructured"}).label == "sparse 25%"
    assert prune.cell(None).label == "dense" and prune.cell(None).level is None
    exit_ = columns_for("early_exit")[0]
    assert exit_.cell({"threshold": 0.95}).label == "exit ≥0.95"
    assert exit_.cell({"threshold": 0.8}).level > exit_.cell({"threshold": 0.99}).level  # lower: more exits


def test_plan_mix_counts_settings_per_compressor():
    plan = {"a/quantize": {"bits": 8}, "b/quantize": {"bits": 4}, "c/quantize": {"bits": 4},
            "a/prune": None, "b/prune": {"sparsity": 0.75, "kind": "unstructured"},
            "b/early_exit": {"threshold": 0.9}}
    assert plan_mix(plan) == "int8×1 int4×2 dense×1 sparse 75%×1 exit ≥0.9×1"
