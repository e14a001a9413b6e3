"""Each layer's weight under a plan, compressed once per (layer, choices) and cached: what `Realised` records hold.

`LayerWeights` applies each layer's compressor chain to its weight (cached on the workload, so runs that share it
share them), slicing structured pruning's removed channels out first and scattering the result back; it knows what a
plan keeps (channels), removes (residual branches, repaired: `modelopt.model.skip_repair`) and stores (the forms along
each layer's chain: `modelopt.evaluation.forms`). Everything here is a function of the plan: what runs it (the state
swapped in, batch-norm statistics, activation ranges) is `modelopt.evaluation.compressed_state`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from modelopt.compressors.contract import RemovesChannels, WeightForm, form_bytes
from modelopt.data.split import Split
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.forms import Step
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.evaluation.realised import Kept, Slices
from modelopt.model.branches import Branch, BranchAnalysis
from modelopt.model.channels import ChannelAnalysis, Removal
from modelopt.model.layer_inputs import LayerInputs, input_columns, input_hessians
from modelopt.model.skip_repair import branch_means, skip_state
from modelopt.model.workload import Workload
from modelopt.plan.plan import Decision, Plan
from modelopt.plan.space import SearchSpace
from modelopt.solvers.least_squares import refit_reader

__all__ = ["SKIP_IMAGES", "LayerWeights"]

# Calibration images a removed branch's mean and the next block's refit are measured on (`skip_repair`; more buy
# little: docs/compressors.md, depth).
SKIP_IMAGES = 512


def _kept(n: int, removed: set[int]) -> torch.Tensor | None:
    """The ascending indices of `n` that `removed` leaves (None: all of them)."""
    return None if not removed else torch.tensor(sorted(set(range(n)) - removed), dtype=torch.long)


class LayerWeights:
    """What a plan does to each compressible layer of the workload's model.

    Example:
        >>> lw = LayerWeights(wl, space, OneTimeCosts())
        >>> lw.weights(plan)["layer1.0.conv1"].shape, lw.kept_slices(plan)
    """

    def __init__(self, workload: Workload, space: SearchSpace, one_time: OneTimeCosts) -> None:
        self.workload, self.space, self.one_time = workload, space, one_time
        # Compressed tensors live on the workload, so runs that share it (a sweep) share them too.
        self._tensors: dict[tuple[Any, ...], torch.Tensor] = workload.tensor_cache
        # Cached tensors are keyed by each compressor's name and options, so runs that share a
        # workload with differently configured compressors never read each other's tensors.
        self._compressor_keys = {
            name: (name, repr(sorted(c.options().items()))) for name, c in space.compressors.items()
        }
        self._layer_decisions = {
            layer.name: [d for d in space.decisions if d.layer == layer.name] for layer in workload.layers
        }
        # The roots of the channel groups structured pruning may remove from (`modelopt.model.channels`).
        self._layers = dict(space.layers)
        self._roots = [x.name for x in space.layers.values() if ChannelAnalysis.of(x).members]
        self._kept: dict[tuple[Any, ...], torch.Tensor | None] = {}
        self._removals: dict[tuple[str, tuple[int, ...]], tuple[Removal, ...]] = {}
        self._skips: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}  # removed blocks -> their float state
        self._means: dict[str, torch.Tensor] | None = None  # every removable branch's mean (`branch_means`)
        self._skipped: dict[str, tuple[Branch, ...]] = {}  # plan key -> the branches it removes
        # `layer_keys` -> the stored forms along the layer's chain (GPTQ's codes again, for every reconstruction's
        # targets and every export, without this).
        self._forms: dict[tuple[Any, ...], tuple[Step, ...]] = {}
        self._keys: dict[str, dict[str, tuple[Any, ...]]] = {}  # plan key -> `layer_keys`

    def decisions(self, layer: str) -> list[Decision]:
        """The decisions on `layer`, in the space's order: its compressor chain."""
        return self._layer_decisions[layer]

    # ---- removed branches (depth) ---------------------------------------------------------

    def skipped(self, plan: Plan) -> tuple[Branch, ...]:
        """The residual branches the plan removes (`SearchSpace.removed_branches`), in model order (kept per plan:
        every layer's weights ask)."""
        if plan.key not in self._skipped:
            self._skipped[plan.key] = tuple(self.workload.analyses.get(BranchAnalysis).branches[end]
                                            for end in self.space.removed_branches(plan))
        return self._skipped[plan.key]

    def skip_key(self, plan: Plan) -> str:
        """The removed blocks as one-time preparations name them ("" for none)."""
        return ",".join(b.block for b in self.skipped(plan))

    def skip_state(self, plan: Plan) -> dict[str, torch.Tensor]:
        """The float tensors of the model with the plan's branches removed and repaired (`skip_repair.skip_state`;
        cached per set of removed blocks, charged once each as three passes over its images)."""
        skips = self.skipped(plan)
        if not skips:
            return {}
        key = tuple(b.block for b in skips)
        if key not in self._skips:
            if self._means is None:
                branches = self.workload.analyses.get(BranchAnalysis).branches
                self._means = branch_means(self.workload, tuple(branches.values()), SKIP_IMAGES)
            self._skips[key] = skip_state(self.workload, skips, SKIP_IMAGES, self._means)
        return self._skips[key]

    def float_weight(self, lname: str, plan: Plan) -> torch.Tensor:
        """`lname`'s weight before compression under `plan`: the float one, or the refit that stands in for a
        removed branch before it (`skip_state`)."""
        own = self.skip_state(plan).get(f"{lname}.weight")
        return self.workload.original[lname] if own is None else own

    # ---- structured pruning ---------------------------------------------------------------

    def kept_channels(self, plan: Plan) -> Kept:
        """{root layer: (decision, ascending kept output channels)} for the plan's structured pruning."""
        out = {}
        for lname in self._roots:
            for d in self._layer_decisions[lname]:
                c = plan.get(d.name)
                if c is None:
                    continue
                key = (lname, self._compressor_keys[d.compressor], c)
                if key not in self._kept:
                    self._kept[key] = self._select(lname, d.compressor, c)
                idx = self._kept[key]
                if idx is not None:
                    out[lname] = (d.name, idx)
        return out

    def _select(self, root: str, compressor: str, choice: Any) -> torch.Tensor | None:
        """The output channels of `root` a structured choice keeps (`RemovesChannels.kept_channels`), told the
        group's one plain reader when the choice asks for layer inputs (its readers are then refitted)."""
        comp = self.space.compressors[compressor]
        if not isinstance(comp, RemovesChannels):
            return None
        reader = self._reader(root, comp.calibration(choice).layer_inputs)
        return comp.kept_channels(self.workload.original[root], choice, reader)

    def _reader(self, root: str, images: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(weight, input second moments) of the one layer reading `root`'s group, when it has exactly one, not
        grouped, and `root` is the group's only writer; None otherwise or without images."""
        group = ChannelAnalysis.of(self._layers[root]).members
        readers = [m for m, out in group if not out]
        writers = [m for m, out in group if out]
        if not images or len(readers) != 1 or writers != [root] or readers[0] not in self._layers:
            return None
        inputs = self.layer_inputs(readers[0], images)
        if inputs is None or inputs.groups > 1:
            return None
        return self.workload.original[readers[0]], inputs.hessian

    def removals(self, plan: Plan) -> tuple[Removal, ...]:
        """What the plan's structured pruning removes, module by module (each root's group, its channels mapped
        onto every member: `ChannelGroups.removals`)."""
        out: list[Removal] = []
        for root, (_, idx) in self.kept_channels(plan).items():
            removed = tuple(sorted(set(range(self._layers[root].out_channels)) - set(idx.tolist())))
            key = (root, removed)
            if key not in self._removals:
                groups = self.workload.analyses.get(ChannelAnalysis).groups
                assert groups is not None, "a prunable layer comes from the workload's groups"
                self._removals[key] = groups.removals(root, removed)
            out += self._removals[key]
        return tuple(out)

    def kept_slices(self, plan: Plan) -> Slices:
        """Per layer the plan's structured pruning shrinks: (kept rows, kept columns) of its weight, ascending
        (None: all of them)."""
        gone: dict[str, tuple[set[int], set[int]]] = {}
        for r in self.removals(plan):
            module = self.workload.modules.get(r.module)
            if module is None:
                continue  # a norm: zeroed in the state the plan swaps in
            along_rows = r.out or (isinstance(module, nn.Conv2d) and module.groups > 1)
            gone.setdefault(r.module, (set(), set()))[0 if along_rows else 1].update(r.idxs)
        out: Slices = {}
        for name, (rows, cols) in gone.items():
            shape = self.workload.original[name].shape
            out[name] = (_kept(shape[0], rows), _kept(shape[1], cols))
        return out

    # ---- weights --------------------------------------------------------------------------

    def layer_keys(self, plan: Plan) -> dict[str, tuple[Any, ...]]:
        """Per layer the plan changes, everything its compressed weight depends on (its choices and their
        compressors' options, the kept slice, the refit that repairs it): the key its weight and its stored forms
        are cached under. Layers left float and whole are absent. Kept per plan: every layer's form asks."""
        if (known := self._keys.get(plan.key)) is not None:
            return known
        slices = self.kept_slices(plan)
        absorbed, skips = self.skip_state(plan), tuple(b.block for b in self.skipped(plan))
        keys = {}
        for layer in self.workload.layers:
            decs = self._layer_decisions[layer.name]
            choices = tuple(plan.get(d.name) for d in decs)
            rows, cols = slices.get(layer.name, (None, None))
            if all(c is None for c in choices) and rows is None and cols is None:
                continue
            shape_key = tuple(None if t is None else tuple(t.tolist()) for t in (rows, cols))
            repair = self._repair_images(plan) if cols is not None else 0  # the readers' refit, or none
            # A layer refitted for a removed branch before it starts from that refit.
            absorbs = skips if f"{layer.name}.weight" in absorbed else ()
            keys[layer.name] = (layer.name, tuple(self._compressor_keys[d.compressor] for d in decs), choices,
                                shape_key, repair, *absorbs)
        self._keys[plan.key] = keys
        return keys

    def weights(self, plan: Plan) -> dict[str, torch.Tensor]:
        """The weights the plan's choices give each layer, compressed one layer at a time (cached)."""
        weights = {}
        for name, key in self.layer_keys(plan).items():
            w = self._tensors.get(key)
            if w is None:
                self._tensors[key] = w = self._compress(name, plan, key).contiguous()
            weights[name] = w
        return weights

    def _compress(self, lname: str, plan: Plan, key: tuple[Any, ...]) -> torch.Tensor:
        # The chain runs on the physically kept slice, so it computes exactly what the smaller model holds (group
        # boundaries, per-tensor scales, magnitude ranks), then is scattered back. Its forms give the weight and
        # the bytes its codes take once coded, in one pass (GPTQ runs once per layer and choice).
        keep_rows, keep_cols = kept_slice = self.kept_slices(plan).get(lname, (None, None))
        steps = self._forms.get(key) or tuple(self._chain(plan, lname, kept_slice))
        form = steps[-1].form
        self.workload.coded_cache[key] = form_bytes(form)  # what `coded_bytes` reads
        w = form.weight
        if keep_rows is None and keep_cols is None:
            return w
        orig = self.workload.original[lname]
        rows = torch.arange(orig.shape[0], device=orig.device) if keep_rows is None else keep_rows.to(orig.device)
        cols = torch.arange(orig.shape[1], device=orig.device) if keep_cols is None else keep_cols.to(orig.device)
        full = torch.zeros_like(orig)
        full[rows[:, None], cols[None, :]] = w.to(orig.device)
        return full

    def _repair_images(self, plan: Plan) -> int:
        """Calibration images the readers of the plan's removed channels are refitted on: what its structured
        choices ask for (`CalibrationNeed.layer_inputs`; 0: none, no repair)."""
        compressors = self.space.compressors
        return max((compressors[self.space.decision(name).compressor].calibration(plan.get(name)).layer_inputs
                    for name, _ in self.kept_channels(plan).values()), default=0)

    def sliced(self, lname: str, plan: Plan) -> torch.Tensor:
        """`lname`'s float weight at the shape the plan stores: its kept rows and columns, refitted on the kept
        columns when the plan removed some of its inputs and repairs (`solvers.least_squares.refit_reader`; a
        grouped conv, whose groups read their own channels, is only sliced); a layer standing in for a removed
        branch before it, its refit (`float_weight`). Every compressor's chain starts here."""
        orig = self.float_weight(lname, plan)
        keep_rows, keep_cols = self.kept_slices(plan).get(lname, (None, None))
        w = orig if keep_rows is None else orig[keep_rows.to(orig.device)]
        if keep_cols is None:
            return w
        cols = keep_cols.to(orig.device)
        inputs = self.layer_inputs(lname, images) if (images := self._repair_images(plan)) else None
        if inputs is None or inputs.groups > 1:
            return w[:, cols]
        return refit_reader(w, inputs.hessian, input_columns(cols, orig[0, 0].numel())).reshape(
            w.shape[0], len(cols), *orig.shape[2:])

    def layer_inputs(self, lname: str, images: int,
                     kept: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)) -> LayerInputs | None:
        """Second moments of `lname`'s inputs in the float model over the first `images` calib images
        (a grouped conv's per group; None for a layer they are not measured on); `kept`: the (rows, columns)
        of the weight structured pruning keeps (None: all), whose inputs alone are returned. Measured
        once per image count for every layer (`gptq.input_hessians`), shared by runs on the workload;
        charged by `CompressedStates.input_cost`.
        """
        x = self.workload.split(Split.CALIB).x.part(0, images)  # prepared batch by batch as the pass reads them
        cache = self.workload.input_cache
        if x.shape[0] not in cache:
            t0 = time.perf_counter()
            with self.workload.weights(self.workload.original):
                cache[x.shape[0]] = input_hessians(self.workload.model, self.workload.modules, x,
                                                   self.workload.batch_size)
            self.one_time.timed(f"layer_inputs:{x.shape[0]}", time.perf_counter() - t0)
        inputs = cache[x.shape[0]].get(lname)
        rows, cols = kept
        if inputs is None:
            return None
        if rows is not None and inputs.groups > 1:  # a grouped conv keeps the groups its kept rows are in
            per_group = self.workload.original[lname].shape[0] // inputs.groups
            groups = torch.unique(rows // per_group)
            if groups.numel() * per_group != rows.numel():
                return None  # a partial group: no second moments fit it (nearest rounding)
            inputs = inputs.select_groups(groups)
        if cols is not None:
            inputs = inputs.select(input_columns(cols, self.workload.original[lname][0, 0].numel()))
        return inputs

    # ---- stored forms ---------------------------------------------------------------------

    def steps(self, plan: Plan, layer: str, fitted: Fitted | None) -> tuple[Step, ...]:
        """The layer's forms along its chain: first its float weight at the stored shape (the kept channels only,
        refitted where the plan repairs: `sliced`), then after each compressor whose choice is not None, and last,
        for a plan run with its refit `fitted`, the weights it was refitted to (decision "reconstructed")."""
        rows, cols = self.kept_slices(plan).get(layer, (None, None))
        key = self.layer_keys(plan).get(layer)
        cached = None if key is None else self._forms.get(key)
        steps = list(cached) if cached is not None else self._chain(plan, layer, (rows, cols))
        if key is not None and cached is None:  # the same choices on the same slice give the same forms: built once
            self._forms[key] = tuple(steps)
        if fitted is not None and layer in fitted.weights:  # reconstructed: the weights the plan was certified with
            w = fitted.weights[layer]
            w = w if rows is None else w[rows.to(w.device)]
            w = w if cols is None else w[:, cols.to(w.device)]
            last = steps[-1]
            form = WeightForm(w.to(last.form.weight.dtype), last.form.mask, fitted.integers.get(layer))
            steps.append(Step("reconstructed", last.choice, form))
        return tuple(steps)

    def _chain(self, plan: Plan, layer: str, kept: tuple[torch.Tensor | None, torch.Tensor | None]) -> list[Step]:
        """The layer's forms along its chain of compressors (`steps` before any reconstruction)."""
        own = self.kept_channels(plan).get(layer)
        steps = [Step("", None, WeightForm(self.sliced(layer, plan)))]
        for d in self._layer_decisions[layer]:
            choice = plan.get(d.name)
            # Slicing already applied the structured decision, as in the evaluator's chain.
            if choice is None or (own is not None and d.name == own[0]):
                continue
            comp = self.space.compressors[d.compressor]
            n = comp.calibration(choice).layer_inputs
            inputs = self.layer_inputs(layer, n, kept) if n else None
            steps.append(Step(d.name, choice, comp.pack(steps[-1].form, choice, inputs)))
        return steps
