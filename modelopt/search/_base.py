"""The strategy plugin surface: ask for plans, tell results, save and restore state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace


class Strategy(ABC):
    """A search strategy. It never touches models: it sees plans and their trials.

    `tell` must accept trials of plans it did not ask for (a resumed run tells
    trials that finished after the last saved state; a warm start tells old ones).
    `state_dict` must be JSON-serialisable.

    Args:
        space: the decisions and their choices.
        objective: what the rewards mean (strategies may read the retention floor).
        seed: every random draw derives from it.
    """

    name: ClassVar[str]

    def __init__(self, space: SearchSpace, objective: Objective, *, seed: int = 0) -> None:
        self.space = space
        self.objective = objective
        self.seed = seed

    @abstractmethod
    def ask(self, n: int = 1) -> list[Plan]:
        """The next `n` plans to evaluate."""

    @abstractmethod
    def tell(self, trial: Trial) -> None:
        """The outcome of a plan (trial.reward is None when it failed)."""

    @property
    def loss_estimator(self) -> str | None:
        """Which one-pass loss estimates the run should measure for this strategy (charged as preparation)
        and hand over with `use_loss_estimates`: "fisher" (`modelopt.evaluation.sensitivity.estimate_losses`, a
        gradient pass), "output" (`modelopt.evaluation.output_sensitivity.output_losses`, one label-free probe of the
        answers per layer), or None."""
        return None

    @property
    def wants_loss_estimates(self) -> bool:
        """Whether the run should measure loss estimates for this strategy (`loss_estimator`)."""
        return self.loss_estimator is not None

    def use_loss_estimates(self, estimates: Mapping[tuple[str, int], float]) -> None:
        """Takes estimated losses {(decision name, choice index): loss}; only strategies that want them."""
        raise NotImplementedError(f"strategy {self.name!r} takes no loss estimates")

    def use_floors(self, floors: Sequence[float]) -> None:  # noqa: B027 -- optional: most work at one floor
        """A curve run's floors, highest first (`Objective.curve`): a strategy that can work towards each takes them
        (call before the first `ask` and before `load_state_dict`); the others work at the lowest, the floor their
        objective holds (`Objective.search`)."""

    def costs_changed(self) -> None:  # noqa: B027 -- optional: a strategy that prices nothing ignores it
        """The space's per-choice cost estimates changed (the latency model was refitted on measured plans);
        strategies that price choices with them read them again."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` returned."""
        del state  # a stateless strategy has nothing to restore
