"""Sweeps: the file's errors (key + line), a real mini-sweep on ResNet-20, skipping finished cells, the CLI."""

from __future__ import annotations

import csv
import json
import statistics
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cell_reports import cells_without_reports  # tests/sweep is on sys.path (pytest prepends a test file's folder)
from typer.testing import CliRunner

import modelopt.sweep.file
import modelopt.sweep.table
from modelopt.cli.app import app
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Metrics
from modelopt.objective import Objective
from modelopt.sweep import load_sweep, run_sweep
from modelopt.testing.cli import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
pytestmark = pytest.mark.xdist_group("sweep_mini")  # one test process makes the module's `mini` sweep once

GOOD = """\
name: t
out: results
models:
  - name: resnet20
    model: cifar10_resnet20
strategies: [random]
budgets: [2, 3]
seeds: [0, 1]
device: cpu
reconstruct: false
"""


def _write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_good_file_parses_with_defaults_and_paths_resolved_against_its_folder(tmp_path):
    (tmp_path / "w.th").write_bytes(b"")
    text = GOOD.replace("    model: cifar10_resnet20\n", "    model: cifar10_resnet20\n    weights: w.th\n")
    sweep = load_sweep(_write(tmp_path, text))
    assert sweep.out == (tmp_path / "results").resolve()
    assert sweep.models[0].weights == str((tmp_path / "w.th").resolve())
    assert sweep.models[0].data == "cifar10-sample"
    assert sweep.budgets == (2.0, 3.0) and sweep.budget == 3.0 and sweep.seeds == (0, 1)
    cfg = sweep.config  # what the file leaves out is RunConfig's default, as on the command line
    quant = cfg.options["quantize"]
    assert (cfg.objective, cfg.min_retention, cfg.confidence, quant.bits, quant.granularity) == (
        "size", 0.99, 0.95, (8, 4, 3), ("per_channel", "group"))
    assert quant.rounding == ("gptq",) and sweep.settings == {"device": "cpu", "reconstruct": False}
    cells = sweep.cells()
    assert [(c.model, c.strategy, c.seed, c.status) for c in cells] == [
        ("resnet20", "random", 0, "todo"), ("resnet20", "random", 1, "todo")]
    assert cells[1].run_dir == sweep.out / "runs" / "resnet20" / "random" / "seed1"


# (replace this, with that, the line the error must name, words it must contain)
BAD = [
    ("budgets: [2, 3]", "budget: [2, 3]", 7, ["'budget'", "did you mean 'budgets'"]),
    ("budgets: [2, 3]", "budgets: [2, many]", 7, ["'budgets'", "positive numbers", "'many'"]),
    ("budgets: [2, 3]", "budgets: [2, -1]", 7, ["'budgets'", "-1"]),
    ("budgets: [2, 3]", "budgets: 3", 7, ["'budgets'", "non-empty list"]),
    ("seeds: [0, 1]", "seeds: []", 8, ["'seeds'", "an empty list"]),
    ("seeds: [0, 1]", "seeds: [0, 0]", 8, ["'seeds'", "listed twice"]),
    ("seeds: [0, 1]", "seeds: [0, true]", 8, ["'seeds'", "integers"]),
    ("strategies: [random]", "strategies: [random, nope]", 6, ["'strategies'", "unknown strategy 'nope'", "random"]),
    ("strategies: [random]", "strategies: random", 6, ["'strategies'", "non-empty list"]),
    ("    model: cifar10_resnet20", "    modle: cifar10_resnet20", 5, ["'models[0].modle'", "did you mean 'model'"]),
    ("    model: cifar10_resnet20", "    model: no_such_model", 5, ["'models[0].model'", "cifar10_resnet20"]),
    ("    model: cifar10_resnet20", "    model: cifar10_resnet20\n    weights: missing.th", 6,
     ["'models[0].weights'", "missing.th", "no such file"]),
    ("    model: cifar10_resnet20", "    model: cifar10_resnet20\n    data: nowhere.npz", 6,
     ["'models[0].data'", "nowhere.npz", "cifar10-sample"]),
    ("  - name: resnet20", "  - name: res/net", 4, ["'models[0].name'", "folder name"]),
    ("device: cpu", "device: cpu\nobjective: speed", 10, ["'objective'", "'speed'", "size, bitops, macs"]),
    ("device: cpu", "device: cpu\nmin_retention: high", 10, ["'min_retention'", "0.99"]),
    ("device: cpu", "device: cpu\nbits: [8, 9]", 10, ["'bits'", "9", "valid: 2, 3, 4"]),
    ("device: cpu", "device: cpu\ngranularity: [per_row]", 10, ["'granularity'", "per_row", "per_channel"]),
    ("device: cpu", "device: cpu\nrounding: [adaround]", 10, ["'rounding'", "adaround", "nearest, gptq"]),
    ("device: cpu", "device: tpu", 9, ["'device'", "tpu", "cpu"]),
    ("device: cpu", "device: cpu\nseeds: [3]", 10, ["'seeds'", "given twice (first at line 8)"]),
    ("name: t\n", "", 1, ["'name'", "missing"]),
    ("out: results", "out: !!python/object:os.system results", 2, ["'out'", "cannot read the value"]),
    ("budgets: [2, 3]", "budgets: [2, 3", 8, ["not valid YAML"]),
]


