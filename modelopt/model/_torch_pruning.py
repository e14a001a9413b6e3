"""torch-pruning, imported without its op counter's `import timm`.

`torch_pruning.utils.op_counter` imports timm, if installed, to count its attention's operations; timm imports
torchvision's models and torch._dynamo, about half of `import modelopt.api`'s time, paid by every command, test
subprocess and Ray worker. modelopt counts its own MACs and uses none of that counter, so timm is hidden while
torch-pruning loads and is importable as usual afterwards (`timm:` models import it when they are loaded).
"""

from __future__ import annotations

import sys

_hidden = "timm" not in sys.modules
if _hidden:
    sys.modules["timm"] = None  # type: ignore[assignment]  # `import timm` raises ImportError: "not installed"
try:
    import torch_pruning as tp
finally:
    if _hidden:
        del sys.modules["timm"]

__all__ = ["tp"]
