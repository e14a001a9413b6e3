"""The memory a process can still take: the least of the system's, its cgroup's and its address-space limit's."""

from __future__ import annotations

import pytest

from modelopt.data import memory


def test_an_address_space_limit_bounds_what_is_available(monkeypatch):
    if memory.resource is None or memory.available_bytes() is None:
        pytest.skip("needs POSIX resource limits and a readable system memory")
    unlimited = memory.available_bytes()
    assert unlimited is not None and unlimited > 0
    used = memory._address_space_room  # the address space in use, read with an (unreal) limit of 2**62 bytes
    monkeypatch.setattr(memory.resource, "getrlimit", lambda _: (2**62, memory.resource.RLIM_INFINITY))
    in_use = 2**62 - used()
    assert 0 < in_use < 2**62
    monkeypatch.setattr(memory.resource, "getrlimit", lambda _: (in_use + 2**20, memory.resource.RLIM_INFINITY))
    assert memory.available_bytes() <= 2 * 2**20 < unlimited  # what ulimit -v leaves, not the system's memory
    monkeypatch.setattr(memory.resource, "getrlimit", lambda _: (in_use // 2, memory.resource.RLIM_INFINITY))
    assert memory.available_bytes() == 0
