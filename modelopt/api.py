"""The Python API: optimize, evaluate, and the loaders. The CLI is a thin shell over this."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from modelopt.compressors import COMPRESSORS, Compressor
from modelopt.compressors.quantize import parse_rounding
from modelopt.confidence import DEFAULT_CONFIDENCE
from modelopt.data import Dataset, load_data
from modelopt.errors import ConfigError, LoadError
from modelopt.evaluator import Evaluator, Metrics
from modelopt.fidelity import Fidelity
from modelopt.models import LoadedModel, load_model
from modelopt.objective import Objective, Target
from modelopt.plan import Plan
from modelopt.plan_latency import LatencySpec, PlanLatency
from modelopt.run.preflight import preflight
from modelopt.run.confirm import check_certifiable
from modelopt.run.runner import CONFIG, Runner, RunResult
from modelopt.search import STRATEGIES
from modelopt.space import SearchSpace, read_plan_file
from modelopt.workload import Workload, check_split

# None: every registered compressor that can lower the run's objective on its model (`default_compressors`).
DEFAULT_COMPRESSORS: Sequence[str] | None = None
# How the quantizer picks codes when the user does not say: GPTQ (calibrated, error feedback).
# Measured on ResNet-20, bundled sample, test split: uniform INT3 per-channel 78.6 % retention
# nearest, 100.8 % GPTQ; INT2 group-64 36.9 % / 92.0 % (modelopt.compressors.gptq).
DEFAULT_ROUNDING: Sequence[str] = ("gptq",)
# Batch-norm statistics re-estimated on this many calib images for plans with a layer at 4 bits or
# fewer (`Quantize(norm_images=...)`): INT2 group-64 confirm agreement 88.5 -> 94.9 % (GPTQ).
DEFAULT_NORM_IMAGES = 64
# Full val evaluations a run may spend when the user does not say: 150 keeps the default run under
# three minutes on 2 CPU cores (200 took 3m20s). Default run, seeds 0-2: the best came at budget 8,
# 148 and 16; more budget can still pay (--budget).
DEFAULT_BUDGET = 150.0
DEFAULT_RUNS_DIR = Path("runs")
DEFAULT_FIDELITY: Fidelity | None = Fidelity()

ModelLike = str | Path | nn.Module | LoadedModel
DataLike = str | Path | DataLoader | Dataset
PlanLike = Plan | Mapping[str, Any] | str | Path | None


def _model(model: ModelLike, weights: str | Path | None, allow_pickle: bool) -> LoadedModel:
    if isinstance(model, LoadedModel):
        return model
    return load_model(model, weights, allow_pickle=allow_pickle)


def _data(data: DataLike, seed: int) -> Dataset:
    return data if isinstance(data, Dataset) else load_data(data, seed=seed)


def default_compressors(objective: str = "size", model: nn.Module | None = None) -> list[str]:
    """The registered compressors that can lower `objective` (and, given a model, can handle it).

    Example:
        >>> default_compressors("size"), default_compressors("macs")
        (['prune', 'quantize'], ['early_exit', 'prune'])
    """
    names = []
    for name in COMPRESSORS.names():
        cls = COMPRESSORS.get(name)
        if objective not in cls.reduces:
            continue
        if model is not None:
            try:
                cls.model_options(model)
            except ConfigError:
                continue  # e.g. early exit on a model it cannot cut into blocks
        names.append(name)
    return names


def build_compressors(
    names: Sequence[str] | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
    model: nn.Module | None = None,
) -> list[Compressor]:
    """Instantiates compressors by registry name with per-compressor options.

    Args:
        names: Registry names; None: quantize alone.
        options: Per-compressor constructor options; None: the tool's defaults (the quantizer
            rounds by `DEFAULT_ROUNDING`). Saved run records pass theirs: a record without
            `rounding` predates it and means nearest, the class default.
        model: The model they will compress: options a compressor derives from it
            (`Compressor.model_options`, e.g. early exit's candidate exits) fill in what
            `options` leaves out.
    """
    if options is None:
        options = {"quantize": {"rounding": list(DEFAULT_ROUNDING), "norm_images": DEFAULT_NORM_IMAGES}}
    for name in options:
        COMPRESSORS.get(name)
    out = []
    for n in ("quantize",) if names is None else names:
        cls = COMPRESSORS.get(n)
        derived = cls.model_options(model) if model is not None else {}
        out.append(cls(**{**derived, **dict(options.get(n, {}))}))
    return out


def build_workload(
    model: ModelLike = "cifar10_resnet20",
    data: DataLike = "cifar10-sample",
    *,
    weights: str | Path | None = None,
    device: str = "auto",
    data_seed: int = 0,
    allow_pickle: bool = False,
) -> Workload:
    """Loads model and data and puts both, with the baseline predictions, on the device."""
    return Workload(_model(model, weights, allow_pickle), _data(data, data_seed), device=device)


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


def load_exit_images(wl: Workload, path: str | Path, n: int = 10000, seed: int = 0) -> Any:
    """A seeded subset of `n` images from an `.npz` (pixels or JPEG bytes), normalised for `wl`'s
    model: extra unlabeled images that early-exit heads are fitted on. They must be images the
    search never scores (e.g. the training set), never the val or test images.

    Example:
        >>> x = load_exit_images(wl, "../shared/data/cifar10/cifar10_jpeg_train.npz", 10000)
    """
    import numpy as np
    import torch

    from modelopt.data_readers import read_npz

    p = Path(path)
    if not p.is_file():
        raise LoadError(f"exit data {str(p)!r} is not a file; pass an .npz of images such as "
                        "../shared/data/cifar10/cifar10_jpeg_train.npz")
    if str(wl.data.source) in (str(path), str(p.resolve())):
        raise ConfigError(f"exit data {str(p)!r} is the data the search scores; fitting heads on val or test "
                          "images would leak them: pass other images (e.g. the training set)")
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"exit_images must be a positive number of images, got {n!r}")
    x, _, _ = read_npz(p, lambda total: np.sort(np.random.default_rng(seed).permutation(total)[: min(n, total)]))
    return wl.prepare(torch.from_numpy(x))


def default_run_dir(model_name: str, strategy: str, seed: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model_name)[-40:]
    return DEFAULT_RUNS_DIR / f"{stamp}-{safe}-{strategy}-s{seed}"


def latest_run_dir(root: Path = DEFAULT_RUNS_DIR) -> Path:
    runs = sorted((p for p in root.glob("*/") if (p / CONFIG).exists()), key=lambda p: (p / CONFIG).stat().st_mtime)
    if not runs:
        raise ConfigError(f"--resume without --out needs a run folder under {str(root)!r}; none found")
    return runs[-1]


def saved_run_config(run_dir: str | Path) -> dict[str, Any]:
    """The settings a run folder was started with (for resuming from the CLI)."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise LoadError(f"{str(run_dir)!r} is not a modelopt run folder (no {CONFIG})")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise LoadError(f"{str(path)!r} is not readable as a run's settings ({exc}); it is not a modelopt run "
                        "folder, or its run.json was damaged") from None
    if not isinstance(config, dict):
        raise LoadError(f"{str(path)!r} holds no run settings; it is not a modelopt run folder")
    _check_saved_config(config, path)
    return config


