"""Merging a store's runs into one estimate per kind of layer, and looking a new layer up in it.

Every (compressor, fingerprint) seen in the store's runs of one model family and loss measure gets
one `Prior`: the layers' relative sensitivities combined by precision (each run's posterior std),
widened by how much the runs disagree (a between-runs variance), so two runs that agree tighten the
prior and two that do not leave it loose. A new layer takes the prior of the nearest matching
fingerprint (`LayerPrint.distance`), several equally near ones merged the same way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from modelopt.knowledge.fingerprint import LayerPrint
from modelopt.knowledge.lessons import LayerLesson
from modelopt.knowledge.store import Store

__all__ = ["Estimate", "KnowledgeIndex", "Prior", "combine"]

MIN_STD = 1e-3  # no estimate is surer than this (relative units), whatever the runs say


@dataclass(frozen=True)
class Estimate:
    mean: float
    std: float


def combine(estimates: Sequence[Estimate]) -> Estimate:
    """Precision-weighted mean; std from the summed precision plus the spread of the means.

    Example:
        >>> combine([Estimate(1.0, 0.1), Estimate(1.0, 0.1)]).std < 0.1
        True
    """
    if not estimates:
        raise ValueError("nothing to combine")
    m = np.array([e.mean for e in estimates])
    p = 1.0 / np.maximum(np.array([e.std for e in estimates]), MIN_STD) ** 2
    mean = float((p * m).sum() / p.sum())
    between = float((p * (m - mean) ** 2).sum() / p.sum())
    return Estimate(mean, float(np.sqrt(1.0 / p.sum() + between)))


@dataclass(frozen=True)
class Prior:
    """What the store says about one kind of layer: its relative sensitivity and each choice's residual."""

    kd_rel: Estimate
    beta_rel: dict[str, Estimate] = field(default_factory=dict)  # by `choice_key`
    layers: int = 1  # stored layer entries merged into it


def _merge(entries: Sequence[LayerLesson]) -> Prior:
    betas: dict[str, list[Estimate]] = defaultdict(list)
    for e in entries:
        for key, c in e.choices.items():
            betas[key].append(Estimate(c.beta_rel, c.beta_rel_std))
    return Prior(combine([Estimate(e.kd_rel, e.kd_rel_std) for e in entries]),
                 {k: combine(v) for k, v in betas.items()}, len(entries))


class KnowledgeIndex:
    """A store's layers of one family and loss measure, grouped by (compressor, fingerprint).

    Example:
        >>> index = KnowledgeIndex(read_store(path), family="cifar10_resnet", measure="broken")
        >>> index.lookup("quantize", LayerPrint.of("conv", weight))
    """

    def __init__(self, store: Store, *, family: str, measure: str) -> None:
        groups: dict[tuple[str, LayerPrint], list[LayerLesson]] = defaultdict(list)
        self.runs = 0
        for lessons in store.runs.values():
            if lessons.family != family or lessons.measure != measure:
                continue
            self.runs += 1
            for entry in lessons.layers:
                groups[(entry.compressor, entry.print)].append(entry)
        self._groups = dict(groups)
        self._merged: dict[tuple[str, LayerPrint], Prior] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def _prior(self, key: tuple[str, LayerPrint]) -> Prior:
        if key not in self._merged:
            self._merged[key] = _merge(self._groups[key])
        return self._merged[key]

    def lookup(self, compressor: str, lp: LayerPrint) -> Prior | None:
        """The prior of the nearest stored fingerprint matching `lp` (None: nothing matches)."""
        near: list[tuple[int, tuple[str, LayerPrint]]] = []
        for key in self._groups:
            if key[0] == compressor and (d := key[1].distance(lp)) is not None:
                near.append((d, key))
        if not near:
            return None
        best = min(d for d, _ in near)
        keys = [k for d, k in near if d == best]
        if len(keys) == 1:
            return self._prior(keys[0])
        return _merge([e for k in keys for e in self._groups[k]])
