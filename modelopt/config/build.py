"""A run's parts from its settings: the workload, search space, evaluator, objective and strategy.

`RunConfig` is data; this is where it becomes a run. `modelopt.run` (the runner, resume, export),
the Ray workers (`modelopt.executors`), reports and sweeps build a run, or rebuild one from its folder,
through these functions and nowhere else.

Example:
    >>> built = build(RunConfig(budget=50, seed=1))   # loads ResNet-20 and the bundled sample
    >>> (plan,) = built.strategy.ask()
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from modelopt.certify.evidence import can_certify, evidence_lines
from modelopt.compressors import Compressor
from modelopt.config.assemble import DEFAULT_BUDGET, build_compressors, default_compressors
from modelopt.config.run_config import RunConfig
from modelopt.data.dataset import load_data
from modelopt.data.split import Split
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.output_sensitivity import PROBE_TIME_SHARE, output_losses, probe_images
from modelopt.evaluation.priors import measure_errors
from modelopt.evaluation.sensitivity import estimate_losses
from modelopt.knowledge import warm_start
from modelopt.latency.engine import Engine
from modelopt.latency.plan import PlanLatency
from modelopt.model.layers import Layer
from modelopt.model.loader import load_model, read_with
from modelopt.model.workload import Workload, check_head
from modelopt.objective import Objective, Target
from modelopt.plan.space import SearchSpace
from modelopt.search import STRATEGIES, Strategy

__all__ = ["BuiltRun", "build", "compressor_names", "load_workload", "make_compressors", "make_evaluator",
           "make_latency", "make_objective", "make_space", "resolve"]


@dataclass(frozen=True)
class BuiltRun:
    """A run's parts, from `build`; `config` is resolved (menus in full, device, fingerprints)."""

    config: RunConfig
    workload: Workload
    evaluator: Evaluator
    strategy: Strategy
    objective: Objective
    latency: PlanLatency | None = None  # where latency is measured (and plans scored, for some engines)
    evidence: tuple[str, ...] = ()  # what the splits can certify, printed before the search (`evidence_lines`)

    @property
    def space(self) -> SearchSpace:
        return self.evaluator.space


def load_workload(config: RunConfig, *, allow_pickle: bool = False) -> Workload:
    """Loads the model and data and puts both, with the float predictions, on the device."""
    given = config.preprocess
    model, prep = read_with(load_model(config.model, config.weights, allow_pickle=allow_pickle), given)
    check_head(model, config.data)  # before the images are decoded
    wl = Workload(model, load_data(config.data, seed=config.data_seed, unlabeled=config.unlabeled, preprocess=prep),
                  device=config.device)
    by = "--resize/--crop" if given.active else "the weights' authors" if prep.active else "as stored"
    wl.read_as = {"resize": prep.resize, "crop": prep.crop,
                  "interpolation": prep.interpolation if prep.active else None,
                  "mean": list(model.mean), "std": list(model.std), "by": by}
    return wl


def compressor_names(config: RunConfig, model: nn.Module | None) -> tuple[str, ...]:
    """The compressors the run uses: the named ones, else those that can lower the objective on `model`."""
    if config.compressors is not None:
        return config.compressors
    if model is None:
        raise ConfigError("a RunConfig without compressors needs the model to choose them")
    return tuple(default_compressors(config.objective, model))


def make_compressors(config: RunConfig, model: nn.Module | None = None) -> list[Compressor]:
    """The run's compressors with their options (options derived from `model` fill what `options` leave out)."""
    names = compressor_names(config, model)
    return build_compressors(names, {n: o for n, o in config.options.items() if n in names}, model=model)


def make_space(config: RunConfig, layers: Sequence[Layer], model: nn.Module | None = None) -> SearchSpace:
    return SearchSpace(layers, make_compressors(config, model))


def make_evaluator(config: RunConfig, workload: Workload) -> Evaluator:
    """An evaluator of the run's space on `workload`. A run that minimises latency in an engine that computes
    something else than the PyTorch simulation (integer kernels, half precision) scores its plans there
    (`modelopt.latency.plan.PlanLatency`): it certifies what deploys. Other runs score in the simulation, and
    the plan they report is checked against the engine at the end (`modelopt.certify.deployed`)."""
    evaluator = Evaluator(workload, make_space(config, workload.layers, workload.model))
    if config.latency is not None and config.objective == Target.LATENCY.value:
        timer = _checked(PlanLatency(evaluator, config.latency))
        if timer.scores:
            evaluator.score_in(timer)
    return evaluator


