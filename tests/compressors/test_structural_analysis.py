"""A compressor brings its own structural analysis through the contract (issue 57): the workload builds it on the first
ask, once, and the compressor's menus read what it found; nothing under modelopt/model/ names it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelopt.compressors.contract import Analysis, Choice, Compressor, ModelView, UsesAnalyses
from modelopt.model.layers import Layer
from modelopt.plan.space import SearchSpace

MODEL = Path(__file__).resolve().parents[2] / "modelopt" / "model"


def _norms_after(view: ModelView) -> dict[str, str]:
    """{conv: the batch norm that reads its output}, found in the model's graph (torch.fx), not in its layers."""
    traced = torch.fx.symbolic_trace(view.model)
    modules = dict(traced.named_modules())
    out = {}
    for node in traced.graph.nodes:
        if node.op == "call_module" and isinstance(modules[node.target], nn.BatchNorm2d):
            feed = node.args[0]
            if isinstance(feed, torch.fx.Node) and feed.op == "call_module" and feed.target in view.layers:
                out[str(feed.target)] = str(node.target)
    return out


def _toy(built: list[ModelView]) -> tuple[type[Analysis[Any, Any]], type[Compressor]]:
    """A fresh analysis (the norm after each conv) and a compressor whose menu offers to fold it, one pair per call."""

    class NormAfter(Analysis[dict[str, str], str]):
        name = "test_norm_after"  # not registered: a run folder's layer table does not keep it

        @classmethod
        def build(cls, view: ModelView) -> dict[str, str]:
            built.append(view)
            return _norms_after(view)

        @classmethod
        def facts(cls, result: dict[str, str]) -> Mapping[str, str]:
            return result

    class FoldNorm(Compressor, UsesAnalyses):
        name = "test_fold_norm"
        analyses = (NormAfter,)

        def menu(self, layer: Layer) -> tuple[Choice, ...]:
            norm = NormAfter.of(layer)
            return () if norm is None else (None, ("fold", norm))

        def parse(self, raw: Mapping[str, Any] | None, layer: Layer) -> Choice:
            return None if raw is None else ("fold", NormAfter.of(layer))

        def dump(self, choice: Choice) -> dict[str, Any] | None:
            return None if choice is None else {"fold": True}

        def apply(self, weight: torch.Tensor, choice: Choice) -> torch.Tensor:
            return weight

        def weight_bytes(self, layer: Layer, choice: Choice) -> int:
            return layer.params * 4

    return NormAfter, FoldNorm


def test_the_workload_builds_a_compressors_analysis_on_first_use_once_and_its_menu_reads_it(resnet20_workload):
    wl = resnet20_workload
    built: list[ModelView] = []
    norm_after, fold_norm = _toy(built)
    assert built == []  # the workload exists and has not built it: nobody asked

    space = SearchSpace(wl.layers, [fold_norm()])
    assert len(built) == 1 and built[0].model is wl.model and set(built[0].layers) == set(wl.modules)
    found = wl.analyses.get(norm_after)
    assert len(built) == 1  # kept: asking again builds nothing
    # ResNet-20: a norm after each of its 19 convs (option-A shortcuts have none), none after the linear head.
    convs = {n for n, m in wl.modules.items() if isinstance(m, nn.Conv2d)}
    assert found == {n: n.replace("conv", "bn") for n in convs}
    # The menus offered exactly what the analysis found, on exactly the layers it found something on.
    assert {d.layer: d.choices for d in space.decisions} == {n: (None, ("fold", norm)) for n, norm in found.items()}
    assert norm_after.of(space.layers["layer2.1.conv2"]) == "layer2.1.bn2"
    assert norm_after.of(space.layers["linear"]) is None

    SearchSpace(wl.layers, [fold_norm()])  # a second space on the same workload
    assert len(built) == 1


def test_an_analysis_no_compressor_asks_for_is_never_built(resnet20_workload):
    built: list[ModelView] = []
    norm_after, fold_norm = _toy(built)

    class Plain(fold_norm):  # the same menus, but it lists no analysis
        analyses = ()

    space = SearchSpace(resnet20_workload.layers, [Plain()])
    assert built == [] and len(space) == 0  # nothing found, nothing offered
    assert all(norm_after.of(layer) is None for layer in space.layers.values())


def test_the_workload_and_its_layers_name_no_plugin_and_no_plugins_analysis():
    words = re.compile(r"prune|prunable|channel_group|branch|depth|quantiz|early_exit|ChannelAnalysis|BranchAnalysis")
    for name in ("workload.py", "layers.py", "analysis.py"):
        text = (MODEL / name).read_text(encoding="utf-8")
        assert not words.findall(text), f"modelopt/model/{name} names {sorted(set(words.findall(text)))}"
