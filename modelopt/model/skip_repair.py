"""Removed residual branches, simulated and repaired: the float state a plan that removes branches starts from.

A removed branch (`modelopt.model.branches`) leaves ``shortcut(x) + c``, `c` its mean output per channel on
calibration images: its end norm's scale becomes zero and its shift `c` (a biased last layer: weight zero, bias
`c`). That alone costs many points per block. The repair: the next kept block's branch is refitted to give, on top
of its own shortcut, the sum the float model's block gave there, so it carries what the removed branch added as
well as its own part (its last layer and the end's shift, least squares on calibration images, closed form); it
then changes a fraction of the answers the mean alone did (measured: docs/compressors.md#measured).

Example:
    >>> branches = workload.analyses.get(BranchAnalysis).branches
    >>> state = skip_state(workload, [branches["layer1.0.conv2"]], images=512)
    >>> with workload.state(state):
    ...     logits = workload.logits(x)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import torch
from torch import fx, nn

from modelopt.data.split import Split
from modelopt.model.branches import Branch, BranchAnalysis, residual_add, traced_block
from modelopt.model.layer_inputs import output_size, sampled_unfold
from modelopt.model.workload import Workload
from modelopt.solvers.least_squares import least_squares

__all__ = ["branch_means", "skip_state"]

_ROWS = 200_000  # output positions the refit samples at most (a 16-channel 3x3 layer's normal equations are exact)
# The ridge: a share of the mean diagonal (`least_squares.ridged`), smaller than the layer refits' `RIDGE`; it only
# keeps the normal equations solvable where an input channel is always zero.
_RIDGE = 1e-4


def branch_means(workload: Workload, branches: Sequence[Branch], images: int) -> dict[str, torch.Tensor]:
    """{branch end: its output's mean per channel} on the first `images` calibration images, float model."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    ends = {b.end: workload.model.get_submodule(b.end) for b in branches}

    def hook(name: str) -> object:
        def grab(_: nn.Module, __: object, out: torch.Tensor) -> None:
            sums[name] = sums.get(name, 0) + out.double().sum(dim=(0, 2, 3))
            counts[name] = counts.get(name, 0) + out.shape[0] * out.shape[2] * out.shape[3]
        return grab

    handles = [m.register_forward_hook(hook(n)) for n, m in ends.items()]  # type: ignore[arg-type]
    x = workload.split(Split.CALIB).x.part(0, images)
    try:
        with torch.inference_mode():
            for i in range(0, x.shape[0], workload.batch_size):
                workload.model(x[i:i + workload.batch_size])
    finally:
        for h in handles:
            h.remove()
    return {n: (sums[n] / counts[n]).float() for n in ends}


def _end_state(model: nn.Module, branch: Branch, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors that make `branch`'s end give `value` per channel, whatever reaches it."""
    end = model.get_submodule(branch.end)
    bias, weight = end.get_parameter("bias"), end.get_parameter("weight")
    # A norm of scale zero, or a biased layer of weight zero, gives its shift whatever reaches it.
    return {f"{branch.end}.bias": value.to(bias.device, bias.dtype), f"{branch.end}.weight": torch.zeros_like(weight)}


def skip_state(workload: Workload, skipped: Sequence[Branch], images: int,
               means: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The float tensors (state_dict names) of the model with `skipped` removed and, where `images` > 0, each run
    of removals absorbed by the next kept block's branch (its last layer's weight and the end's shift refitted).

    Args:
        workload: The resident model, its original weights and calibration images.
        skipped: The branches removed.
        images: Calibration images the means and the refits use (0: means on 512 images, no refit).
        means: The branches' means when already measured (`branch_means`).
    """
    if not skipped:
        return {}
    means = dict(means) if means is not None else branch_means(workload, skipped, images or 512)
    state: dict[str, torch.Tensor] = {}
    for b in skipped:
        state.update(_end_state(workload.model, b, means[b.end]))
    if not images:
        return state
    gone = {b.block for b in skipped}
    residuals = workload.analyses.get(BranchAnalysis)
    by_block = {b.block: b for b in residuals.branches.values()}
    blocks = residuals.blocks
    # The kept block after each run of removed ones absorbs it; refitting every later block as well keeps a little
    # more at several times the seconds (docs/compressors.md, depth), too slow for the plans a search scores.
    for before, name in itertools.pairwise(blocks):
        if before in gone and name not in gone and name in by_block:
            state.update(_absorb(workload, by_block[name], state, images))
    return state


class _Values(fx.Interpreter):
    """Runs a traced block, keeping the values of the nodes asked for."""

    def __init__(self, module: fx.GraphModule, keep: set[fx.Node]) -> None:
        super().__init__(module)
        self.keep = keep
        self.kept: dict[fx.Node, torch.Tensor] = {}

    def run_node(self, n: fx.Node) -> object:
        out = super().run_node(n)
        if n in self.keep:
            self.kept[n] = out
        return out

    def values(self, x: torch.Tensor) -> dict[fx.Node, torch.Tensor]:
        self.run(x)
        return self.kept


def _block_input(workload: Workload, block: str, state: Mapping[str, torch.Tensor], images: int) -> torch.Tensor:
    """`block`'s input over the first `images` calibration images, the model holding `state` (else float)."""
    module = workload.model.get_submodule(block)
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda _, inp: seen.append(inp[0].detach().clone()))
    x = workload.split(Split.CALIB).x.part(0, images)
    try:
        with torch.inference_mode(), workload.state(state):
            for i in range(0, x.shape[0], workload.batch_size):
                workload.model(x[i:i + workload.batch_size])
    finally:
        handle.remove()
    return torch.cat(seen)


def _absorb(workload: Workload, branch: Branch, state: Mapping[str, torch.Tensor], images: int
            ) -> dict[str, torch.Tensor]:
    """`branch` refitted so its block's sum, on the inputs the model holding `state` gives it, is the float
    block's: its last layer's weight and its end's shift (none where the last layer is not a plain conv)."""
    block = workload.model.get_submodule(branch.block)
    last_name = branch.layers[-1]
    last = workload.model.get_submodule(last_name)
    end = workload.model.get_submodule(branch.end)
    traced = traced_block(block)
    found = None if traced is None else residual_add(traced.graph)
    if (traced is None or found is None or not isinstance(last, nn.Conv2d) or last.groups != 1
            or isinstance(last.padding, str)):
        return {}
    add, side = found
    shortcut = add.args[1 - side]
    last_node = next(n for n in traced.graph.nodes
                     if n.op == "call_module" and f"{branch.block}.{n.target}" == last_name)
    feed = last_node.all_input_nodes[0]
    assert isinstance(shortcut, fx.Node)
    # The end as an affine map per channel, y = scale * z + shift (a norm in eval mode; a biased conv: 1 and 0).
    end_bias = end.get_parameter("bias")
    mean = end.running_mean if isinstance(end, nn.BatchNorm2d) else None
    if isinstance(end, nn.BatchNorm2d) and mean is not None and end.running_var is not None:
        scale = end.weight / torch.sqrt(end.running_var + end.eps)
        shift = end_bias - mean * scale
    elif isinstance(end, nn.BatchNorm2d):
        return {}  # a norm without running statistics: its output depends on the batch
    else:
        scale, shift = torch.ones_like(end_bias), torch.zeros_like(end_bias)
    x_float = _block_input(workload, branch.block, {}, images)
    with torch.inference_mode():
        sums = torch.cat([_Values(traced, {add}).values(x_float[i:i + workload.batch_size])[add]
                          for i in range(0, x_float.shape[0], workload.batch_size)])
    del x_float
    x_own = _block_input(workload, branch.block, state, images)
    k = last.weight[0].numel() + 1
    h_acc = torch.zeros(k, k, dtype=torch.float64, device=x_own.device)
    c_acc = torch.zeros(k, last.out_channels, dtype=torch.float64, device=x_own.device)
    with torch.inference_mode(), workload.state(state):
        for i in range(0, x_own.shape[0], workload.batch_size):
            own = _Values(traced, {shortcut, feed}).values(x_own[i:i + workload.batch_size])
            h = own[feed]
            oh, ow = output_size(last, h)
            stride = max(1, (x_own.shape[0] * oh * ow) // _ROWS)
            cols = sampled_unfold(last, h, stride)  # (n, fan_in, positions)
            a = cols.permute(0, 2, 1).reshape(-1, cols.shape[1]).double()
            a = torch.cat([a, torch.ones(a.shape[0], 1, dtype=a.dtype, device=a.device)], 1)
            want = sums[i:i + workload.batch_size] - own[shortcut]  # what the branch's end must give
            z = ((want - shift.view(1, -1, 1, 1)) / scale.view(1, -1, 1, 1)).flatten(2)[:, :, ::stride]
            t = z.permute(0, 2, 1).reshape(-1, last.out_channels).double()
            h_acc += a.T @ a
            c_acc += a.T @ t
    sol = least_squares(h_acc, c_acc.T, _RIDGE, floor=0.0).T  # (fan_in + 1, out)
    weight = sol[:-1].T.reshape(last.weight.shape).to(last.weight.dtype)
    new_shift = shift.double() + scale.double() * sol[-1]
    # A norm's shift that gives new_shift after its mean is taken off; a conv's bias is the shift itself.
    bias = new_shift if mean is None else new_shift + mean * scale
    return {f"{last_name}.weight": weight, f"{branch.end}.bias": bias.to(end_bias.dtype)}
