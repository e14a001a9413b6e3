"""The plan's integer weights in an ONNX graph: each behind a DequantizeLinear (int8, or opset 21's packed int4
with per-channel or blocked group scales), batch-norm factors folded into the scales, biases of integer-input layers
as int32 at the input's scale times the weight's (as QLinearConv takes them), and the 0/1 weights of the option-A
shortcuts (`_subsample`) as exact int8 codes. Part of `modelopt.exporters.onnx`."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from modelopt.compressors.contract import Granularity, IntegerWeight, WeightForm
from modelopt.errors import ConfigError
from modelopt.exporters.onnx_qdq import Graph, QParams, initializer_behind, tensor_proto

__all__ = ["Weights"]

SHIFT_CODE = 127  # a `Shift` conv's identity weight in int8: its bias then has 1/127 of an input step


class Weights:
    """Integer weights put behind DequantizeLinear nodes (`front`), their initializers in `extra`."""

    def __init__(self, graph: Graph, factors: dict[str, np.ndarray], qparams: dict[str, QParams], widen: bool,
                 decoded: bool = False) -> None:
        self.graph, self.factors, self.qparams, self.widen = graph, factors, qparams, widen
        # Layers whose inputs stay float keep their decoded float32 weights: ONNX Runtime has no kernel for integer
        # weights and float inputs, and dequantizes them on every call behind a DequantizeLinear.
        self.decoded = decoded
        self.per_call = 0  # integer weights behind a DequantizeLinear whose layer reads float inputs
        self.consumers = graph.consumers()
        self.inits = dict(graph.inits)
        self.front: list[Any] = []
        self.extra: list[Any] = []
        self.counts: Counter[str] = Counter()
        self.widened: list[str] = []

    def add(self, layer: str, form: WeightForm) -> None:
        """A float form stays as its initializer (pruned weights are zeros there)."""
        q, wname = form.integer, f"{layer}.weight"
        if q is None:
            self.counts["float"] += 1
            return
        node = self._user(layer, wname)
        if self.decoded and node.input[0] not in self.qparams:  # the initializer holds the decoded values
            self.counts["decoded"] += 1
            return
        if node.op_type == "Gemm" and self.graph.attr(node, "transB", 0) != 1:
            raise ConfigError(f"layer {layer!r}: Gemm without transB is not supported by the exporter")
        int4 = q.bits <= 4 and not self.widen
        self.counts["int4" if int4 else "int8"] += 1
        if q.bits != (4 if int4 else 8):
            self.widened.append(layer)
        del self.inits[wname]
        w_scale = _weight_dq(q, self.factors.get(wname), wname, int4, self.front, self.extra)
        x_in = node.input[0]
        if x_in not in self.qparams:
            self.per_call += 1
        if (len(node.input) > 2 and node.input[2] and not int4 and x_in in self.qparams
                and q.granularity is not Granularity.GROUP):
            self._int32_bias(node, layer, np.float32(self.qparams[x_in].scale) * w_scale)

    def add_copy(self, wname: str) -> None:
        """A `Subsample` conv's 0/1 weight as int8 codes at scale 1 (exact) where its input is quantized, so it
        runs as a QLinearConv; float where not."""
        node = self._user(wname, wname)
        if node.input[0] not in self.qparams:
            return
        codes = self.graph.inits[self._initializer(wname)].astype(np.int8)
        self._dq_weight(wname, codes, np.array(1.0, np.float32))

    def add_shift(self, wname: str) -> None:
        """A `Shift` conv's identity weight as int8 code 127 at scale 1/127 per channel and its bias (the removed
        branch's constant) as int32 at the input's scale over 127, where its input is quantized; float where not."""
        node = self._user(wname, wname)
        if node.input[0] not in self.qparams or len(node.input) < 3:
            return
        channels = self.graph.inits[self._initializer(wname)].shape[0]
        codes = np.zeros((channels, channels, 1, 1), np.int8)
        codes[np.arange(channels), np.arange(channels)] = SHIFT_CODE
        w_scale = np.full(channels, 1.0 / SHIFT_CODE, np.float32)
        self._dq_weight(wname, codes, w_scale)
        self._int32_bias(node, wname.removesuffix(".weight"), np.float32(self.qparams[node.input[0]].scale) * w_scale)

    def _dq_weight(self, wname: str, codes: np.ndarray, scale: np.ndarray) -> None:
        """`wname` as int8 `codes` at `scale` (one per output channel, or one for all) behind a DequantizeLinear;
        its initializer dropped where nothing else reads it."""
        from onnx import helper

        self.extra += [tensor_proto(f"{wname}_q", codes), tensor_proto(f"{wname}_scale", scale),
                       tensor_proto(f"{wname}_zp", np.zeros(scale.shape, np.int8))]
        node = self._user(wname, wname)
        node.input[1] = f"{wname}_int"
        axis: dict[str, Any] = {"axis": 0} if scale.ndim else {}
        self.front.append(helper.make_node("DequantizeLinear", [f"{wname}_q", f"{wname}_scale", f"{wname}_zp"],
                                           [node.input[1]], name=f"{wname}_dq", **axis))
        if self._initializer(wname) == wname and len(self.consumers.get(wname, [])) == 1:
            del self.inits[wname]

    def _initializer(self, name: str) -> str:
        """The initializer behind `name` (`onnx_qdq.initializer_behind`)."""
        return initializer_behind(name, self.graph, self.graph.producer())

    def _user(self, layer: str, wname: str) -> Any:
        """The Conv, Gemm or MatMul that reads the weight (a Linear on 3-D inputs exports as a Transpose of it,
        then a MatMul)."""
        users = self.consumers.get(wname, [])
        for n in users:
            if n.op_type in ("Conv", "Gemm", "MatMul"):
                return n
        for t in (n for n in users if n.op_type == "Transpose"):
            for n in self.consumers.get(t.output[0], []):
                if n.op_type == "MatMul":
                    return n
        raise ConfigError(f"layer {layer!r}: its weight feeds no Conv, Gemm or MatMul in the exported graph; it "
                          "cannot be exported to ONNX")

    def _int32_bias(self, node: Any, layer: str, scale: np.ndarray) -> None:
        """The bias at scale x_scale * w_scale, as QLinearConv takes it. A bias the exporter merged with an equal
        one (torchvision's zero-initialised biases: one initializer, Identity nodes for the others) gets a copy
        of its own, under a new name; the merged one stays for its other readers."""
        from onnx import helper

        bname = node.input[2]
        source = self._initializer(bname)
        own = source == bname and sum(bname in n.input for n in self.consumers.get(bname, [])) == 1
        out = bname if own else f"{layer}.bias_own"
        node.input[2] = out
        b_scale = scale.astype(np.float32)
        b_q = np.round(self.graph.inits[source].astype(np.float64) / b_scale).astype(np.int32)
        if own:
            del self.inits[bname]  # the DequantizeLinear writes it now
        self.extra += [tensor_proto(f"{out}_q", b_q), tensor_proto(f"{out}_scale", b_scale)]
        self.front.append(helper.make_node("DequantizeLinear", [f"{out}_q", f"{out}_scale"], [out],
                                           name=f"{out}_dq", axis=0))


def _weight_dq(qw: IntegerWeight, factor: np.ndarray | None, wname: str, int4: bool, front: list[Any],
               extra: list[Any]) -> np.ndarray:
    """Adds the DequantizeLinear (and Reshape) producing `wname`; returns the per-channel scale."""
    from onnx import helper

    codes = qw.codes.cpu().numpy().astype(np.int8)
    scales = qw.scales.float().cpu().numpy().astype(np.float64)
    out_ch = codes.shape[0]
    fac = np.ones(out_ch) if factor is None else factor.astype(np.float64)
    attrs: dict[str, Any] = {}
    if qw.granularity is Granularity.GROUP:
        codes = codes.reshape(out_ch, -1)
        scale = scales.reshape(out_ch, -1) * fac[:, None]
        attrs = {"axis": 1, "block_size": qw.group_size}
    elif qw.granularity is Granularity.PER_CHANNEL or factor is not None:
        scale = scales.reshape(-1) * fac if scales.size == out_ch else np.full(out_ch, scales.item()) * fac
        attrs = {"axis": 0}
    else:
        scale = scales.reshape(())
    scale = scale.astype(np.float32)
    qname, sname = f"{wname}_q", f"{wname}_scale"
    extra += [tensor_proto(qname, codes, int4=int4), tensor_proto(sname, scale)]
    inputs = [qname, sname]
    if not int4:  # explicit zero points: ORT's QDQ Conv fusion expects them on int8 weights
        extra.append(tensor_proto(f"{wname}_zp", np.zeros(scale.shape, np.int8)))
        inputs.append(f"{wname}_zp")
    dq_out = f"{wname}_2d" if codes.shape != tuple(qw.codes.shape) else wname
    front.append(helper.make_node("DequantizeLinear", inputs, [dq_out], name=f"{wname}_dq", **attrs))
    if dq_out != wname:
        extra.append(tensor_proto(f"{wname}_shape", np.array(qw.codes.shape, np.int64)))
        front.append(helper.make_node("Reshape", [dq_out, f"{wname}_shape"], [wname], name=f"{wname}_reshape"))
    per_channel = scale.reshape(out_ch, -1)[:, 0] if scale.ndim else np.full(out_ch, float(scale), np.float32)
    return per_channel.astype(np.float32)
