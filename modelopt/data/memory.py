"""How much memory this process can still take: what decoding a data set at a given size is checked against
before it starts (a `MemoryError`, or the kernel's OOM killer, after minutes of decoding says nothing useful).

The figure is an upper bound on what can be allocated, so a refusal is certain to be right: the system's available
memory (Linux's MemAvailable, which counts reclaimable page cache; elsewhere all physical memory), less where a
cgroup (a container, a batch job) or an address-space limit (``ulimit -v``) allows less.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import resource
except ImportError:  # Windows: no address-space limit to read
    resource = None  # type: ignore[assignment]

__all__ = ["available_bytes"]

_CGROUP = Path("/sys/fs/cgroup")


def available_bytes() -> int | None:
    """Bytes this process can still allocate at most, or None where nothing can be read."""
    room = [v for v in (_meminfo_available(), _cgroup_room(), _address_space_room()) if v is not None]
    return min(room) if room else None


def _meminfo_available() -> int | None:
    """Linux's MemAvailable; elsewhere all physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _physical()


def _physical() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX, or the names are unknown here
        return None


def _cgroup_room() -> int | None:
    """cgroup v2's memory.max less memory.current, where a limit is set."""
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((_CGROUP / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def _address_space_room() -> int | None:
    """RLIMIT_AS less the address space in use (/proc/self/statm's first field, in pages)."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        used = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return soft
    return max(0, soft - used)