def _is(*kinds: type) -> Callable[[Any], bool]:
    """isinstance, where a bool passes only when bool is named (JSON's true is no seed)."""
    return lambda v: isinstance(v, kinds) and (not isinstance(v, bool) or bool in kinds)


def _list_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


# What `optimize --resume` reads back from run.json before the model loads, and the form each must have.
_SAVED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "model": (_is(str), "a model name"), "weights": (_is(str), "a path or null"), "data": (_is(str), "a data source"),
    "strategy": (_is(str), "a strategy name"), "seed": (_is(int), "an integer"), "objective": (_is(str), "a name"),
    "min_retention": (_is(int, float), "a number"), "confidence": (_is(int, float), "a number"),
    "count_gains": (_is(bool), "true or false"),
    "compressors": (lambda v: isinstance(v, dict) and all(isinstance(o, dict) for o in v.values()),
                    "a mapping of compressor names to their options"),
    "exit_data": (lambda v: isinstance(v, dict) and _is(str)(v.get("path")) and _is(int)(v.get("images")),
                  "null or {path, images}"),
}
_SAVED_QUANTIZE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "bits": (_list_of(_is(int)), "a list of bit widths"), "granularity": (_list_of(_is(str)), "a list of names"),
    "rounding": (_list_of(_is(str)), "a list of names"),
    "activations": (_list_of(_is(int, type(None))), "a list of bit widths or nulls"),
}


def _check_saved_config(config: Mapping[str, Any], path: Path) -> None:
    """Raises LoadError naming the first setting of a run.json that has not the form a resume reads
    (null is always allowed: the default then applies)."""
    comps = config.get("compressors")
    quantize = comps.get("quantize") if isinstance(comps, dict) else None
    for where, table, values in (("", _SAVED, config),
                                 ("compressors.quantize.", _SAVED_QUANTIZE, quantize if isinstance(quantize, dict) else {})):
        for key, (ok, form) in table.items():
            if values.get(key) is not None and not ok(values[key]):
                raise LoadError(f"{str(path)!r} has {where}{key} = {values[key]!r}, not {form}; its run.json was "
                                "damaged or is not a modelopt run's")


