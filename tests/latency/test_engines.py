"""The latency engines (torch, onnxruntime, openvino) on the real ResNet-20: each builds a plan, runs it with
the answers the PyTorch simulation gives (integer kernels aside), times it with its name, shares a
measurement between plans that build to the same graph, and names the layer it cannot build. How fast each
engine runs is for benchmarks/engine_latency.py to show, not a timed unit test."""

from __future__ import annotations

import pytest
import torch

from modelopt.api import build_compressors
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.latency import ENGINES, LatencySpec
from modelopt.latency.plan import PlanLatency
from modelopt.plan.space import SearchSpace

ONNX_ENGINES = ("onnxruntime", "openvino")


@pytest.fixture(scope="session")
def ev(small_workload) -> Evaluator:
    """The small sample (169 calib, 169 val images): an ONNX engine times a plan over up to 256 val images, ten
    rounds each, and these tests check what is built, answered and named, not how fast. GPTQ's input moments and
    the inputs' ranges on 64 calib images: the codes differ from nearest ones all the same."""
    options = {"quantize": {"bits": [8, 4], "granularity": ["per_channel", "group"], "rounding": ["nearest", "gptq"],
                            "activations": [None, 8], "norm_images": 0, "calib_images": 64,
                            "act_calibration_images": 64}}
    return Evaluator(small_workload, SearchSpace(small_workload.layers, build_compressors(["quantize"], options)))


def _plan(ev: Evaluator, **quantize: object):
    return ev.space.parse_plan({"default": {"quantize": quantize}})


def _agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.argmax(1) == b.argmax(1)).double().mean())


def test_the_engines_are_registered() -> None:
    assert {"torch", "onnxruntime", "openvino"} <= set(ENGINES.names())
    assert all(ENGINES.get(name).name == name for name in ENGINES.names())  # named by registering


@pytest.mark.parametrize("engine", ["torch", *ONNX_ENGINES])
def test_an_engine_runs_a_plan_as_scored_and_times_it(ev, engine: str) -> None:
    pytest.importorskip("openvino" if engine == "openvino" else "torch")
    spec = LatencySpec(engine, batch_size=4, threads=1, warmup=1, repeats=3)
    x = ev.workload.split("val").x[:128]
    precision = "f32" if engine == "openvino" else None  # its default may be bf16: answers near, not equal
    for plan, floor in ((ev.space.plan(), 1.0), (_plan(ev, bits=8), 1.0), (_plan(ev, bits=8, activations=8), 0.98)):
        built = ENGINES.get(engine)().compile(ev, plan, spec, precision)
        assert _agreement(built.run(x), ev.states.logits(plan, x)) >= floor  # integer kernels: near, not equal
        latency = built.time(x[:32])  # the ONNX engines: ten rounds over 8 batches of 4, not 32
        assert latency.median_ms > 0 and latency.batch_size == 4 and latency.threads == 1
    assert built.name == f"{engine}/cpu/fp32/b4"


def test_openvino_runs_and_names_its_default_precision(ev) -> None:
    """A plan runs in OpenVINO's default precision on this CPU (what a user's plain compile_model gets), named in
    the figure; the float model is also timed at f32 when that default is lower."""
    pytest.importorskip("openvino")
    from modelopt.latency.engine_onnx import default_precision

    engine = ENGINES.get("openvino")()
    built = engine.compile(ev, ev.space.plan(), LatencySpec("openvino", batch_size=2, warmup=1, repeats=3))
    x = ev.workload.split("val").x[:256]
    assert _agreement(built.run(x), ev.states.logits(ev.space.plan(), x)) >= 0.97
    expected = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}[default_precision()]
    assert built.name == f"openvino/cpu/{expected}/b2" == PlanLatency(ev, LatencySpec("openvino", batch_size=2)).name
    assert engine.float_references() == (() if expected == "fp32" else ("f32",))


