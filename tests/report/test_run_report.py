"""Run reports from run folders alone: a finished committed run, one in progress, one with failures
and no feasible plan; the HTML is self-contained; the CLI and the API dispatch by folder kind."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import modelopt
from modelopt.cli import app
from modelopt.errors import LoadError
from modelopt.report import write_report
from modelopt.testing.cli import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "experiments" / "mcts_vs_baselines" / "runs" / "resnet20" / "mcts" / "seed0"


def _copy_run(tmp_path: Path, n_records: int | None = None, summary: bool = True) -> Path:
    dst = tmp_path / "run"
    dst.mkdir()
    shutil.copy(RUN / "run.json", dst)
    lines = (RUN / "trials.jsonl").read_text().splitlines(keepends=True)
    (dst / "trials.jsonl").write_text("".join(lines[:n_records] if n_records else lines))
    if summary:
        shutil.copy(RUN / "summary.json", dst)
        shutil.copy(RUN / "best_plan.yaml", dst)
    return dst


def _images(html: str) -> list[str]:
    return re.findall(r'<img[^>]*src="([^"]+)"', html)


def test_finished_run_report_is_self_contained_and_shows_the_summary(tmp_path):
    run = _copy_run(tmp_path)
    paths = write_report(run)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    summary = json.loads((run / "summary.json").read_text())
    best = summary["best"]
    # Every figure is inlined; nothing is fetched from anywhere.
    srcs = _images(html)
    assert len(srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r'(src|href)="(https?:|//|file:)', html)
    # The numbers the summary table shows are the run's own.
    assert f"{best['val']['compression']:.2f}× val" in html
    assert f"{best['val']['retention']:.2%} val, {best['test']['retention']:.2%} test" in html
    assert f"trial {best['trial']} (key <code>{best['plan_key']}</code>)" in html
    assert "budget used | 200 of 200 full val evaluations" in md
    # Markdown links the same figures, written beside it.
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert links == ["report_files/pareto.png", "report_files/progress.png", "report_files/layers.png"]
    for link in links:
        assert (run / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The per-layer table: one row per layer of ResNet-20, bits as the best plan says.
    layer_rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(layer_rows) == 20
    plan = best["plan"]
    assert plan["layers"]["conv1"]["quantize"]["bits"] == 8
    conv1 = next(r for r in layer_rows if r.startswith("| `conv1`"))
    assert "| int8 | per-channel |" in conv1
    default_bits = plan["default"]["quantize"]["bits"]
    untouched = [r for r in layer_rows if r.split("`")[1] not in plan["layers"]]
    assert untouched and all(f"| int{default_bits} |" in r for r in untouched)
    # Shares of the plan's size add up to the weights' part of it (the rest is float biases and norms).
    shares = [float(r.rsplit("|", 2)[1].strip().rstrip("%")) for r in layer_rows]
    assert 80 < sum(shares) < 100


def test_report_of_a_run_in_progress_leaves_the_journal_alone(tmp_path):
    run = _copy_run(tmp_path, n_records=30, summary=False)
    torn = '{"v":1,"number":30,"plan_key":"abc'  # a trial being written right now
    with open(run / "trials.jsonl", "a") as f:
        f.write(torn)
    before = (run / "trials.jsonl").read_bytes()
    paths = write_report(run)
    assert (run / "trials.jsonl").read_bytes() == before
    html = paths.html.read_text()
    assert "in progress or stopped" in html and "30 trials" in html
    assert "budget used</td><td>30 of 200" in html.replace('<td class="num">', "<td>")
    assert "test: re-scored when the run ends" in html or "none above the floor yet" in html
    assert not (run / "summary.json").exists()


def test_report_with_failed_trials_and_no_feasible_plan(tmp_path):
    run = _copy_run(tmp_path, n_records=6, summary=False)
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    for r in records[:4]:
        r["metrics"]["accuracy"] *= 0.5
        r["metrics"]["retention"] *= 0.5
        r["feasible"], r["reward"] = False, r["metrics"]["retention"] - 1.99
    for r in records[4:]:
        r.update(status="failed", metrics=None, reward=None, feasible=False, error="TrialError: weights went NaN")
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    paths = write_report(run)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    assert "No plan kept val retention ≥ 99.00% in 6 trials so far." in md
    assert "Failed trials (2)" in md and "weights went NaN" in md
    assert "6 (2 failed, 0 feasible)" in md
    assert len(_images(html)) == 2  # no layer map without a best plan; the Pareto and progress plots stay


def test_report_of_an_empty_run_folder(tmp_path):
    run = _copy_run(tmp_path, n_records=None, summary=False)
    (run / "trials.jsonl").write_text("")
    md = write_report(run).markdown.read_text()
    assert "0 trials" in md and "No plan kept" in md


def test_api_and_cli_pick_run_or_sweep_and_refuse_other_folders(tmp_path):
    run = _copy_run(tmp_path, n_records=10, summary=False)
    assert modelopt.report(run).html == run / "report.html"
    with pytest.raises(LoadError, match="is neither a run folder"):
        modelopt.report(tmp_path / "run" / "..")
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert str(run / "report.html") in result.stdout
    assert_one_line_error(CliRunner().invoke(app, ["report", str(tmp_path / "nope")]), "nope", "does not exist")
