"""Every registered latency engine passes the conformance suite (`modelopt.testing.engines`, parametrised over
the registry) on the real ResNet-20, for the float model and a W8A8 plan: the three shipped engines and the toy
engine of docs/export-and-latency.md, run as the docs write it. The suite rejects broken engines, and an engine
that cannot build a plan as deployed stops certification with its name instead of being checked elsewhere."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from modelopt._registry import Registry, named
from modelopt.api import build_compressors
from modelopt.certify.deployed import deployed_agreement
from modelopt.evaluation.evaluator import Evaluator
from modelopt.latency import ENGINES, ArrayDeployment, Engine, LatencySpec
from modelopt.latency.plan import PlanLatency
from modelopt.plan.space import SearchSpace
from modelopt.testing.engines import check_compiled, check_deployed, check_engine, check_registered

DOCS = Path(__file__).resolve().parents[2] / "docs" / "export-and-latency.md"
# What an engine's runtime needs beyond torch: without it the engine is skipped, not failed.
RUNTIMES = {"onnxruntime": ("onnx", "onnxruntime"), "openvino": ("onnx", "openvino")}


def _recipe() -> str:
    """The docs' toy engine: the first Python block of "Adding an engine"."""
    section = DOCS.read_text(encoding="utf-8").split("### Adding an engine", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, f"{DOCS.name}: 'Adding an engine' has no Python block"
    return found.group(1)


# Run as written, as a plugin author's module would be imported: it registers "toy" before the registry is read.
RECIPE: dict[str, object] = {"__name__": "toy_engine"}
exec(compile(_recipe(), str(DOCS), "exec"), RECIPE)  # the docs' block, as a user runs it
TOY: type[Engine] = ENGINES.get("toy")


@pytest.fixture(scope="session")
def ev(small_workload) -> Evaluator:
    """The small sample: certification checks the deployed plan on its whole test split (339 images, not 423), the
    W8A8 plan's input ranges come from its 169 calib images (not 256)."""
    options = {"quantize": {"bits": [8], "granularity": ["per_channel"], "activations": [None, 8],
                            "rounding": ["nearest"], "norm_images": 0}}
    return Evaluator(small_workload, SearchSpace(small_workload.layers, build_compressors(["quantize"], options)))


@pytest.fixture(scope="session")
def plans(ev):
    return [ev.space.plan(), ev.space.parse_plan({"default": {"quantize": {"bits": 8, "activations": 8}}})]


@pytest.fixture(scope="session")
def x(ev):
    return ev.workload.split("test").x.part(0, 64)


def _needs_runtime(name: str) -> None:
    for module in RUNTIMES.get(name, ()):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"engine {name!r} needs {module}, which is not installed")


def test_the_shipped_engines_and_the_docs_toy_are_registered() -> None:
    assert {"torch", "onnxruntime", "openvino", "toy"} <= set(ENGINES.names())
    assert TOY.__name__ == "Toy" and TOY.name == "toy"  # named by registering: the recipe never writes name


@pytest.mark.slow
@pytest.mark.parametrize("name", ENGINES.names())
def test_every_engine_passes_the_suite(ev, plans, x, name: str) -> None:
    _needs_runtime(name)
    check_engine(ENGINES.get(name), ev, plans, x)


@pytest.mark.parametrize("name", ENGINES.names())
def test_certification_asks_the_engine(ev, plans, name: str) -> None:
    """`certify.deployed` checks the W8A8 plan in the engine the run names (the deployed form answers as the run
    scored it on the whole test split), whichever engine that is: the toy too, which no name table knows."""
    _needs_runtime(name)
    timer = PlanLatency(ev, LatencySpec(name))
    assert deployed_agreement(timer, plans[1]) >= 0.95


# ---- an engine is named once, by registering --------------------------------------------------------------


def test_an_engine_is_named_by_registering_it() -> None:
    registry: Registry[type[Engine]] = Registry("latency engine", None, named("latency engine"))

    class Fast(TOY):
        pass

    registry.register("fast")(Fast)
    assert Fast.name == "fast" and registry.get("fast") is Fast
    check_registered(Fast, registry)

    class Misnamed(TOY):
        name = "quick"

    with pytest.raises(ValueError, match="says name = 'quick' but is registered as 'quicker'"):
        registry.register("quicker")(Misnamed)


