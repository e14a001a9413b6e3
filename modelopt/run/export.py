"""`modelopt.export`: a plan of a run (a run folder, a live workload or the evaluator that scored it)
written by one of the writers in `modelopt.exporters` (packed checkpoint, ONNX).

What an export starts from is resolved here (`resolve`: an evaluator and one plan); each layer's
stored form comes from its compressors (`modelopt.exporters._forms`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelopt.config.assemble import build_compressors
from modelopt.config.build import load_workload, make_evaluator
from modelopt.config.run_config import RunConfig
from modelopt.errors import ConfigError, LoadError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.evaluation.trial import TrialStatus
from modelopt.exporters.onnx import check_options, export_onnx
from modelopt.exporters.onnx_exits import export_onnx_exits
from modelopt.exporters.packed import export_packed
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace, read_plan_file
from modelopt.reconstruct.store import Refits
from modelopt.run.journal import Record, read_records
from modelopt.run.layout import BEST_PLAN, JOURNAL
from modelopt.run.lock import check_started
from modelopt.run.summary import read_summary

__all__ = ["FORMATS", "ExportSource", "PlanRef", "export", "resolve"]

PlanRef = str | int | Path | Plan | Mapping[str, Any]
FLOOR_PREFIX = "floor:"  # a point of a run's certified curve: --plan floor:0.98


@dataclass(frozen=True)
class ExportSource:
    """An evaluator, the plan to export as it runs (as the run certified it: reconstructed where it was) and a short
    tag naming it (``best``, ``trial12``, a file stem)."""

    evaluator: Evaluator
    realised: Realised
    tag: str
    run_dir: Path | None = None

    @property
    def plan(self) -> Plan:
        return self.realised.plan


def resolve(source: str | Path | Workload | Evaluator, plan: PlanRef = "best", *, device: str = "cpu") -> ExportSource:
    """An ExportSource from a run folder, a Workload (default quantizer) or an Evaluator.

    Args:
        source: a run folder (its `run.json` rebuilds the workload), a Workload or an Evaluator.
        plan: ``"best"`` (the run's best_plan.yaml), a trial number (int or digits), a plan
            YAML path, a Plan, or a plan mapping.
        device: where a workload rebuilt from a run folder lives.
    """
    run_dir: Path | None = None
    if isinstance(source, Evaluator):
        evaluator = source
    elif isinstance(source, Workload):
        evaluator = Evaluator(source, SearchSpace(source.layers, build_compressors()))
    elif isinstance(source, (str, Path)):
        run_dir = Path(source)
        _check_plan_ref(plan, run_dir)  # fail fast, before the workload is built
        evaluator = _evaluator_from_run(run_dir, device)
    else:
        raise ConfigError(
            f"cannot export from a {type(source).__name__}; pass a run folder, a Workload or an Evaluator"
        )
    resolved, tag = _plan(plan, evaluator.space, run_dir)
    # The plan as the run certified it: with its reconstruction, when the run made one and chose it.
    realised = evaluator.realise(resolved) if run_dir is None else Refits(evaluator, run_dir).realise(resolved)
    return ExportSource(evaluator, realised, tag, run_dir)


# The last run folder's evaluator, kept so exporting several plans of one run (or both formats)
# builds its workload once per process. Keyed by everything the workload is built from.
_CACHE: dict[str, Evaluator] = {}


def _evaluator_from_run(run_dir: Path, device: str) -> Evaluator:
    cfg = dataclasses.replace(RunConfig.read(run_dir), device=device)
    stamp = Path(cfg.weights).stat().st_mtime_ns if cfg.weights and Path(cfg.weights).is_file() else None
    key = json.dumps([cfg.to_json(), stamp], sort_keys=True, default=str)
    if key in _CACHE:
        return _CACHE[key]
    wl = load_workload(cfg)
    now = wl.fingerprints()
    saved = cfg.fingerprints.get("model_sha256")
    if saved is not None and now["model_sha256"] != saved:
        raise LoadError(
            f"the weights of model {cfg.model!r} differ from those run {str(run_dir)!r} was searched on; "
            "restore the original weights file"
        )
    saved = cfg.fingerprints.get("data_sha256")
    if saved is not None and now["data_sha256"] != saved:  # as --resume refuses it: other images, other figures
        raise LoadError(
            f"the data {cfg.data!r} differs from the data run {str(run_dir)!r} was searched on (its images, their "
            "order or labels changed): its splits would be other images than the run's; restore the original data"
        )
    _CACHE.clear()
    _CACHE[key] = ev = make_evaluator(cfg, wl)
    return ev


def _check_plan_ref(plan: PlanRef, run_dir: Path) -> None:
    check_started(run_dir)  # a run still loading there has no run.json yet: it is busy, not "not a run folder"
    RunConfig.read(run_dir)  # raises LoadError when it is not a run folder
    if (isinstance(plan, int) and not isinstance(plan, bool)) or (isinstance(plan, str) and plan.isdigit()):
        _trial_record(int(plan), run_dir)
    elif plan == "best":
        read_plan_file(_best_path(run_dir))
    elif isinstance(plan, str) and plan.startswith(FLOOR_PREFIX):
        _floor_trial(plan, run_dir)
    elif isinstance(plan, (str, Path)):
        if not Path(plan).is_file():
            raise LoadError(f"plan file {str(plan)!r} does not exist; pass 'best', a trial number or a plan YAML file")
        read_plan_file(plan)


def _plan(plan: PlanRef, space: SearchSpace, run_dir: Path | None) -> tuple[Plan, str]:
    if isinstance(plan, Plan):
        return space.plan(dict(plan.choices)), "plan"
    if isinstance(plan, Mapping):
        return space.parse_plan(plan), "plan"
    if isinstance(plan, bool):
        raise ConfigError(f"plan {plan!r} is not valid; pass 'best', a trial number or a plan file")
    if isinstance(plan, int) or (isinstance(plan, str) and plan.isdigit()):
        return _trial_plan(int(plan), space, run_dir), f"trial{int(plan)}"
    if plan == "best":
        if run_dir is None:
            raise ConfigError("plan 'best' needs a run folder as the source; pass a plan file, Plan or mapping")
        return space.load_plan(_best_path(run_dir)), "best"
    if isinstance(plan, str) and plan.startswith(FLOOR_PREFIX):
        if run_dir is None:
            raise ConfigError(f"plan {plan!r} needs a run folder as the source (its certified curve)")
        number = _floor_trial(plan, run_dir)
        return _trial_plan(number, space, run_dir), f"floor{plan.removeprefix(FLOOR_PREFIX)}"
    return space.load_plan(plan), Path(plan).stem


def _floor_trial(ref: str, run_dir: Path) -> int:
    """The trial a run certified at the floor `ref` names ("floor:0.98", a point of its curve); ConfigError naming the
    floors it has otherwise."""
    try:
        floor = float(ref.removeprefix(FLOOR_PREFIX))
    except ValueError:
        raise ConfigError(f"plan {ref!r} names no floor; pass floor:F with F one of the run's floors, like "
                          "floor:0.98") from None
    summary = read_summary(run_dir)
    if summary is None:
        raise LoadError(f"run {str(run_dir)!r} has not finished (no summary.json): it has no certified curve yet")
    curve = summary.curve or ()
    floors = ", ".join(f"floor:{p.floor:g}" for p in curve) or "none (the run certified one floor: pass best)"
    point = next((p for p in curve if abs(p.floor - floor) < 1e-9), None)
    if point is None:
        raise ConfigError(f"run {str(run_dir)!r} certified no plan at floor {floor:g}; its floors: {floors}")
    if point.plan is None:
        raise ConfigError(f"run {str(run_dir)!r} certified nothing at floor {floor:g}; its floors: {floors}")
    return point.plan.trial


def _best_path(run_dir: Path) -> Path:
    path = run_dir / BEST_PLAN
    if not path.is_file():
        raise LoadError(
            f"run {str(run_dir)!r} has no {BEST_PLAN} (no feasible plan, or unfinished); "
            "pass --plan N for a trial number or a plan file"
        )
    return path


def _trial_record(number: int, run_dir: Path) -> Record:
    records = read_records(run_dir / JOURNAL)  # read-only: the run may still be going on
    for rec in records:
        if rec.number == number:
            if rec.status is not TrialStatus.COMPLETE:  # its plan is what it is, metrics or not
                raise ConfigError(f"trial {number} of {str(run_dir)!r} failed ({rec.error}); pick another")
            return rec
    raise ConfigError(f"run {str(run_dir)!r} has no trial {number}; valid: 0..{len(records) - 1}")


def _trial_plan(number: int, space: SearchSpace, run_dir: Path | None) -> Plan:
    if run_dir is None:
        raise ConfigError(f"plan {number} (a trial number) needs a run folder as the source")
    return space.plan_from_flat(_trial_record(number, run_dir).plan)


FORMATS = {"modelopt": ".pt", "onnx": ".onnx"}


def export(
    source: str | Path | Workload | Evaluator,
    plan: PlanRef = "best",
    format: str = "modelopt",
    out: str | Path | None = None,
    *,
    device: str = "cpu",
    **options: Any,
) -> Path:
    """Writes a plan applied to a model as a packed checkpoint or an ONNX file.

    Args:
        source: a run folder (its run.json rebuilds model and data), a Workload (the default
            quantizer reads the plan) or the Evaluator that scored the plan.
        plan: ``"best"`` (the run's best_plan.yaml), a trial number of the run, a plan YAML file,
            a Plan or a plan mapping.
        format: ``modelopt`` (packed checkpoint; reload with `modelopt.load`) or ``onnx`` (QDQ, runs in ONNX
            Runtime and OpenVINO; a plan with early exits is written as a folder of segment files with an
            ``exits.json`` and a ``predict.py`` that needs only onnxruntime or openvino and numpy).
        out: the file (or, for an ONNX export with exits, the folder) to write; default
            ``<run folder>/model-<plan>.pt``, ``.onnx`` or ``model-<plan>/``.
        device: where a workload rebuilt from a run folder lives.
        **options: for ``onnx``: activations, calibration, percentile, calib_samples, quantize_input,
            widen_int4, image_input, weights (see `modelopt.exporters.onnx.export_onnx`).

    Returns:
        The path written.

    Raises:
        ConfigError: unknown format, a plan that names no trial or file, no `out` without a run folder.
        LoadError: the run folder or its model and data cannot be read.

    Example:
        >>> modelopt.export("runs/r20", plan="best", format="onnx")
        PosixPath('runs/r20/model-best.onnx')
        >>> net = modelopt.load(modelopt.export("runs/r20"))
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}; valid: {', '.join(FORMATS)}")
    if format == "modelopt" and options:
        raise ConfigError(f"option {min(options)!r} applies only to format 'onnx'")
    if format == "onnx":  # bad values are refused before the run's model and data load
        valid = ("activations", "calibration", "percentile", "calib_samples", "quantize_input", "widen_int4",
                 "image_input", "weights")
        for key in options:
            if key not in valid:
                raise ConfigError(f"unknown onnx export option {key!r}; valid: {', '.join(valid)}")
        check_options(**options)
    src = resolve(source, plan, device=device)
    routed = format == "onnx" and src.realised.route is not None
    if out is None:
        if src.run_dir is None:
            raise ConfigError("pass out=PATH (--out) when exporting from a workload rather than a run folder")
        out = src.run_dir / f"model-{src.tag}{'' if routed else FORMATS[format]}"
    if format == "onnx":
        if routed:  # early exits: a folder of segments that return early, with its predict.py
            if options.get("image_input", "float") != "float":
                raise ConfigError("image_input 'uint8' is for one-file exports; a plan with early exits is written "
                                  "as segments whose predict.py reads normalised float images")
            return export_onnx_exits(src.evaluator, src.realised, out, **options).path
        return export_onnx(src.evaluator, src.realised, out, **options).path
    return export_packed(src.evaluator, src.realised, out)