@pytest.mark.parametrize(("old", "new", "line", "needles"), BAD,
                         ids=[(b[1].strip().splitlines() or ["no name"])[-1][:30] for b in BAD])
def test_a_malformed_file_names_the_key_its_line_and_what_is_right(tmp_path, old, new, line, needles):
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert f"line {line}" in msg, msg
    for needle in needles:
        assert needle in msg, msg


# A bad option value, checked by RunConfig.replace with every other setting: the error names the line of its key.
BAD_OPTIONS = [
    ("norm_images: -1\nobjective: size", 11, ["'norm_images'", "non-negative integer", "-1"]),
    ("objective: size\nsparsity: [0.5, 2.0]\nmin_retention: 0.9", 12, ["'sparsity'", "2.0", "share in (0, 1)"]),
    ("compressors: [quantize]\nexit_images: 5", 12, ["'exit_images'", "does not use", "add early_exit"]),
    ("compressors: [early_exit]\nmin_retention: 5\nexit_images: 7", 12, ["'min_retention'", "fraction in [0, 1]"]),
    ("confidence: '0.9'", 11, ["'confidence'", "'0.9'"]),
]


@pytest.mark.parametrize(("lines", "line", "needles"), BAD_OPTIONS, ids=[b[0].splitlines()[-1] for b in BAD_OPTIONS])
def test_a_bad_option_value_names_its_line(tmp_path, lines, line, needles):
    with pytest.raises(ConfigError) as info:
        load_sweep(_write(tmp_path, GOOD + lines + "\n"))
    msg = str(info.value)
    assert "\n" not in msg and f"line {line}, key " in msg, msg
    for needle in needles:
        assert needle in msg, msg


def test_the_settings_are_checked_once_together(tmp_path, monkeypatch):
    """One RunConfig.replace checks every setting the file gives (a compressor's value as its record reads it)."""
    calls = []
    replace = modelopt.sweep.file.RunConfig.replace
    monkeypatch.setattr(modelopt.sweep.file.RunConfig, "replace",
                        lambda self, **kw: calls.append(kw) or replace(self, **kw))
    sweep = load_sweep(_write(tmp_path, GOOD + "bits: 8\ngranularity: per_channel\nmin_retention: 1\n"))
    assert len(calls) == 1 and set(calls[0]) == {"device", "reconstruct", "bits", "granularity", "min_retention"}
    assert sweep.settings["bits"] == [8] and sweep.settings["granularity"] == ["per_channel"]  # as run.json has them
    assert sweep.config.options["quantize"].bits == (8,) and sweep.config.min_retention == 1.0


@pytest.mark.parametrize("text,needle", [
    (None, "does not exist"),
    ("", "is empty"),
    ("- a\n- b\n", "expected a mapping"),
])
def test_missing_empty_or_not_a_mapping(tmp_path, text, needle):
    path = tmp_path / "s.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_sweep(path)


def test_the_committed_sweep_files_parse(shared_dir):
    smoke = load_sweep(REPO / "experiments" / "smoke.yaml")
    assert len(smoke.cells()) == 2 and smoke.budgets == (2.0, 4.0)
    try:
        full = load_sweep(REPO / "experiments" / "mcts_vs_baselines.yaml")
    except ConfigError as exc:  # strategies still being written are the one acceptable gap
        assert "unknown strategy" in str(exc) and "line 14" in str(exc), exc
        return
    assert len(full.cells()) == 2 * 5 * 5 and full.budget == 200 and full.settings["bits"] == [8, 4, 3, 2]
    assert Path(full.models[1].weights) == (shared_dir / "models" / "cifar10" / "resnet56-4bfd9763.th").resolve()


# ---- a real mini-sweep ------------------------------------------------------------------------


