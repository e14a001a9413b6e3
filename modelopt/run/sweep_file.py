"""The sweep file: its parsing (errors name the key and its line) and its cells' run folders."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelopt._version import __version__
from modelopt.errors import ConfigError, UnknownNameError
from modelopt.objective import Target
from modelopt.run.runner import CONFIG, JOURNAL, SUMMARY

from modelopt.run.sweep_table import (  # the table reads what the sweep writes
    EPS,
    RUNS,
    _read_journal,
    _read_json,
)

__all__ = ["Cell", "Sweep", "SweepModel", "cell_status", "load_sweep"]

_REQUIRED = ("name", "models", "strategies", "budgets", "seeds")
_DEFAULTS: dict[str, Any] = {  # `out` defaults to the sweep's name, beside the sweep file
    "objective": "size",
    "min_retention": 0.99,
    "confidence": 0.95,
    "bits": [8, 4],
    "granularity": ["per_channel", "group"],
    "rounding": ["gptq"],
    "device": "auto",
}
_KEYS = (*_REQUIRED[:1], "out", *_REQUIRED[1:], "objective", "min_retention", "confidence", "compressors", "bits",
         "granularity", "rounding", "device")
_MODEL_KEYS = ("name", "model", "weights", "data")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# ---- the sweep file -------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepModel:
    """One model of the grid; `name` is its folder under runs/."""

    name: str
    model: str
    weights: str | None = None
    data: str = "cifar10-sample"


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file; paths are absolute."""

    path: Path
    name: str
    out: Path
    models: tuple[SweepModel, ...]
    strategies: tuple[str, ...]
    budgets: tuple[float, ...]  # ascending
    seeds: tuple[int, ...]
    objective: str = "size"
    min_retention: float = 0.99
    confidence: float = 0.95  # a plan meets the floor when its retention bound at this confidence does
    bits: tuple[int, ...] = (8, 4)
    granularity: tuple[str, ...] = ("per_channel", "group")
    rounding: tuple[str, ...] = ("gptq",)
    device: str = "auto"
    compressors: tuple[str, ...] | None = None  # None: the API's default for the objective

    @property
    def budget(self) -> float:
        """What every cell runs at: the largest budget."""
        return self.budgets[-1]

    def cell_dir(self, model: str, strategy: str, seed: int) -> Path:
        return self.out / RUNS / model / strategy / f"seed{seed}"

    def cells(self) -> list[Cell]:
        """Every cell with its state on disk, in run order (model, strategy, seed)."""
        return [
            cell_status(self.cell_dir(m.name, s, k), m.name, s, k, self.budget)
            for m in self.models for s in self.strategies for k in self.seeds
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1, "modelopt": __version__, "path": str(self.path), "name": self.name, "out": str(self.out),
            "models": [vars(m) for m in self.models], "strategies": list(self.strategies),
            "budgets": list(self.budgets), "seeds": list(self.seeds), "objective": self.objective,
            "min_retention": self.min_retention, "confidence": self.confidence, "bits": list(self.bits), "granularity": list(self.granularity),
            "rounding": list(self.rounding), "device": self.device, "compressors": None if self.compressors is None else list(self.compressors),
        }