def make_latency(config: RunConfig, evaluator: Evaluator) -> PlanLatency | None:
    """Where the run measures latency: the engine its plans are scored in, else a new one (None: nowhere)."""
    if isinstance(evaluator.engine, PlanLatency):
        return evaluator.engine
    return None if config.latency is None else _checked(PlanLatency(evaluator, config.latency))


def _checked(timer: PlanLatency) -> PlanLatency:
    """`timer`, whose engine can build the plan a run reports as deployed (`Engine.deployed`): one that cannot is
    refused before the search, not after it at certification."""
    if type(timer.engine).deployed is Engine.deployed:
        name = getattr(timer.engine, "name", type(timer.engine).__name__)
        raise ConfigError(f"latency engine {name!r} does not build a plan as deployed ({type(timer.engine).__name__}"
                          f".deployed), so the plan a run reports could not be checked in it; pick another --latency")
    return timer


def make_objective(config: RunConfig, workload: Workload) -> Objective:
    """The run's objective on `workload`: its search bounds are taken at the size of the confirm split
    (`Objective.claim_images`) when that split can certify the floor."""
    objective = config.make_objective()
    if Split.CONFIRM not in workload.splits or config.confidence <= 0:
        return objective
    usable = can_certify(workload, Split.CONFIRM, config.confidence, min(objective.curve))
    return dataclasses.replace(objective, claim_images=len(workload.split(Split.CONFIRM))) if usable else objective


def resolve(config: RunConfig, workload: Workload, space: SearchSpace) -> RunConfig:
    """`config` as run on `workload`: compressor menus in full, the device and fingerprints named."""
    return dataclasses.replace(
        config, model=workload.name, data=str(workload.data.source), device=str(workload.device),
        compressors=tuple(space.compressors),
        options={name: c.opts for name, c in space.compressors.items()},
        fingerprints=workload.fingerprints(), read_as=workload.read_as or config.read_as)


def build(config: RunConfig, workload: Workload | None = None, *, allow_pickle: bool = False) -> BuiltRun:
    """The run's parts: `workload` (loaded from `config.model` and `config.data` when None), space,
    evaluator, and the strategy (after the priors it starts from are measured).

    A given workload is the caller's word that it is this config's model, data and device.

    Raises:
        ConfigError: the val split is too small to certify the floor (before any work).
    """
    wl = workload if workload is not None else load_workload(config, allow_pickle=allow_pickle)
    evaluator = make_evaluator(config, wl)
    if not evaluator.space.decisions:  # e.g. a channel multiple no group's kept channels can meet
        settings = "; ".join(f"{name}: " + ", ".join(f"{k}={v}" for k, v in c.options().items() if k != "version")
                             for name, c in evaluator.space.compressors.items())
        raise ConfigError(f"nothing to search: no layer of {wl.name} offers a choice under these settings "
                          f"({settings}); widen them (more bit widths, sparsities or kinds, a smaller channel "
                          "multiple)")
    objective = make_objective(config, wl)
    said = evidence_lines(wl, objective)  # a val split too small to certify the floor: refused before any work
    measure_errors(evaluator)  # data-free priors the strategies start from; costs no evaluation
    latency = make_latency(config, evaluator)
    if latency is not None and objective.target is Target.LATENCY:
        latency.priors()  # per-choice latency estimates, from the anchors measured in the run's engine
    strategy = STRATEGIES.get(config.strategy)(evaluator.space, objective.search, seed=config.seed)
    strategy.use_floors(objective.curve)  # a curve run's floors, for a strategy that works towards each
    if strategy.loss_estimator == "fisher":  # the knapsack's one-pass (gradient) sensitivities
        strategy.use_loss_estimates(estimate_losses(evaluator))
    elif strategy.loss_estimator == "output" and (n := probe_images(
            config.budget if config.budget < math.inf else DEFAULT_BUDGET,  # a timed run's open budget: the default's
            len(wl.split(Split.VAL)),
            len({d.layer for d in evaluator.space.decisions}),
            len(wl.split(Split.CALIB)))):  # MCTS's label-free probes, when the budget affords them
        # A timed run gives the probes a share of its time: a short run keeps the data-free prior instead.
        seconds = None if config.time is None else PROBE_TIME_SHARE * config.time
        if estimates := output_losses(evaluator, n, seconds):
            strategy.use_loss_estimates(estimates)
    if config.knowledge is not None:  # priors from earlier runs' lessons (a missing store: none yet)
        warm_start(config.knowledge, evaluator, strategy)
    return BuiltRun(resolve(config, wl, evaluator.space), wl, evaluator, strategy, objective, latency, said)
