"""What a reloaded model needs to run on CUDA as on the CPU (checked on the CPU, where eps 0 passes)."""

from __future__ import annotations

from torch import nn


def assert_norms_run_on_cuda(model: nn.Module) -> None:
    """Every batch norm of `model` has a positive eps: CUDA's batch_norm refuses eps <= 0."""
    bad = {name: m.eps for name, m in model.named_modules()
           if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.eps > 0}
    assert not bad, f"batch norms with eps <= 0 (CUDA refuses them): {bad}"