class _File:
    """The sweep file's text and nodes; every error it raises names the key and its line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loader = yaml.SafeLoader("")

    def error(self, node: yaml.Node | None, key: str, msg: str) -> ConfigError:
        line = 1 if node is None else node.start_mark.line + 1
        return ConfigError(f"sweep file {str(self.path)!r}, line {line}, key {key!r}: {msg}")

    def value(self, node: yaml.Node, key: str) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            raise self.error(node, key, f"cannot read the value: {getattr(exc, 'problem', exc)}") from None

    def mapping(self, node: yaml.Node, key: str, valid: Sequence[str], what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """{key: (key node, value node)}; refuses duplicates and unknown keys."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, key, f"expected a mapping with keys {', '.join(valid)}; got {_kind(node)}")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            name = self.value(knode, key)
            if not isinstance(name, str):
                raise self.error(knode, key, f"keys must be names ({', '.join(valid)}); got {name!r}")
            full = name if not key or key == "(top level)" else f"{key}.{name}"
            if name in out:
                first = out[name][0].start_mark.line + 1
                raise self.error(knode, full, f"given twice (first at line {first}); keep one")
            if name not in valid:
                msg = str(UnknownNameError(f"{what} key", name, valid))
                raise self.error(knode, full, msg[0].lower() + msg[1:])
            out[name] = (knode, vnode)
        return out

    def string(self, node: yaml.Node, key: str, example: str) -> str:
        v = self.value(node, key)
        if not isinstance(v, str) or not v.strip() or "\x00" in v:  # a NUL: no file system takes it in a path
            raise self.error(node, key, f"expected a non-empty string like {example}; got {v!r}")
        return v.strip()

    def items(self, node: yaml.Node, key: str, example: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            got = "an empty list" if isinstance(node, yaml.SequenceNode) else repr(self.value(node, key))
            raise self.error(node, key, f"expected a non-empty list like {example}; got {got}")
        return list(node.value)

    def unique(self, nodes: list[yaml.Node], values: list[Any], key: str) -> None:
        seen: dict[Any, int] = {}
        for node, v in zip(nodes, values):
            if v in seen:
                raise self.error(node, key, f"{v!r} is listed twice (first at line {seen[v]}); list it once")
            seen[v] = node.start_mark.line + 1


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(node.value) if node.value else "nothing"


def _is_number(v: Any) -> bool:
    """A finite int or float, not a bool; nor an int too large for a float (a YAML integer of 400 digits)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def load_sweep(path: str | Path) -> Sweep:
    """Reads and checks a sweep file (YAML, safe constructors only).

    Args:
        path: the sweep file.

    Returns:
        The sweep with absolute paths (relative ones are resolved against the file's folder).

    Raises:
        ConfigError: the file is missing or malformed; the message names the key, its line and
            what would be right.

    Example:
        >>> sweep = load_sweep("experiments/smoke.yaml")
        >>> [c.run_dir.name for c in sweep.cells()][:2]
        ['seed0', 'seed1']
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"sweep file {str(path)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"sweep file {str(path)!r} is a folder; pass a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"sweep file {str(path)!r} cannot be read as UTF-8 text: {exc}") from None
    f = _File(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"sweep file {str(path)!r}{where}: not valid YAML: {problem}") from None
    if root is None:
        raise ConfigError(f"sweep file {str(path)!r} is empty; it needs the keys {', '.join(_REQUIRED)}")
    top = f.mapping(root, "(top level)", _KEYS, "sweep file")
    for key in _REQUIRED:
        if key not in top:
            raise f.error(root, key, f"missing; a sweep file needs {', '.join(_REQUIRED)} (see modelopt/run/sweep.py)")
    base = path.resolve().parent

    def node(key: str) -> yaml.Node | None:
        return top[key][1] if key in top else None

    name = f.string(top["name"][1], "name", "mcts_vs_baselines")
    out_node = node("out")
    out = base / (f.string(out_node, "out", "results/my_sweep") if out_node is not None else name)
    models = _models(f, top["models"][1], base)

    from modelopt.search import STRATEGIES

    s_nodes = f.items(top["strategies"][1], "strategies", "[random, mcts]")
    strategies = [f.string(n, "strategies", "random") for n in s_nodes]
    for n, s in zip(s_nodes, strategies):
        if s not in STRATEGIES:
            raise f.error(n, "strategies", str(UnknownNameError("strategy", s, STRATEGIES.names())))
    f.unique(s_nodes, strategies, "strategies")

    b_nodes = f.items(top["budgets"][1], "budgets", "[50, 100, 200]")
    budgets = []
    for n in b_nodes:
        v = f.value(n, "budgets")
        if not _is_number(v) or v <= 0:
            raise f.error(n, "budgets", f"expected positive numbers of full val evaluations like [50, 100, 200]; got {v!r}")
        budgets.append(float(v))
    f.unique(b_nodes, budgets, "budgets")

    k_nodes = f.items(top["seeds"][1], "seeds", "[0, 1, 2]")
    seeds = []
    for n in k_nodes:
        v = f.value(n, "seeds")
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise f.error(n, "seeds", f"expected non-negative integers like [0, 1, 2]; got {v!r}")
        seeds.append(v)
    f.unique(k_nodes, seeds, "seeds")

    settings = dict(_DEFAULTS)
    if (n := node("objective")) is not None:
        settings["objective"] = f.string(n, "objective", "size")
        if settings["objective"] not in {t.value for t in Target}:
            raise f.error(n, "objective", f"unknown objective {settings['objective']!r}; valid: "
                          + ", ".join(t.value for t in Target))
    if (n := node("min_retention")) is not None:
        v = f.value(n, "min_retention")
        if not _is_number(v) or not 0.0 <= v <= 1.0:
            raise f.error(n, "min_retention", f"expected a fraction of the float accuracy like 0.99; got {v!r}")
        settings["min_retention"] = float(v)
    if (n := node("confidence")) is not None:
        v = f.value(n, "confidence")
        if not _is_number(v) or not 0.0 <= v < 1.0:
            raise f.error(n, "confidence", f"expected a confidence in [0, 1) like 0.95 (0: point estimates); got {v!r}")
        settings["confidence"] = float(v)
    if (n := node("bits")) is not None:
        nodes = f.items(n, "bits", "[8, 4]")
        settings["bits"] = [f.value(b, "bits") for b in nodes]
        for b, v in zip(nodes, settings["bits"]):
            if not isinstance(v, int) or isinstance(v, bool):
                raise f.error(b, "bits", f"expected integer bit widths like [8, 4, 3, 2]; got {v!r}")
    if (n := node("granularity")) is not None:
        nodes = f.items(n, "granularity", "[per_channel, group]")
        settings["granularity"] = [f.string(g, "granularity", "per_channel") for g in nodes]
    if (n := node("rounding")) is not None:
        nodes = f.items(n, "rounding", "[gptq]")
        settings["rounding"] = [f.string(r, "rounding", "gptq") for r in nodes]
    _check_quantizer(f, top, settings)
    compressors = None
    if (n := node("compressors")) is not None:
        from modelopt.compressors import COMPRESSORS

        nodes = f.items(n, "compressors", "[quantize, prune]")
        compressors = tuple(f.string(c, "compressors", "quantize") for c in nodes)
        for c, name_ in zip(nodes, compressors):
            if name_ not in COMPRESSORS:
                raise f.error(c, "compressors", f"unknown compressor {name_!r}; valid: {', '.join(COMPRESSORS.names())}")
    if (n := node("device")) is not None:
        settings["device"] = f.string(n, "device", "auto")
        from modelopt.workload import resolve_device

        try:
            resolve_device(settings["device"])
        except ConfigError as exc:
            raise f.error(n, "device", str(exc)) from None

    return Sweep(
        path=path.resolve(), name=name, out=out.resolve(), models=tuple(models), strategies=tuple(strategies),
        budgets=tuple(sorted(budgets)), seeds=tuple(seeds), objective=settings["objective"],
        min_retention=settings["min_retention"], confidence=settings["confidence"], bits=tuple(settings["bits"]),
        granularity=tuple(settings["granularity"]), rounding=tuple(settings["rounding"]), device=settings["device"],
        compressors=compressors,
    )


def _check_quantizer(f: _File, top: Mapping[str, tuple[yaml.Node, yaml.Node]], settings: Mapping[str, Any]) -> None:
    from modelopt.api import build_compressors

    try:
        build_compressors(["quantize"], {"quantize": {"bits": settings["bits"], "granularity": settings["granularity"],
                                                      "rounding": settings["rounding"]}})
    except ConfigError as exc:
        key = next((k for k in ("granularity", "rounding") if k in str(exc)), "bits")
        raise f.error(top[key][1] if key in top else None, key, str(exc)) from None


def _models(f: _File, node: yaml.Node, base: Path) -> list[SweepModel]:
    from modelopt.data import list_data_sources
    from modelopt.models import list_models

    example = "[{name: resnet20, model: cifar10_resnet20}]"
    models, names, name_nodes = [], [], []
    entries = f.items(node, "models", example)
    for i, entry in enumerate(entries):
        where = f"models[{i}]"
        keys = f.mapping(entry, where, _MODEL_KEYS, "model entry")
        for req in ("name", "model"):
            if req not in keys:
                raise f.error(entry, f"{where}.{req}", f"missing; each model needs name and model, like {example}")
        name = f.string(keys["name"][1], f"{where}.name", "resnet20")
        if not _SAFE_NAME.match(name):
            raise f.error(keys["name"][1], f"{where}.name", f"{name!r} is used as a folder name: use letters, "
                          "digits, '-', '_' and '.' only")
        vnode = keys["model"][1]
        model = f.string(vnode, f"{where}.model", "cifar10_resnet20")
        if model not in list_models() and ":" not in model:  # not zoo, torchvision:NAME or pkg.mod:factory: a file
            resolved = base / model
            if not resolved.is_file():
                raise f.error(vnode, f"{where}.model", f"{model!r} is neither a zoo model ({', '.join(list_models())}), "
                              f"torchvision:NAME, pkg.module:factory, nor a file (looked for {str(resolved)!r})")
            model = str(resolved.resolve())
        weights = None
        if "weights" in keys:
            wnode = keys["weights"][1]
            weights_path = base / f.string(wnode, f"{where}.weights", "../models/resnet56.th")
            if not weights_path.is_file():
                raise f.error(wnode, f"{where}.weights", f"no such file {str(weights_path.resolve())!r} "
                              "(relative paths are resolved against the sweep file's folder)")
            weights = str(weights_path.resolve())
        data = "cifar10-sample"
        if "data" in keys:
            dnode = keys["data"][1]
            data = f.string(dnode, f"{where}.data", "cifar10-sample")
            if data not in list_data_sources():
                resolved = base / data
                if not resolved.exists():
                    raise f.error(dnode, f"{where}.data", f"{data!r} is neither a data source "
                                  f"({', '.join(list_data_sources())}) nor a path (looked for {str(resolved)!r})")
                data = str(resolved.resolve())
        models.append(SweepModel(name, model, weights, data))
        names.append(name)
        name_nodes.append(keys["name"][1])
    f.unique(name_nodes, names, "models[].name")
    return models


# ---- cells ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One run of the grid and how far it got."""

    model: str
    strategy: str
    seed: int
    run_dir: Path
    n_trials: int
    spent: float
    done: bool  # summary.json written and the budget reached (or the space exhausted at it)

    @property
    def started(self) -> bool:
        return (self.run_dir / CONFIG).exists() or (self.run_dir / JOURNAL).exists()

    @property
    def status(self) -> str:
        return "done" if self.done else "partial" if self.started else "todo"


def cell_status(run_dir: Path, model: str, strategy: str, seed: int, budget: float) -> Cell:
    """A cell is done when its summary exists and its trials' cost reaches `budget`, or its run
    stopped early at that budget because the strategy had nothing new to propose."""
    records = _read_journal(run_dir / JOURNAL)
    spent = sum(float(r.get("cost", 0.0)) for r in records)
    summary = _read_json(run_dir / SUMMARY)
    done = summary is not None and (spent >= budget - EPS or float(summary.get("budget", 0)) >= budget - EPS)
    return Cell(model, strategy, seed, run_dir, len(records), spent, done)
