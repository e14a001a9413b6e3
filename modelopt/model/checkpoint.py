"""Checkpoint files: read safely (`torch.load(..., weights_only=True)` unless the caller opts into unpickling, since a
pickled module can run arbitrary code on load), the state dict found where training scripts nest it, and loaded
into an architecture only when every key and shape fits (one line naming what does not)."""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from modelopt.errors import LoadError

__all__ = ["WEIGHT_SUFFIXES", "apply_weights", "first_line", "load_weights", "read_checkpoint", "state_dict_of"]

WEIGHT_SUFFIXES = {".pt", ".pth", ".th", ".ckpt", ".bin", ".tar"}
_NESTED_KEYS = ("state_dict", "model_state_dict", "model")  # where training scripts nest the weights
_PREFIXES = ("module.", "_orig_mod.")  # DataParallel / torch.compile wrappers


def load_weights(path: str | Path, *, allow_pickle: bool = False) -> dict[str, Tensor]:
    """Reads a checkpoint file into a flat state dict.

    Args:
        path: A file saved by `torch.save`: a state dict, a dict nesting one under
            ``state_dict``/``model_state_dict``/``model``, or (with ``allow_pickle``) a module.
        allow_pickle: Allow unpickling arbitrary objects. Only for trusted files.

    Returns:
        Parameter and buffer tensors by name, with a ``module.``/``_orig_mod.`` prefix removed.

    Raises:
        LoadError: The file is missing, unreadable, pickled without ``allow_pickle``, or holds no tensors.

    Example:
        >>> sd = load_weights("resnet20-12fca82f.th")  # doctest: +SKIP
        >>> sd["linear.weight"].shape  # doctest: +SKIP
        torch.Size([10, 64])
    """
    obj = read_checkpoint(Path(path), allow_pickle)
    if isinstance(obj, nn.Module):
        return dict(obj.state_dict())
    state = state_dict_of(obj)
    if state is None:
        raise LoadError(
            f"{str(path)!r} holds no weights ({type(obj).__name__}); expected a state dict or a dict "
            f"with one under {'/'.join(_NESTED_KEYS)}"
        )
    return state


def read_checkpoint(path: Path, allow_pickle: bool) -> Any:
    """What `torch.save` wrote to `path`; LoadError in one line naming what is wrong (a refused pickle: what for)."""
    if not path.is_file():
        raise LoadError(f"no such model or weights file: {str(path)!r}")
    if not _torch_save_format(path):  # random bytes, text: torch's own message would advise unpickling
        raise LoadError(f"cannot read {str(path)!r} as a PyTorch checkpoint: it is neither a torch.save zip "
                        "archive nor a pickle (a truncated download, or another kind of file?)")
    try:
        with warnings.catch_warnings():  # torch's pickle-protocol warning and its source line: not the user's
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        found = re.search(r"GLOBAL ([\w.]+)", text)
        if allow_pickle or not (found or "Unsupported operand" in text):
            raise LoadError(f"cannot read {str(path)!r} as a PyTorch checkpoint: it is damaged or not one "
                            f"({first_line(exc)})") from None
        # The safe loader read a valid pickle and refused what it asks for: say what, not "damaged".
        what = (f"a pickled reference to {found.group(1)}" if found else
                "pickled Python objects beyond tensors (a whole nn.Module, or code)")
        raise LoadError(
            f"{str(path)!r} holds {what}, which the safe loader (weights_only=True) refused: unpickling it can "
            "run arbitrary code; pass --allow-pickle (allow_pickle=True) only for a file you trust"
        ) from None
    except Exception as exc:  # torch raises many kinds for corrupt files or missing classes
        raise LoadError(f"cannot read {str(path)!r} as a PyTorch checkpoint: {first_line(exc)}") from exc


def state_dict_of(obj: Any) -> dict[str, Tensor] | None:
    """The tensors of a checkpoint's state dict (nested or not, a wrapper's prefix removed); None when it holds none."""
    if not isinstance(obj, Mapping):
        return None
    for key in _NESTED_KEYS:
        inner = obj.get(key)
        if isinstance(inner, nn.Module):
            inner = inner.state_dict()
        if isinstance(inner, Mapping) and any(isinstance(v, Tensor) for v in inner.values()):
            obj = inner
            break
    state = {str(k): v for k, v in obj.items() if isinstance(v, Tensor)}
    if not state:
        return None
    for prefix in _PREFIXES:
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def apply_weights(module: nn.Module, state: dict[str, Tensor], path: str | Path, name: str) -> None:
    """Loads `state` into `module` strictly; LoadError naming the missing, unexpected and misshapen keys otherwise."""
    expected = module.state_dict()
    # BatchNorm fills in num_batches_tracked when old checkpoints lack it.
    missing = [k for k in expected if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    problems = [
        f"{label} {_few(items)}"
        for label, items in [("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)]
        if items
    ]
    if problems:
        raise LoadError(
            f"weights {str(path)!r} do not fit model {name!r}: {'; '.join(problems)}; "
            "pass the architecture these weights were saved from"
        )
    module.load_state_dict(state, strict=True)


def _few(items: list[str], n: int = 3) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _torch_save_format(path: Path) -> bool:
    """Whether the file starts as torch.save writes: a zip archive, or a pickle (protocol 2-5)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError as exc:
        raise LoadError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return head == b"PK" or (len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def first_line(exc: BaseException) -> str:
    """An exception as one line for a LoadError: its type and the first line of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
