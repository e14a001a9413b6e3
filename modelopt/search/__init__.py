"""Search strategies behind one ask/tell interface, registered by name."""

from modelopt.search import optuna  # noqa: F401  (registers optuna-tpe, optuna-nsga2; optuna loads lazily)
from modelopt.search._base import Strategy
from modelopt.search._registry import STRATEGIES
from modelopt.search.knapsack import KnapsackSearch
from modelopt.search.mcts import MCTS
from modelopt.search.random import RandomSearch

__all__ = ["MCTS", "STRATEGIES", "KnapsackSearch", "RandomSearch", "Strategy"]
