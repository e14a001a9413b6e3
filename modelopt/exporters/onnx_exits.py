"""ONNX export of a plan with early exits: one ONNX file per segment, chained by the caller, so a sample that
leaves at an exit runs nothing after it.

The plan is exported whole first, as `modelopt.exporters.onnx` exports any plan (integer weights, QDQ where the
plan quantizes inputs, pruned channels removed), with each exit's head and its outputs (`onnx_model(...,
routed=True)`). That graph is then cut at each exit's block output: segment k reads the previous boundary and
returns its own boundary, its exit's logits and confidence; the last segment returns the network's logits. Where
the plan quantizes the boundary (the next layer runs integer kernels), the segments pass the uint8 tensor, so
the cut adds no quantize/dequantize pair.

Why segments and not ONNX's own control flow (`If` on the confidence, one file): in ONNX Runtime a subgraph
under `If` loses the cross-node optimisations of the main graph: the samples that stay cost more than in the plain
model, where chained files cost what it costs (measured: docs/export-and-latency.md#export). The folder's
``predict.py`` (`modelopt.exporters.exit_predictor`) runs it with onnxruntime or openvino and numpy alone.

Example:
    >>> export_onnx_exits(ev, plan, "runs/r20/model-best")     # a folder
    >>> Predictor("runs/r20/model-best").run(x)                # predict.py's class
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelopt.data.split import Split
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.exporters import exit_predictor
from modelopt.exporters.onnx import IR_VERSION, OnnxExport, onnx_model
from modelopt.plan.plan import Plan

__all__ = ["ExitSegments", "exit_segments", "export_onnx_exits"]

PREDICT = "predict.py"


@dataclass(frozen=True, eq=False)
class ExitSegments:
    """A routed plan as ONNX segments (`onnx.ModelProto` each) and the manifest that chains them."""

    models: tuple[Any, ...]
    manifest: dict[str, Any]
    info: OnnxExport

    def write(self, folder: Path) -> None:
        """The segment files, ``exits.json`` and ``predict.py`` into `folder` (which exists)."""
        import onnx

        for model, seg in zip(self.models, self.manifest["segments"], strict=True):
            onnx.save(model, folder / seg["file"])
        (folder / exit_predictor.MANIFEST).write_text(json.dumps(self.manifest, indent=2) + "\n")
        shutil.copyfile(exit_predictor.__file__, folder / PREDICT)


def exit_segments(evaluator: Evaluator, plan: Plan | Realised, **options: Any) -> ExitSegments:
    """`plan` (which routes samples) exported and cut into segments at its exits.

    Args:
        evaluator: the evaluator that scored the plan (its routing's heads are the plan's).
        plan: a plan with at least one active exit.
        **options: as for `modelopt.exporters.onnx.export_onnx` (activations, calibration, ...).

    Raises:
        ConfigError: the plan has no exit, or an exit cannot be cut out of the graph.
    """
    import onnx
    from onnx.utils import Extractor

    if evaluator.realise(plan).route is None:
        raise ConfigError("this plan has no early exit; export it as one ONNX file")
    whole, info = onnx_model(evaluator, plan, routed=True, **options)
    heads = [o.name for o in whole.graph.output if o.name.startswith("exit") and o.name.endswith("_logits")]
    boundaries = [_boundary(whole, k) for k in range(len(heads))]
    extractor = Extractor(onnx.shape_inference.infer_shapes(whole))
    models, segments, source = [], [], "input"
    for k, ((name, threshold), boundary) in enumerate(zip(info.exits, boundaries, strict=True)):
        outputs = [boundary, f"exit{k}_logits", f"exit{k}_confidence"]
        models.append(_extracted(extractor, [source], outputs))
        segments.append({"file": f"segment{k}.onnx", "input": source, "outputs": outputs, "exit": name,
                         "threshold": threshold})
        source = boundary
    models.append(_extracted(extractor, [source], ["logits"]))
    segments.append({"file": f"segment{len(info.exits)}.onnx", "input": source, "outputs": ["logits"]})
    manifest = {"format": exit_predictor.FORMAT, "version": 1, "input": "input", "segments": segments,
                "input_shape": list(evaluator.workload.split(Split.VAL).x.shape[1:]),
                "mean": [float(m) for m in evaluator.workload.source.mean],  # how predict.py's input is normalised
                "std": [float(v) for v in evaluator.workload.source.std]}
    return ExitSegments(tuple(models), manifest, info)


def export_onnx_exits(evaluator: Evaluator, plan: Plan | Realised, folder: str | Path, **options: Any) -> OnnxExport:
    """Writes `plan` (with early exits) as a folder: one ONNX file per segment, ``exits.json``, ``predict.py``.

    A folder already there is replaced only when it holds an earlier export (its ``exits.json``) or nothing;
    the new one is written beside it and moved into place, so a failed export leaves the old one whole.

    Example:
        >>> export_onnx_exits(ev, plan, "r20-exits").path
        PosixPath('r20-exits')
    """
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir())
                                                    and not (folder / exit_predictor.MANIFEST).is_file())):
        raise ConfigError(f"{str(folder)!r} exists and is not an early-exit export; a plan with exits is written as "
                          "a folder of segments: pass a new path")
    segments = exit_segments(evaluator, plan, **options)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        segments.write(staging)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return dataclasses.replace(segments.info, path=folder)


def _boundary(model: Any, k: int) -> str:
    """The tensor exit k's head reads (the block's output), or its uint8 form where the plan quantizes it."""
    scope = f"/exit_heads.{k}/"
    inits = {t.name for t in model.graph.initializer}
    inits |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}  # constants: not data
    inside = [n for n in model.graph.node if n.name.startswith(scope)]
    made = {o for n in inside for o in n.output}
    read = {i for n in inside for i in n.input if i and i not in made and i not in inits}
    if len(read) != 1:
        raise ConfigError(f"exit {k}'s head reads {len(read)} tensors of the graph, not one; cannot cut it out")
    tensor = read.pop()
    produced = {o: n for n in model.graph.node for o in n.output}
    node = produced.get(tensor)
    if node is not None and node.op_type == "DequantizeLinear" and node.input[0] in produced:
        return str(node.input[0])  # the uint8 tensor: the next segment dequantizes it itself
    return tensor


def _extracted(extractor: Any, inputs: list[str], outputs: list[str]) -> Any:
    model = extractor.extract_model(inputs, outputs)
    model.ir_version = IR_VERSION
    return model
