"""`modelopt --version`: this modelopt's version and the engines' it runs with."""

from __future__ import annotations

import importlib.metadata
from typing import Annotated

import typer

from modelopt._version import __version__
from modelopt.cli.errors import out

__all__ = ["root"]


def _version(value: bool) -> None:
    """Prints the versions and exits 0 (an eager option: before any command is looked for)."""
    if not value:
        return
    parts = [f"modelopt {__version__}", f"torch {importlib.metadata.version('torch')}"]
    for name in ("onnxruntime", "openvino"):
        try:
            parts.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{name} not installed")
    out.print(", ".join(parts), highlight=False)
    raise typer.Exit(0)


def root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version (and torch's, onnxruntime's) and exit.")]
         = False) -> None:
    """Find how to compress a trained PyTorch vision model (quantization search), without fine-tuning."""
