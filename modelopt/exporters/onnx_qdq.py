"""Graph surgery for the ONNX export: batch-norm folding, QDQ placement, activation calibration.

The QDQ layout follows what ONNX Runtime's CPU provider fuses into integer kernels: every
activation entering or leaving a Conv, Gemm, MatMul or Add passes through a
QuantizeLinear/DequantizeLinear pair (uint8, per tensor), moved past a ReLU that follows the op
(a zero point of 0 lets ORT drop the ReLU), and weights are integer initializers behind a
DequantizeLinear. ORT then rewrites DQ -> Conv -> Q into QLinearConv and DQ, DQ -> Add -> Q into
QLinearAdd. Tensors that data-movement ops (Slice, Pad, Reshape, ...) derive from a quantized
tensor reuse its scale, so re-quantizing them loses nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from modelopt.exporters.onnx_run import ort_session

if TYPE_CHECKING:
    import onnx

QUANTIZED_OPS = ("Conv", "Gemm", "MatMul", "Add")
# Activations a quantized op's output passes through before its next reader (ReLU, and ReLU6 exported as Clip(0, 6)):
# the output is quantized after them, once, where the reader's input is, and ONNX Runtime folds them into the op
# (its output range lies within theirs). Quantized before them as well, a MobileNetV2 ran a DequantizeLinear, the
# Clip and a QuantizeLinear in float after every conv, a large share of its W8A8 kernel time (measured:
# docs/export-and-latency.md#measured).
FOLDED_ACTIVATIONS = ("Relu", "Clip")
# Ops whose output holds (a subset of) the input's values, zeros possibly added: same scale serves.
PRESERVING_OPS = ("Slice", "Pad", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "Identity")


@dataclass(frozen=True)
class QParams:
    """uint8 affine quantization of one activation tensor."""

    scale: float
    zero_point: int

    @classmethod
    def from_range(cls, lo: float, hi: float) -> QParams:
        lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)  # zero must be exact (padding, ReLU)
        scale = (hi - lo) / 255.0
        if not np.isfinite(scale) or scale <= 0:
            return cls(1.0, 0)
        scale = float(np.float32(scale))
        return cls(scale, int(np.clip(round(-lo / scale), 0, 255)))


class Graph:
    """A mutable view of an ONNX graph: nodes, float initializers as numpy, producers and consumers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from onnx import numpy_helper

        self.model = model
        g = model.graph
        self.nodes = list(g.node)
        self.inits: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.inputs = [i.name for i in g.input if i.name not in self.inits]
        self.outputs = [o.name for o in g.output]

    def producer(self) -> dict[str, Any]:
        return {out: n for n in self.nodes for out in n.output}

    def consumers(self) -> dict[str, list[Any]]:
        cons: dict[str, list[Any]] = {}
        for n in self.nodes:
            for i in n.input:
                cons.setdefault(i, []).append(n)
        return cons

    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default


def fold_batchnorm(graph: Graph) -> dict[str, np.ndarray]:
    """Folds every BatchNormalization that alone consumes a Conv's output into that Conv.

    Returns:
        The per-output-channel factor each folded conv weight was multiplied by, by weight name.
    """
    producer, consumers = graph.producer(), graph.consumers()
    factors: dict[str, np.ndarray] = {}
    drop = []
    for bn in [n for n in graph.nodes if n.op_type == "BatchNormalization"]:
        conv = _foldable_into(bn, graph, producer, consumers)
        if conv is None:
            continue
        scale = _fold(bn, conv, graph, producer, consumers)
        factors[conv.input[1]] = factors.get(conv.input[1], np.ones_like(scale)) * scale
        drop.append(bn)
    graph.nodes = [n for n in graph.nodes if all(n is not d for d in drop)]
    used = {i for n in graph.nodes for i in n.input}
    graph.inits = {k: v for k, v in graph.inits.items() if k in used}
    return factors