# ---- an engine that does not build plans as deployed fails loudly ------------------------------------------


class Bare(Engine):
    """Times plans (as the toy does) but does not say how a plan deploys in it."""

    def compile(self, evaluator, plan, spec, precision=None):
        return TOY().compile(evaluator, plan, spec, precision)


Registry("latency engine", None, named("latency engine")).register("bare")(Bare)


def test_an_engine_without_deployed_stops_certification_naming_it(ev, plans) -> None:
    with pytest.raises(NotImplementedError, match=r"latency engine 'bare' \(Bare\).*implement Bare.deployed"):
        Bare().deployed(ev, plans[0])
    timer = PlanLatency(ev, LatencySpec("toy"))
    timer.engine = Bare()  # a run timing in it: its reported plan is never checked in another runtime
    with pytest.raises(NotImplementedError, match="'bare'"):
        deployed_agreement(timer, plans[0])


def test_a_run_refuses_an_engine_without_deployed_before_it_searches(ev) -> None:
    from modelopt.config.build import make_latency
    from modelopt.config.run_config import RunConfig
    from modelopt.errors import ConfigError

    class Unchecked(Bare):
        pass

    ENGINES.register("unchecked")(Unchecked)
    try:
        with pytest.raises(ConfigError, match=r"latency engine 'unchecked' does not build a plan as deployed "
                                              r"\(Unchecked.deployed\)"):
            make_latency(RunConfig(latency=LatencySpec("unchecked")), ev)
        assert make_latency(RunConfig(latency=LatencySpec("toy")), ev) is not None
    finally:
        ENGINES._items.pop("unchecked", None)


# ---- the suite itself must catch broken engines ------------------------------------------------------------


class _Wrong(TOY):
    """The toy with one part broken (`BROKEN`); unregistered, it keeps the toy's name."""


def _zeros(self, evaluator, plan):
    return ArrayDeployment(lambda rows: np.zeros((len(rows), 10), dtype=np.float32))  # every image: class 0


def _shuffled(self, evaluator, plan):
    good = TOY().deployed(evaluator, plan)  # as if the runtime read the images in another order
    return ArrayDeployment(lambda rows: good.run(rows[::-1]).numpy())


def _untimed(self, evaluator, plan, spec, precision=None):
    built = TOY().compile(evaluator, plan, spec, precision)
    timed = built.time
    built.time = lambda x: dataclasses.replace(timed(x), median_ms=0.0)
    return built


def _misnamed(self, evaluator, plan, spec, precision=None):
    built = TOY().compile(evaluator, plan, spec, precision)
    built.name = built.name.replace("toy/", "torch/")  # a figure that names another engine
    return built


def _wrong_answers(self, evaluator, plan, spec, precision=None):
    built = TOY().compile(evaluator, plan, spec, precision)
    built.run = lambda x: -type(built).run(built, x)  # the least likely class, everywhere
    return built


BROKEN = {
    "deployed-answers-class-0": (check_deployed, "deployed", _zeros),
    "deployed-reads-rows-out-of-order": (check_deployed, "deployed", _shuffled),
    "timed-at-zero-ms": (check_compiled, "compile", _untimed),
    "figure-names-another-engine": (check_compiled, "compile", _misnamed),
    "built-answers-wrong": (check_compiled, "compile", _wrong_answers),
}


@pytest.mark.parametrize("case", BROKEN)
def test_the_suite_rejects_a_broken_engine(ev, plans, x, case: str) -> None:
    check, attr, broken = BROKEN[case]
    check(TOY(), ev, plans[0], x)  # the unbroken toy passes
    wrong = type(f"Wrong_{attr}", (_Wrong,), {attr: broken})
    with pytest.raises(AssertionError):
        check(wrong(), ev, plans[0], x)


def test_the_suite_rejects_an_engine_registered_under_another_class() -> None:
    with pytest.raises(AssertionError, match="names Toy in the registry"):
        check_registered(_Wrong)
