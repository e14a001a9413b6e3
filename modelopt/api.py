"""The Python API: optimize, evaluate, and the loaders. The CLI is a thin shell over this."""

from __future__ import annotations

import dataclasses
import inspect
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from modelopt.compressors.quantize import parse_rounding
from modelopt.confidence import DEFAULT_CONFIDENCE
from modelopt.config.assemble import (
    DEFAULT_BITS,
    DEFAULT_BUDGET,
    DEFAULT_GRANULARITY,
    DEFAULT_NORM_IMAGES,
    DEFAULT_ROUNDING,
    build_compressors,
    default_compressors,
    load_exit_images,
)
from modelopt.config.build import build
from modelopt.config.run_config import RunConfig
from modelopt.data.dataset import Dataset, load_data
from modelopt.errors import ConfigError, LoadError
from modelopt.evaluation.evaluator import Evaluator, Metrics
from modelopt.evaluation.fidelity import Fidelity
from modelopt.executors import make_executor
from modelopt.executors.on_ray import import_ray
from modelopt.knowledge import read_store, record_run
from modelopt.latency.plan import PlanLatency
from modelopt.latency.spec import LatencySpec
from modelopt.model.loader import LoadedModel, load_model
from modelopt.model.workload import Workload, check_split
from modelopt.objective import Target
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace, read_plan_file
from modelopt.reports import write_report
from modelopt.run.layout import CONFIG
from modelopt.run.lock import lock_run_folder
from modelopt.run.optuna_storage import check_storage, export_run
from modelopt.run.preflight import check_run_folder
from modelopt.run.run_folder import save_layers
from modelopt.run.runner import Runner, RunResult

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_NORM_IMAGES",
    "DEFAULT_ROUNDING",
    "KEYWORD_SETTINGS",
    "RunConfig",
    "build_compressors",
    "build_workload",
    "default_compressors",
    "evaluate",
    "load_exit_images",
    "optimize",
    "run",
    "run_config",
    "with_settings",
]

# None: every registered compressor that can lower the run's objective on its model (`default_compressors`).
DEFAULT_COMPRESSORS: Sequence[str] | None = None
DEFAULT_RUNS_DIR = Path("runs")
DEFAULT_FIDELITY: Fidelity | None = Fidelity()

ModelLike = str | Path | nn.Module | LoadedModel
DataLike = str | Path | DataLoader | Dataset
UnlabeledLike = str | Path | DataLoader | None
PlanLike = Plan | Mapping[str, Any] | str | Path | None


def _model(model: ModelLike, weights: str | Path | None, allow_pickle: bool) -> LoadedModel:
    if isinstance(model, LoadedModel):
        return model
    return load_model(model, weights, allow_pickle=allow_pickle)


def _data(data: DataLike, seed: int, unlabeled: UnlabeledLike = None) -> Dataset:
    return data if isinstance(data, Dataset) else load_data(data, seed=seed, unlabeled=unlabeled)


def build_workload(
    model: ModelLike = "cifar10_resnet20",
    data: DataLike = "cifar10-sample",
    *,
    weights: str | Path | None = None,
    device: str = "auto",
    data_seed: int = 0,
    allow_pickle: bool = False,
    unlabeled: UnlabeledLike = None,
) -> Workload:
    """Loads model and data and puts both, with the baseline predictions, on the device (`unlabeled`:
    images for calibration and fitting, see `modelopt.data.dataset.load_data`)."""
    return Workload(_model(model, weights, allow_pickle), _data(data, data_seed, unlabeled), device=device)


def resolve_plan(plan: PlanLike, space: SearchSpace) -> Plan:
    """A Plan from a Plan, a plan mapping, a YAML file path, or None (no compression)."""
    if plan is None:
        return space.plan()
    if isinstance(plan, Plan):
        return space.plan(dict(plan.choices))
    if isinstance(plan, Mapping):
        return space.parse_plan(plan)
    return space.load_plan(plan)


