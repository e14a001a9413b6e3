"""ONNX export against PyTorch: ONNX Runtime runs the plan's integer weights with integer kernels."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
import onnx
import torch

from modelopt.errors import ConfigError
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.onnx_run import fused_op_counts, run_onnx


def _torch_logits(evaluator, plan, x):
    with evaluator.workload.weights(evaluator.states.compressed_weights(plan)):
        return evaluator.workload.logits(x).numpy()


def test_int8_qdq_runs_integer_kernels_and_agrees(r20_evaluator, r20_plans, tmp_path):
    plan = r20_plans["int8_per_channel"]
    info = export_onnx(r20_evaluator, plan, tmp_path / "int8.onnx", activations="all")
    model = onnx.load(info.path)
    onnx.checker.check_model(model, full_check=True)
    assert info.int8_layers == 20 and info.int4_layers == 0 and info.activation_tensors > 0
    # What ORT runs after its QDQ fusions: every conv, the first on the quantized image too, becomes
    # QLinearConv, residual adds QLinearAdd: integer kernels, not float Conv on DQ output. The two option-A
    # shortcuts are strided 1x1 QLinearConvs too, not Slices and a float Pad.
    ops = fused_op_counts(info.path)
    assert ops.get("QLinearConv") == 19 + 2 and "Conv" not in ops, ops
    assert not {"Slice", "Pad", "DequantizeLinear"} & set(ops), ops
    assert ops.get("QLinearAdd") == 9, ops
    x = r20_evaluator.workload.split("val").x.tensor()
    agreement = float((run_onnx(info.path, x).argmax(1) == _torch_logits(r20_evaluator, plan, x).argmax(1)).mean())
    assert agreement >= 0.995, agreement


def test_an_integer_stem_lets_ort_run_nhwc_without_a_transpose_per_residual_add(r20_evaluator, r20_plans, tmp_path):
    """With the image quantized the whole W8A8 network runs NHWC: one Transpose in, one out. With a float stem ORT
    transposes back and forth where the float Conv's NCHW output meets the integer kernels."""
    plan = r20_plans["int8_per_channel"]
    stem = export_onnx(r20_evaluator, plan, tmp_path / "stem8.onnx", activations="all")
    float_stem = export_onnx(r20_evaluator, plan, tmp_path / "stem32.onnx", activations="all", quantize_input=False)
    assert fused_op_counts(stem.path, level="all").get("Transpose", 0) <= 2
    assert fused_op_counts(float_stem.path, level="all").get("Transpose", 0) >= 6


@pytest.mark.slow
def test_the_plan_decides_which_layers_run_integer_kernels(r20_evaluator, r20_plans, tmp_path):
    """By default the export quantizes activations exactly around the layers whose inputs the plan quantizes:
    a weight-only plan stays float there (DequantizeLinear + float Conv), an integer-input plan fuses."""
    weight_only = export_onnx(r20_evaluator, r20_plans["int8_per_channel"], tmp_path / "w8.onnx")
    assert weight_only.activation_tensors == 0 and "QLinearConv" not in fused_op_counts(weight_only.path)
    ev = r20_evaluator
    stage3 = {n: {"quantize": {"bits": 8, "activations": 8}} for n in ev.space.layers if n.startswith("layer3")}
    plan = ev.space.parse_plan({"default": {"quantize": {"bits": 8}}, "layers": stage3})
    info = export_onnx(ev, plan, tmp_path / "w8a8.onnx")
    ops = fused_op_counts(info.path)
    # the six convs of stage 3, and its option-A shortcut, which reads the quantized input of layer3.0.conv1
    assert ops.get("QLinearConv") == 6 + 1 and info.activation_tensors > 0, ops
    x = ev.workload.split("val").x.tensor()
    agreement = float((run_onnx(info.path, x).argmax(1) == _torch_logits(ev, plan, x).argmax(1)).mean())
    assert agreement >= 0.99, agreement


def test_weight_only_int4_group_is_exact(r20_evaluator, r20_plans, tmp_path):
    # Float activations: ORT must reproduce PyTorch's logits, which checks the int4 packing, the
    # blocked (group) DequantizeLinear and the folded batch norms number by number.
    plan = r20_plans["mixed_2_3_4"]
    info = export_onnx(r20_evaluator, plan, tmp_path / "mixed.onnx", activations=False)
    model = onnx.load(info.path)
    types = {t.name: t.data_type for t in model.graph.initializer}
    assert types["layer1.0.conv2.weight_q"] == onnx.TensorProto.INT4
    assert info.int4_layers == 20 and info.activation_tensors == 0 and "conv1" in info.widened
    blocked = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
               and any(a.name == "block_size" for a in n.attribute)]
    assert blocked
    x = r20_evaluator.workload.split("val").x[:128]
    np.testing.assert_allclose(run_onnx(info.path, x), _torch_logits(r20_evaluator, plan, x), atol=2e-4, rtol=1e-4)


