"""A read-only view of one run folder: settings, journal, summary and the model's layer table.

Reports and the Optuna export read a run through this alone, so they work on a finished run,
on one still in progress (no summary.json yet) and on a run folder copied to another machine.
Nothing here writes to the journal: a torn last line is skipped, not truncated.

The layer table (`layers.json`, written by `modelopt.optimize` at the end of a run) gives each
layer's weight shape, so per-layer sizes can be computed from a plan. A folder without it falls
back to the architecture named in run.json (weights are not needed for shapes).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from modelopt._files import write_atomic
from modelopt.config.build import make_space
from modelopt.config.run_config import RunConfig
from modelopt.config.run_json import objective_from_json
from modelopt.errors import LoadError
from modelopt.evaluation.cost import CostModel, PlanCost
from modelopt.evaluation.metrics import Metrics
from modelopt.model.analysis import ANALYSES, Analyses, Analysis, Layers, ModelView
from modelopt.model.attention import unfuse_attention
from modelopt.model.layers import Layer, LayerKind, compressible_modules, discover_layers
from modelopt.model.loader import load_model
from modelopt.objective import Objective, best_of
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace
from modelopt.run.journal import Record, read_json, read_records
from modelopt.run.layout import CONFIG, JOURNAL, LAYERS
from modelopt.run.reported import PlanEntry, Scores
from modelopt.run.summary import RunSummary, read_summary
from modelopt.zoo import MODELS, ZooEntry

log = logging.getLogger(__name__)

LAYERS_VERSION = 1

__all__ = ["LAYERS", "RunFolder", "is_run_folder", "read_run", "save_layers"]


@dataclass(frozen=True)
class RunFolder:
    """What one run folder holds.

    Attributes:
        path: the folder.
        config: run.json (model, data, strategy, seed, objective, floor, compressors, budget).
        records: the journal's finished trials, by number (`modelopt.run.journal.Record`).
        summary: summary.json, or None while the run is still in progress (or was killed).
        layers: the model's compressible layers, or None when neither layers.json nor the model
            named in run.json could be read.
    """

    path: Path
    config: dict[str, Any]
    records: tuple[Record, ...]
    summary: RunSummary | None
    layers: tuple[Layer, ...] | None

    @property
    def done(self) -> bool:
        return self.summary is not None

    @cached_property
    def run_config(self) -> RunConfig | None:
        """run.json as a RunConfig, or None when it names something this installation cannot build
        (a compressor plugin or strategy not installed here)."""
        try:
            return RunConfig.from_json(self.config, str(self.path / CONFIG))
        except LoadError as exc:
            log.info("settings of %s unreadable: %s", self.path, exc)
            return None

    @cached_property
    def objective(self) -> Objective:
        return objective_from_json(self.config)

    @property
    def budget(self) -> float:
        """Full val evaluations the run may spend (infinite: a timed run given no budget, run.json's null)."""
        if "budget" in self.config and self.config["budget"] is None and self.config.get("time") is not None:
            return math.inf
        return float(self.config.get("budget", 0.0) or 0.0)

    @cached_property
    def cum_costs(self) -> tuple[float, ...]:
        """The budget spent up to and including each record (aligned with `records`)."""
        return tuple(itertools.accumulate(r.cost for r in self.records))

    @property
    def spent(self) -> float:
        return self.cum_costs[-1] if self.records else 0.0

    @property
    def float_size_bytes(self) -> int | None:
        if self.summary is not None and self.summary.float_size_bytes:
            return self.summary.float_size_bytes
        m = next((r.metrics for r in self.records if r.metrics is not None), None)
        return None if m is None else m.float_size_bytes

    def reduction(self, m: Metrics) -> float:
        """The objective's reduction factor (float value / plan value): compression for size."""
        return self.objective.reduction(m)

    @cached_property
    def search_best(self) -> Record | None:
        """The val-feasible trial with the highest reward (ties: higher retention bound; first wins): the
        search's own pick, a search-time estimate; once the run has finished, the one summary.json names (the
        runner judged val bounds at the confirm split's size)."""
        if self.summary is not None and self.summary.search_best is not None:
            key = self.summary.search_best.plan_key
            found = next((r for r in self.records if r.plan_key == key), None)
            if found is not None:
                return found
        scored = [(r, r.metrics) for r in self.records if r.feasible and r.metrics is not None]
        best = best_of(scored, lambda pair: pair[1], self.objective)
        return None if best is None else best[0]

    @cached_property
    def best(self) -> Record | None:
        """The plan the run reports: once it has finished, the one summary.json names (confirmed on the
        confirm split when the data have one); while it runs, the search's pick so far."""
        if self.summary is None:
            return self.search_best
        entry = self.summary.best
        if entry is None:
            return None
        return next((r for r in self.records if r.plan_key == entry.plan_key), None)

    @property
    def confirmed(self) -> bool:
        """Whether the reported best was confirmed on images that did not select it."""
        return self.summary is not None and self.summary.confirmed

    def best_so_far(self) -> list[tuple[float, float | None]]:
        """(cumulative cost, best feasible reduction so far or None) after each trial."""
        out: list[tuple[float, float | None]] = []
        best: float | None = None
        for r, cum in zip(self.records, self.cum_costs, strict=True):
            if r.metrics is not None and self.objective.feasible(r.metrics):
                red = self.reduction(r.metrics)
                best = red if best is None else max(best, red)
            out.append((cum, best))
        return out

    @cached_property
    def entries(self) -> dict[str, PlanEntry]:
        """The record of each plan the finished run reports (summary.json: the best, the search's own pick, the
        front, the anchors), by plan key; empty while the run goes on."""
        if self.summary is None:
            return {}
        s = self.summary
        return {e.plan_key: e for e in (s.best, s.search_best, *s.pareto, *s.anchors) if e is not None}

    @cached_property
    def test_scores(self) -> dict[str, Scores]:
        """Test figures from summary.json (the best plan, the search's pick and the Pareto plans), by plan key."""
        if self.summary is None:
            return {}
        s = self.summary
        return {e.plan_key: e.test for e in (s.best, s.search_best, *s.pareto) if e is not None and e.test is not None}

    @property
    def test_by_key(self) -> dict[str, Metrics]:
        """Test re-scores from summary.json (the best plan and the Pareto plans), by plan key."""
        return {key: x.metrics for key, x in self.test_scores.items()}

    @cached_property
    def confirm_scores(self) -> dict[str, Scores]:
        """Confirm-split figures from summary.json (the finalists confirmation tested), by plan key."""
        if self.summary is None:
            return {}
        return {f.plan_key: f.confirm for f in self.summary.confirmation.finalists if f.confirm is not None}

    def figures(self, record: Record) -> Scores | None:
        """A trial's val figures: its record's where the run reports the plan (summary.json), else as a record
        works them out (`Scores.of`, under the run's objective); None for a failed trial."""
        entry = self.entries.get(record.plan_key)
        if entry is not None and entry.val is not None:
            return entry.val
        return None if record.metrics is None else Scores.of(record.metrics, self.objective)

    @cached_property
    def space(self) -> SearchSpace | None:
        """The run's search space (its compressors' full menus), or None without the layer table."""
        if self.layers is None or self.run_config is None:
            return None
        try:
            space = make_space(self.run_config, self.layers)
        except Exception as exc:  # noqa: BLE001 -- a compressor plugin not installed here, options it no longer takes
            log.info("search space of %s unavailable: %s", self.path, exc)
            return None
        if self.records and set(self.records[0].plan) != {d.name for d in space.decisions}:
            return None  # not the space the run searched (another menu or model)
        return space

    def layer_bytes(self, record: Record) -> dict[str, int] | None:
        """Bytes each layer accounts for under the trial's plan, as the evaluator counts them
        (`modelopt.evaluation.cost.LayerCost.bytes`: its packed weight, plus an exit head after it, less the float
        norm and bias entries its removed channels drop); with the float tensors outside the weights
        (float_size_bytes - 4 x the layers' parameters) they sum to size_bytes. None without the layer table."""
        cost = self.plan_cost(record)
        return None if cost is None else cost.layer_bytes()

    def layer_bits(self, record: Record) -> dict[str, float] | None:
        """Bits each layer's weight takes in the file, per weight of the float layer (codes as coded, scales,
        sparse index; a pruned weight takes none): the per-layer tables' "bits / weight". None without the layer
        table."""
        cost = self.plan_cost(record)
        if cost is None:
            return None
        params = {layer.name: layer.params for layer in self.layers or ()}
        return {x.layer.name: 8 * x.storage.bytes / max(1, params.get(x.layer.name, 0)) for x in cost.layers}

    def plan_cost(self, record: Record) -> PlanCost | None:
        """The trial's costs layer by layer (`CostModel.cost`), its codes' bytes as measured when it was scored
        (`Metrics.coded`). None without the layer table."""
        plan = self.plan(record)
        if plan is None or self.space is None or self.layers is None:
            return None
        coded = None if record.metrics is None else record.metrics.coded  # measured on its codes when it ran
        return CostModel(self.space).cost(plan, coded=coded)

    def size_bytes(self, record: Record) -> int | None:
        """The plan's packed size: measured when the trial ran, else computed (a failed trial)."""
        if record.metrics is not None:
            return record.metrics.size_bytes
        per_layer, float_bytes = self.layer_bytes(record), self.float_size_bytes
        if per_layer is None or float_bytes is None or self.layers is None:
            return None
        return float_bytes + sum(per_layer[layer.name] - layer.params * 4 for layer in self.layers)

    def plan(self, record: Record) -> Plan | None:
        """A journal record's plan as a Plan of `space`, or None without the space."""
        return None if self.space is None else self.space.plan_from_flat(record.plan)


def is_run_folder(path: str | Path) -> bool:
    return (Path(path) / CONFIG).is_file()


def save_layers(run_dir: str | Path, layers: Sequence[Layer]) -> Path:
    """Writes the model's layer table into a run folder (`layers.json`) so reports need no model: each layer and
    what every registered structural analysis found of it (`ANALYSES`, in name order; a workload's `Layers` are
    analysed by each first), so a space of any compressors is rebuilt from it.

    Example:
        >>> save_layers(result.run_dir, workload.layers)
    """
    kinds = _registered_analyses()
    if isinstance(layers, Layers):
        layers = layers.analysed(*kinds)
    path = Path(run_dir) / LAYERS
    doc = {"version": LAYERS_VERSION, "layers": [
        {"name": layer.name, "kind": layer.kind.value, "weight_shape": list(layer.weight_shape), "macs": layer.macs,
         "has_bias": layer.has_bias, **{k: v for kind in kinds for k, v in kind.to_json(kind.of(layer)).items()}}
        for layer in layers]}
    write_atomic(path, json.dumps(doc, indent=1))
    return path


def _registered_analyses() -> list[type[Analysis[Any, Any]]]:
    return [ANALYSES.get(name) for name in ANALYSES.names()]


def _layers_from_file(path: Path) -> tuple[Layer, ...] | None:
    doc = read_json(path)
    if doc is None or doc.get("version") != LAYERS_VERSION:
        return None
    kinds = _registered_analyses()
    try:
        return tuple(Layer(d["name"], LayerKind(d["kind"]), tuple(d["weight_shape"]), int(d.get("macs", 0)),
                           bool(d.get("has_bias", False))).noted({k.name: k.from_json(d) for k in kinds})
                     for d in doc["layers"])
    except KeyError:  # written before an analysis's fields (structured pruning's): rebuild from the model instead
        return None


def _layers_from_model(config: dict[str, Any]) -> tuple[Layer, ...] | None:
    """Weight shapes from the architecture run.json names (MACs left 0: a report does not need them)."""
    source = str(config.get("model", ""))
    try:
        if source in MODELS.names():  # shapes only: the zoo's factory, no weights file needed
            entry = MODELS.get(source)
            module = unfuse_attention(entry.factory() if isinstance(entry, ZooEntry) else entry())
        else:
            module = load_model(source, config.get("weights")).module
    except Exception as exc:  # noqa: BLE001 -- a report without sizes beats no report
        log.info("layer table of %r unavailable: %s", source, exc)
        return None
    # What every registered analysis finds, unchecked: sizes need the structure only.
    analyses = Analyses(ModelView(module, compressible_modules(module), torch.zeros(2, 3, 32, 32), check=False))
    layers = Layers(discover_layers(module, torch.zeros(1, 3, 32, 32)), analyses).analysed(*_registered_analyses())
    return tuple(dataclasses.replace(x, macs=0) for x in layers)


def read_run(run_dir: str | Path, *, layers: Sequence[Layer] | None = None, with_layers: bool = True) -> RunFolder:
    """Reads a run folder without changing it.

    Args:
        run_dir: a folder written by `modelopt.optimize` (it holds run.json).
        layers: the model's layers when the caller has them (else layers.json, else the model).
        with_layers: False skips the layer table (faster; per-layer sizes are then unknown).

    Raises:
        LoadError: the folder holds no run.json.

    Example:
        >>> run = read_run("runs/r20")
        >>> run.best.metrics.compression if run.best else None
    """
    path = Path(run_dir)
    config = read_json(path / CONFIG)
    if config is None or "model" not in config:
        # A run.json naming no model (`{}`) is not one `optimize` wrote: it was reported as a run of "?", exit 0.
        if not path.exists():
            what = "does not exist"
        elif config is None:
            what = f"is not a modelopt run folder (no readable {CONFIG})"
        else:
            what = f"is not a modelopt run folder (its {CONFIG} names no model)"
        raise LoadError(f"{str(path)!r} {what}; pass a folder written by `modelopt optimize --out`")
    records = tuple(read_records(path / JOURNAL))
    if layers is not None:  # a workload's `Layers` keep their door: the space built on them asks what it needs
        found: tuple[Layer, ...] | None = layers if isinstance(layers, Layers) else tuple(layers)
    else:
        found = _layers_from_file(path / LAYERS) if with_layers else None
    if found is None and with_layers:
        found = _layers_from_model(config)
    if found is not None and records:
        # A layer table that does not match the plans (another model) is worse than none.
        names = {layer.name for layer in found}
        if any(name.rsplit("/", 1)[0] not in names for name in records[0].plan if "/" in name):
            found = None
    return RunFolder(path, config, records, read_summary(path), found)
