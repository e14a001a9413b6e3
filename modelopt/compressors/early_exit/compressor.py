"""Early exit as a compressor plugin: "an exit after this block, at this confidence threshold".

Early exit is a model-level decision: it changes no weight, it adds exit heads (fitted on the
calib split with the backbone frozen, see `modelopt.compressors.early_exit`) and lets confident samples
leave the network early. To reuse the per-layer decision machinery (SearchSpace, Plan, YAML
plans, journals) unchanged, the decision is attached to the last layer of each candidate
block: the decision on ``layer2.4.conv2`` says whether an exit sits after block ``layer2.4``
and with which threshold. ``None`` (off) means no exit there; which exits are active is the set
of layers whose choice is not None. A plan reads, in YAML (the top-level form, which plans are
written in; the per-layer form ``layers: {layer2.4.conv2: {early_exit: {threshold: 0.95}}}``
is read too)::

    early_exit: {exits: [layer1.2, layer2.4], threshold: 0.95}
    early_exit: {exits: {layer1.2: 0.98, layer2.4: 0.9}}     # a threshold per exit

How the evaluator runs it (`modelopt.compressors.early_exit.runtime`, `Evaluator.exit_policy`):

1. `model_options` offers every block's end but the last (`exit_layers(split_backbone(model))`);
   `build_compressors` fills them into the options record's `exits` when the user names none.
2. The first plan with an active exit makes the evaluator fit one head per candidate exit on the
   float model (calib images, label-free; temperatures on val, label-free); the budget that
   costs is charged to that plan, like batch-norm re-estimation.
3. A plan's pass over the split runs the heads of its active exits on the plan's own
   (compressed) block outputs: each sample's exit and prediction, hence accuracy, retention,
   agreement, and mean MACs and bitops over the samples, heads included (docs/certification.md, Numbers).
4. Size: heads add their float32 bytes to size_bytes. `apply` leaves weights untouched and
   `stored` passes the layer's storage through, so a layer's other compressors (prune,
   quantize) keep owning its weight's bytes; `weight_bytes` (the layer's float32 bytes) is only
   what the plugin contract asks for when early exit is alone on the layer.
5. Latency: `EarlyExitNet(backbone, heads, policy)` is the deployable module that stops early.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from modelopt.compressors._base import Choice, Compressor
from modelopt.compressors._packing import Storage
from modelopt.compressors._registry import COMPRESSORS
from modelopt.compressors._routing import Routes
from modelopt.compressors._surface import Cell, ReportColumn
from modelopt.compressors.early_exit.options import EarlyExitOptions, threshold_error
from modelopt.compressors.early_exit.pools import load_exit_images
from modelopt.compressors.early_exit.routing import ExitRouting, with_exits
from modelopt.compressors.early_exit.runtime import RuntimeConfig
from modelopt.errors import ConfigError
from modelopt.model.backbone import exit_layers, split_backbone
from modelopt.model.layers import Layer, LayerKind
from modelopt.model.workload import Workload

__all__ = ["EarlyExit", "EarlyExitOptions", "ExitChoice", "exit_layers"]


@dataclass(frozen=True)
class ExitChoice:
    """An active exit after the block this layer ends, leaving at confidence >= threshold."""

    threshold: float

    def __post_init__(self) -> None:
        if (why := threshold_error(self.threshold)) is not None:
            raise ConfigError(why)

    def __str__(self) -> str:
        return f"exit@{self.threshold:g}"


@COMPRESSORS.register("early_exit")
class EarlyExit(Compressor, Routes):
    """Offers, on each candidate block's last layer, an exit at one of a few confidence thresholds.

    Takes its options as a record (`EarlyExitOptions`) or as its fields by keyword, which change that record.

    Args:
        thresholds: Confidence thresholds offered (each in (0, 1]).
        exits: Names (or fnmatch patterns) of the layers that end a candidate block, e.g.
            ``exit_layers(split_backbone(model))``; None (run with a model: its block ends) offers every
            convolution, which only a model whose every conv ends a block should use.
        blocks: The block each of `exits` ends (plans name exits by block); None: the layer's name
            without its last part (``layer2.1.conv2`` ends ``layer2.1``), as in a CIFAR ResNet.

    Example:
        >>> ee = EarlyExit(thresholds=(0.9, 0.99), exits=exit_layers(split_backbone(model)))
        >>> space = SearchSpace(workload.layers, [Quantize(), ee])
    """

    order = 90  # after every weight transform; it changes none
    packed_key = "e"  # a packed checkpoint's exit heads (`modelopt.compressors.early_exit.routing.ExitRouting.pack`)
    record = EarlyExitOptions
    opts: EarlyExitOptions
    report_columns = (ReportColumn("exit", "Greens", lambda raw: _exit_cell(raw)),)
    reduces = frozenset({"macs", "bitops", "latency"})  # heads add bytes: never smaller

    @classmethod
    def model_options(cls, model: torch.nn.Module) -> dict[str, Any]:
        """Every block's end but the last one's (an exit there saves nothing) is a candidate exit."""
        backbone = split_backbone(model)
        ends = list(exit_layers(backbone).items())[:-1]
        return {"exits": [layer for layer, _ in ends], "blocks": [block for _, block in ends],
                "classes": backbone.classes}

    # What the search is offered, read from the record (`EarlyExitOptions` checked every value when it was built).
    @property
    def thresholds(self) -> tuple[float, ...]:
        return tuple(sorted({float(t) for t in self.opts.thresholds}))

    @property
    def exits(self) -> tuple[str, ...]:
        return self.opts.exit_patterns

    @property
    def classes(self) -> int:
        return 10 if self.opts.classes is None else self.opts.classes

    @property
    def exit_data(self) -> str | None:
        return self.opts.exit_data

    @property
    def exit_images(self) -> int:
        return self.opts.exit_images

    @property
    def _block_of(self) -> dict[str, str]:
        blocks = self.opts.blocks
        return dict(zip(self.exits, blocks, strict=True)) if blocks else {}

    def routing(self, workload: Workload, decisions: Sequence[tuple[str, tuple[Choice, ...]]]) -> ExitRouting | None:
        """The heads, exits and priors of plans on `workload`; the heads are also fitted on `exit_images` of
        `exit_data` when given (images the search never scores, e.g. the training set)."""
        if not decisions:
            return None
        extra = None if self.exit_data is None else load_exit_images(workload, self.exit_data, self.exit_images)
        return ExitRouting(workload, decisions, extra)

    @classmethod
    def unpack(cls, module: torch.nn.Module, entries: list[Any], floats: torch.Tensor,
               meta: Mapping[str, Any]) -> torch.nn.Module:
        """The loaded model in the `EarlyExitNet` the stored heads and thresholds describe."""
        return with_exits(module, entries, floats, meta)

    def added_bytes(self, layer: Layer, choice: Choice) -> int:
        """An active exit's head, float32 (the evaluator's head: multi-grid pooling + linear): what
        `modelopt.evaluation.cost` adds to size_bytes for it."""
        if choice is None:
            return 0
        return RuntimeConfig().spec.params(layer.out_channels, self.classes) * 4

    def _offers(self, layer: Layer) -> bool:
        """A conv matching `exits`, or any layer they name exactly (a Linear can end a block: ConvNeXt's)."""
        return layer.name in self._block_of or (layer.kind is LayerKind.CONV and any(
            fnmatch.fnmatchcase(layer.name, p) for p in self.exits))

    def block(self, layer: str) -> str:
        """The block that `layer` ends: what a plan names its exit by."""
        return self._block_of.get(layer) or layer.rsplit(".", 1)[0]

    def menu(self, layer: Layer) -> tuple[Choice, ...]:
        return (None, *(ExitChoice(t) for t in self.thresholds)) if self._offers(layer) else ()

    def parse(self, raw: Mapping[str, Any] | None, layer: Layer) -> Choice:
        if raw is None:
            return None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            raw = {"threshold": raw}
        if not isinstance(raw, Mapping) or set(raw) != {"threshold"}:
            raise ConfigError(f"early_exit on {layer.name!r} takes {{threshold: T}} with T in (0, 1]; got {raw!r}")
        if not self._offers(layer):
            raise ConfigError(f"layer {layer.name!r} does not end a candidate exit block; candidates: {self.exits}")
        t = raw["threshold"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:  # before float(): "0.9", 10**400
            raise ConfigError(f"early_exit threshold on {layer.name!r} must be a number in (0, 1]; got {t!r}")
        return ExitChoice(float(t))

    def dump(self, choice: Choice) -> dict[str, Any] | None:
        if choice is None:
            return None
        assert isinstance(choice, ExitChoice)
        return {"threshold": choice.threshold}

    def parse_top(self, raw: Any, layers: Sequence[Layer]) -> dict[str, Choice] | None:
        """A plan's top-level form: ``early_exit: {exits: [layer1.2, layer2.1], threshold: 0.9}``, or
        one threshold per exit: ``early_exit: {exits: {layer1.2: 0.97, layer2.1: 0.9}}``. An exit is
        named by its block (``layer2.1``) or by the block's last layer (``layer2.1.conv2``)."""
        if raw is None:
            return {}
        offered = {self.block(x.name): x.name for x in layers if self._offers(x)}
        out: dict[str, Choice] = {}
        for name, t in _wanted_exits(raw).items():
            layer = name if name in offered.values() else offered.get(str(name))
            if layer is None:
                raise ConfigError(f"no candidate exit {name!r}; valid: {', '.join(offered)}")
            out[layer] = self.parse({"threshold": t}, next(x for x in layers if x.name == layer))
        return out

    def dump_top(self, choices: Mapping[str, Choice]) -> Any:
        active = {self.block(layer): _threshold(c) for layer, c in choices.items() if c is not None}
        if not active:
            return None
        shared = set(active.values())
        if len(shared) == 1:
            return {"exits": list(active), "threshold": shared.pop()}
        return {"exits": active}

    def apply(self, weight: torch.Tensor, choice: Choice) -> torch.Tensor:
        """Weights are untouched: the exit adds a head after the block, it does not change the layer."""
        return weight.clone() if choice is not None else weight

    def weight_bytes(self, layer: Layer, choice: Choice) -> int:
        """The layer's own float32 bytes (the head's bytes are counted apart: `added_bytes`)."""
        return layer.params * 4

    def stored(self, layer: Layer, choice: Choice, inner: Storage) -> Storage:
        """Storage is whatever the layer's other compressors made of it: an exit adds a head, apart."""
        return inner


def _wanted_exits(raw: Any) -> dict[str, Any]:
    """The exits a plan's top-level ``early_exit`` names, each with its threshold (as written)."""
    if not isinstance(raw, Mapping) or "exits" not in raw or not set(raw) <= {"exits", "threshold"}:
        raise ConfigError(f"plan key 'early_exit' takes {{exits: [BLOCK, ...], threshold: T}} or "
                          f"{{exits: {{BLOCK: T, ...}}}}; got {raw!r}")
    exits, shared = raw["exits"], raw.get("threshold")
    if isinstance(exits, (Mapping, list, tuple)) and not all(isinstance(name, str) for name in exits):
        name = next(name for name in exits if not isinstance(name, str))
        raise ConfigError(f"plan key 'early_exit.exits' names blocks like 'layer2.1'; got {name!r}")
    if isinstance(exits, Mapping):
        if shared is not None:
            raise ConfigError("plan key 'early_exit': give one threshold per exit or a shared 'threshold', not both")
        return dict(exits)
    if isinstance(exits, (list, tuple)):
        if shared is None:
            raise ConfigError("plan key 'early_exit' lists exits but no 'threshold'")
        return {name: shared for name in exits}
    raise ConfigError(f"plan key 'early_exit.exits' must be a list or a mapping of exits; got {exits!r}")


def _threshold(choice: Choice) -> float:
    """An active exit's threshold (early_exit's choices are ExitChoice or None)."""
    if not isinstance(choice, ExitChoice):
        raise TypeError(f"an active early_exit choice is an ExitChoice; got {choice!r}")
    return choice.threshold


def _exit_cell(raw: Mapping[str, Any] | None) -> Cell:
    if raw is None:
        return Cell("no exit", None)
    t = float(raw["threshold"])
    return Cell(f"exit ≥{t:g}", min(1.0, max(0.1, (1.0 - t) * 5)))  # lower thresholds exit more
