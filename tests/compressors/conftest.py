from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    # Tensors here are tiny: with 2+ intra-op threads on a loaded 2-core box OpenMP spin-waits
    # make each op ~100x slower than running it on one thread.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
