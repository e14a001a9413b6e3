"""The environment a test's child process runs in: this checkout first on its path, the caller's path kept."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """os.environ with this checkout put first on PYTHONPATH (kept, not replaced: a machine whose packages
    come from PYTHONPATH, as on a device with carried wheels, still finds them) and `extra` set."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}
