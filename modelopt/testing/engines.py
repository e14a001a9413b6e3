"""Conformance checks every registered latency engine must pass, on a real workload and plans the caller picks
(the float model and a plan with integer kernels, say).

Each check raises AssertionError naming the engine, the plan and what broke the contract: the engine is named by
registering; it builds a plan, answers as the plan was scored and times it with a figure named as its runs
name it; and the plan as a user deploys it (`Engine.deployed`) answers as scored, whatever form the images
come in. Optuna's `testing/pytest_samplers.py` runs one suite over every registered sampler; this is that
suite for engines.

Example:
    >>> from modelopt.testing.engines import check_engine
    >>> x = evaluator.workload.split("test").x.part(0, 64)
    >>> check_engine(ENGINES.get("tensorrt"), evaluator, [evaluator.space.plan(), w8a8], x)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from modelopt._registry import Registry
from modelopt.evaluation.evaluator import Evaluator
from modelopt.latency.engine import ENGINES, Deployment, Engine
from modelopt.latency.spec import LatencySpec
from modelopt.model.images import Images, as_tensor
from modelopt.plan.plan import Plan

__all__ = ["check_compiled", "check_deployed", "check_engine", "check_registered", "timing_spec"]

# Agreement of top-1 answers an engine must reach on the images it is checked on: integer kernels and half
# precision move a few images near a tie, a wrong graph or input layout moves most of them.
FLOOR = 0.95


def _where(engine: Engine, plan: Plan) -> str:
    return f"engine {engine.name!r} on plan {plan.key}"


def _agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.cpu() == b.cpu()).double().mean())


def timing_spec(engine: Engine) -> LatencySpec:
    """A short measurement (batch 2, one thread, few repeats): the checks are of the contract, not of speed."""
    return LatencySpec(engine.name, batch_size=2, threads=1, warmup=1, repeats=3)


def check_registered(cls: type[Engine], registry: Registry[type[Engine]] = ENGINES) -> None:
    """The engine's name is the one it registers under: the registry gives the class back by it."""
    name = getattr(cls, "name", None)
    assert isinstance(name, str) and name, f"{cls.__name__} has no name: register it (ENGINES.register('...'))"
    assert name in registry.names(), f"{cls.__name__}.name {name!r} is not a registered engine"
    found = registry.get(name)
    assert found is cls, f"{name!r} names {found.__name__} in the registry, not {cls.__name__}"


def check_compiled(engine: Engine, evaluator: Evaluator, plan: Plan, x: Images, floor: float = FLOOR) -> torch.Tensor:
    """The plan built for timing (`compile`): a figure named as its runs name it (engine/device/precision/batch,
    as `PlanLatency.name`), a structure key, one row of finite float32 logits per image on the CPU with the
    top-1 the simulation scores (exits and all) on at least `floor` of the images, and a time in positive
    finite milliseconds at the spec's batch and threads. Returns the built plan's top-1 (the run's scored
    answers where the engine scores plans)."""
    spec = timing_spec(engine)
    built = engine.compile(evaluator, evaluator.realise(plan), spec)
    where = _where(engine, plan)
    expected = spec.name(engine.device(evaluator), engine.precision(evaluator))
    assert built.name == expected, f"{where}: its figure is named {built.name!r}, not {expected!r}"
    assert isinstance(built.key, str) and built.key, f"{where}: the built plan has no structure key"
    assert built.seconds >= 0, f"{where}: building took {built.seconds} s"
    logits = built.answers(as_tensor(x))[0]
    _check_logits(logits, len(x), f"{where}: compile(...).answers")
    got = _agreement(logits.argmax(1), evaluator.answers_on(plan, x)[0])
    assert got >= floor, f"{where}: built, it gives the simulated top-1 on {got:.1%} of images (< {floor:.0%})"
    latency = built.time(as_tensor(x))
    assert math.isfinite(latency.median_ms) and latency.median_ms > 0, f"{where}: timed at {latency.median_ms} ms"
    assert (latency.batch_size, latency.threads) == (spec.batch_size, spec.threads), (
        f"{where}: timed at batch {latency.batch_size}, {latency.threads} threads; the spec says batch "
        f"{spec.batch_size}, {spec.threads} threads")
    return logits.argmax(1)


def check_deployed(engine: Engine, evaluator: Evaluator, plan: Plan, x: Images, floor: float = FLOOR,
                   scored: torch.Tensor | None = None) -> None:
    """The plan as deployed (`Engine.deployed`) gives the top-1 the run scored on at least `floor` of the images,
    and the same answers whether the images come as a split's `Images`, a tensor or a numpy array.

    Args:
        scored: The run's scored top-1 on `x` where the engine scores plans (its built plan's answers); None:
            the simulation's, exits and all.
    """
    where = _where(engine, plan)
    deployment = engine.deployed(evaluator, evaluator.realise(plan))
    assert isinstance(deployment, Deployment), (
        f"{where}: deployed(...) returned {type(deployment).__name__}, not a Deployment")
    logits = deployment.run(x)
    _check_logits(logits, len(x), f"{where}: deployed(...).run")
    if scored is None:
        scored = evaluator.answers_on(plan, x)[0]
    got = _agreement(logits.argmax(1), scored)
    assert got >= floor, f"{where}: deployed, it gives the scored top-1 on {got:.1%} of images (< {floor:.0%})"
    tensor = as_tensor(x)
    for form, rows in (("a tensor", tensor), ("a numpy array", tensor.cpu().numpy())):
        again = deployment.run(rows)
        _check_logits(again, len(x), f"{where}: deployed(...).run on {form}")
        assert _agreement(again.argmax(1), logits.argmax(1)) >= floor, f"{where}: deployed, it answers {form} otherwise"


def _check_logits(logits: object, n: int, where: str) -> None:
    assert isinstance(logits, torch.Tensor), f"{where} returned {type(logits).__name__}, not a tensor"
    assert logits.ndim == 2 and logits.shape[0] == n, f"{where}: logits of shape {tuple(logits.shape)} for {n} images"
    assert logits.dtype == torch.float32 and logits.device.type == "cpu", (
        f"{where}: logits are {logits.dtype} on {logits.device}, not float32 on the CPU")
    assert bool(torch.isfinite(logits).all()), f"{where}: non-finite logits"


def check_engine(cls: type[Engine], evaluator: Evaluator, plans: Sequence[Plan], x: Images, floor: float = FLOOR,
                 registry: Registry[type[Engine]] = ENGINES) -> None:
    """Runs every check: the registration, then each plan built, run, timed, and built as deployed.

    Args:
        cls: The engine under test, as registered.
        evaluator: Scores `plans` on a workload (its model is what the engine builds).
        plans: Plans to try: the float model and one with integer kernels, at least.
        x: A few images of the workload (normalised, as the model reads them).
        floor: The share of images on which the engine's answers must give the scored top-1.
        registry: Where the engine is registered.
    """
    check_registered(cls, registry)
    engine = cls()
    assert len(x) > 0 and plans, "check_engine needs images and plans"
    for plan in plans:
        top1 = check_compiled(engine, evaluator, plan, x, floor)
        # A run that times plans in an engine whose answers differ scores them there: those are its certified ones.
        check_deployed(engine, evaluator, plan, x, floor, top1 if engine.scores_on(evaluator) else None)
