from __future__ import annotations

import pytest
from _threads import one_torch_thread


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    with one_torch_thread():
        yield