def test_float_export_and_bad_options(r20_evaluator, tmp_path):
    plan = r20_evaluator.space.plan()
    info = export_onnx(r20_evaluator, plan, tmp_path / "float.onnx", activations=False)
    model = onnx.load(info.path)
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)  # folded into the convs
    x = r20_evaluator.workload.split("val").x[:32]
    np.testing.assert_allclose(run_onnx(info.path, x), _torch_logits(r20_evaluator, plan, x), atol=2e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match="calibration 'entropy'"):
        export_onnx(r20_evaluator, plan, tmp_path / "x.onnx", calibration="entropy")


def test_qparams_keep_zero_exact():
    from modelopt.exporters.onnx_qdq import QParams

    relu = QParams.from_range(0.0, 2.55)
    assert relu.zero_point == 0 and relu.scale == pytest.approx(0.01)  # ORT drops a ReLU before zp 0
    signed = QParams.from_range(-1.0, 3.0)
    assert signed.zero_point == round(1.0 / signed.scale) and signed.scale == pytest.approx(4 / 255)
    assert QParams.from_range(0.0, 0.0) == QParams(1.0, 0)  # a dead tensor still gets a valid scale


def test_percentile_calibration_clips_the_tails():
    from onnx import TensorProto, helper

    from modelopt.exporters.onnx_qdq import calibrate

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1000])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    x = np.random.default_rng(0).standard_normal((8, 1000)).astype(np.float32)
    x[0, 0] = 50.0  # one outlier
    lo, hi = calibrate(model, ["y"], [x], "minmax")["y"]
    assert (lo, hi) == (0.0, 50.0)
    _, hi_p = calibrate(model, ["y"], [x], "percentile", percentile=99.9)["y"]
    assert 2.0 < hi_p < 5.0


def test_a_failed_write_leaves_the_old_onnx_file_whole(r20_evaluator, r20_plans, tmp_path, monkeypatch):
    import os

    from modelopt.errors import StorageError

    path = export_onnx(r20_evaluator, r20_plans["int8_per_channel"], tmp_path / "m.onnx", activations=False).path
    old = path.read_bytes()

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(StorageError, match=r"cannot write .*m\.onnx"):
        export_onnx(r20_evaluator, r20_plans["int4_group"], path, activations=False)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["m.onnx"]
    onnx.checker.check_model(onnx.load(path))


def test_integer_inputs_on_layers_whose_biases_the_exporter_merged(small_data, tmp_path):
    """torchvision zero-initialises its squeeze-excitation biases; torch.onnx keeps one initializer for equal
    ones and Identity nodes for the rest. Each integer-input layer still gets its own int32 bias."""
    torchvision = pytest.importorskip("torchvision")
    import torch

    import modelopt
    from modelopt.api import build_compressors
    from modelopt.evaluation.evaluator import Evaluator
    from modelopt.plan.space import SearchSpace

    torch.manual_seed(0)
    wl = modelopt.build_workload(torchvision.models.mobilenet_v3_small(num_classes=10).eval(), str(small_data),
                                 device="cpu")
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize"], {"quantize": {
        "bits": [8], "granularity": ["per_channel"], "activations": [None, 8], "rounding": ["nearest"],
        "norm_images": 0}})))
    se = [x.name for x in wl.layers if x.name.endswith("fc1")]
    plan = ev.space.parse_plan({"layers": {n: {"quantize": {"bits": 8, "granularity": "per_channel",
                                                           "activations": 8}} for n in se}})
    info = export_onnx(ev, plan, tmp_path / "se.onnx")
    model = onnx.load(info.path)
    onnx.checker.check_model(model, full_check=True)
    inits = {i.name for i in model.graph.initializer}
    assert len(se) == 9 and sum(f"{n}.bias_own_q" in inits for n in se) == 7  # per bias shape, one keeps the original
    assert fused_op_counts(info.path).get("QLinearConv", 0) >= len(se)
    x = wl.split("val").x[:64]
    agreement = float((run_onnx(info.path, x).argmax(1) == _torch_logits(ev, plan, x).argmax(1)).mean())
    assert agreement >= 0.95, agreement


