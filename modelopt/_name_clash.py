"""One warning line when NVIDIA's nvidia-modelopt shares this environment.

Both distributions install a top-level package named `modelopt`: whichever comes first on
sys.path (or was installed last, over the other's files) shadows the other. Imported first by
`modelopt/__init__.py`, so the warning comes before any import that a mixed-up install could break.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from pathlib import Path

from modelopt._version import __version__
from modelopt.errors import NameClashWarning

# Distributions that install a top-level package also named `modelopt`: NVIDIA's Model Optimizer.
CLASHING = ("nvidia-modelopt", "nvidia-modelopt-core")


def clash_message() -> str | None:
    """What the warning says, or None when no clashing distribution is installed."""
    for name in CLASHING:
        try:
            other = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return (f"two packages named 'modelopt' are installed: loaded is this one (modelopt {__version__}, "
                f"search-based compression) from {Path(__file__).parent}, and {name} {other.version} (NVIDIA Model "
                f"Optimizer) is in {other.locate_file('')}; they shadow each other: install them in separate "
                "virtual environments")
    return None


if (_message := clash_message()) is not None:
    warnings.warn(NameClashWarning(_message), stacklevel=2)
