"""Early exit while plans are scored (`Routes.routing`): which exits a plan turns on, their heads
(fitted once, on the float model, and charged once), the priors strategies read, where each sample
left, the deployable `EarlyExitNet`, and the heads a packed checkpoint stores.

The evaluator drives it through the `Routing` contract (`modelopt.evaluation.routes`) with the plan's
early-exit choices, {decision layer: ExitChoice or None}; a route is the plan's `ExitPolicy`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from modelopt.compressors._base import Choice
from modelopt.compressors._routing import ExitTap, Forward, Route, Routing
from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec
from modelopt.compressors.early_exit.module import EarlyExitNet, HeadModule
from modelopt.compressors.early_exit.policy import ExitPolicy
from modelopt.compressors.early_exit.runtime import ExitLayout, ExitProbe, decide, exit_layout, fit_heads
from modelopt.data.split import Split
from modelopt.errors import ConfigError, LoadError, TrialError
from modelopt.model.backbone import split_backbone
from modelopt.model.images import Images
from modelopt.model.workload import Workload

__all__ = ["HEAD_TENSORS", "ExitRouting", "with_exits"]

HEAD_TENSORS = ("weight", "bias", "temperature", "hidden_weight", "hidden_bias")  # an exit head's, in file order
HEADS, PRIORS = "exit_heads", "exit_priors"  # one-time preparations: the heads' fit, the priors' val pass


class ExitRouting(Routing):
    """Early exit for one evaluator's workload and the early-exit decisions of its space.

    Args:
        workload: The resident model and splits.
        decisions: (decision layer, choices) of each candidate exit.
        extra_images: Normalised images (never val or test) the heads are fitted on besides the calib
            split; their feature pass is charged with the fit.

    Example:
        >>> routing = ExitRouting(wl, [(d.layer, d.choices) for d in exit_decisions])
        >>> policy = routing.route({"layer2.0.conv2": ExitChoice(0.95)})
        >>> charges = routing.prepare(policy)
        >>> pred, exit_at = routing.predict(wl.logits, x, policy)
    """

    def __init__(self, workload: Workload, decisions: Sequence[tuple[str, tuple[Choice, ...]]],
                 extra_images: torch.Tensor | None = None) -> None:
        self.workload = workload
        self.decisions = tuple(decisions)
        self._extra = extra_images
        self._layout: ExitLayout | None = None
        self._heads: dict[str, ExitHead] | None = None
        self._fit_cost = 0.0
        self._priors = False  # computed: their val pass is charged to the run's first trial

    @property
    def layout(self) -> ExitLayout:
        """Where the candidate exits sit (what their heads cost in MACs), known before any fitting."""
        if self._layout is None:
            _, _, height, width = self.workload.split(Split.VAL).x.shape
            self._layout = exit_layout(self.workload.model, (height, width), [layer for layer, _ in self.decisions],
                                       [x.name for x in self.workload.layers])
        return self._layout

    def heads(self) -> tuple[dict[str, ExitHead], float]:
        """The fitted head of every candidate exit, and the budget fitting them cost now (0 once fitted).
        Fitted once, on the float model."""
        if self._heads is not None:
            return self._heads, 0.0
        val = self.workload.split(Split.VAL)
        self._heads, images = fit_heads(self.layout, self.workload.split(Split.CALIB).x, val.x, extra=self._extra)
        self._fit_cost = images / len(val)
        return self._heads, self._fit_cost

    def route(self, choices: Mapping[str, Choice]) -> ExitPolicy | None:
        if all(c is None for c in choices.values()):
            return None
        return self.layout.policy(choices)

    def one_time_keys(self, route: Route | None) -> set[str]:
        keys = {HEADS, PRIORS} if self._priors else set()
        if route is not None:
            keys.add(HEADS)
        return keys

    def prepare(self, route: Route | None) -> dict[str, float]:
        if route is not None:
            self.heads()
        return {key: self._fit_cost if key == HEADS else 1.0 for key in self.one_time_keys(route)}

    def predict(self, forward: Forward, x: Images, route: Route) -> tuple[torch.Tensor, torch.Tensor]:
        policy = _policy(route)
        heads, _ = self.heads()
        with ExitProbe(self.layout, heads, policy) as probe:
            logits = forward(x)
        head_logits = probe.logits()
        if not torch.isfinite(logits).all() or not all(torch.isfinite(t).all() for t in head_logits.values()):
            raise TrialError(f"exits {policy.exits} give non-finite outputs")
        exit_at, pred = decide(head_logits, logits, heads, policy)
        return pred, exit_at

    def reach(self, route: Route, exit_at: torch.Tensor) -> dict[str, float]:
        layout, policy = self.layout, _policy(route)
        n = max(1, int(exit_at.numel()))
        # A sample leaving at exit j ran every block up to and including exit j's block.
        last_block = torch.tensor([layout.block_index(e) for e in policy.exits] + [len(layout.backbone.blocks)],
                                  device=exit_at.device)[exit_at]
        return {x.name: float((last_block >= layout.block_of[x.name]).sum()) / n for x in self.workload.layers}

    def extra_macs(self, route: Route, exit_at: torch.Tensor) -> float:
        """Mean head MACs per sample: a sample evaluated every active head up to where it left."""
        layout, policy = self.layout, _policy(route)
        n = max(1, int(exit_at.numel()))
        return sum(layout.head_macs(e) * float((exit_at >= j).sum()) / n for j, e in enumerate(policy.exits))

    def left_early(self, route: Route, exit_at: torch.Tensor) -> float:
        return float((exit_at < len(_policy(route).exits)).float().mean())

    def priors(self) -> dict[str, tuple[tuple[float, float] | None, ...]]:
        """Per exit choice, what strategies may expect before trying it: the MACs it saves and an
        accuracy-loss proxy, from the fitted heads on the float model over val (the share of images
        that would leave there alone, and of those whose head disagrees with the full model).

        The loss proxy is put on the weight-error scale the strategies' priors read (`error`):
        sqrt(expected drop) / 0.5, the square root of the drop per unit of relative weight error
        the MCTS starts from. Fitting the heads and this val pass are charged to the next trial.
        """
        heads, _ = self.heads()
        layout = self.layout
        points = tuple(p.name for p in layout.backbone.points if p.name in heads)
        every = ExitPolicy(points, tuple(2.0 for _ in points))  # heads run, nobody leaves
        with ExitProbe(layout, heads, every) as probe:
            full = self.workload.logits(self.workload.split(Split.VAL).x).argmax(1)
        logits = probe.logits()
        self._priors = True
        total = layout.backbone.total_macs
        out: dict[str, tuple[tuple[float, float] | None, ...]] = {}
        for layer, choices in self.decisions:
            point = layout.point_of[layer]
            conf = heads[point].confidence(logits[point])
            differs = logits[point].argmax(1) != full
            after = total - layout.backbone.point(point).macs
            per_choice: list[tuple[float, float] | None] = []
            for c in choices:
                if c is None:
                    per_choice.append(None)
                    continue
                fire = conf >= getattr(c, "threshold", math.inf)
                share, wrong = float(fire.double().mean()), float((fire & differs).double().mean())
                per_choice.append((share * after - layout.head_macs(point), math.sqrt(0.9 * wrong) / 0.5))
            out[layer] = tuple(per_choice)
        return out

    def describe(self, route: Route) -> str:
        exits = _policy(route).exits
        return f"{'an exit' if len(exits) == 1 else 'exits'} after block {', '.join(repr(e) for e in exits)}"

    def deployable(self, model: nn.Module, route: Route) -> nn.Module:
        """`model` in an `EarlyExitNet` that really returns at the first confident exit."""
        heads, _ = self.heads()
        _, _, height, width = self.workload.split(Split.VAL).x.shape
        return EarlyExitNet(split_backbone(model, (height, width)), heads, _policy(route)).eval()

    def taps(self, model: nn.Module, route: Route) -> list[ExitTap]:
        """The active exits of `route` on `model` (the plan's physical model): each block, its head, its threshold.

        Raises:
            ConfigError: the plan removes channels of a block's output that an exit's head reads (the head was
                fitted on them).
        """
        heads, _ = self.heads()
        policy = _policy(route)
        _, _, height, width = self.workload.split(Split.VAL).x.shape
        backbone = split_backbone(model, (height, width))
        blocks = dict(backbone.blocks)
        out = []
        for point, threshold in zip(policy.exits, policy.thresholds, strict=True):
            if heads[point].spec.features(backbone.point(point).channels) != heads[point].in_features:
                raise ConfigError(f"the plan removes output channels of block {point!r}, which its exit's head was "
                                  "fitted on; an exit cannot follow a block whose output channels are pruned")
            out.append(ExitTap(point, blocks[point], HeadModule(heads[point], backbone.point(point).size), threshold))
        return out

    def pack(self, route: Route) -> tuple[list[Any], list[torch.Tensor]]:
        """Each active head: [exit point, threshold, avg grids, max grids, hidden units, [[tensor, shape], ...]]
        and its tensors, float32 (what size_bytes counts)."""
        policy = _policy(route)
        heads, _ = self.heads()
        entries: list[Any] = []
        floats: list[torch.Tensor] = []
        for point, threshold in zip(policy.exits, policy.thresholds, strict=True):
            tensors = heads[point].state_dict()
            names = [n for n in HEAD_TENSORS if n in tensors]
            spec = heads[point].spec
            entries.append([point, threshold, list(spec.avg_grids), list(spec.max_grids), spec.hidden,
                            [[n, list(tensors[n].shape)] for n in names]])
            floats += [tensors[n].float().reshape(-1) for n in names]
        return entries, floats


def with_exits(module: nn.Module, entries: list[Any], floats: torch.Tensor, meta: Mapping[str, Any]) -> nn.Module:
    """The loaded model wrapped in the `EarlyExitNet` a packed checkpoint's exit entries describe (`pack`)."""
    heads, off = {}, 0
    for point, _, avg, mx, hidden, shapes in entries:
        t = {}
        for name, shape in shapes:
            n = math.prod(shape)
            t[name] = floats[off : off + n].reshape(shape).clone()
            off += n
        heads[point] = ExitHead(HeadSpec(tuple(avg), tuple(mx), int(hidden)), t["weight"], t["bias"],
                                t.get("hidden_weight"), t.get("hidden_bias"), t["temperature"])
    size = meta.get("input_size") or [32, 32]
    try:
        backbone = split_backbone(module, (int(size[-2]), int(size[-1])))
        policy = ExitPolicy(tuple(e[0] for e in entries), tuple(float(e[1]) for e in entries))
        return EarlyExitNet(backbone, heads, policy).eval()
    except ConfigError as exc:
        raise LoadError(f"its early exits do not fit the model: {exc}") from None


def _policy(route: Route) -> ExitPolicy:
    if not isinstance(route, ExitPolicy):
        raise TypeError(f"an early-exit route is an ExitPolicy; got {route!r}")
    return route