def optimize(
    model: ModelLike | Workload = "cifar10_resnet20",
    data: DataLike = "cifar10-sample",
    *,
    weights: str | Path | None = None,
    strategy: str = "mcts",
    budget: float = DEFAULT_BUDGET,
    objective: str = "size",
    min_retention: float = 0.99,
    confidence: float = DEFAULT_CONFIDENCE,
    count_gains: bool = False,
    seed: int = 0,
    device: str = "auto",
    out: str | Path | None = None,
    resume: bool = False,
    report: bool = True,
    storage: str | None = None,
    bits: Sequence[int] = (8, 4),
    granularity: Sequence[str] = ("per_channel", "group"),
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
) -> RunResult:
    """Searches for the smallest plan that keeps `min_retention` of the float accuracy.

    Every trial is appended to `<out>/trials.jsonl` as it finishes; `resume=True`
    continues a killed run without repeating or losing finished trials. At the end
    the best plan and the Pareto front are re-scored on the held-out test split.

    Args:
        model: a zoo name, `torchvision:NAME`, `pkg.module:factory`, a file, an nn.Module, or a
            `Workload` already built (then `data`, `device` and `data_seed` are its own).
        data: a named source, a path, a DataLoader or a Dataset.
        weights: checkpoint for `model`.
        strategy: a registered strategy name (see `modelopt list`).
        budget: full-evaluation equivalents (one trial on the whole val split costs 1).
        objective: size, bitops or macs.
        min_retention: floor on accuracy / float accuracy, on images the search never saw.
        confidence: a plan counts as meeting the floor when a one-sided lower bound on its
            retention at this confidence does (`modelopt.confidence`); 0: the point estimate.
        count_gains: let images a plan fixes offset those it breaks in that bound (off: only the
            breaks count; gains on a few hundred images are mostly luck a search harvests).
        seed: the search's seed.
        device: auto, cpu, cuda or cuda:N.
        out: the run folder (default: runs/<time>-<model>-<strategy>-s<seed>).
        resume: continue the run in `out` (default: the latest under runs/).
        report: write report.md and report.html into the run folder at the end (a failure warns).
        storage: an Optuna storage URL (e.g. `sqlite:///studies.db`): every trial is written into a
            study there at the end, for optuna-dashboard (a failure warns; the run folder is kept).
        bits, granularity: the quantizer's menu.
        rounding: how the quantizer picks codes, offered to the search: gptq (calibrated on the
            calib split, charged once as preparation), nearest, or both.
        norm_images: calib images batch-norm statistics are re-estimated on after quantizing a
            layer to 4 bits or fewer (charged per plan; 0: never).
        activations: input activation bits the quantizer offers per layer (None = float; 8 =
            W8A8-style, calibrated on the calib split); default: (None, 8) when the objective is
            bitops (the only one quantized activations lower here), else float only.
        exit_data, exit_images: an `.npz` of images the search never scores (e.g. the training
            set) and how many of them (seeded subset) early-exit heads are also fitted on.
        compressors: which registered compressors contribute decisions; None: every registered one
            that can lower `objective` on this model (`default_compressors`: quantize and prune
            for size; early exit and prune for macs; all three for bitops and latency).
        data_seed: the seed of the calib/val/test split (fixed across search seeds).
        allow_pickle: allow full unpickling of model files (trusted files only).
        progress: show a progress bar.
        latency: how latency is measured (a backend name, torch or onnxruntime, or a
            LatencySpec): for every plan when `objective` is latency, else for the best plan
            and the Pareto front at the end; None measures none.
        fidelity: multi-fidelity scoring: a plan below the floor beyond doubt on part of the
            val split (or that cannot beat the best so far) stops there and is charged only
            that part; None scores every plan on the whole split.

    Example:
        >>> result = modelopt.optimize(budget=20)
        >>> result.best.metrics.compression, result.best_test.retention
    """
    STRATEGIES.get(strategy)
    if isinstance(latency, str):
        latency = LatencySpec(latency)
    if storage is not None:  # a bad URL is refused before the search spends its budget
        from modelopt.run.optuna_storage import check_storage

        check_storage(storage)
    obj = Objective(objective, min_retention, confidence, count_gains)
    for name in compressors or ():  # a bad name is refused before the model loads
        COMPRESSORS.get(name)
    parse_rounding(rounding)
    if resume and out is None:
        out = latest_run_dir()
    preflight(budget, out, seed)  # a bad budget or seed, an unwritable or busy --out: refused before the model loads
    if isinstance(model, Workload):  # reuse one resident workload across runs (sweeps)
        wl = model
    else:
        wl = build_workload(model, data, weights=weights, device=device, data_seed=data_seed,
                            allow_pickle=allow_pickle)
    onnx_timed = latency is not None and latency.backend == "onnxruntime"
    if compressors is None:
        compressors = default_compressors(obj.target.value, wl.model)
        if onnx_timed:  # an ONNX graph cannot return early: exits could not be timed there
            compressors = [c for c in compressors if c != "early_exit"]
    elif onnx_timed and "early_exit" in compressors:
        raise ConfigError("latency backend 'onnxruntime' cannot time early exits (an ONNX graph has no early "
                          "return); use --latency torch, or leave early_exit out of --compressors")
    if activations is None:
        activations = (None, 8) if obj.target is Target.BITOPS else (None,)
    comp_options: dict[str, dict[str, Any]] = {"quantize": {"bits": list(bits), "granularity": list(granularity),
                                                            "rounding": list(rounding), "norm_images": norm_images}}
    if tuple(activations) != (None,):
        comp_options["quantize"]["activations"] = list(activations)
    comps = build_compressors(compressors, {k: v for k, v in comp_options.items() if k in compressors},
                              model=wl.model)
    space = SearchSpace(wl.layers, comps)
    run_dir = Path(out) if out is not None else default_run_dir(wl.name, strategy, seed)
    config = {
        "model": wl.name,
        "weights": None if weights is None else str(weights),
        "data": wl.data.source,
        "data_seed": data_seed,
        "strategy": strategy,
        "seed": seed,
        "objective": obj.target.value,
        "min_retention": min_retention,
        "confidence": obj.confidence,
        "count_gains": obj.count_gains,
        "compressors": {c.name: c.options() for c in comps},
        "device": str(wl.device),
        "fidelity": None if fidelity is None else fidelity.to_dict(),
        "latency": None if latency is None else dataclasses.asdict(latency),
        "exit_data": None if exit_data is None else {"path": str(exit_data), "images": exit_images},
        **wl.fingerprints(),
    }
    extra = None
    if exit_data is not None and any(c.name == "early_exit" for c in comps):
        extra = load_exit_images(wl, exit_data, exit_images)
    evaluator = Evaluator(wl, space, exit_images=extra)
    check_certifiable(evaluator, obj)  # a val split too small to certify the floor: refused before any work
    evaluator.measure_errors()  # data-free priors for strategies that use them; costs no evaluation
    strat = STRATEGIES.get(strategy)(space, obj, seed=seed)
    if getattr(strat, "wants_loss_estimates", False):  # knapsack's one-pass sensitivities
        from modelopt.sensitivity import estimate_losses

        strat.use_loss_estimates(estimate_losses(evaluator))  # type: ignore[attr-defined]
    if latency is None and obj.target is Target.LATENCY:
        raise ConfigError("objective 'latency' needs a latency backend; pass latency='torch' or 'onnxruntime'")
    timer = None if latency is None else PlanLatency(evaluator, latency)
    runner = Runner(evaluator, strat, obj, budget=budget, run_dir=run_dir, config=config, resume=resume,
                    progress=progress, fidelity=fidelity, latency=timer)
    result = runner.run()
    _after_run(result, wl, report=report, storage=storage)
    return result


def _after_run(result: RunResult, wl: Workload, *, report: bool, storage: str | None) -> None:
    """The run's report and Optuna export: extras, so a failure warns and the run folder stands."""
    import warnings

    from modelopt.run.run_folder import save_layers

    try:
        save_layers(result.run_dir, wl.layers)  # lets reports size each layer without the model
        if report:
            from modelopt.report import write_report

            write_report(result.run_dir, layers=wl.layers)
    except Exception as exc:
        warnings.warn(f"the run finished but its report was not written ({type(exc).__name__}: {exc}); "
                      f"retry with `modelopt report {result.run_dir}`", stacklevel=3)
    if storage is not None:
        try:
            from modelopt.run.optuna_storage import export_run

            export_run(result.run_dir, storage)
        except Exception as exc:
            warnings.warn(f"the run finished but was not written to {storage!r} ({type(exc).__name__}: {exc}); "
                          f"retry with `modelopt dashboard {result.run_dir} --storage {storage}`", stacklevel=3)
