"""The two entry points: `warm_start` a run's search from a store, `record_run` a finished run into it.

How a warm start acts: for each decision whose layer matches a stored fingerprint, one pseudo-trial
per compressing choice (that choice at that layer, every other layer left as it is), with the loss
earlier runs' sensitivities predict for it on *this* layer's measured error, is handed to the
strategy (`MCTS.use_prior_trials`). Only MCTS's loss model sees them: they move its rollouts and
node priors, never its tree, its budget or the journal. A layer's pseudo-trials together are worth
what the store knows about it: their weight makes the model's prior std on the layer's sensitivity
the stored posterior std widened by `TRANSFER` of the value (a layer of another model is only like
the stored one). Strategies without that hook (random, Optuna, knapsack) start as they would.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.trial import Trial
from modelopt.knowledge.fingerprint import LayerPrint, model_family
from modelopt.knowledge.index import KnowledgeIndex, Prior
from modelopt.knowledge.lessons import choice_key, learn, loss_measure
from modelopt.knowledge.store import read_store, record, store_file
from modelopt.plan.space import SearchSpace
from modelopt.search import Strategy
from modelopt.search.loss_model import KAPPA0, NOISE_SIGMA

__all__ = ["PriorTrials", "prior_trials", "record_run", "warm_start"]

log = logging.getLogger(__name__)

TRANSFER = 0.5  # a stored sensitivity holds for a matching layer of another run to within this share
MAX_WEIGHT = 4.0  # no pseudo-trial counts for more trials than this


@runtime_checkable
class _TakesPriorTrials(Protocol):
    def use_prior_trials(self, idx: np.ndarray, rel_loss: np.ndarray, weight: np.ndarray) -> None: ...


@dataclass(frozen=True)
class PriorTrials:
    """Pseudo-trials for a space: choice indices (rows x decisions), loss relative to kappa, weight."""

    idx: np.ndarray
    rel_loss: np.ndarray
    weight: np.ndarray
    matched: int  # decisions a stored layer matched


def _layer_print(space: SearchSpace, evaluator: Evaluator, layer: str) -> LayerPrint:
    kind = space.layers[layer].kind
    return LayerPrint.of(getattr(kind, "value", str(kind)), evaluator.workload.original[layer])


def _rows(space: SearchSpace, i: int, prior: Prior, none_idx: list[int]) -> tuple[list[list[int]], list[float],
                                                                                   list[float]]:
    d = space.decisions[i]
    errors = np.nan_to_num(np.array([f.error for f in space.features[d.name]], dtype=float), nan=1.0, posinf=1.0)
    kd = prior.kd_rel
    rows, rel = [], []
    for j, c in enumerate(d.choices):
        if c is None:
            continue
        beta = prior.beta_rel.get(choice_key(c))
        rows.append([j if k == i else none_idx[k] for k in range(len(none_idx))])
        rel.append(max(kd.mean * float(errors[j]) + (beta.mean if beta is not None else 0.0), 0.0))
    energy = float(sum(float(errors[j]) ** 2 for j, c in enumerate(d.choices) if c is not None))
    std = KAPPA0 * float(np.hypot(kd.std, TRANSFER * kd.mean))
    weight = min(NOISE_SIGMA**2 / (std**2 * energy), MAX_WEIGHT) if energy > 0 and std > 0 else 0.0
    return rows, rel, [weight] * len(rows)


def prior_trials(index: KnowledgeIndex, evaluator: Evaluator) -> PriorTrials:
    """The pseudo-trials `index` gives `evaluator`'s space (none for a decision no stored layer matches)."""
    space = evaluator.space
    none_idx = [d.choices.index(None) if None in d.choices else -1 for d in space.decisions]
    rows: list[list[int]] = []
    rel: list[float] = []
    weight: list[float] = []
    matched = 0
    if -1 not in none_idx:  # a pseudo-trial leaves every other layer uncompressed, which needs a None choice
        for i, d in enumerate(space.decisions):
            prior = index.lookup(d.compressor, _layer_print(space, evaluator, d.layer))
            if prior is None:
                continue
            matched += 1
            r, y, w = _rows(space, i, prior, none_idx)
            rows += r
            rel += y
            weight += w
    idx = np.array(rows, dtype=int).reshape(len(rows), len(space.decisions))
    return PriorTrials(idx, np.array(rel, dtype=float), np.array(weight, dtype=float), matched)


def warm_start(path: str, evaluator: Evaluator, strategy: Strategy) -> None:
    """Starts `strategy`'s priors from what the knowledge store at `path` holds about `evaluator`'s layers.

    Charges no budget and changes no trial the strategy has told; a missing store is a first run
    (nothing to start from). Called by `RunConfig.build` when the run names a store.

    Raises:
        LoadError: `path` exists but is not a readable knowledge store (one line).

    Example:
        >>> built = build(RunConfig(model="cifar10_resnet56", weights=w, data=d))  # modelopt.config.build
        >>> warm_start("runs/knowledge", built.evaluator, built.strategy)
    """
    store = read_store(path)
    if not isinstance(strategy, _TakesPriorTrials):
        log.info("knowledge: strategy %r takes no priors; %s not used", strategy.name, path)
        return
    measure = loss_measure(strategy.objective.confidence <= 0)
    index = KnowledgeIndex(store, family=model_family(evaluator.workload.name), measure=measure)
    if index.runs == 0:
        log.info("knowledge: %s holds no %s run of this model family yet", path, measure)
        return
    trials = prior_trials(index, evaluator)
    log.info("knowledge: %d of %d decisions warm-started from %d runs in %s", trials.matched,
             len(evaluator.space.decisions), index.runs, path)
    if trials.matched:
        strategy.use_prior_trials(trials.idx, trials.rel_loss, trials.weight)


def run_id(run_dir: str | Path) -> str:
    """A run's key in a store: this host and its absolute folder (a resumed run replaces its entry)."""
    return f"{socket.gethostname()}:{Path(run_dir).resolve()}"


def record_run(path: str, run_dir: str | Path, trials: Sequence[Trial], confidence: float,
               evaluator: Evaluator) -> None:
    """Adds what a run's `trials` taught about each layer to the knowledge store at `path` (`confidence`: the
    run's; 0 for point estimates).

    Creates the store (a folder, or the .json file named) when there is none; a run with no
    completed trial adds nothing.

    Raises:
        LoadError: the store there is not readable (left as it is).
        StorageError: it could not be written.

    Example:
        >>> result = runner.run()
        >>> record_run("runs/knowledge", result.run_dir, result.trials, 0.95, built.evaluator)
    """
    lessons = learn(run_id(run_dir), trials, confidence, evaluator)
    if lessons is None:
        log.info("knowledge: run %s completed no trial; nothing recorded", run_dir)
        return
    record(path, lessons)
    log.info("knowledge: %d layer entries of %s recorded in %s", len(lessons.layers), run_dir, store_file(path))
