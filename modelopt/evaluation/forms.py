"""Each layer's weight as a plan stores it (`WeightForm`), step by step along the layer's compressor chain.

Every writer reads these (`Realised.steps`, `Realised.forms`), so what is written is what the evaluator scored: the
chain runs on the same structurally kept slice, with the same calibration inputs, in the same order as the weights
the plan runs with (`modelopt.evaluation.layer_weights`), each compressor adding its part through
`Compressor.pack`; a reconstructed plan's refitted weights come last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from modelopt.compressors.contract import Choice, WeightForm

__all__ = ["Step", "Steps"]


@dataclass(frozen=True)
class Step:
    """The layer's form after one compressor of its chain ran (``decision`` "": the start; "reconstructed": the
    weights a reconstructed plan was refitted to, on the same codes' grid, mask and shape)."""

    decision: str
    choice: Choice
    form: WeightForm


class Steps(Mapping[str, tuple[Step, ...]]):
    """Per layer, in model order, its steps: built on first read by `build`, then kept (the record they belong to
    is a value, so they never change)."""

    def __init__(self, layers: Sequence[str], build: Callable[[str], tuple[Step, ...]]) -> None:
        self._layers, self._build = tuple(layers), build
        self._built: dict[str, tuple[Step, ...]] = {}

    def __getitem__(self, layer: str) -> tuple[Step, ...]:
        if layer not in self._built:
            if layer not in self._layers:
                raise KeyError(layer)
            self._built[layer] = self._build(layer)
        return self._built[layer]

    def __iter__(self) -> Iterator[str]:
        return iter(self._layers)

    def __len__(self) -> int:
        return len(self._layers)
