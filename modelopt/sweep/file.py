"""The sweep file and its parsing (errors name the key and its line); its cells are in `modelopt.sweep.cells`."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelopt._version import __version__
from modelopt.compressors import COMPRESSORS, Setting, SettingKind, compressor_settings
from modelopt.config.run_config import MAX_WORKERS, RunConfig
from modelopt.data.dataset import list_data_sources
from modelopt.errors import TOO_LARGE, ConfigError, UnknownNameError, beyond_float
from modelopt.model.loader import list_models
from modelopt.model.workload import resolve_device
from modelopt.run.layout import RUNS
from modelopt.search import STRATEGIES
from modelopt.sweep.cells import EPS, Cell, cell_status

__all__ = ["EPS", "Cell", "Sweep", "SweepModel", "cell_status", "load_sweep"]

_REQUIRED = ("name", "models", "strategies", "budgets", "seeds")
# The run settings a sweep file may give besides every compressor's (`Compressor.record.settings()`); one left out
# takes RunConfig's default, as `modelopt optimize` does.
_RUN_KEYS = ("objective", "min_retention", "floors", "confidence", "compressors", "device", "reconstruct", "time",
             "latency")
_FIXED_KEYS = (*_REQUIRED[:1], "out", *_REQUIRED[1:], *_RUN_KEYS, "workers_per_cell")
_MODEL_KEYS = ("name", "model", "weights", "data", "unlabeled")
_MODELS_EXAMPLE = "[{name: resnet20, model: cifar10_resnet20}]"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class SweepModel:
    """One model of the grid; `name` is its folder under runs/."""

    name: str
    model: str
    weights: str | None = None
    data: str = "cifar10-sample"
    unlabeled: str | None = None  # images for calibration (`load_data(unlabeled=...)`)


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
    settings: Mapping[str, Any] = field(default_factory=dict)  # the run settings the file gives
    workers_per_cell: int = 1  # > 1: each cell's evaluations fanned over that many Ray workers
    # The settings every cell starts from: RunConfig's defaults, then the file's (one `RunConfig.replace`).
    config: RunConfig = field(default_factory=RunConfig)

    @property
    def objective(self) -> str:
        return self.config.objective

    @property
    def device(self) -> str:
        return self.config.device

    @property
    def compressors(self) -> tuple[str, ...] | None:
        return self.config.compressors

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
        """sweep.json: the grid, the run settings every cell used (RunConfig's, and the compressors' settings
        as `settings`, defaults included) and the settings the file gave (`given`)."""
        cfg = self.config
        declared = compressor_settings()
        records = {c: o.to_json() for c, o in cfg.options.items()}
        used = {o: records[c][o] for o, (c, _) in declared.items() if c in records}
        return {
            "version": 2, "modelopt": __version__, "path": str(self.path), "name": self.name, "out": str(self.out),
            "models": [vars(m) for m in self.models], "strategies": list(self.strategies), "seeds": list(self.seeds),
            "budgets": list(self.budgets), "objective": cfg.objective, "workers_per_cell": self.workers_per_cell,
            "min_retention": cfg.min_retention, "floors": list(cfg.floors), "confidence": cfg.confidence,
            "device": cfg.device,
            "compressors": None if cfg.compressors is None else list(cfg.compressors), "settings": used,
            "given": {k: list(v) if isinstance(v, tuple) else v for k, v in self.settings.items()},
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

    def mapping(self, node: yaml.Node, key: str, valid: Sequence[str],
                what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
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

    def checked(self, node: yaml.Node, key: str, ok: Callable[[Any], bool], expected: str) -> Any:
        """The node's value when `ok` accepts it; else an error saying what was `expected`."""
        v = self.value(node, key)
        if not ok(v):  # a 400-digit integer is named, not printed
            shown = TOO_LARGE if isinstance(v, int) and not isinstance(v, bool) and beyond_float(v) else repr(v)
            raise self.error(node, key, f"{expected}; got {shown}")
        return v

    def names(self, node: yaml.Node, key: str, example: str, valid: Sequence[str], what: str, *,
              unique: bool = True) -> list[str]:
        """A non-empty list of names like `example`, each one of `valid` (and each once when `unique`)."""
        nodes = self.items(node, key, example)
        names = [self.string(n, key, example.strip("[]").split(",")[0]) for n in nodes]
        for n, name in zip(nodes, names, strict=True):
            if name not in valid:
                raise self.error(n, key, str(UnknownNameError(what, name, valid)))
        if unique:
            self.unique(nodes, names, key)
        return names

    def unique(self, nodes: list[yaml.Node], values: list[Any], key: str) -> None:
        seen: dict[Any, int] = {}
        for node, v in zip(nodes, values, strict=True):
            if v in seen:
                raise self.error(node, key, f"{v!r} is listed twice (first at line {seen[v]}); list it once")
            seen[v] = node.start_mark.line + 1


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(node.value) if node.value else "nothing"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A finite int or float, not a bool; nor an int too large for a float (a YAML integer of 400 digits)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not beyond_float(v) and math.isfinite(v)


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
    f = _File(path)
    root = _compose(path)
    top = f.mapping(root, "(top level)", (*_FIXED_KEYS, *compressor_settings()), "sweep file")
    for key in _REQUIRED:
        if key not in top:
            raise f.error(root, key, f"missing; a sweep file needs {', '.join(_REQUIRED)} (see modelopt/sweep/run.py)")
    base = path.resolve().parent
    name = f.string(top["name"][1], "name", "mcts_vs_baselines")
    out = base / (f.string(top["out"][1], "out", "results/my_sweep") if "out" in top else name)
    models = _models(f, top["models"][1], base)
    strategies = f.names(top["strategies"][1], "strategies", "[random, mcts]", STRATEGIES.names(), "strategy")
    b_nodes = f.items(top["budgets"][1], "budgets", "[50, 100, 200]")
    budgets = [float(f.checked(n, "budgets", lambda v: _is_number(v) and v > 0,
                               "expected positive numbers of full val evaluations like [50, 100, 200]"))
               for n in b_nodes]
    f.unique(b_nodes, budgets, "budgets")
    k_nodes = f.items(top["seeds"][1], "seeds", "[0, 1, 2]")
    seeds = [f.checked(n, "seeds", lambda v: _is_int(v) and v >= 0, "expected non-negative integers like [0, 1, 2]")
             for n in k_nodes]
    f.unique(k_nodes, seeds, "seeds")
    settings, config, workers = _settings(f, top, base)
    return Sweep(
        path=path.resolve(), name=name, out=out.resolve(), models=tuple(models), strategies=tuple(strategies),
        budgets=tuple(sorted(budgets)), seeds=tuple(seeds), settings=settings, workers_per_cell=workers,
        config=config,
    )