def _foldable_into(bn: Any, graph: Graph, producer: Mapping[str, Any], consumers: Mapping[str, list[Any]]) -> Any:
    """The Conv `bn` folds into: the one producing its input, read by nothing else, with its weight, bias and the
    norm's statistics held as initializers (through torch.onnx's Identity nodes); None otherwise."""
    conv = producer.get(bn.input[0])
    if conv is None or conv.op_type != "Conv" or len(consumers.get(bn.input[0], [])) != 1 or len(bn.output) != 1:
        return None
    held = [*bn.input[1:5], *conv.input[2:3]]
    if conv.input[1] not in graph.inits or any(
            i and initializer_behind(i, graph, producer) not in graph.inits for i in held):
        return None
    return conv


def _fold(bn: Any, conv: Any, graph: Graph, producer: Mapping[str, Any], consumers: Mapping[str, list[Any]]
          ) -> np.ndarray:
    """Folds `bn` into `conv` in place; returns the per-output-channel factor its weight was multiplied by."""
    gamma, beta, mean, var = (graph.inits[initializer_behind(i, graph, producer)].astype(np.float64)
                              for i in bn.input[1:5])
    scale = gamma / np.sqrt(var + float(graph.attr(bn, "epsilon", 1e-5)))
    wname = conv.input[1]
    w = graph.inits[wname]
    graph.inits[wname] = (w * scale.reshape(-1, *[1] * (w.ndim - 1))).astype(np.float32)
    given = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
    bias = graph.inits[initializer_behind(given, graph, producer)].astype(np.float64) if given else 0.0
    # The folded bias is this conv's own: a bias torch.onnx shares with other layers (through Identity nodes) is left
    # to them.
    own = given is not None and given in graph.inits and len(consumers.get(given, [])) == 1
    bname = given if own and given else f"{wname.removesuffix('.weight')}.bias" + ("_folded" if given else "")
    graph.inits[bname] = (bias * scale + beta - mean * scale).astype(np.float32)
    if len(conv.input) < 3:
        conv.input.append(bname)
    else:
        conv.input[2] = bname
    conv.output[0] = bn.output[0]
    return scale


def initializer_behind(name: str, graph: Graph, producer: Mapping[str, Any]) -> str:
    """The initializer behind `name`: torch.onnx keeps one of equal tensors (a fresh network's norms: weight 1,
    bias 0, mean 0, variance 1) and Identity nodes for the others."""
    while name not in graph.inits and name in producer and producer[name].op_type == "Identity":
        name = producer[name].input[0]
    return name


def activation_tensors(graph: Graph, layers: Collection[str] | None = None, copies: Collection[str] = (),
                       shifts: Collection[str] = ()) -> dict[str, str]:
    """The activations to quantize, each mapped to the tensor whose range sets its scale.

    `layers`: only around these layers' Conv/Gemm/MatMul nodes (found by their weight initializer,
    ``<layer>.weight``), and around an Add whose data inputs are all quantized already (so it runs as an
    integer Add too); None: around every such node. `copies`: weight names of convs that only move values
    (`modelopt.exporters._subsample`): quantized where their input is, their output at the input's scale.
    `shifts`: weight names of convs that add a removed branch's constant (`modelopt.exporters._shift`): quantized
    where their input is, as an Add is, their output at its own scale.
    """
    producer, consumers = graph.producer(), graph.consumers()
    needed: dict[str, None] = {}
    for n in graph.nodes:
        if n.op_type not in QUANTIZED_OPS:
            continue
        data_inputs = [i for i in (n.input[:1] if n.op_type in ("Conv", "Gemm") else n.input)
                       if i and i not in graph.inits]
        if not all(_is_float_activation(i, producer) for i in data_inputs):
            continue
        moves = _copies(n, copies) or _copies(n, shifts)
        if layers is not None and not _chosen(n, data_inputs, layers, needed, producer, moves):
            continue
        for i in data_inputs:
            needed[i] = None
        needed[_quantized_output(n, graph, consumers)] = None
    return _sources({t: None for t in needed if t not in graph.outputs}, graph, producer, copies)