def evaluate(
    model: ModelLike = "cifar10_resnet20",
    plan: PlanLike = None,
    data: DataLike = "cifar10-sample",
    *,
    weights: str | Path | None = None,
    split: str = "val",
    device: str = "auto",
    data_seed: int = 0,
    compressors: Sequence[str] | None = DEFAULT_COMPRESSORS,
    allow_pickle: bool = False,
    rounding: Sequence[str] = DEFAULT_ROUNDING,
) -> Metrics:
    """Scores one plan on one split.

    Args:
        model: a zoo name, `torchvision:NAME`, `pkg.module:factory`, a file or an nn.Module.
        plan: a Plan, a plan mapping (`default` + `layers`), a YAML file, or None for float.
        data: a named source, a path, a DataLoader or a Dataset.
        weights: checkpoint for `model`.
        split: calib, val, test, or all (val + test).
        device: auto, cpu, cuda or cuda:N.
        data_seed: the seed of the calib/val/test split.
        compressors: which compressors a plan may use (default: every registered one the model suits).
        allow_pickle: allow full unpickling of model files (trusted files only).
        rounding: the rounding a plan entry without `rounding` gets (nearest, gptq).

    Example:
        >>> m = modelopt.evaluate("cifar10_resnet20", {"default": {"quantize": {"bits": 8}}}, split="test")
        >>> round(m.retention, 3), round(m.compression, 2)
    """
    check_split(split)  # what needs no model is checked before it loads
    parse_rounding(rounding)
    if isinstance(plan, (str, Path)):
        read_plan_file(plan)
    wl = build_workload(model, data, weights=weights, device=device, data_seed=data_seed, allow_pickle=allow_pickle)
    if compressors is None:  # a plan may use any compressor that can handle the model
        compressors = sorted({n for t in ("size", "macs") for n in default_compressors(t, wl.model)})
    quant = {"rounding": list(rounding), "norm_images": DEFAULT_NORM_IMAGES}
    space = SearchSpace(wl.layers, build_compressors(compressors, {"quantize": quant}, model=wl.model))
    return Evaluator(wl, space).evaluate(resolve_plan(plan, space), split=split)


def default_run_dir(model_name: str, strategy: str, seed: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model_name)[-40:]
    return DEFAULT_RUNS_DIR / f"{stamp}-{safe}-{strategy}-s{seed}"


def latest_run_dir(root: Path = DEFAULT_RUNS_DIR) -> Path:
    runs = sorted((p for p in root.glob("*/") if (p / CONFIG).exists()), key=lambda p: (p / CONFIG).stat().st_mtime)
    if not runs:
        raise ConfigError(f"--resume without --out needs a run folder under {str(root)!r}; none found")
    return runs[-1]


def optimize(
    model: ModelLike | Workload | RunConfig = "cifar10_resnet20",
    data: DataLike = "cifar10-sample",
    *,
    weights: str | Path | None = None,
    strategy: str = "mcts",
    budget: float = DEFAULT_BUDGET,
    objective: str = "size",
    min_retention: float = 0.99,
    confidence: float = DEFAULT_CONFIDENCE,
    count_gains: bool = True,
    unlabeled: UnlabeledLike = None,
    seed: int = 0,
    device: str = "auto",
    out: str | Path | None = None,
    resume: bool = False,
    report: bool = True,
    storage: str | None = None,
    bits: Sequence[int] = DEFAULT_BITS,
    granularity: Sequence[str] = DEFAULT_GRANULARITY,
    rounding: Sequence[str] = DEFAULT_ROUNDING,
    norm_images: int = DEFAULT_NORM_IMAGES,
    compressors: Sequence[str] | None = DEFAULT_COMPRESSORS,
    activations: Sequence[int | None] | None = None,
    exit_data: str | Path | None = None,
    exit_images: int = 10000,
    data_seed: int = 0,
    allow_pickle: bool = False,
    progress: bool = True,
    fidelity: Fidelity | None = DEFAULT_FIDELITY,
    latency: str | LatencySpec | None = "torch",
    workers: int = 1,
    executor: str | None = None,
    ray_address: str | None = None,
    knowledge: str | Path | None = None,
) -> RunResult:
    """Searches for the smallest plan that keeps `min_retention` of the float accuracy.

    Every trial is journaled as it finishes (`resume=True` continues a killed run); at the end the best
    plan, confirmed on images that did not select it, is re-scored on held-out test images.

    Args:
        model: a zoo name, `torchvision:NAME`, `pkg.module:factory`, a file, an nn.Module, a `Workload`
            (then `data`, `device` and `data_seed` are its own), or a `RunConfig` holding every run setting
            (then only `out`, `resume`, `report`, `storage`, `allow_pickle` and `progress` may be passed).
        data: a named source, a path, a DataLoader or a Dataset.
        out, resume: the run folder (default: runs/<time>-<model>-<strategy>-s<seed>); continue the
            run in it (default: the latest under runs/).
        report, storage: write report.md and report.html at the end; an Optuna storage URL (e.g.
            `sqlite:///studies.db`) every trial is written into at the end (a failure of either warns).
        allow_pickle, progress: allow full unpickling of model files (trusted files only); show a bar.
        bits, granularity, rounding, norm_images, activations: the quantizer's menu (`Quantize`'s
            options); activations (input bits per layer, None = float) default to (None, 8) for
            bitops, else float only.
        weights, strategy, budget, objective, min_retention, confidence, count_gains, unlabeled (or a
        DataLoader), seed, device, compressors, exit_data, exit_images, data_seed, fidelity, latency, workers,
        executor, ray_address, knowledge: `RunConfig`'s fields of the same names (executor None: `ray`
            when `workers` > 1 or `ray_address` is given, else `local`).

    Example:
        >>> result = modelopt.optimize(RunConfig(strategy="random", budget=20), out="runs/r20-random")
        >>> result.best.metrics.compression, result.best_test.retention
    """
    settings = {k: v for k, v in locals().items() if k in KEYWORD_SETTINGS}
    if isinstance(model, RunConfig):
        changed = sorted(k for k, v in settings.items() if v != KEYWORD_SETTINGS[k])
        if changed:
            raise ConfigError(f"{changed[0]!r} was passed beside a RunConfig; set it in the RunConfig instead")
        return run(model, out=out, resume=resume, report=report, storage=storage, progress=progress,
                   allow_pickle=allow_pickle)
    in_memory = isinstance(unlabeled, DataLoader)
    named = isinstance(model, (str, Path)) and isinstance(data, (str, Path)) and not in_memory
    settings["unlabeled"] = "<in memory>" if in_memory else unlabeled
    config = run_config(model=str(model) if named else "<in memory>", data=str(data) if named else "<in memory>",
                        **settings)  # every setting is checked before a model loads
    workload = None if named else model if isinstance(model, Workload) else build_workload(
        model, data, weights=weights, device=device, data_seed=data_seed, allow_pickle=allow_pickle,
        unlabeled=unlabeled)
    return run(config, workload=workload, out=out, resume=resume, report=report, storage=storage,
               progress=progress, allow_pickle=allow_pickle)


