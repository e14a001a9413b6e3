"""`modelopt.export`: one verb over the packed and ONNX writers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters._source import PlanRef, resolve
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.packed import export_packed
from modelopt.model.workload import Workload

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
        format: ``modelopt`` (packed checkpoint; reload with `modelopt.load`) or ``onnx`` (QDQ,
            runs in ONNX Runtime).
        out: the file to write; default ``<run folder>/model-<plan>.pt`` or ``.onnx``.
        device: where a workload rebuilt from a run folder lives.
        **options: for ``onnx``: activations, calibration, percentile, calib_samples, quantize_input,
            widen_int4 (see `modelopt.exporters.onnx.export_onnx`).

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
    src = resolve(source, plan, device=device)
    if out is None:
        if src.run_dir is None:
            raise ConfigError("pass out=PATH (--out) when exporting from a workload rather than a run folder")
        out = src.run_dir / f"model-{src.tag}{FORMATS[format]}"
    if format == "onnx":
        valid = ("activations", "calibration", "percentile", "calib_samples", "quantize_input", "widen_int4")
        for key in options:
            if key not in valid:
                raise ConfigError(f"unknown onnx export option {key!r}; valid: {', '.join(valid)}")
        return export_onnx(src.evaluator, src.plan, out, **options).path
    return export_packed(src.evaluator, src.plan, out)