def _sources(needed: Mapping[str, None], graph: Graph, producer: Mapping[str, Any], copies: Collection[str]
             ) -> dict[str, str]:
    """Each tensor to quantize mapped to the tensor whose range sets its scale: itself, or what it was moved from
    (through data-movement ops and `copies` convs) where that is quantized too or is the graph's input."""
    source: dict[str, str] = {}
    for t in needed:
        root = t
        while root in producer and (producer[root].op_type in PRESERVING_OPS or _copies(producer[root], copies)):
            root = producer[root].input[0]
            if root in needed:
                break
        if root in graph.outputs or root in graph.inits:
            root = t
        source[t] = root
        source.setdefault(root, root)
    return source


def _quantized_output(node: Any, graph: Graph, consumers: Mapping[str, list[Any]]) -> str:
    """Where `node`'s output is quantized: after the activation it feeds alone (ONNX Runtime folds a Relu or Clip
    into the integer op), else its output."""
    out = node.output[0]
    users = consumers.get(out, [])
    if len(users) == 1 and users[0].op_type in FOLDED_ACTIVATIONS and out not in graph.outputs:
        return str(users[0].output[0])
    return str(out)


def _copies(node: Any, copies: Collection[str]) -> bool:
    return node.op_type == "Conv" and len(node.input) > 1 and node.input[1] in copies


def _chosen(node: Any, data_inputs: list[str], layers: Collection[str], needed: Mapping[str, None],
            producer: Mapping[str, Any], copy: bool = False) -> bool:
    """Whether `node` runs integer in a plan whose integer layers are `layers` (nodes come in graph order): a
    layer's node if the layer is one; an Add, or a `copy` or shift conv, if its data inputs are quantized."""
    if node.op_type != "Add" and not copy:
        return any(w.endswith(".weight") and w[: -len(".weight")] in layers for w in node.input[1:2])

    def quantized(t: str) -> bool:  # the tensor, or what a data-movement op derived it from, is quantized
        while t not in needed and t in producer and producer[t].op_type in PRESERVING_OPS:
            t = producer[t].input[0]
        return t in needed

    return bool(data_inputs) and all(quantized(i) for i in data_inputs)


def _is_float_activation(name: str, producer: Mapping[str, Any]) -> bool:
    # Shape arithmetic (Shape, Gather, Constant ...) feeds some Adds; only data tensors are quantized.
    node = producer.get(name)
    return node is None or node.op_type not in ("Shape", "Constant", "ConstantOfShape", "Gather", "Cast", "Size")


def calibrate(
    model: onnx.ModelProto, tensors: Iterable[str], batches: Iterable[np.ndarray], method: str = "minmax",
    percentile: float = 99.99, seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """The (low, high) range of each named tensor over the calibration batches.

    `minmax` takes the extremes; `percentile` the given percentile of each tail, estimated on a
    seeded sample of up to 20,000 values per tensor and batch.
    """
    import onnx

    names = list(dict.fromkeys(tensors))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    sess = ort_session(probe.SerializeToString(), threads=2, level="basic")
    in_name = sess.get_inputs()[0].name
    lo = dict.fromkeys(names, np.inf)
    hi = dict.fromkeys(names, -np.inf)
    samples: dict[str, list[np.ndarray]] = {n: [] for n in names}
    rng = np.random.default_rng(seed)
    for x in batches:
        outs = sess.run(names, {in_name: x})
        for name, v in zip(names, outs, strict=True):
            v = v.reshape(-1)
            lo[name], hi[name] = min(lo[name], float(v.min())), max(hi[name], float(v.max()))
            if method == "percentile":
                samples[name].append(v if v.size <= 20000 else rng.choice(v, 20000, replace=False))
    if method == "percentile":
        for name in names:
            v = np.concatenate(samples[name])
            lo[name], hi[name] = float(np.percentile(v, 100 - percentile)), float(np.percentile(v, percentile))
    return {n: (lo[n], hi[n]) for n in names}


def tensor_proto(name: str, array: np.ndarray, *, int4: bool = False) -> onnx.TensorProto:
    """An initializer; `int4` stores integer codes in ONNX's packed 4-bit type (opset 21)."""
    from onnx import TensorProto, helper, numpy_helper

    if int4:
        return helper.make_tensor(name, TensorProto.INT4, list(array.shape), array.astype(np.int8).reshape(-1).tolist())
    return numpy_helper.from_array(np.ascontiguousarray(array).reshape(array.shape), name)