def run_config(
    *, model: str, data: str, bits: Sequence[int], granularity: Sequence[str], rounding: Sequence[str],
    norm_images: int, compressors: Sequence[str] | None, activations: Sequence[int | None] | None,
    latency: str | LatencySpec | None, exit_data: str | Path | None, **fields: Any,
) -> RunConfig:
    """A RunConfig from `optimize`'s keywords: the quantizer's menu given as its own keywords."""
    parse_rounding(rounding)
    fields["executor"] = _executor(fields.get("executor"), fields.get("workers", 1), fields.get("ray_address"))
    for path in ("knowledge", "unlabeled"):
        if fields.get(path) is not None:
            fields[path] = str(fields[path])
    if activations is None:  # quantized inputs lower only bitops here
        activations = (None, 8) if fields.get("objective") == Target.BITOPS.value else (None,)
    quantize: dict[str, Any] = {"bits": list(bits), "granularity": list(granularity), "rounding": list(rounding),
                                "norm_images": norm_images}
    if tuple(activations) != (None,):
        quantize["activations"] = list(activations)
    return RunConfig(
        model=model, data=data, compressors=None if compressors is None else tuple(compressors),
        options={"quantize": quantize}, latency=LatencySpec(latency) if isinstance(latency, str) else latency,
        exit_data=None if exit_data is None else str(exit_data), **fields)


def with_settings(config: RunConfig, **given: Any) -> RunConfig:
    """`config` with some of `optimize`'s keywords changed (a resumed run's settings, overridden by flags)."""
    menu = {k: given.pop(k) for k in ("bits", "granularity", "rounding", "activations") if k in given}
    if "rounding" in menu:
        parse_rounding(menu["rounding"])
    fields: dict[str, Any] = dict(given)
    if menu:
        options = {name: dict(o) for name, o in config.options.items()}
        options["quantize"] = {**options.get("quantize", {}), **{k: list(v) for k, v in menu.items()}}
        fields["options"] = options
    if "compressors" in fields:
        fields["compressors"] = None if fields["compressors"] is None else tuple(fields["compressors"])
    if isinstance(fields.get("latency"), str):
        fields["latency"] = LatencySpec(fields["latency"])
    for path in ("weights", "exit_data", "knowledge", "unlabeled"):
        if fields.get(path) is not None:
            fields[path] = str(fields[path])
    if {"workers", "ray_address"} & fields.keys() and fields.get("executor") is None:
        fields["executor"] = _executor(None, fields.get("workers", config.workers),
                                       fields.get("ray_address", config.ray_address))
    elif "executor" in fields and fields["executor"] is None:
        del fields["executor"]
    return dataclasses.replace(config, **fields)


