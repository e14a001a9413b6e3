"""A run's plans in the engine it measures latency in: built once per plan, scored there when the engine's
answers can differ from the PyTorch simulation, timed once per distinct graph.

- ``torch`` on the CPU: the plan's deployable module (pruned channels removed, exits that return) in
  float32: the simulation itself, so plans are scored as always and only timed here.
- ``onnxruntime``, ``openvino`` (and ``torch`` on a GPU, in half precision): the engine computes something
  else than the simulation (integer kernels where the plan quantizes activations, half precision), so the
  run scores every plan in the engine (`modelopt.evaluation.scorer.Scorer.engine`): what it certifies is what
  deploys. Building a plan (export and the engine's compilation) is charged to the budget, in full val
  evaluations (its seconds over the seconds the engine takes for the float model on val), once per plan.

The metric's name carries the engine, device, precision and batch (`latency_backend`, e.g.
``onnxruntime/cpu/fp32/b1``), so numbers from different runtimes are never compared as one.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

import torch

from modelopt.data.split import Split
from modelopt.errors import ConfigError, TrialError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.latency.cost_model import LatencyModel, routes
from modelopt.latency.engine import ENGINES, Compiled
from modelopt.latency.measure import Latency
from modelopt.latency.spec import LatencySpec
from modelopt.model.images import Images, as_tensor
from modelopt.plan.plan import Plan

__all__ = ["PlanLatency"]

log = logging.getLogger(__name__)

# Images an engine answers at a time: a multiple of every engine's own batch (256), so the batches it runs, and
# its answers, are those of one call on the whole split.
_ANSWER_ROWS = 1024
KEEP_BUILT = 4  # plans kept built: a trial's, and the plans confirmation and the test re-scoring come back to
# Val images a timing reads, at least 8 batches' worth: the ONNX engines time these (`pattern_latency`), torch its first
# batch, or these in batches for a plan whose work depends on its input. Only these are prepared: at 224 pixels the
# whole split, decoded and normalised for every timing, was gigabytes.
TIMING_IMAGES = 256


class PlanLatency:
    """Builds, scores with and times a run's plans in its engine.

    Example:
        >>> lat = PlanLatency(evaluator, LatencySpec("onnxruntime", batch_size=64))
        >>> lat.measure(plan).median_ms, lat.reference().median_ms
        >>> lat.logits(plan, x)            # the engine's answers
    """

    def __init__(self, evaluator: Evaluator, spec: LatencySpec | None = None) -> None:
        self.evaluator = evaluator
        self.spec = spec or LatencySpec()
        self.engine = ENGINES.get(self.spec.backend)()
        self.device = self.engine.device(evaluator)
        self.scores = self.engine.scores_on(evaluator)  # the run scores its plans here
        self._built: OrderedDict[str, Compiled] = OrderedDict()
        self._timed: dict[str, Latency] = {}  # by graph (`Compiled.key`)
        self._graph_of: dict[str, str] = {}  # plan key -> its graph's key
        self._charged: set[str] = set()
        self._val_seconds: float | None = None
        self.model = LatencyModel(evaluator.space)  # fitted on every plan measured (`measure`)

    @property
    def name(self) -> str:
        return self.spec.name(self.device, self.engine.precision(self.evaluator))

    def compiled(self, plan: Plan | Realised) -> Compiled:
        """The plan as the engine runs it (a plan as composed, or a `Realised` record; built on first use, kept by
        the record's key: the last `KEEP_BUILT` are kept).

        Raises:
            ConfigError: the engine cannot build it (one line naming the layer and the engine's limit).
        """
        if plan.key in self._built:
            self._built.move_to_end(plan.key)
            return self._built[plan.key]
        built = self.engine.compile(self.evaluator, self.evaluator.realise(plan), self.spec)
        self._built[plan.key] = built
        while len(self._built) > KEEP_BUILT:
            self._built.popitem(last=False)
        return built

    def reference(self) -> Latency:
        """The uncompressed model's latency, measured the same way."""
        return self.measure(self.evaluator.space.plan())

    def measure(self, plan: Plan | Realised) -> Latency:
        """The plan's median batch latency (plans that build to the same graph share one measurement)."""
        key = self._graph_of.get(plan.key)
        if key is None or key not in self._timed:  # a plan timed before is not built again to find its graph
            built = self.compiled(plan)
            key = self._graph_of[plan.key] = built.key
            if key not in self._timed:
                self._timed[key] = built.time(self._timing_rows())
        latency = self._timed[key]
        self.model.observe(_plan(plan), latency.median_ms)
        return latency

    def retime(self, plans: list[Plan | Realised]) -> None:
        """Times the float model and `plans` once more, back to back, each keeping the faster of its two figures:
        on a shared machine a burst of steal can outlast every round of one measurement (measured:
        docs/export-and-latency.md#measured), and the figures a run reports are these."""
        x = self._timing_rows()
        for plan in {p.key: p for p in [self.evaluator.space.plan(), *plans]}.values():
            first = self.measure(plan)
            again = self.compiled(plan).time(x)
            if again.median_ms < first.median_ms:
                self._timed[self._graph_of[plan.key]] = again

    def priors(self) -> None:
        """The strategies' per-choice latency estimates (`ChoiceFeatures.latency`), from the latency model fitted
        on the no-search plans (float, and each uniform anchor the menus offer), measured here; building them
        is charged when they are scored (they are the run's first trials). When the menus offer exits, the last
        anchor with one exit is measured too (the exit whose leavers skip the most), so an exit's fixed cost is
        known before a rollout turns exits on; it is no trial, so building it is charged as a preparation."""
        space = self.evaluator.space
        plans = list(dict.fromkeys((space.plan(), *space.anchors((8,)), *space.anchors((8,), act_bits=8))))
        for plan in plans:
            try:
                self.measure(plan)
            except ConfigError as exc:  # the engine cannot build it: the search learns that from the trial
                log.info("latency priors: %s", exc)
        with_exit = self._with_one_exit(plans[-1])
        if with_exit is not None:
            try:
                self.measure(with_exit)
                self.evaluator.add_pre_pass("exit_latency", self.cost(with_exit))
            except (ConfigError, TrialError) as exc:
                log.info("latency priors: %s", exc)
        self.model.apply()

    def _with_one_exit(self, plan: Plan) -> Plan | None:
        """`plan` with the one exit choice whose leavers are expected to skip the most MACs; None without exits."""
        space = self.evaluator.space
        best: tuple[float, str, object] | None = None
        for d in space.decisions:
            if not routes(space, d.name):
                continue
            layer = space.layers[d.layer]
            for c, f in zip(d.choices, space.features[d.name], strict=True):
                if c is not None and (best is None or layer.macs - f.macs > best[0]):
                    best = (layer.macs - f.macs, d.name, c)
        if best is None:
            return None
        return space.plan({**{d.name: plan.get(d.name) for d in space.decisions}, best[1]: best[2]})

    def float_references(self) -> dict[str, Latency]:
        """The float model timed in the engine's other precisions (`Engine.float_references`), by figure name:
        beside `reference()` (its default), so a speed-up against either reads from the run."""
        plan = self.evaluator.space.plan()
        out = {}
        for precision in self.engine.float_references():
            built = self.engine.compile(self.evaluator, self.evaluator.realise(plan), self.spec, precision)
            if built.key + precision not in self._timed:
                self._timed[built.key + precision] = built.time(self._timing_rows())
            out[built.name] = self._timed[built.key + precision]
        return out

    def answers(self, plan: Plan | Realised, x: torch.Tensor | Images) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The engine's logits for `plan` on `x` and, with exits, where each sample left; TrialError when the
        logits are not finite."""
        built = self.compiled(plan)
        parts = [built.answers(x[i : i + _ANSWER_ROWS]) for i in range(0, len(x), _ANSWER_ROWS)]
        out = torch.cat([p[0] for p in parts])
        exit_at = None if parts[0][1] is None else torch.cat([p[1] for p in parts if p[1] is not None])
        if not torch.isfinite(out).all():
            raise TrialError(f"plan {_plan(plan).key} gives non-finite outputs in {self.engine.name}")
        return out, exit_at

    def cost(self, plan: Plan | Realised) -> float:
        """Budget building `plan` costs now, in full val evaluations: its seconds over the seconds the engine
        takes to score the float model on val (measured once); 0 after the first time."""
        if plan.key in self._charged:
            return 0.0
        built = self.compiled(plan)
        self._charged.add(plan.key)
        return built.seconds / self._val_pass_seconds()

    def _timing_rows(self) -> torch.Tensor:
        """The first val images a timing reads (`TIMING_IMAGES`, or 8 batches when more), prepared."""
        x = self.evaluator.workload.split(Split.VAL).x
        return as_tensor(x.part(0, min(len(x), max(TIMING_IMAGES, 8 * self.spec.batch_size))))

    def _val_pass_seconds(self) -> float:
        if self._val_seconds is None:
            reference = self.compiled(self.evaluator.space.plan())
            t0 = time.perf_counter()
            reference.run(as_tensor(self.evaluator.workload.split(Split.VAL).x))
            self._val_seconds = max(time.perf_counter() - t0, 1e-3)
        return self._val_seconds


def _plan(plan: Plan | Realised) -> Plan:
    return plan.plan if isinstance(plan, Realised) else plan
