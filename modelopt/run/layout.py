"""What a run folder holds, by file name: the one place these names are spelled (run.json, the settings, is
named by the record it holds, `modelopt.config.run_config.RunConfig`)."""

from modelopt.config.run_config import CONFIG

JOURNAL = "trials.jsonl"  # one line per finished trial, appended as it finishes
STATE = "strategy_state.json"  # the strategy's state after the journal's last trial
STATE_NEXT = "strategy_state.next.json"  # the state after the trial being journaled
SUMMARY = "summary.json"  # written when the run finishes: best, Pareto front, test re-scores
BEST_PLAN = "best_plan.yaml"  # the reported best plan, hand-editable
LAYERS = "layers.json"  # the model's compressible layers, so reports size layers without the model
LOCK = ".lock"  # held by the process writing the folder

# A sweep's results folder (modelopt.sweep): one run folder per cell, and the table made from them.
RUNS = "runs"  # <out>/runs/<model>/<strategy>/seed<k>/
SWEEP_JSON = "sweep.json"  # the parsed sweep file, so the table knows the budgets and the order
TABLE_MD = "table.md"
TABLE_CSV = "table.csv"
SEEDS_CSV = "table_seeds.csv"  # the per-seed values behind the table

__all__ = ["BEST_PLAN", "CONFIG", "JOURNAL", "LAYERS", "LOCK", "RUNS", "SEEDS_CSV", "STATE", "STATE_NEXT", "SUMMARY",
           "SWEEP_JSON", "TABLE_CSV", "TABLE_MD"]
