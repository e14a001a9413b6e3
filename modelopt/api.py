"""The Python API: optimize, evaluate, and the loaders. The CLI is a thin shell over this."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from modelopt.certify.evidence import check_scores
from modelopt.compressors import COMPRESSORS
from modelopt.config.assemble import DEFAULT_BUDGET, DEFAULT_TIME, build_compressors, default_compressors
from modelopt.config.build import build
from modelopt.config.run_config import SETTLED_RESUME_KEYS, RunConfig
from modelopt.data.dataset import Dataset, load_data
from modelopt.data.preprocess import DEFAULT_INTERPOLATION, Preprocess
from modelopt.data.split import Split, check_split
from modelopt.errors import ConfigError, LoadError
from modelopt.evaluation.evaluator import Evaluator, Metrics
from modelopt.executors import make_executor
from modelopt.executors.on_ray import import_ray
from modelopt.knowledge import read_store, record_run
from modelopt.model.layers import compressible_modules
from modelopt.model.loader import LoadedModel, load_model, read_with
from modelopt.model.workload import Workload, check_head
from modelopt.plan.file import check_plan_names
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace, read_plan_file
from modelopt.reconstruct.store import Refits
from modelopt.reports import write_report
from modelopt.run.clock import RunClock
from modelopt.run.export import resolve
from modelopt.run.layout import BEST_PLAN, CONFIG
from modelopt.run.lock import lock_run_folder
from modelopt.run.optuna_storage import check_storage, export_run
from modelopt.run.preflight import check_run_folder
from modelopt.run.run_folder import save_layers
from modelopt.run.runner import Runner, RunResult

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_TIME",
    "RunConfig",
    "build_compressors",
    "build_workload",
    "default_compressors",
    "evaluate",
    "optimize",
    "run",
]

DEFAULT_RUNS_DIR = Path("runs")

ModelLike = str | Path | nn.Module | LoadedModel
DataLike = str | Path | DataLoader | Dataset
UnlabeledLike = str | Path | DataLoader | None
PlanLike = Plan | Mapping[str, Any] | str | Path | None | int  # int: a trial number of `run`


def _model(model: ModelLike, weights: str | Path | None, allow_pickle: bool) -> LoadedModel:
    if isinstance(model, LoadedModel):
        return model
    return load_model(model, weights, allow_pickle=allow_pickle)


def _data(data: DataLike, seed: int, unlabeled: UnlabeledLike = None, preprocess: Preprocess | None = None) -> Dataset:
    return data if isinstance(data, Dataset) else load_data(data, seed=seed, unlabeled=unlabeled, preprocess=preprocess)


def build_workload(
    model: ModelLike = "cifar10_resnet20",
    data: DataLike = "cifar10-sample",
    *,
    weights: str | Path | None = None,
    device: str = "auto",
    data_seed: int = 0,
    allow_pickle: bool = False,
    unlabeled: UnlabeledLike = None,
    preprocess: Preprocess | None = None,
) -> Workload:
    """Loads model and data and puts both, with the baseline predictions, on the device (`unlabeled`:
    images for calibration and fitting; `preprocess`: how decoded images are resized and cropped; see
    `modelopt.data.dataset.load_data`)."""
    decoded = not isinstance(data, (Dataset, DataLoader))
    loaded, prep = read_with(_model(model, weights, allow_pickle), preprocess or Preprocess(), decoded)
    check_head(loaded, data)  # before the images are decoded
    return Workload(loaded, _data(data, data_seed, unlabeled, prep), device=device)


def resolve_plan(plan: PlanLike, space: SearchSpace) -> Plan:
    """A Plan from a Plan, a plan mapping, a YAML file path, or None (no compression)."""
    if plan is None:
        return space.plan()
    if isinstance(plan, Plan):
        return space.plan(dict(plan.choices))
    if isinstance(plan, Mapping):
        return space.parse_plan(plan)
    if isinstance(plan, int):
        raise ConfigError(f"plan {plan} is a trial number: it names a plan of a run folder (evaluate run=...)")
    return space.load_plan(plan)


def evaluate(
    model: ModelLike = "cifar10_resnet20",
    plan: PlanLike = None,
    data: DataLike = "cifar10-sample",
    *,
    weights: str | Path | None = None,
    split: str = Split.VAL,
    device: str = "auto",
    data_seed: int = 0,
    compressors: Sequence[str] | None = None,
    allow_pickle: bool = False,
    unlabeled: UnlabeledLike = None,
    run: str | Path | None = None,
    resize: int | None = None,
    crop: int | None = None,
    interpolation: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    reconstruct: bool | None = None,
    **settings: Any,
) -> Metrics:
    """Scores one plan on one split.

    Args:
        model: a zoo name, `torchvision:NAME`, `pkg.module:factory`, a file or an nn.Module.
        plan: a Plan, a plan mapping (`default` + `layers`), a YAML file, or None for float; with `run`, also
            ``"best"`` (the default there: the run's reported plan) or a trial number.
        data: a named source, a path, a DataLoader or a Dataset.
        unlabeled: images for calibration and fitting, as `optimize` takes them (they change the splits).
        resize, crop, interpolation: each decoded image's shorter side resized to `resize` pixels (resampled by
            `interpolation`, bicubic by default), then a centre `crop` (as `optimize` takes them;
            `modelopt.data.preprocess`). Without them, a torchvision or timm model with weights reads images as
            its authors did (its weights enum's transforms, its pretrained config).
        mean, std: per-channel normalisation in place of the model's own.
        reconstruct: refit the plan on its own compressed inputs before scoring it, as `optimize` does before
            confirmation (`modelopt.reconstruct`; default True); with `run`, the run's plan is scored as the run
            certified it (reconstructed when the run reconstructed it) and this may not be given.
        run: a run folder: its model, data, splits and compressors exactly as the run had them (its run.json);
            `model`, `data`, `weights`, `unlabeled`, `compressors` and settings are then not given.
        weights: checkpoint for `model`.
        split: calib, val, test, or all (val + test).
        device: auto, cpu, cuda or cuda:N.
        data_seed: the seed of the calib/val/test split.
        compressors: which compressors a plan may use (default: every registered one the model suits).
        allow_pickle: allow full unpickling of model files (trusted files only).
        **settings: compressors' settings by name (`Compressor.record.settings()`), e.g. ``rounding=["nearest"]``:
            what a plan entry that names no rounding gets.

    Example:
        >>> m = modelopt.evaluate("cifar10_resnet20", {"default": {"quantize": {"bits": 8}}}, split="test")
        >>> round(m.retention, 3), round(m.compression, 2)
    """
    check_split(split)  # what needs no model is checked before it loads
    if run is not None:
        check_run_alone(run, {"model": model != "cifar10_resnet20" or None, "data": data != "cifar10-sample" or None,
                              "weights": weights, "unlabeled": unlabeled, "resize": resize, "crop": crop,
                              "interpolation": interpolation, "mean": mean, "std": std, "compressors": compressors,
                              **dict.fromkeys(sorted(map(str, settings)), True), "reconstruct": reconstruct})
        source = resolve(run, "best" if plan is None else plan, device=device)
        check_scores(source.evaluator.workload, split)
        return source.evaluator.evaluate(source.realised, split=split)
    # A bad value: one line, before loading.
    prep = Preprocess(resize, crop, interpolation or DEFAULT_INTERPOLATION, None if mean is None else tuple(mean),
                      None if std is None else tuple(std))
    settled = RunConfig(compressors=None if compressors is None else tuple(compressors)).replace(**settings)
    doc = read_plan_file(plan) if isinstance(plan, (str, Path)) else plan if isinstance(plan, Mapping) else None
    loaded = _model(model, weights, allow_pickle)
    if doc is not None:  # a typo in a layer or compressor name: one line before the images are decoded
        check_plan_names(doc, compressible_modules(loaded.module), compressors or COMPRESSORS.names())
    wl = build_workload(loaded, data, device=device, data_seed=data_seed, unlabeled=unlabeled, preprocess=prep)
    if compressors is None:  # a plan may use any compressor that can handle the model
        compressors = sorted({n for t in ("size", "macs") for n in default_compressors(t, wl.model)})
    space = SearchSpace(wl.layers, build_compressors(compressors, settled.options, model=wl.model))
    check_scores(wl, split)  # 0 of N right: retention would read nan
    evaluator, chosen = Evaluator(wl, space), resolve_plan(plan, space)
    fitted = None
    if settled.replace(**({} if reconstruct is None else {"reconstruct": reconstruct})).reconstruct:
        fitted = Refits(evaluator)(chosen)
    return evaluator.evaluate(evaluator.realise(chosen, fitted), split=split)


def check_run_alone(run: str | Path, given: Mapping[str, object], *, flags: bool = False) -> None:
    """`evaluate` with a run folder scores the run's plans as the run had them, everything rebuilt from the folder:
    refuses what else was given, each by its name, with the way to score the plan otherwise.

    Args:
        run: the run folder.
        given: each argument by the name the caller knows it by; None where it was not given.
        flags: the names are the command line's (`modelopt evaluate RUN_DIR`), and so is the way out.
    """
    extra = [name for name, value in given.items() if value is not None]
    if not extra:
        return
    config, best = str(Path(run) / CONFIG), Path(run) / BEST_PLAN
    if flags:
        raise ConfigError(f"evaluate RUN_DIR scores the run's plans with the model, data, compressors and settings "
                          f"in {config!r}; leave out {', '.join(extra)} (to score a plan otherwise, pass it as a file "
                          f"without RUN_DIR: --plan {best} with the run's --model and --data)")
    raise ConfigError(f"evaluate(run={str(run)!r}) scores the run's plans with the model, data, compressors and "
                      f"settings in {config!r}; leave out {', '.join(extra)}, or pass the plan ({str(best)!r}) without "
                      "run, with the run's model and data and yours")


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
    model: ModelLike | Workload | RunConfig | None = None,
    data: DataLike | None = None,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    report: bool = True,
    storage: str | None = None,
    allow_pickle: bool = False,
    progress: bool = True,
    **settings: Any,
) -> RunResult:
    """Searches for the smallest plan that keeps `min_retention` of the float accuracy.

    Every trial is journaled as it finishes (`resume=True` continues a killed run); at the end the best
    plan, confirmed on images that did not select it, is re-scored on held-out test images.

    Args:
        model: a zoo name, `torchvision:NAME`, `pkg.module:factory`, a file, an nn.Module, a `Workload`
            (then `data`, `device` and `data_seed` are its own), or a `RunConfig` holding every run setting
            (then no `settings` may be passed); None: `RunConfig`'s (the bundled ResNet-20).
        data: a named source, a path, a DataLoader or a Dataset; None: `RunConfig`'s (the bundled sample).
        out, resume: the run folder (default: runs/<time>-<model>-<strategy>-s<seed>); continue the
            run in it (default: the latest under runs/).
        report, storage: write report.md and report.html at the end; an Optuna storage URL (e.g.
            `sqlite:///studies.db`) every trial is written into at the end (a failure of either warns).
        allow_pickle, progress: allow full unpickling of model files (trusted files only); show a bar.
        **settings: the run's settings, each `RunConfig`'s field of that name (strategy, budget, objective,
            min_retention, confidence, seed, compressors, latency, workers, ...; `unlabeled` may also be a
            DataLoader) or a compressor's setting (`Compressor.record.settings()`: bits, granularity, rounding,
            activations, norm_images, exit_data, exit_images, ...). Defaults are `RunConfig`'s and the
            compressors' own (`RunConfig.replace` applies them; an unknown name is one ConfigError).

    Example:
        >>> result = modelopt.optimize(strategy="random", budget=20, bits=[8, 4], out="runs/r20-random")
        >>> result.best.metrics.compression, result.best_test.retention
    """
    if isinstance(model, RunConfig):
        if settings or data is not None:
            given = "data" if data is not None else sorted(settings)[0]
            raise ConfigError(f"{given!r} was passed beside a RunConfig; set it in the RunConfig instead")
        return run(model, out=out, resume=resume, report=report, storage=storage, progress=progress,
                   allow_pickle=allow_pickle)
    unlabeled = settings.get("unlabeled")
    in_memory = isinstance(unlabeled, DataLoader)
    named = isinstance(model, (str, Path, type(None))) and isinstance(data, (str, Path, type(None))) and not in_memory
    if in_memory:
        settings["unlabeled"] = "<in memory>"
    if not named:
        settings.update(model="<in memory>", data="<in memory>")
    else:
        settings.update({k: str(v) for k, v in (("model", model), ("data", data)) if v is not None})
    config = RunConfig().replace(**settings)  # every setting is checked before a model loads
    workload = None if named else model if isinstance(model, Workload) else build_workload(
        model if model is not None else config.model, data if data is not None else config.data,
        weights=config.weights, device=config.device, data_seed=config.data_seed, allow_pickle=allow_pickle,
        unlabeled=unlabeled, preprocess=config.preprocess)
    return run(config, workload=workload, out=out, resume=resume, report=report, storage=storage,
               progress=progress, allow_pickle=allow_pickle)


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
    clock = RunClock(config.time)  # loading counts: the user waits for it too
    if storage is not None:  # a bad URL is refused before the search spends its budget
        check_storage(storage)
    if resume and out is None:
        out = latest_run_dir()
    check_run_folder(out, resume=resume)  # unwritable, busy, a run not resumed, a damaged journal: before loading
    if resume and out is not None and (Path(out) / CONFIG).is_file():
        config.check_resumes(out, SETTLED_RESUME_KEYS)  # a changed floor, seed, ...: before loading, too
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
        timer = built.latency
        run_dir = Path(out) if out is not None else default_run_dir(built.workload.name, config.strategy, config.seed)
        executor = make_executor(built, workload=workload, allow_pickle=allow_pickle)
        runner = Runner(built.evaluator, built.strategy, built.objective, budget=config.budget, run_dir=run_dir,
                        config=built.config, resume=resume, progress=progress, fidelity=config.fidelity,
                        latency=timer, executor=executor, lock=lock, evidence=built.evidence, clock=clock)
    except BaseException as exc:
        if lock is not None:
            lock.release()
            if created:  # refused before the run began: leave no folder behind
                lock.remove_folder_if_empty()
        if isinstance(exc, KeyboardInterrupt):  # no run folder written yet: the CLI says so, not "--resume"
            exc.started = False  # type: ignore[attr-defined]
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