def _executor(name: str | None, workers: int, ray_address: str | None) -> str:
    """The executor a run's keywords ask for: the one named, else Ray when more than one worker or a
    cluster address is given (a local run scores one plan at a time)."""
    if name is not None:
        return name
    return "ray" if ray_address is not None or (isinstance(workers, int) and workers > 1) else "local"




def run(
    config: RunConfig,
    *,
    workload: Workload | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    report: bool = True,
    storage: str | None = None,
    progress: bool = True,
    allow_pickle: bool = False,
) -> RunResult:
    """Runs the search `config` describes (see `optimize` for the other arguments).

    `workload`: the model and data already loaded (sweeps share one across runs); the caller
    vouches that it is `config`'s model, data and device.
    """
    if storage is not None:  # a bad URL is refused before the search spends its budget
        check_storage(storage)
    if resume and out is None:
        out = latest_run_dir()
    check_run_folder(out, resume=resume)  # unwritable, busy, a run not resumed, a damaged journal: before loading
    if not resume:
        config.check_exit_data()  # an option this run would ignore: refused before the model loads
    if config.executor == "ray":
        import_ray()  # the `distributed` extra missing: refused before the model loads, too
    if config.knowledge is not None:
        read_store(config.knowledge)  # a damaged store: refused before the model loads, too
    if workload is None and config.unlabeled is not None and not Path(config.unlabeled).expanduser().exists():
        raise LoadError(f"unlabeled images {config.unlabeled!r} do not exist; pass an .npz (x, or jpeg and offsets) "
                        "or an image folder")  # before the model loads, too
    # The folder is this process's from here (a second process on it is refused at once, before it loads);
    # the runner holds the lock to the end and lets it go however the run ends.
    created = out is not None and not Path(out).exists()
    lock = lock_run_folder(out) if out is not None else None
    try:
        built = build(config, workload, allow_pickle=allow_pickle)
        timer = None if config.latency is None else PlanLatency(built.evaluator, config.latency)
        run_dir = Path(out) if out is not None else default_run_dir(built.workload.name, config.strategy, config.seed)
        executor = make_executor(built, workload=workload, allow_pickle=allow_pickle)
        runner = Runner(built.evaluator, built.strategy, built.objective, budget=config.budget, run_dir=run_dir,
                        config=built.config, resume=resume, progress=progress, fidelity=config.fidelity,
                        latency=timer, executor=executor, lock=lock)
    except BaseException:
        if lock is not None:
            lock.release()
            if created:  # refused before the run began: leave no folder behind
                lock.remove_folder_if_empty()
        raise
    result = runner.run()
    if config.knowledge is not None:  # what this run learned per layer, for later runs to start from
        record_run(config.knowledge, result.run_dir, result.trials, built.objective.confidence, built.evaluator)
    _after_run(result, built.workload, report=report, storage=storage)
    return result


def _after_run(result: RunResult, wl: Workload, *, report: bool, storage: str | None) -> None:
    """The run's report and Optuna export: extras, so a failure warns and the run folder stands."""
    try:
        save_layers(result.run_dir, wl.layers)  # lets reports size each layer without the model
        if report:
            write_report(result.run_dir, layers=wl.layers)
    except Exception as exc:  # noqa: BLE001 -- an extra: whatever breaks it, the run folder stands
        warnings.warn(f"the run finished but its report was not written ({type(exc).__name__}: {exc}); "
                      f"retry with `modelopt report {result.run_dir}`", stacklevel=3)
    if storage is not None:
        try:
            export_run(result.run_dir, storage)
        except Exception as exc:  # noqa: BLE001 -- an extra, as the report
            warnings.warn(f"the run finished but was not written to {storage!r} ({type(exc).__name__}: {exc}); "
                          f"retry with `modelopt dashboard {result.run_dir} --storage {storage}`", stacklevel=3)


# optimize's keywords that are run settings (RunConfig's fields, or the quantizer's menu), with their
# defaults: the ones a RunConfig passed as `model` must leave alone, and the CLI's for a new run.
_NOT_SETTINGS = frozenset({"model", "data", "out", "resume", "report", "storage", "allow_pickle", "progress"})
KEYWORD_SETTINGS: dict[str, Any] = {name: p.default for name, p in inspect.signature(optimize).parameters.items()
                                    if name not in _NOT_SETTINGS}
