"""A model that also returns its exits' head outputs, for the ONNX export of a plan with early exits."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from modelopt.compressors.contract import ExitTap
from modelopt.errors import ConfigError

__all__ = ["tapped"]


@contextlib.contextmanager
def tapped(model: torch.nn.Module, taps: list[ExitTap]) -> Iterator[None]:
    """`model` also returning each tap's head outputs (logits, confidence), the heads registered under
    ``exit_heads.{k}`` (their nodes are named ``/exit_heads.{k}/...`` in the traced graph); undone after."""
    seen: list[torch.Tensor] = []
    handles = [t.block.register_forward_hook(lambda _m, _i, out: seen.append(out)) for t in taps]
    heads = torch.nn.ModuleList([t.head for t in taps])
    model.add_module("exit_heads", heads)
    plain = model.forward

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        seen.clear()
        logits = plain(x)
        if len(seen) != len(taps):
            raise ConfigError(f"the exits' blocks ran {len(seen)} times in one pass, not once each ({len(taps)})")
        return (logits, *(t for fmap, head in zip(seen, heads, strict=True) for t in head(fmap)))

    model.forward = forward  # this copy only: the tracer calls it
    try:
        yield
    finally:
        del model.forward
        del model.exit_heads
        for h in handles:
            h.remove()
