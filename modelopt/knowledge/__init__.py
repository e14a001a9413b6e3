"""Knowledge across runs: what a run learns per layer, kept in a store that later runs warm-start from.

A run with `knowledge=PATH` (CLI `--knowledge PATH`) starts its search's priors from the store at
PATH (`warm_start`) and, when it ends, adds what its trials taught to it (`record_run`). Entries are
keyed by layer fingerprint (`LayerPrint`: shape and coarsely binned weight statistics) and model
family, so a layer of a related model (ResNet-56 after ResNet-20 runs) finds what was learned.

Example:
    >>> modelopt.optimize(budget=50, knowledge="runs/knowledge", report=False)   # records a store
    >>> modelopt.optimize("cifar10_resnet56", data, weights=w, knowledge="runs/knowledge")  # starts from it
"""

from __future__ import annotations

from modelopt.knowledge.fingerprint import LayerPrint, model_family
from modelopt.knowledge.index import KnowledgeIndex, Prior
from modelopt.knowledge.lessons import RunLessons, learn
from modelopt.knowledge.store import Store, read_store, record, store_file
from modelopt.knowledge.warm import prior_trials, record_run, run_id, warm_start

__all__ = [
    "KnowledgeIndex",
    "LayerPrint",
    "Prior",
    "RunLessons",
    "Store",
    "learn",
    "model_family",
    "prior_trials",
    "read_store",
    "record",
    "record_run",
    "run_id",
    "store_file",
    "warm_start",
]
