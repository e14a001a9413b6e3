"""What a run folder holds, by file name: the one place these names are spelled. Two are spelled by what writes
them, in rooms below this one, and named here: run.json, the settings, by the record it holds
(`modelopt.config.run_config.RunConfig`), and the reconstructions' sub-folder by their store
(`modelopt.reconstruct.store.Refits`)."""

from modelopt.config.run_config import CONFIG
from modelopt.reconstruct.store import RECONSTRUCTED

JOURNAL = "trials.jsonl"  # one line per finished trial, appended as it finishes
STATE = "strategy_state.json"  # the strategy's state after the journal's last trial
STATE_NEXT = "strategy_state.next.json"  # the state after the trial being journaled
SUMMARY = "summary.json"  # written when the run finishes: best, Pareto front, test re-scores
BEST_PLAN = "best_plan.yaml"  # the reported best plan, hand-editable
LAYERS = "layers.json"  # the model's compressible layers, so reports size layers without the model
LOCK = ".lock"  # held by the process writing the folder

# A report (modelopt.reports), in a run folder or a sweep's results folder.
REPORT_MD = "report.md"
REPORT_HTML = "report.html"  # self-contained: styles and figures inlined
REPORT_FILES = "report_files"  # the PNGs report.md links to

# A sweep's results folder (modelopt.sweep): one run folder per cell, and the table made from them.
RUNS = "runs"  # <out>/runs/<model>/<strategy>/seed<k>/
SWEEP_JSON = "sweep.json"  # the parsed sweep file, so the table knows the budgets and the order
TABLE_MD = "table.md"
TABLE_CSV = "table.csv"
SEEDS_CSV = "table_seeds.csv"  # the per-seed values behind the table

__all__ = ["BEST_PLAN", "CONFIG", "JOURNAL", "LAYERS", "LOCK", "RECONSTRUCTED", "REPORT_FILES", "REPORT_HTML",
           "REPORT_MD", "RUNS", "SEEDS_CSV", "STATE", "STATE_NEXT", "SUMMARY", "SWEEP_JSON", "TABLE_CSV", "TABLE_MD"]