def _compose(path: Path) -> yaml.Node:
    """The file's YAML node tree; a missing, unreadable, malformed or empty file is a ConfigError."""
    if not path.exists():
        raise ConfigError(f"sweep file {str(path)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"sweep file {str(path)!r} is a folder; pass a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"sweep file {str(path)!r} cannot be read as UTF-8 text: {exc}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"sweep file {str(path)!r}{where}: not valid YAML: {problem}") from None
    if root is None:
        raise ConfigError(f"sweep file {str(path)!r} is empty; it needs the keys {', '.join(_REQUIRED)}")
    return root


def _settings(f: _File, top: Mapping[str, tuple[yaml.Node, yaml.Node]],
              base: Path) -> tuple[dict[str, Any], RunConfig, int]:
    """The run settings the file gives, the config they make (checked once, together, by `RunConfig.replace`; a
    ConfigError names the line of the key it is about), and workers_per_cell (1 when absent)."""
    given = {key: vnode for key, (_, vnode) in top.items()}
    declared = compressor_settings()
    run_keys = {*_RUN_KEYS, *declared}
    settings = {key: _value(f, key, n, base, declared) for key, n in given.items() if key in run_keys}
    try:
        config = RunConfig().replace(**settings)
    except ConfigError as exc:
        key = _blame(settings, exc, declared)
        raise f.error(given.get(key), key, str(exc)) from None
    records = {name: o.to_json() for name, o in config.options.items()}  # each setting as its record holds it
    settings.update({k: records[declared[k][0]][k] for k in settings if k in declared})
    return settings, config, _workers(f, given.get("workers_per_cell"))


def _workers(f: _File, node: yaml.Node | None) -> int:
    """workers_per_cell: Ray workers each cell's evaluations are fanned over (1 when absent)."""
    if node is None:
        return 1
    return int(f.checked(node, "workers_per_cell", lambda v: _is_int(v) and 1 <= v <= MAX_WORKERS,
                         f"expected a number of Ray workers per cell from 1 to {MAX_WORKERS}, like 4"))


def _value(f: _File, key: str, node: yaml.Node, base: Path, declared: Mapping[str, tuple[str, Setting]]) -> Any:
    """A run setting for `RunConfig.replace` to check; read here: list items (with lines), devices, relative paths."""
    if key == "compressors":
        return tuple(f.names(node, key, "[quantize, prune]", COMPRESSORS.names(), "compressor", unique=False))
    if key == "device":
        return _device(f, node)
    if key in declared and declared[key][1].kind is SettingKind.PATH:
        return _existing(f, node, key, base, f.string(node, key, "../data/train.npz"))
    value = f.value(node, key)
    if key == "latency":  # an engine's name, or none (as `--latency none`: no plan is timed)
        if not isinstance(value, (str, type(None))):
            raise f.error(node, key, "expected a latency engine: torch, onnxruntime, openvino or none")
        return None if value is None or value.lower() == "none" else value
    # A YAML integer floor (min_retention: 1) is the number it means, saved as a float as the command line saves it.
    return float(value) if key in ("min_retention", "confidence") and _is_number(value) else value


def _blame(settings: Mapping[str, Any], exc: ConfigError, declared: Mapping[str, tuple[str, Setting]]) -> str:
    """The key a ConfigError from the settings together is about: the first whose value alone is refused alike;
    else (a refusal only the settings together make, such as a setting of a compressor the run does not use) the
    first the message names, a compressor's setting before a run field; else the first key."""
    for key, value in settings.items():
        try:
            RunConfig().replace(**{key: value})
        except ConfigError as alone:
            if str(alone) == str(exc):
                return key
    named = [k for k in settings if re.search(rf"\b{re.escape(k)}\b", str(exc))]
    named.sort(key=lambda k: k not in declared)
    return next(iter(named or settings), "(top level)")


def _existing(f: _File, node: yaml.Node, key: str, base: Path, value: str) -> str:
    """A path a key names, resolved against the sweep file's folder; it must exist."""
    path = base / value
    if not path.exists():
        raise f.error(node, key, f"no such file {str(path.resolve())!r} (relative paths are resolved against the "
                      "sweep file's folder)")
    return str(path.resolve())


def _device(f: _File, n: yaml.Node) -> str:
    device = f.string(n, "device", "auto")
    try:
        resolve_device(device)
    except ConfigError as exc:
        raise f.error(n, "device", str(exc)) from None
    return device


def _models(f: _File, node: yaml.Node, base: Path) -> list[SweepModel]:
    entries = f.items(node, "models", _MODELS_EXAMPLE)
    parsed = [_model(f, entry, f"models[{i}]", base) for i, entry in enumerate(entries)]
    f.unique([name_node for _, name_node in parsed], [m.name for m, _ in parsed], "models[].name")
    return [m for m, _ in parsed]


def _model(f: _File, entry: yaml.Node, where: str, base: Path) -> tuple[SweepModel, yaml.Node]:
    """One entry of `models` and the node of its name."""
    keys = {k: vnode for k, (_, vnode) in f.mapping(entry, where, _MODEL_KEYS, "model entry").items()}
    for req in ("name", "model"):
        if req not in keys:
            raise f.error(entry, f"{where}.{req}", f"missing; each model needs name and model, like {_MODELS_EXAMPLE}")
    name = f.string(keys["name"], f"{where}.name", "resnet20")
    if not _SAFE_NAME.match(name):
        raise f.error(keys["name"], f"{where}.name", f"{name!r} is used as a folder name: use letters, "
                      "digits, '-', '_' and '.' only")
    model = f.string(keys["model"], f"{where}.model", "cifar10_resnet20")
    if model not in list_models() and ":" not in model:  # not zoo, torchvision:NAME or pkg.mod:factory: a file
        resolved = base / model
        if not resolved.is_file():
            raise f.error(keys["model"], f"{where}.model", f"{model!r} is neither a zoo model "
                          f"({', '.join(list_models())}), torchvision:NAME, pkg.module:factory, nor a file "
                          f"(looked for {str(resolved)!r})")
        model = str(resolved.resolve())
    weights, unlabeled = (_path(f, keys, key, where, base, example) for key, example in
                          (("weights", "../models/resnet56.th"), ("unlabeled", "../data/cifar10_jpeg_train.npz")))
    data = "cifar10-sample"
    if "data" in keys:
        data = f.string(keys["data"], f"{where}.data", "cifar10-sample")
        if data not in list_data_sources():
            resolved = base / data
            if not resolved.exists():
                raise f.error(keys["data"], f"{where}.data", f"{data!r} is neither a data source "
                              f"({', '.join(list_data_sources())}) nor a path (looked for {str(resolved)!r})")
            data = str(resolved.resolve())
    return SweepModel(name, model, weights, data, unlabeled), keys["name"]


def _path(f: _File, keys: dict[str, yaml.Node], key: str, where: str, base: Path, example: str) -> str | None:
    """An existing path named by `key` (relative to the sweep file's folder), resolved; None when absent."""
    if key not in keys:
        return None
    path = base / f.string(keys[key], f"{where}.{key}", example)
    if not path.exists():
        raise f.error(keys[key], f"{where}.{key}", f"no such file {str(path.resolve())!r} "
                      "(relative paths are resolved against the sweep file's folder)")
    return str(path.resolve())
