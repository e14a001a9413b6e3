"""The evaluator's routing part: where each sample leaves a plan's forward pass.

A compressor whose choices let samples leave early (early exit) has the `Routes` capability and offers a
`Routing` through `Routes.routing`; this part hands it the plan's choices on that compressor's decisions, charges the
one-time preparations it reports once per run, and turns where samples left into the share of samples
each layer saw (`reach`, for MACs and bitops). A space whose compressors route nothing has no routing,
and every sample runs the whole network.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from modelopt.compressors.contract import ExitTap, Route, Routes, Routing
from modelopt.errors import ConfigError
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.model.images import Images
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

__all__ = ["PlanRoutes"]


class PlanRoutes:
    """A plan's routing, for one evaluator's workload and space.

    Args:
        workload: The resident model and splits.
        space: Its decisions; a compressor offering a `Routing` routes through its own.
        one_time: Where one-time preparations are charged (shared with the evaluator's other parts).

    Example:
        >>> routes = PlanRoutes(wl, space, OneTimeCosts())
        >>> route, cost = routes.setup(plan)
        >>> pred, exit_at = routes.predict(route, x)      # with the plan's weights in place
    """

    def __init__(self, workload: Workload, space: SearchSpace, one_time: OneTimeCosts) -> None:
        self.workload, self.space, self.one_time = workload, space, one_time
        self.routing: Routing | None = None
        self.owner: str | None = None  # the compressor whose routing it is
        self.decisions: tuple[str, ...] = ()  # decision names of the routing compressor, in space order
        for name, comp in space.compressors.items():
            if not isinstance(comp, Routes):
                continue
            decisions = [d for d in space.decisions if d.compressor == name]
            routing = comp.routing(workload, [(d.layer, d.choices) for d in decisions])
            if routing is None:
                continue
            if self.routing is not None:
                raise ConfigError(f"compressors {self.owner!r} and {name!r} both route samples; a run may use one")
            self.routing, self.decisions, self.owner = routing, tuple(d.name for d in decisions), name

    def route(self, plan: Plan) -> Route | None:
        """The plan's route; None when every sample runs the whole network."""
        if self.routing is None:
            return None
        return self.routing.route({self.space.decision(n).layer: plan.get(n) for n in self.decisions})

    def setup(self, plan: Plan) -> tuple[Route | None, float]:
        """The plan's route and the budget to charge its trial: the routing's preparations (heads' fit,
        priors' val pass), each to the run's first trial that needs it (`OneTimeCosts`)."""
        route = self.route(plan)
        if self.routing is None:
            return route, 0.0
        return route, sum(self.one_time.charge(k, c) for k, c in self.routing.prepare(route).items())

    def one_time_keys(self, plan: Plan) -> set[str]:
        """The one-time preparations a trial of `plan` is charged for, when first."""
        return set() if self.routing is None else self.routing.one_time_keys(self.route(plan))

    def predict(self, route: Route, x: Images) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictions for `x` with the plan's weights in place, and the exit each sample left at."""
        assert self.routing is not None, "a route comes from a routing"
        return self.routing.predict(self.workload.logits, x, route)

    def reach(self, route: Route, exit_at: torch.Tensor) -> tuple[dict[str, float], float, float]:
        """Per layer, the share of samples that ran it; the mean MACs per sample the route adds; and the share
        of samples that left before the end."""
        assert self.routing is not None, "a route comes from a routing"
        r = self.routing
        return r.reach(route, exit_at), r.extra_macs(route, exit_at), r.left_early(route, exit_at)

    def priors(self) -> None:
        """The routing's priors (MACs saved, expected loss per choice) in the space's features."""
        if self.routing is None:
            return
        per_layer = self.routing.priors()
        for name in self.decisions:
            d = self.space.decision(name)
            given = per_layer.get(d.layer)
            if given is None:
                continue
            self.space.features[name] = tuple(
                f if p is None else dataclasses.replace(f, macs=round(f.macs - p[0]), error=p[1])
                for f, p in zip(self.space.features[name], given, strict=True))

    def refuse_static(self, plan: Plan, what: str, instead: str) -> None:
        """Raises ConfigError, naming the plan's route, when the plan routes samples and `what` (e.g. "an ONNX
        export") runs a graph without data-dependent returns; `instead`: what the user can do."""
        route = self.route(plan)
        if route is None or self.routing is None:
            return
        raise ConfigError(f"this plan's {self.owner} route ({self.routing.describe(route)}) cannot run in {what} (a "
                          f"graph has no data-dependent return); {instead}")

    def taps(self, model: nn.Module, plan: Plan) -> list[ExitTap]:
        """Where the plan's samples may leave `model` (its physical model), in order: none without a route."""
        route = self.route(plan)
        return [] if route is None or self.routing is None else self.routing.taps(model, route)

    def deployable(self, model: nn.Module, plan: Plan) -> nn.Module:
        """`model` as the plan deploys it: routed when the plan has a route."""
        route = self.route(plan)
        return model if route is None or self.routing is None else self.routing.deployable(model, route)
