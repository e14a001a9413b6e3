"""ONNX export of a plan: integer weights behind DequantizeLinear, calibrated QDQ activations.

The graph is the plan's physical model (`Evaluator.physical_model`): structurally pruned blocks
as smaller convolutions, re-estimated batch norms, unstructured sparsity as zeros. Each layer's
stored form comes from its compressors (`Compressor.pack`, `modelopt.evaluation.forms`); an integer
form keeps the plan's own codes and float16 scales (never re-quantized): INT5..INT8 as int8
initializers, INT2..INT4 as ONNX's packed int4 type (opset 21; 2 and 3 bits are widened to 4,
and 5..7 to 8, ONNX having no narrower type ONNX Runtime runs). Group scales use opset 21's
blocked DequantizeLinear over the weight flattened to (out channels, fan-in), reshaped back for
the Conv. Batch norms are folded into their convs, each channel's factor going into its scale.

Activations (``activations``): ``"plan"`` (the default) puts a uint8 QDQ pair on the activations around
the layers whose inputs the plan quantizes (a quantize choice with ``activations: 8``: the layers it runs
as integer kernels), and around an Add whose inputs are all quantized; ``True`` (``"all"``) around every
Conv/Gemm/Add (but the network input, by default); ``False`` on none. Ranges are calibrated on the float
model over the workload's calib split (min/max or percentile), once per workload and setting. ONNX
Runtime's CPU provider then fuses int8-weight layers with quantized activations into QLinearConv /
QLinearAdd (integer kernels; see `fused_op_counts`); a layer with float activations runs as
DequantizeLinear + float Conv (slower than the float model: the weights are dequantized on every call);
int4 and group-scaled layers do too (``widen_int4=True`` stores them as int8 so per-channel ones fuse).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelopt._files import save_atomic
from modelopt.compressors.contract import ExitTap, RemovesBranch
from modelopt.data.split import Split
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.exporters._image_input import check_image_input, describe_input, with_uint8_input
from modelopt.exporters._shift import shift_constants
from modelopt.exporters._subsample import subsample_shortcuts
from modelopt.exporters._taps import tapped
from modelopt.exporters.onnx_qdq import (
    Graph,
    QParams,
    activation_tensors,
    calibrate,
    fold_batchnorm,
    tensor_proto,
)
from modelopt.exporters.onnx_weights import Weights
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan

OPSET = 21  # int4 and blocked (group) DequantizeLinear
IR_VERSION = 10
CALIBRATIONS = ("minmax", "percentile")
WEIGHT_FORMS = ("integer", "decoded")  # how the integer weights of float-input layers are written (`export_onnx`)
ACTIVATION_MODES = ("plan", "all", "none")
INTEGER_KERNELS = ("QLinearConv", "QLinearAdd", "ConvInteger", "MatMulInteger", "QGemm", "QLinearMatMul",
                   "QLinearGlobalAveragePool", "DynamicQuantizeLinear")


@dataclass(frozen=True)
class OnnxExport:
    """What `export_onnx` wrote."""

    path: Path
    opset: int
    int8_layers: int  # weights stored as int8 initializers
    int4_layers: int  # weights stored as packed int4 initializers
    float_layers: int
    widened: tuple[str, ...]  # layers stored wider than their bit width
    activation_tensors: int  # activations with a QDQ pair (0: weight-only)
    calibration: str | None
    exits: tuple[tuple[str, float], ...] = ()  # a routed export's exits: (name, threshold), in order
    decoded_layers: int = 0  # integer weights of float-input layers written decoded, as float32 (`weights="decoded"`)
    # Integer weights of layers whose inputs stay float, behind a DequantizeLinear ONNX Runtime runs on every call
    # (`weights="integer"`): the graph then runs slower than the float model's.
    dequantized_per_call: int = 0


def export_onnx(
    evaluator: Evaluator,
    plan: Plan | Realised,
    path: str | Path,
    *,
    activations: bool | str = "plan",
    calibration: str = "minmax",
    percentile: float = 99.99,
    calib_samples: int = 512,
    quantize_input: bool | None = None,
    widen_int4: bool = False,
    image_input: str = "float",
    weights: str = "integer",
) -> OnnxExport:
    """Writes `plan` applied to the evaluator's model as an ONNX (QDQ) file.

    Args:
        evaluator: the evaluator that scored the plan.
        plan: the plan to export, as composed or a `Realised` record (`Evaluator.realise`: a reconstructed plan
            is written with its refitted weights): any compressors' choices but early exits (a graph has no
            data-dependent return; export those with `export_packed`).
        path: the .onnx file to write.
        activations: which activations get a uint8 QDQ pair (calibrated), so ONNX Runtime runs integer
            kernels there: ``"plan"``, those of the layers whose inputs the plan quantizes; ``True`` or
            ``"all"``, every one; False, none (weight-only quantization, float activations).
        calibration: ``minmax`` or ``percentile`` activation ranges.
        percentile: the tail percentile for ``percentile`` calibration.
        calib_samples: calib-split images the ranges are measured on.
        quantize_input: quantize the network input (the normalised image) where a layer that reads it has its
            input quantized. None (the default): as the activations asked for, so the first conv runs the
            integer kernel the plan was scored with; False: the input stays float and the first conv runs in
            float, at a price beyond its own time: ONNX Runtime then runs the integer convs in NHWC between
            Transposes (measured: docs/export-and-latency.md#export).
        widen_int4: store 2..4-bit codes as int8: a larger file, but per-channel and per-tensor
            layers then fuse into QLinearConv (ONNX Runtime has no int4 convolution kernel).
        image_input: ``float``, the normalised NCHW image the model reads (input ``input``); ``uint8``, pixels as a
            decoder gives them (input ``image``, batch x height x width x channels at the size the model reads),
            normalised in the graph as the workload normalises them (`_image_input`).
        weights: ``integer``, every integer weight as its codes behind a DequantizeLinear (the smallest file; a layer
            whose inputs stay float then dequantizes its weight on every call, slower than float: the record's
            `dequantized_per_call` counts them); ``decoded``, those layers' weights as their decoded float32 values
            (the same numbers: they run at float speed, stored at float size). Layers with quantized inputs keep
            their codes either way (integer kernels).

    Raises:
        ConfigError: a bad option, or a plan with early exits (one line naming the exit: ONNX has
            no data-dependent return; export it with format ``modelopt``).

    Example:
        >>> info = export_onnx(ev, ev.space.load_plan("best_plan.yaml"), "r20.onnx")
        >>> run_onnx(info.path, x).argmax(1)
    """
    model, info = onnx_model(evaluator, plan, activations=activations, calibration=calibration, percentile=percentile,
                             calib_samples=calib_samples, quantize_input=quantize_input, widen_int4=widen_int4,
                             image_input=image_input, weights=weights)
    import onnx

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic(path, lambda f: onnx.save(model, f))  # never half a model on a failed write
    if info.dequantized_per_call:
        warnings.warn(f"{info.dequantized_per_call} layers read float inputs and keep integer weights behind "
                      "DequantizeLinear, which ONNX Runtime runs on every call (slower than the float model); "
                      "weights='decoded' (--weights decoded) writes them as their float32 values, at float speed",
                      stacklevel=2)
    return dataclasses.replace(info, path=path)


def onnx_model(
    evaluator: Evaluator,
    plan: Plan | Realised,
    *,
    activations: bool | str = "plan",
    calibration: str = "minmax",
    percentile: float = 99.99,
    calib_samples: int = 512,
    quantize_input: bool | None = None,
    widen_int4: bool = False,
    routed: bool = False,
    image_input: str = "float",
    weights: str = "integer",
) -> tuple[Any, OnnxExport]:
    """The ONNX model `export_onnx` writes (an `onnx.ModelProto`) and what it holds (`path`: none yet).

    With `routed`, a plan that routes samples (early exit) is exported whole, with each exit's head and two
    more outputs per exit, ``exit{k}_logits`` and ``exit{k}_confidence`` (`modelopt.exporters.onnx_exits` cuts
    it into segments that return early); without, such a plan is refused."""
    r = evaluator.realise(plan)
    plan = r.plan
    if not routed:
        evaluator.routes.refuse_static(plan, "one ONNX file", "export it with modelopt.export(format='onnx'), "
                                       "which writes a folder of segments that return early")
    mode = check_options(activations, calibration, calib_samples, percentile, image_input=image_input, weights=weights)
    import onnx

    gone = r.skipped_layers  # removed branches: not in the graph
    forms = {name: form for name, form in r.forms.items() if name not in gone}
    layers = None if mode == "all" else set(evaluator.input_qparams(r)) if mode == "plan" else set()
    integer = layers is None or bool(layers)  # some activations quantized
    traced, taps, copies, shifts = _torch_export(evaluator, r, routed=routed, shifts=integer)
    exported = version_converter_convert(traced)
    graph = Graph(exported)
    factors = fold_batchnorm(graph)
    missing = [layer for layer in forms if f"{layer}.weight" not in graph.inits]
    if missing:
        raise ConfigError(f"layer {missing[0]!r} has no weight initializer in the exported graph; cannot export it")
    qparams: dict[str, QParams] = {}
    if integer:
        qparams = _activation_qparams(evaluator, plan, graph, exported, layers, _Calibration(calibration, percentile,
                                      calib_samples), quantize_input, copies, shifts)
    stored = Weights(graph, factors, qparams, widen_int4, decoded=weights == "decoded")
    for layer, form in forms.items():
        stored.add(layer, form)
    for name in copies:
        stored.add_copy(name)
    for name in shifts:
        stored.add_shift(name)
    model = _model(graph, exported, _with_qdq(graph, qparams, stored.front, stored.extra), stored.inits, stored.extra)
    source = evaluator.workload.source
    if image_input == "uint8":
        model = with_uint8_input(model, source.mean, source.std)
    describe_input(model, image_input, source.mean, source.std)
    onnx.checker.check_model(model)
    counts = stored.counts
    return model, OnnxExport(Path(), OPSET, counts["int8"], counts["int4"], counts["float"], tuple(stored.widened),
                             len(qparams), calibration if qparams else None,
                             tuple((t.name, t.threshold) for t in taps), counts["decoded"], stored.per_call)


def check_options(activations: bool | str = "plan", calibration: str = "minmax", calib_samples: int = 512,
                  percentile: float = 99.99, image_input: str = "float", weights: str = "integer", **_: Any) -> str:
    """The activations mode (`ACTIVATION_MODES`) of export options checked before anything is built; ConfigError
    naming the bad value and what is right otherwise (the other options are checked where they are used)."""
    _check(calibration, calib_samples, percentile)
    check_image_input(image_input)
    if weights not in WEIGHT_FORMS:
        raise ConfigError(f"unknown weights {weights!r}; valid: {', '.join(WEIGHT_FORMS)}")
    mode = {True: "all", False: "none"}.get(activations, activations) if isinstance(activations, bool) else activations
    if mode not in ACTIVATION_MODES:
        raise ConfigError(f"unknown activations {activations!r}; valid: {', '.join(ACTIVATION_MODES)}")
    return str(mode)


def _check(calibration: str, calib_samples: int, percentile: float) -> None:
    if calibration not in CALIBRATIONS:
        raise ConfigError(f"unknown calibration {calibration!r}; valid: {', '.join(CALIBRATIONS)}")
    if calib_samples < 1:
        raise ConfigError(f"calib_samples must be a positive number of images, got {calib_samples!r}")
    if not 50 < percentile <= 100:
        raise ConfigError(f"percentile must be in (50, 100], got {percentile!r}")


@dataclass(frozen=True)
class _Calibration:
    method: str
    percentile: float
    samples: int


# Activation ranges in the float model, per workload, calibration and removed branches (the key of the plan that
# removes them): measured once, shared by every export.
_RANGES: weakref.WeakKeyDictionary[Workload, dict[tuple[_Calibration, str], dict[str, tuple[float, float]]]] = (
    weakref.WeakKeyDictionary())


def _activation_qparams(evaluator: Evaluator, plan: Plan, graph: Graph, exported: Any, layers: set[str] | None,
                        calib: _Calibration, quantize_input: bool | None, copies: tuple[str, ...] = (),
                        shifts: tuple[str, ...] = ()
                        ) -> dict[str, QParams]:
    """uint8 QDQ parameters of the activations to quantize (`layers`: around those; None: every one), from
    their ranges on the calibration images in the float model. The ranges are measured once per workload
    and calibration (the float graph's tensors keep their names in every plan's graph) and cached there.
    `copies`: the `Subsample` convs, whose outputs take their inputs' parameters; `shifts`: the `Shift` convs."""
    source = activation_tensors(graph, layers, copies, shifts)
    # A plan that removes residual branches is calibrated on the float model without them (and repaired): the
    # layers after a removed branch see other ranges than in the float model.
    space = evaluator.space
    reference = space.plan({d.name: plan.get(d.name) for d in space.decisions
                            if isinstance(space.compressors[d.compressor], RemovesBranch)})
    ranges = _RANGES.setdefault(evaluator.workload, {}).setdefault((calib, reference.key), {})
    missing = set(source.values()) - set(ranges)
    if missing:
        traced, _, float_copies, float_shifts = _torch_export(evaluator, evaluator.realise(reference))
        float_graph = Graph(version_converter_convert(traced))
        fold_batchnorm(float_graph)
        every = set(activation_tensors(float_graph, None, float_copies, float_shifts).values()) | missing
        calib_x = evaluator.workload.split(Split.CALIB).x[: calib.samples].cpu().numpy()
        batches = (calib_x[i : i + 128] for i in range(0, len(calib_x), 128))
        known = {t for t in every if any(t in n.output for n in float_graph.nodes) or t in float_graph.inputs}
        ranges.update(calibrate(_model(float_graph, float_graph.model, []), known, batches, calib.method,
                                calib.percentile))
        if missing - set(ranges):  # a tensor only this plan's graph has: calibrated on it
            batches = (calib_x[i : i + 128] for i in range(0, len(calib_x), 128))
            ranges.update(calibrate(_model(graph, exported, []), missing - set(ranges), batches, calib.method,
                                    calib.percentile))
    return {t: QParams.from_range(*ranges[root]) for t, root in source.items()
            if quantize_input is not False or t not in graph.inputs}


def version_converter_convert(model: Any) -> Any:
    """`model` at the export's opset."""
    from onnx import version_converter

    return version_converter.convert_version(model, OPSET)


def _with_qdq(graph: Graph, qparams: dict[str, QParams], front: list[Any], extra: list[Any]) -> list[Any]:
    """The graph's nodes after `front`, each quantized activation followed by its QDQ pair."""
    nodes = list(front)
    for t in graph.inputs:
        if t in qparams:
            nodes += _qdq(t, qparams[t], extra)
    renamed = {t: f"{t}_dq" for t in graph.inputs if t in qparams}
    for node in graph.nodes:
        for k, i in enumerate(node.input):
            if i in renamed:
                node.input[k] = renamed[i]
        nodes.append(node)
        for out in node.output:
            if out in qparams:
                nodes += _qdq(out, qparams[out], extra)
                renamed[out] = f"{out}_dq"
    return nodes


def _qdq(t: str, qp: QParams, extra: list[Any]) -> list[Any]:
    from onnx import helper

    extra += [tensor_proto(f"{t}_scale", np.array(qp.scale, np.float32)),
              tensor_proto(f"{t}_zp", np.array(qp.zero_point, np.uint8))]
    return [helper.make_node("QuantizeLinear", [t, f"{t}_scale", f"{t}_zp"], [f"{t}_q"], name=f"{t}_quant"),
            helper.make_node("DequantizeLinear", [f"{t}_q", f"{t}_scale", f"{t}_zp"], [f"{t}_dq"], name=f"{t}_dequant")]


def _model(graph: Graph, exported: Any, nodes: list[Any], inits: dict[str, np.ndarray] | None = None,
           extra: list[Any] | None = None) -> Any:
    from onnx import helper

    inits = graph.inits if inits is None else inits
    g = exported.graph
    initializer = [tensor_proto(k, v) for k, v in inits.items()] + list(extra or [])
    new = helper.make_graph(nodes or graph.nodes, g.name, [i for i in g.input if i.name not in graph.inits],
                            list(g.output), initializer)
    model = helper.make_model(new, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelopt")
    model.ir_version = IR_VERSION
    return model


def _torch_export(evaluator: Evaluator, r: Realised, routed: bool = False, shifts: bool = True
                  ) -> tuple[Any, list[ExitTap], tuple[str, ...], tuple[str, ...]]:
    """The plan's engine model (dequantized weights, re-estimated norms, pruned channels and removed branches gone),
    exported as float ONNX (batch size free); `routed`: with its exits' heads and their outputs (and the exits).
    Its option-A shortcuts are strided 1x1 convs (`_subsample`): the weight names of those come third; the sums
    of removed branches' constants are 1x1 convs with a bias (`_shift`; `shifts` off: float Adds, cheaper where no
    activation is quantized): their weight names come fourth."""
    model = evaluator.engine_model(r).cpu().float().eval()
    x = evaluator.workload.split(Split.VAL).x[:2].cpu().float()
    copies = tuple(f"{name}.weight" for name in subsample_shortcuts(model, x))
    shifted = tuple(f"{name}.weight" for name in shift_constants(model)) if shifts else ()
    outputs = ["logits"]
    taps = evaluator.routes.taps(model, r.plan) if routed else []
    with tapped(model, taps) if taps else contextlib.nullcontext():
        outputs += [f"exit{k}_{what}" for k in range(len(taps)) for what in ("logits", "confidence")]
        return _traced(model, x[:1], outputs), taps, copies, shifted


def _traced(model: torch.nn.Module, x: torch.Tensor, outputs: list[str]) -> Any:
    import onnx

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The TorchScript exporter keeps parameter names as initializer names (the weights are
        # found by layer name) and leaves batch norms for our folding.
        torch.onnx.export(
            model, (x,),
            buf,  # type: ignore[arg-type]  # torch annotates str | PathLike, yet writes to file objects too
            dynamo=False, opset_version=17, input_names=["input"], output_names=outputs,
            dynamic_axes={name: {0: "batch"} for name in ["input", *outputs]}, do_constant_folding=False,
        )
    return onnx.load_from_string(buf.getvalue())
