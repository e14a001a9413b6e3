"""One torch intra-op thread for a test package or module (tiny tensors on a shared 2-core box:
with 2+ threads OpenMP spin-waits make each op far slower than on one thread)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
