"""The per-layer map of one plan: a row per layer, columns contributed by each compressor.

A compressor declares its own columns (`Compressor.report_columns`), so a new compressor adds them
without touching the report; one that declares none (or is not installed here) gets one generic column
showing its settings. Each cell has a label and a level in [0, 1] on its column's colour scale (1 = the
most aggressive setting).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from modelopt.compressors import COMPRESSORS, Cell
from modelopt.run.journal import Record
from modelopt.run.run_folder import RunFolder

__all__ = ["Cell", "Column", "LayerMap", "LayerRow", "columns_for", "layer_map", "plan_mix"]


@dataclass(frozen=True)
class Column:
    """A column of the map: its header, the compressor it reads and how a choice becomes a cell."""

    name: str
    compressor: str
    cmap: str  # a matplotlib colormap name
    cell: Callable[[Any], Cell]  # from the choice's JSON form (None when off)


def _generic_column(compressor: str) -> Column:
    def cell(raw: Any) -> Cell:
        if raw is None:
            return Cell("off", None)
        text = json.dumps(raw, separators=(",", ":"), sort_keys=True) if not isinstance(raw, str) else raw
        return Cell(text[:24], 0.5)

    return Column(compressor, compressor, "Greens", cell)


def columns_for(compressor: str) -> tuple[Column, ...]:
    """The columns `compressor` declares (`Compressor.report_columns`), else one generic column."""
    declared = COMPRESSORS.get(compressor).report_columns if compressor in COMPRESSORS else ()
    return tuple(Column(c.title, compressor, c.cmap, c.cell) for c in declared) or (_generic_column(compressor),)


@dataclass(frozen=True)
class LayerRow:
    """One layer of the map."""

    layer: str
    cells: tuple[Cell, ...]  # aligned with LayerMap.columns
    params: int | None  # weights in the layer
    # Bytes the plan stores for the layer (`modelopt.evaluation.cost.LayerCost.bytes`): its packed weight (scales,
    # sparse indices), plus an exit head after it, less the float norm and bias entries its removed
    # channels drop. With `LayerMap.other_bytes`, the rows sum to the plan's size_bytes.
    plan_bytes: int | None
    bits: float | None = None  # bits a weight of the float layer takes in the file (`RunFolder.layer_bits`)


@dataclass(frozen=True)
class LayerMap:
    """A plan, layer by layer; sizes are None when the run folder has no layer table."""

    columns: tuple[Column, ...]
    rows: tuple[LayerRow, ...]
    size_bytes: int | None  # the whole plan's packed size (weights + scales + float tensors)
    other_bytes: int | None = None  # float tensors outside the layers' weights (biases, norms), all channels

    @property
    def has_sizes(self) -> bool:
        return all(r.plan_bytes is not None for r in self.rows) and bool(self.rows)

    def share(self, row: LayerRow) -> float:
        """The layer's share of the plan's total size."""
        if row.plan_bytes is None or not self.size_bytes:
            return math.nan
        return row.plan_bytes / self.size_bytes

    def param_share(self, row: LayerRow) -> float:
        total = sum(r.params or 0 for r in self.rows)
        return math.nan if row.params is None or not total else row.params / total


def _split(name: str) -> tuple[str, str]:
    """(layer, compressor) of a decision name `layer/compressor`."""
    layer, _, comp = name.rpartition("/")
    return layer, comp


def layer_map(run: RunFolder, record: Record) -> LayerMap:
    """The map of one trial's plan.

    Args:
        run: the run folder (its layer table and search space give sizes).
        record: the trial, e.g. `run.best`.

    Example:
        >>> m = layer_map(run, run.best)
        >>> [(r.layer, r.cells[0].label) for r in m.rows][:2]
    """
    comps: list[str] = []
    by_layer: dict[str, dict[str, Any]] = {}
    for name, raw in record.plan.items():
        layer, comp = _split(name)
        if comp not in comps:
            comps.append(comp)
        by_layer.setdefault(layer, {})[comp] = raw
    columns = tuple(col for comp in comps for col in columns_for(comp))
    order = [layer.name for layer in run.layers] if run.layers is not None else list(by_layer)
    params = {layer.name: layer.params for layer in run.layers} if run.layers is not None else {}
    per_layer = run.layer_bytes(record) or {}
    bits = run.layer_bits(record) or {}
    rows = []
    for name in order:
        choices = by_layer.get(name, {})
        cells = tuple(col.cell(choices.get(col.compressor)) for col in columns)
        rows.append(LayerRow(name, cells, params.get(name), per_layer.get(name), bits.get(name)))
    size = None if record.metrics is None else record.metrics.size_bytes
    float_bytes = run.float_size_bytes
    other = None if float_bytes is None or run.layers is None else float_bytes - 4 * sum(x.params for x in run.layers)
    return LayerMap(columns, tuple(rows), size, other)


def plan_mix(plan: Mapping[str, Any]) -> str:
    """A one-line digest of a plan: how many layers got each setting of each compressor's first column.

    Example:
        >>> plan_mix(record.plan)
        'int8×2 int4×12 int3×6'
    """
    counts: dict[str, Counter[Cell]] = {}
    for name, raw in plan.items():
        _, comp = _split(name)
        counts.setdefault(comp, Counter())[columns_for(comp)[0].cell(raw)] += 1
    parts: list[str] = []
    for counter in counts.values():  # off first, then from the mildest setting to the most aggressive
        ordered = sorted(counter.items(), key=lambda kv: (-1.0 if kv[0].level is None else kv[0].level, kv[0].label))
        parts.extend(f"{cell.label}×{n}" for cell, n in ordered)
    return " ".join(parts)
