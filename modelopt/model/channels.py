"""Which channels must be removed together, found in the model's graph, and their removal: simulated
(zeroed) or physical.

Torch-Pruning's dependency graph (`torch_pruning.DependencyGraph`, traced once) groups every layer's output
channels with everything that shares them: the norm after the layer, depthwise convolutions on them, the
layers reading them, residual additions that tie several layers' outputs together, concatenations, channel
shuffles, squeeze-excitation, attention projections, MLP hidden units. A group is offered for structured
pruning when removing channels from it is exactly what zeroing them computes: the evaluator scores a plan
with the removed channels' weights zeroed (every slice of the group: a layer's rows, a reader's columns, a
norm's scale and shift) and deploys the physically smaller model (Torch-Pruning's own slicing), so the two
must agree. Each group is checked once, on the model as loaded: a quarter of its channels zeroed against
the same channels removed, on two images (a norm across channels, LayerNorm, computes other statistics
without them: such groups are left out). A group that changes the model's outputs (its classes) is too.

The groups are a structural analysis (`ChannelAnalysis`, `modelopt.model.analysis`), built the first time a search
space's compressors ask for it (`RemovesChannels` does); each group's record (`ChannelGroup`) is on its root layer.

Example:
    >>> groups = ChannelGroups(model, x[:2], [layer.name for layer in layers])
    >>> list(groups.roots)[:2], groups.roots["layer1.0.conv1"]
    (['layer1.0.conv1', 'layer1.1.conv1'], 16)
    >>> removals = groups.removals("layer1.0.conv1", [0, 5, 7])
    >>> smaller = groups.remove(copy.deepcopy(model), removals)
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from modelopt.errors import ConfigError
from modelopt.model._torch_pruning import tp
from modelopt.model.analysis import ANALYSES, Analysis, ModelView
from modelopt.model.layers import Layer

__all__ = ["ChannelAnalysis", "ChannelGroup", "ChannelGroups", "Channels", "Removal", "zeroed"]

log = logging.getLogger(__name__)

_CHECK_TOLERANCE = 1e-4  # relative: zeroed and removed logits must agree to float32 rounding


@dataclass(frozen=True)
class Removal:
    """Channels removed from one module: its outputs (rows of a weight, a norm's entries) or its inputs."""

    module: str
    out: bool
    idxs: tuple[int, ...]


class ChannelGroups:
    """The channel groups of `model` that structured pruning may remove from, by root layer.

    Args:
        model: The model (its structure is traced once; it is not changed).
        example: A batch of inputs (its first two rows are traced and check each group).
        layers: The compressible layers (a group's root is one of them).
        check: Check each group's zeroing against its removal (off: trust them, e.g. to rebuild a model).

    Raises:
        ConfigError: the model does not trace (a one-line reason; it keeps the other compressors).
    """

    def __init__(self, model: nn.Module, example: torch.Tensor, layers: Iterable[str], *, check: bool = True) -> None:
        # Traced on a copy of its own, with gradients (the graph is read off autograd), whatever mode the caller
        # is in (a model built under inference mode holds inference tensors, which cannot require gradients).
        with torch.inference_mode(False), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unwrapped parameters (a class token): their groups fail the check
            self.model = copy.deepcopy(model)
            for p in self.model.parameters():
                p.requires_grad_(True)
            self._names = {m: n for n, m in self.model.named_modules()}
            try:
                self._graph = tp.DependencyGraph().build_dependency(self.model, example_inputs=example[:1].clone())
            except Exception as exc:  # noqa: BLE001 -- any tracing failure: the model keeps the other compressors
                raise ConfigError(f"structured pruning needs the model's graph, and it does not trace "
                                  f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]})") from None
        wanted = set(layers)
        self.roots: dict[str, int] = {}  # root layer -> its group's channels
        for group in self._graph.get_all_groups(root_module_types=[nn.Conv2d, nn.Linear]):
            root = self._names.get(group[0].dep.target.module)
            channels = len(group[0].idxs)
            if root in wanted and channels >= 2 and (not check or self._exact(root, channels, example[:2])):
                self.roots[root] = channels

    def removals(self, root: str, removed: Sequence[int]) -> tuple[Removal, ...]:
        """What removing output channels `removed` of `root` removes, module by module."""
        module = self.model.get_submodule(root)
        pruner = self._graph.get_pruner_of_module(module)
        group = self._graph.get_pruning_group(module, pruner.prune_out_channels, sorted(int(i) for i in removed))
        out = []
        for dep, idxs in group:
            name = self._names.get(dep.target.module)
            if name is None or not list(dep.target.module.parameters(recurse=False)):
                continue  # an operation without weights (activation, addition, concatenation)
            out.append(Removal(name, bool(self._graph.is_out_channel_pruning_fn(dep.handler)),
                               tuple(sorted(int(i) for i in idxs))))
        return tuple(out)

    def remove(self, model: nn.Module, removals: Iterable[Removal]) -> nn.Module:
        """`model` (a copy of the traced one, any weights) with the channels physically removed, in place."""
        for r in removals:
            module = model.get_submodule(r.module)
            pruner = self._graph.get_pruner_of_module(module)
            (pruner.prune_out_channels if r.out else pruner.prune_in_channels)(module, list(r.idxs))
        return model

    def _exact(self, root: str, channels: int, x: torch.Tensor) -> bool:
        """Whether zeroing a quarter of the group's channels computes what removing them does."""
        removals = self.removals(root, range(max(1, channels // 4)))
        try:
            with torch.inference_mode():
                small = self.remove(copy.deepcopy(self.model), removals)
                got = small(x)
            want = self._zeroed_output(removals, x)
        except Exception as exc:  # noqa: BLE001 -- a removal Torch-Pruning cannot apply: the group is not offered
            log.info("channel group of %s left out: %s", root, exc)
            return False
        if got.shape != want.shape:
            return False  # it removes outputs (classes)
        scale = float(want.abs().max()) or 1.0
        return float((got - want).abs().max()) <= _CHECK_TOLERANCE * scale


    def _zeroed_output(self, removals: Iterable[Removal], x: torch.Tensor) -> torch.Tensor:
        """The traced model's output with `removals` zeroed: the changed tensors swapped in and back (a copy of the
        whole model per group was most of a large model's check)."""
        changed = zeroed(self.model, removals)
        tensors = self.model.state_dict(keep_vars=True)
        saved = {k: tensors[k].detach().clone() for k in changed}
        try:
            with torch.no_grad():
                for k, v in changed.items():
                    tensors[k].copy_(v)
            with torch.inference_mode():
                return self.model(x)
        finally:
            with torch.no_grad():
                for k, v in saved.items():
                    tensors[k].copy_(v)


def zeroed(model: nn.Module, removals: Iterable[Removal]) -> dict[str, torch.Tensor]:
    """The state-dict entries that zeroing `removals` changes (weights, biases, norms' scales and shifts), as new
    tensors: the model computes what the physically smaller one does."""
    state = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for r in removals:
        module = model.get_submodule(r.module)
        idx = torch.tensor(r.idxs, dtype=torch.long)
        rows = r.out or _norm(module) or (isinstance(module, nn.Conv2d) and module.groups > 1)
        for pname in ("weight", "bias"):
            key = f"{r.module}.{pname}" if r.module else pname
            if key not in state or state[key] is None or (pname == "bias" and not rows):
                continue
            t = out.get(key, state[key]).clone()
            if rows:
                t[idx.to(t.device)] = 0
            else:
                t[:, idx.to(t.device)] = 0
            out[key] = t
    return out


def _norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm))


@dataclass(frozen=True)
class ChannelGroup:
    """One checked channel group, as its root layer carries it.

    Attributes:
        members: The compressible layers its output channels are rows (True) or columns (False) of, the root first
            (a block's conv1 and the conv2 reading it; a depthwise conv between them; every layer of a residual
            stream). Empty on a layer whose output channels no checked group removes.
        floats: The float entries per channel outside those weights that removing one drops (norms' scales and
            shifts, biases).
    """

    members: tuple[tuple[str, bool], ...] = ()
    floats: int = 0


NO_GROUP = ChannelGroup()


@dataclass(frozen=True)
class Channels:
    """What `ChannelAnalysis` finds: the checked groups, and each root's record (None: the model does not trace)."""

    groups: ChannelGroups | None
    roots: Mapping[str, ChannelGroup] = field(default_factory=dict)
    refused: str | None = None  # why the model has no groups: it does not trace


@ANALYSES.register("channel_groups")
class ChannelAnalysis(Analysis[Channels, ChannelGroup]):
    """The channel groups structured pruning may remove (`ChannelGroups`, each checked once), by root layer.

    Example:
        >>> ChannelAnalysis.of(space.layers["layer1.0.conv1"]).members
        (('layer1.0.conv1', True), ('layer1.0.conv2', False))
        >>> workload.analyses.get(ChannelAnalysis).groups.removals("layer1.0.conv1", [0, 5])
    """

    @classmethod
    def build(cls, view: ModelView) -> Channels:
        try:
            groups = ChannelGroups(view.model, view.example, view.layers, check=view.check)
        except ConfigError as exc:  # it does not trace: the model keeps the other compressors
            return Channels(None, refused=str(exc))
        roots = {root: _group(groups, root, view.layers) for root in view.layers if root in groups.roots}
        return Channels(groups, roots)

    @classmethod
    def facts(cls, result: Channels) -> Mapping[str, ChannelGroup]:
        return result.roots

    @classmethod
    def of(cls, layer: Layer) -> ChannelGroup:
        """`layer`'s group where it roots one, else an empty one."""
        found = layer.fact(cls.name)
        return found if isinstance(found, ChannelGroup) else NO_GROUP

    @classmethod
    def to_json(cls, fact: ChannelGroup | None) -> dict[str, Any]:
        fact = fact or NO_GROUP
        return {"channel_group": [list(m) for m in fact.members], "channel_floats": fact.floats}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> ChannelGroup | None:
        """An older layer table named a block's conv2 (`channel_consumer`): the group of conv1's rows, its norm (two
        entries a channel, and the bias) and conv2's columns."""
        if "channel_group" in entry:
            members = tuple((str(m), bool(r)) for m, r in entry["channel_group"])
            return ChannelGroup(members, int(entry.get("channel_floats", 0))) if members else None
        if "channel_consumer" not in entry:
            raise KeyError("channel_group")  # written before structured pruning's fields
        if entry["channel_consumer"]:
            return ChannelGroup(((entry["name"], True), (entry["channel_consumer"], False)),
                                2 + int(bool(entry.get("has_bias"))))
        return None


def _group(groups: ChannelGroups, root: str, modules: Mapping[str, nn.Module]) -> ChannelGroup:
    """`root`'s group: its compressible members as (layer, rows), the float entries it drops per channel."""
    members: list[tuple[str, bool]] = []
    floats = 0
    for r in groups.removals(root, [0]):
        module = groups.model.get_submodule(r.module)
        rows = r.out or (isinstance(module, nn.Conv2d) and module.groups > 1)
        if r.module in modules:
            members.append((r.module, rows))
            floats += int(rows and getattr(module, "bias", None) is not None)
        else:  # a norm: its scale and shift
            floats += sum(getattr(module, a, None) is not None for a in ("weight", "bias"))
    members.sort(key=lambda m: m[0] != root)  # the root first
    return ChannelGroup(tuple(dict.fromkeys(members)), floats)