@pytest.fixture(scope="session")
def depth_evaluator(resnet20_workload):
    """ResNet-20 with removable blocks and W8A8 offered: the two tests that remove blocks share it, and with it the
    means of every block's output on the calib images, which the repair of a removed block reads."""
    from modelopt.api import build_compressors
    from modelopt.evaluation.evaluator import Evaluator
    from modelopt.plan.space import SearchSpace

    return Evaluator(resnet20_workload, SearchSpace(resnet20_workload.layers, build_compressors(
        ["depth", "quantize"], {"quantize": {"bits": [8], "activations": [None, 8], "rounding": ["nearest"],
                                             "norm_images": 0}})))


def test_a_plan_that_removes_blocks_exports_without_them_and_agrees(depth_evaluator, tmp_path):
    from modelopt.compressors.depth import SKIP

    ev = depth_evaluator
    float_skip = ev.space.plan({"layer2.2.conv2/depth": SKIP})
    info = export_onnx(ev, float_skip, tmp_path / "skip.onnx", activations=False)
    inits = {i.name for i in onnx.load(info.path).graph.initializer}
    assert "layer2.2.conv1.weight" not in inits and "layer2.1.conv1.weight" in inits
    ops = fused_op_counts(info.path)
    # 19 convs less the removed branch's two, and the two option-A shortcuts' strided 1x1 convs
    assert ops.get("Conv", 0) + ops.get("FusedConv", 0) == 17 + 2, ops
    x = ev.workload.split("val").x.tensor()[:128]
    np.testing.assert_allclose(run_onnx(info.path, x), ev.states.logits(float_skip, x).numpy(), rtol=1e-3, atol=1e-3)


def test_relu6_is_quantized_after_the_clip_once_and_folded_into_the_integer_conv(small_data, tmp_path):
    """MobileNetV2's ReLU6 exports as Clip(0, 6). Its conv's output was quantized before the Clip and the Clip's
    output again for the next conv: ORT ran a DequantizeLinear, the Clip and a QuantizeLinear in float after every
    conv (a third of the W8A8 kernel time, 1.5x slower than ORT's own quantize_static). And a fresh network's norms
    (equal tensors, which torch.onnx shares through Identity nodes) were left unfolded, in float."""
    torchvision = pytest.importorskip("torchvision")
    import torch

    import modelopt
    from modelopt.api import build_compressors
    from modelopt.evaluation.evaluator import Evaluator
    from modelopt.plan.space import SearchSpace

    torch.manual_seed(0)
    net = torchvision.models.mobilenet_v2(num_classes=10, width_mult=0.25).eval()
    wl = modelopt.build_workload(net, str(small_data), device="cpu")
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize"], {"quantize": {
        "bits": [8], "granularity": ["per_channel"], "activations": [8], "rounding": ["nearest"], "norm_images": 0}})))
    plan = ev.space.parse_plan({"default": {"quantize": {"bits": 8, "granularity": "per_channel", "activations": 8}}})
    info = export_onnx(ev, plan, tmp_path / "mb2.onnx")
    qdq = onnx.load(info.path).graph
    producer = {o: n for n in qdq.node for o in n.output}
    clipped_convs = [n for n in qdq.node if n.op_type == "Clip" and producer[n.input[0]].op_type == "Conv"]
    assert len(clipped_convs) == 35  # every conv but the projections and the classifier is followed by a ReLU6
    before_clip = {n.input[0] for n in clipped_convs}
    assert not [n for n in qdq.node if n.op_type == "QuantizeLinear" and n.input[0] in before_clip]  # once, after
    ops = fused_op_counts(info.path)  # norms folded, though a fresh network's are equal tensors torch.onnx shares
    assert "Clip" not in ops and "BatchNormalization" not in ops and ops.get("QLinearConv") == 52, ops
    assert ops.get("DequantizeLinear", 0) + ops.get("QuantizeLinear", 0) <= 2, ops  # the image in, the logits out
    x = wl.split("val").x[:64]
    agreement = float((run_onnx(info.path, x).argmax(1) == _torch_logits(ev, plan, x).argmax(1)).mean())
    assert agreement >= 0.95, agreement


