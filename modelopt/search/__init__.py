"""Search strategies behind one ask/tell interface, registered by name."""

from modelopt.search._base import Strategy
from modelopt.search._registry import STRATEGIES
from modelopt.search.knapsack import KnapsackSearch
from modelopt.search.mcts import MCTS
from modelopt.search.random import RandomSearch
from modelopt.search import optuna  # noqa: E402,F401  (registers optuna-tpe, optuna-nsga2; optuna loads lazily)

__all__ = ["MCTS", "KnapsackSearch", "STRATEGIES", "RandomSearch", "Strategy"]