@pytest.mark.slow
def test_plans_that_build_to_one_graph_share_a_measurement(ev) -> None:
    timer = PlanLatency(ev, LatencySpec("onnxruntime", batch_size=1, warmup=1, repeats=3))
    nearest, gptq = _plan(ev, bits=8, rounding="nearest"), _plan(ev, bits=8, rounding="gptq")
    assert nearest.key != gptq.key
    assert timer.compiled(nearest).key == timer.compiled(gptq).key  # other codes, the same graph
    assert timer.measure(nearest) is timer.measure(gptq)
    assert timer.compiled(nearest).key != timer.compiled(_plan(ev, bits=8, activations=8)).key


def test_an_engine_that_cannot_build_a_plan_names_the_layer(ev) -> None:
    pytest.importorskip("openvino")
    # OpenVINO's blocked DequantizeLinear needs the fan-in to divide into groups: layer2.1.conv1's 288 does not.
    plan = ev.space.parse_plan({"default": {"quantize": {"bits": 8}},
                                "layers": {"layer2.1.conv1": {"quantize": {"bits": 4, "granularity": "group"}}}})
    with pytest.raises(ConfigError) as info:
        ENGINES.get("openvino")().compile(ev, plan, LatencySpec("openvino"))
    message = str(info.value)
    assert message.startswith("openvino cannot build layer 'layer2.1.conv1': ") and "block_size" in message
    assert "\n" not in message


def test_a_graph_engine_scores_the_run_and_charges_its_builds(ev, tmp_path) -> None:
    """With ONNX Runtime as the latency engine, the run's plans are scored there: a W8A8 plan's val answers are
    the engine's, building each plan is charged once, and the timer is the scorer's."""
    from modelopt.config.build import make_evaluator, make_latency
    from modelopt.config.run_config import RunConfig

    config = RunConfig(compressors=("quantize",), latency=LatencySpec("onnxruntime", warmup=1, repeats=3),
                       objective="latency").replace(rounding=["nearest"])
    evaluator = make_evaluator(config, ev.workload)
    timer = make_latency(config, evaluator)
    assert timer is not None and evaluator.scorer.engine is timer
    plan = evaluator.space.parse_plan({"default": {"quantize": {"bits": 8, "activations": 8}}})
    first = evaluator.scorer.evaluate(plan, split="val")
    x = evaluator.workload.split("val").x.tensor()
    engine_right = (timer.answers(plan, x)[0].argmax(1) == evaluator.workload.split("val").y).double().mean()
    assert first.accuracy == pytest.approx(float(engine_right))
    assert first.prep_cost > 0  # its build, charged
    assert evaluator.scorer.evaluate(plan, split="test").prep_cost == 0.0  # once


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_torch_engine_on_cuda_runs_half_precision_through_a_cuda_graph() -> None:
    """On a GPU the torch engine runs the deployable module in half precision (timed as one CUDA-graph replay
    per batch), scores the run's plans there, names the precision, and deploys the plan as it scores it."""
    from modelopt.api import build_workload

    wl = build_workload("cifar10_resnet20", "cifar10-exact-sample", device="cuda")
    options = {"quantize": {"bits": [8, 4], "rounding": ["nearest"], "norm_images": 0}}
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize"], options)))
    timer = PlanLatency(ev, LatencySpec("torch", batch_size=64, warmup=2, repeats=5))
    assert timer.scores and timer.name == "torch/cuda/fp16/b64"
    plan = _plan(ev, bits=8)
    x = wl.split("val").x.tensor()
    assert _agreement(timer.answers(plan, x)[0].cpu(), ev.states.logits(plan, x).cpu()) >= 0.99
    assert timer.measure(plan).median_ms > 0 and timer.measure(ev.space.plan()).median_ms > 0
    # As deployed (what certification checks): the module in half precision too, answering as scored.
    assert _agreement(timer.engine.deployed(ev, plan).run(x), timer.answers(plan, x)[0].cpu()) >= 0.99
