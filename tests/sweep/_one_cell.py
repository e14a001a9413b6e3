"""A one-cell sweep file with one more run setting on its line 10: what the tests of a single key's reading write."""

from __future__ import annotations

from pathlib import Path

_FILE = """name: s
out: {out}
models:
  - name: r20
    model: cifar10_resnet20
strategies: [random]
budgets: [2]
seeds: [0]
compressors: [quantize]
{key}: {value}
"""


def one_cell_sweep(folder: Path, key: str, value: str, extra: str = "") -> Path:
    """`folder`/s.yaml: the one-cell sweep with `key: value` on line 10 (`extra` lines after it)."""
    path = folder / "s.yaml"
    path.write_text(_FILE.format(out=folder / "out", key=key, value=value) + extra)
    return path