@pytest.mark.slow
def test_a_removed_branchs_constant_is_added_by_an_integer_conv_not_a_float_add(depth_evaluator, tmp_path):
    """A removed block computes relu(x + c). Exported as a float Add, ONNX Runtime ran DequantizeLinear, Add and
    QuantizeLinear in float there; as a 1x1 identity conv with bias c it runs one QLinearConv."""
    from modelopt.compressors import QuantSpec
    from modelopt.compressors.depth import SKIP

    ev = depth_evaluator
    w8a8 = ev.space.uniform("quantize", QuantSpec(8).with_activations(8))
    plan = ev.space.plan({**dict(w8a8.choices), "layer1.0.conv2/depth": SKIP})
    info = export_onnx(ev, plan, tmp_path / "skip.onnx")
    ops = fused_op_counts(info.path)
    # 19 convs less the removed branch's two, the two option-A shortcuts and the shift; 9 residual adds less one
    assert ops.get("QLinearConv") == 17 + 2 + 1 and "Conv" not in ops, ops
    assert not {"Add", "DequantizeLinear"} & set(ops) and ops.get("QLinearAdd") == 8, ops
    assert ops.get("QuantizeLinear") == 1, ops  # the image's
    x = ev.workload.split("val").x.tensor()
    agreement = float((run_onnx(info.path, x).argmax(1) == ev.states.logits(plan, x).argmax(1).numpy()).mean())
    assert agreement >= 0.995, agreement


def test_a_uint8_image_input_gives_the_float_inputs_answers_without_a_transpose_more(r20_evaluator, r20_plans,
                                                                                   tmp_path):
    """`image_input="uint8"`: the graph reads HWC pixels as decoded and normalises them as the workload does, so
    its logits are the float-input graph's on the normalised images."""
    import onnxruntime as ort

    from modelopt.data.split import Split

    plan = r20_plans["int8_per_channel"]
    floats = export_onnx(r20_evaluator, plan, tmp_path / "float_in.onnx", activations="all")
    pixels = export_onnx(r20_evaluator, plan, tmp_path / "uint8_in.onnx", activations="all", image_input="uint8")
    raw = r20_evaluator.workload.data.split(Split.VAL).x[:256]  # uint8 NHWC, as the data source holds them
    assert raw.dtype == torch.uint8 and raw.shape[-1] == 3
    sess = ort.InferenceSession(str(pixels.path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in sess.get_inputs()] == [("image", "tensor(uint8)")]
    got = sess.run(None, {"image": raw.numpy()})[0]
    want = run_onnx(floats.path, r20_evaluator.workload.prepare(raw))
    np.testing.assert_array_equal(got, want)
    assert fused_op_counts(pixels.path, level="all").get("Transpose", 0) <= 2
    # Each file says what its input must be (a uint8 file fed floats cast to uint8 scored 9.8 % with no hint).
    import onnx

    for path, layout, dtype in ((pixels.path, "NHWC", "uint8"), (floats.path, "NCHW", "float32")):
        model = onnx.load(str(path))
        props = {p.key: p.value for p in model.metadata_props}
        assert (props["input_layout"], props["input_dtype"]) == (layout, dtype)
        assert props["mean"] == ",".join(f"{m:g}" for m in r20_evaluator.workload.source.mean)
        assert dtype in model.doc_string and "std" in model.doc_string
    with pytest.raises(ConfigError, match="image_input 'rgb'"):
        export_onnx(r20_evaluator, plan, tmp_path / "x.onnx", image_input="rgb")


def test_decoded_weights_run_float_kernels_and_answer_as_the_integer_graph(r20_evaluator, r20_plans, tmp_path):
    """A weight-only plan: `weights="integer"` keeps every code behind a DequantizeLinear ORT runs on every call
    (and says so in one warning naming the fast form); `weights="decoded"` writes the same values as float32, so
    ORT runs plain float Convs, answering as the integer graph does."""
    plan = r20_plans["int4_per_channel"]
    with pytest.warns(UserWarning, match=r"20 layers read float inputs .*--weights decoded"):
        integer = export_onnx(r20_evaluator, plan, tmp_path / "int4.onnx", activations="none")
    assert integer.dequantized_per_call == 20 and integer.int4_layers == 20
    decoded = export_onnx(r20_evaluator, plan, tmp_path / "int4-decoded.onnx", activations="none", weights="decoded")
    assert decoded.decoded_layers == 20
    assert decoded.int4_layers == decoded.int8_layers == decoded.dequantized_per_call == 0
    ops = fused_op_counts(decoded.path)
    assert "DequantizeLinear" not in ops and ops.get("Conv", 0) + ops.get("FusedConv", 0) >= 19, ops
    x = r20_evaluator.workload.split("val").x.tensor()
    want = _torch_logits(r20_evaluator, plan, x).argmax(1)
    assert float((run_onnx(decoded.path, x).argmax(1) == want).mean()) >= 0.995
    assert float((run_onnx(decoded.path, x).argmax(1) == run_onnx(integer.path, x).argmax(1)).mean()) >= 0.995
    with pytest.raises(ConfigError, match="unknown weights 'float'; valid: integer, decoded"):
        export_onnx(r20_evaluator, plan, tmp_path / "bad.onnx", weights="float")
