"""Which format `modelopt export` writes: --format, else what --out's suffix names."""

from __future__ import annotations

from pathlib import Path

from modelopt.errors import ConfigError

__all__ = ["format_for"]

# What each export format writes, by the suffix its file takes (an exit plan's ONNX export is a folder: no suffix).
_SUFFIXES = {".onnx": "onnx", ".pt": "modelopt", ".pth": "modelopt"}


def format_for(out_path: Path | None, format: str, given: bool) -> str:
    """The export format: --format when given (refused in one line when --out's suffix says another), else the one
    --out's suffix names, else modelopt. A packed checkpoint written as `model.onnx` was exit 0 and unreadable."""
    by_suffix = None if out_path is None else _SUFFIXES.get(out_path.suffix.lower())
    if not given:
        return by_suffix or format
    if by_suffix is not None and by_suffix != format:
        named = "an ONNX" if by_suffix == "onnx" else "a packed checkpoint (modelopt)"
        raise ConfigError(f"--out {str(out_path)!r} names {named} file but --format is {format!r}; "
                          f"drop --format, or write to a {'.onnx' if format == 'onnx' else '.pt'} file")
    return format