def _journal(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trials.jsonl").read_text().splitlines()]


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# A one-choice menu (int8 per-channel or float per layer) keeps quantization, the costly part, small. The sweeps run
# on `small_workload` (846 images: val, calib and confirm 169 each, where cifar10-exact-sample confirms on 1,000), at a
# floor its val can certify. A budget counts val passes of 169 images: 4 is 3 trials, the first costing 2 (its own
# pass and GPTQ's one-time pass over the 169 calib images).
MINI = (GOOD.replace("budgets: [2, 3]", "budgets: [2, 4]")
        + "bits: [8]\ngranularity: [per_channel]\ncompressors: [quantize]\nmin_retention: 0.9\n"
        + "latency: none\n")  # the tables and journals are read, not the finalists' timings
ONE_BUDGET = MINI.replace("budgets: [2, 4]", "budgets: [1]")  # a cell of one trial
FLOOR = 0.9


@pytest.fixture
def no_cell_reports() -> Iterator[None]:
    """The sweep's cells write no run report (tests/sweep/_cell_reports.py): these tests read journals and tables."""
    with cells_without_reports():
        yield


@pytest.fixture(scope="session")
def mini(tmp_path_factory, small_workload):
    """The sweep run once, after seed 1's cell was started and killed after one trial."""
    import modelopt

    path = _write(tmp_path_factory.mktemp("sweep"), MINI)
    sweep = load_sweep(path)
    partial = sweep.cell_dir("resnet20", "random", 1)
    modelopt.optimize(small_workload, strategy="random", budget=1, out=partial, seed=1, bits=[8], min_retention=FLOOR,
                      granularity=["per_channel"], progress=False, compressors=["quantize"], reconstruct=False,
                      report=False)  # killed runs write no report
    (partial / "summary.json").unlink()  # killed before it finished
    before = [c.status for c in sweep.cells()]
    first_trial = (partial / "trials.jsonl").read_bytes()
    with cells_without_reports():
        result = run_sweep(path, progress=False, workloads={"resnet20": small_workload})
    return path, result, before, first_trial


@pytest.mark.slow
def test_the_mini_sweep_runs_each_cell_once_at_the_largest_budget(mini):
    _, result, before, first_trial = mini
    out = result.sweep.out
    assert before == ["todo", "partial"]
    assert [(c.strategy, c.seed) for c in result.ran] == [("random", 0), ("random", 1)]
    # The partial cell was resumed, not restarted.
    assert (out / "runs" / "resnet20" / "random" / "seed1" / "trials.jsonl").read_bytes().startswith(first_trial)
    for seed in (0, 1):
        cell = out / "runs" / "resnet20" / "random" / f"seed{seed}"
        records = _journal(cell)
        assert [r["number"] for r in records] == [0, 1, 2]  # one run at budget 4, none at 2
        # Three trials of the whole val split, plus GPTQ's one-time pass over the 169 calib images.
        assert sum(r["cost"] for r in records) == pytest.approx(3 + 169 / 169)
        assert (cell / "summary.json").exists()
    assert sorted(p.name for p in (out / "runs" / "resnet20" / "random").iterdir()) == ["seed0", "seed1"]
    rows = _csv(out / "table.csv")
    assert [(r["model"], r["strategy"], r["budget"], r["n_seeds"]) for r in rows] == [
        ("resnet20", "random", "2", "2"), ("resnet20", "random", "4", "2")]
    assert [r["budget"] for r in result.rows] == [2, 4]
    md = (out / "table.md").read_text()
    assert md == result.markdown and "## resnet20" in md and "| random | 2 | 2 (" in md


def _best_within(records, budget):
    """The oracle: the best feasible record whose cumulative cost is within budget (runner's order)."""
    obj, spent, best = Objective("size", FLOOR), 0.0, None
    for r in records:
        spent += r["cost"]
        if spent > budget + 1e-9:
            break
        if r["feasible"] and (best is None or (r["reward"], r["metrics"]["retention"])
                              > (best["reward"], best["metrics"]["retention"])):
            best = r
        assert r["feasible"] == obj.feasible(Metrics.from_dict(r["metrics"]))
    return best


@pytest.mark.slow
def test_smaller_budgets_are_read_from_the_largest_budgets_trace(mini):
    _, result, *_ = mini
    out = result.sweep.out
    by_budget = {row["budget"]: row for row in result.rows}
    for budget in (2, 4):
        comps = []
        for seed in (0, 1):
            best = _best_within(_journal(out / "runs" / "resnet20" / "random" / f"seed{seed}"), budget)
            comps.append(1.0 if best is None else best["metrics"]["compression"])
        row = by_budget[budget]
        assert row["val_compression_median"] == pytest.approx(statistics.median(comps))
        assert row["val_compression_mean"] == pytest.approx(statistics.fmean(comps))
        assert row["val_compression_std"] == pytest.approx(statistics.stdev(comps))
        assert row["val_reduction_median"] == pytest.approx(row["val_compression_median"])  # objective: size
    # At the full budget the chosen plan is the runner's best: its own test re-score must agree.
    test_ret = []
    for seed in (0, 1):
        summary = json.loads((out / "runs" / "resnet20" / "random" / f"seed{seed}" / "summary.json").read_text())
        test_ret.append(1.0 if summary["best"] is None else summary["best"]["test"]["retention"])
    assert by_budget[4]["test_retention_mean"] == pytest.approx(statistics.fmean(test_ret))
    for row in result.rows:
        # Size does not depend on the data: test compression is val compression.
        assert row["test_compression_median"] == pytest.approx(row["val_compression_median"])
        assert row["lead_vs_random_pct"] != row["lead_vs_random_pct"]  # NaN: no lead over itself
        assert row["random_best_target"] == pytest.approx(by_budget[4]["val_reduction_median"])
        assert row["budget_to_random_best"] == "never" or 0 < row["budget_to_random_best"] <= 4


@pytest.mark.slow
def test_at_its_own_budget_a_cell_states_what_its_run_reported(mini, small_workload, tmp_path):
    """The table replays nothing at a run's own budget: the seed's plan and test figures are its summary.json's,
    even where a replay of confirmation would pick another; data paths in the table are relative to the repository."""
    import shutil

    from modelopt.sweep.table import make_table

    _, result, *_ = mini
    out = tmp_path / "copy"
    shutil.copytree(result.sweep.out, out)
    (out / ".git").mkdir()  # the table's repository
    cell = out / "runs" / "resnet20" / "random" / "seed0"
    summary = json.loads((cell / "summary.json").read_text())
    first = _journal(cell)[0]
    summary["best"] = {"trial": 0, "plan_key": first["plan_key"], "plan": {}, "val": None, "confirm": None,
                       "test": {**first["metrics"], "split": "test", "retention": 0.5, "compression": 2.5}}
    (cell / "summary.json").write_text(json.dumps(summary))
    make_table(out, workloads={"resnet20": small_workload}, device="cpu")
    seeds = {(r["budget"], r["seed"]): r for r in _csv(out / "table_seeds.csv")}
    own = seeds[("4", "0")]
    assert (own["best_trial"], float(own["test_retention"]), float(own["test_compression"])) == ("0", 0.5, 2.5)
    assert "what-if" in (out / "table.md").read_text()


@pytest.mark.slow
def test_a_second_run_skips_finished_cells_and_rebuilds_the_table_from_the_folders(mini, small_workload, small_data,
                                                                                  monkeypatch):
    path, first, *_ = mini
    out = first.sweep.out
    journals = {p: p.read_bytes() for p in out.glob("runs/*/*/*/trials.jsonl")}
    assert len(journals) == 2
    table = (out / "table.csv").read_text()
    for name in ("table.md", "table.csv", "table_seeds.csv"):
        (out / name).unlink()
    assert [c.status for c in load_sweep(path).cells()] == ["done", "done"]
    calls = []

    def fake_load(config, **kw):  # make_table rebuilds the workload from run.json
        calls.append((config.model, config.data, config.weights, config.data_seed))
        return small_workload

    monkeypatch.setattr(modelopt.sweep.table, "load_workload", fake_load)
    result = runner.invoke(app, ["sweep", str(path), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "Ran 0 of 2 cells" in result.stdout and "resnet20" in result.stdout
    assert {p: p.read_bytes() for p in out.glob("runs/*/*/*/trials.jsonl")} == journals  # no trial added
    assert calls == [("cifar10_resnet20", str(small_data), None, 0)]  # the shared workload's data
    assert (out / "table.csv").read_text() == table
    assert len(_csv(out / "table_seeds.csv")) == 4  # 2 seeds x 2 budgets


@pytest.mark.slow
def test_a_changed_sweep_file_does_not_mix_with_cells_run_before(mini):
    path, *_ = mini
    changed = _write(path.parent, MINI.replace("bits: [8]", "bits: [8, 4]"), "changed.yaml")
    with pytest.raises(ConfigError, match=r"was run with bits=\[8\] but sweep file .* says \[8, 4\]"):
        run_sweep(changed, progress=False)


# ---- the CLI ----------------------------------------------------------------------------------



@pytest.mark.slow
def test_cli_dry_run_lists_cells_and_which_are_done(mini, tmp_path):
    path, *_ = mini
    result = runner.invoke(app, ["sweep", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("done") >= 2 and "2 of 2 cells done" in result.stdout
    fresh = _write(tmp_path, GOOD)
    result = runner.invoke(app, ["sweep", str(fresh), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "todo" in result.stdout and "0 of 2 cells done" in result.stdout
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


@pytest.mark.parametrize("text,needles", [
    (GOOD.replace("seeds: [0, 1]", "seeds: [0, 1]\nbudget: 5"), ["line 9", "'budget'"]),
    (GOOD.replace("strategies: [random]", "strategies: [randum]"), ["line 6", "did you mean 'random'"]),
    (None, ["does not exist"]),
])
def test_cli_malformed_file_is_one_line_exit_2(tmp_path, text, needles):
    path = tmp_path / "s.yaml"
    if text is not None:
        path.write_text(text)
    for args in (["sweep", str(path)], ["sweep", str(path), "--dry-run"]):
        assert_one_line_error(runner.invoke(app, args), *needles)


def test_an_only_pattern_matching_no_cell_and_a_bad_workers_are_refused_on_a_dry_run_too(tmp_path):
    """`--only nosuch` ran nothing and exited 0; a dry run ignored --only and --workers 0."""
    path = _write(tmp_path, GOOD)
    for args in (["sweep", str(path), "--only", "nosuch"], ["sweep", str(path), "--dry-run", "--only", "nosuch"]):
        assert_one_line_error(runner.invoke(app, args), "--only 'nosuch' matches no cell", "resnet20/random/seed0")
    assert_one_line_error(runner.invoke(app, ["sweep", str(path), "--dry-run", "--workers", "0"]),
                          "--workers must be a number of cells run at once from 1 to 4096")
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_only_runs_the_matching_cells_in_the_order_given(tmp_path, small_workload, no_cell_reports):
    path = _write(tmp_path, ONE_BUDGET)
    result = run_sweep(path, progress=False, workloads={"resnet20": small_workload}, only=["*/random/seed1"])
    assert [(c.strategy, c.seed) for c in result.ran] == [("random", 1)]
    sweep = load_sweep(path)
    assert len(_journal(sweep.cell_dir("resnet20", "random", 1))) == 1
    assert not (sweep.cell_dir("resnet20", "random", 0) / "trials.jsonl").exists()


@pytest.mark.slow
def test_compressors_key_is_checked_by_name_and_against_started_cells(tmp_path, small_workload):
    import modelopt

    with pytest.raises(ConfigError, match=r"line \d+, key 'compressors': unknown compressor 'quantise'"):
        load_sweep(_write(tmp_path, GOOD + "compressors: [quantise]\n"))
    path = _write(tmp_path, MINI)
    sweep = load_sweep(path)
    assert sweep.compressors == ("quantize",)
    started = sweep.cell_dir("resnet20", "random", 0)
    # A cell started with pruning too: a small menu (one sparsity of one kind), no latency timing of the finalists.
    modelopt.optimize(small_workload, strategy="random", budget=1, out=started, bits=[8], min_retention=FLOOR,
                      granularity=["per_channel"], progress=False, compressors=["prune", "quantize"], reconstruct=False,
                      sparsity=[0.5], kind=["unstructured"], latency=None, report=False)
    with pytest.raises(ConfigError, match="compressors=\\['prune', 'quantize'\\]"):
        run_sweep(path, progress=False, workloads={"resnet20": small_workload})


@pytest.mark.slow
def test_a_cell_out_of_cuda_memory_frees_the_cache_and_the_grid_goes_on(tmp_path, small_workload, monkeypatch,
                                                                        no_cell_reports):
    import torch

    from modelopt.sweep import cell_run

    real = cell_run.optimize
    calls: list[str] = []

    def optimize(wl, **kw):
        calls.append(f"seed{kw['seed']}")
        if kw["seed"] == 0:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(wl, **kw)

    monkeypatch.setattr(cell_run, "optimize", optimize)  # each cell runs through the API
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    path = _write(tmp_path, ONE_BUDGET)
    result = run_sweep(path, progress=False, workloads={"resnet20": small_workload})
    assert calls == ["seed0", "empty_cache", "seed1"]  # freed before the next cell starts
    assert [(c.strategy, c.seed) for c in result.ran] == [("random", 1)]
