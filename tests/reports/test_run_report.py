"""Run reports from run folders alone: a finished run (a real small run, built once per session), one
in progress, one with failures and no feasible plan; the HTML is self-contained; the CLI and the API
dispatch by folder kind."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import modelopt
from modelopt.cli.app import app
from modelopt.errors import LoadError
from modelopt.reports import write_report
from modelopt.testing.cli import assert_one_line_error

pytestmark = pytest.mark.slow  # every test reads the session fixture small_run: a finished MCTS run, ~35 s to make


@pytest.fixture
def copy_run(tmp_path, small_run):
    """Copies of the session's small run: the whole of it, or its first n trials without the end."""

    def make(n_records: int | None = None, summary: bool = True) -> Path:
        dst = tmp_path / "run"
        dst.mkdir()
        shutil.copy(small_run / "run.json", dst)
        lines = (small_run / "trials.jsonl").read_text().splitlines(keepends=True)
        (dst / "trials.jsonl").write_text("".join(lines[:n_records] if n_records else lines))
        if summary:
            for name in ("summary.json", "best_plan.yaml", "layers.json"):
                shutil.copy(small_run / name, dst)
        return dst

    return make


def _n_trials(run: Path) -> int:
    return len((run / "trials.jsonl").read_text().splitlines())


def _images(html: str) -> list[str]:
    return re.findall(r'<img[^>]*src="([^"]+)"', html)


def test_finished_run_report_is_self_contained_and_shows_the_summary(copy_run):
    run = copy_run()
    paths = write_report(run)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    summary = json.loads((run / "summary.json").read_text())
    best = summary["best"]
    assert best is not None, "the small run found no plan above its floor"
    # Every figure is inlined; nothing is fetched from anywhere.
    srcs = _images(html)
    assert len(srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r'(src|href)="(https?:|//|file:)', html)
    # The numbers the summary table shows are the run's own.
    assert f"best compression | {best['test']['compression']:.2f}×" in md
    # Retention leads with test, then confirm, then val (a search-time estimate), each with its bounds.
    t, c, v = best["test"], best["confirm"], best["val"]
    lead = f"{t['retention']:.2%} [{t['retention_lower']:.1%}, {t['retention_upper']:.1%}] test (held out)"
    assert lead in md
    assert md.index("test (held out)") < md.index("val (search-time estimate)")
    if c is not None:
        assert f"{c['retention']:.2%} [{c['retention_lower']:.1%}, {c['retention_upper']:.1%}] confirm" in md
    assert f"{v['retention']:.2%} [{v['retention_lower']:.1%}" in md
    assert f"trial {best['trial']} (key <code>{best['plan_key']}</code>)" in html
    assert f"budget used | {summary['budget_used']:.4g} of {summary['budget']:g} full val evaluations" in md
    # Beside the uniform plans the run scored on the same images: in the summary and in a table of their own.
    for a in summary["anchors"]:
        assert f"{a['name']} {a['test']['compression']:.2f}× ({a['test']['retention']:.2%} test)" in md
        assert f"| {a['name']} | {a['trial']} | {a['test']['compression']:.2f}× |" in md
    # Markdown links the same figures, written beside it.
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert links == ["report_files/pareto.png", "report_files/progress.png", "report_files/layers.png"]
    for link in links:
        assert (run / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The per-layer table: one row per layer of ResNet-20, bits and granularity as the best plan says.
    layer_rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(layer_rows) == 20
    plan = best["plan"]
    for row in layer_rows:
        q = {**plan["default"].get("quantize", {}), **plan["layers"].get(row.split("`")[1], {}).get("quantize", {})}
        want = "| float |" if not q.get("bits") else f"| int{q['bits']} | {q['granularity'].replace('_', '-')} |"
        assert want in row, (row, q)
    # Shares of the plan's size add up to the weights' part of it (the rest is float biases and norms).
    shares = [float(r.rsplit("|", 2)[1].strip().rstrip("%")) for r in layer_rows]
    assert 80 < sum(shares) < 100


def test_report_of_a_run_in_progress_leaves_the_journal_alone(copy_run, small_run):
    n = _n_trials(small_run) // 2
    run = copy_run(n_records=n, summary=False)
    torn = f'{{"v":1,"number":{n},"plan_key":"abc'  # a trial being written right now
    with open(run / "trials.jsonl", "a") as f:
        f.write(torn)
    before = (run / "trials.jsonl").read_bytes()
    paths = write_report(run)
    assert (run / "trials.jsonl").read_bytes() == before
    html = paths.html.read_text()
    spent = sum(json.loads(line)["cost"] for line in (run / "trials.jsonl").read_text().splitlines()[:n])
    budget = json.loads((run / "run.json").read_text())["budget"]
    assert "in progress or stopped" in html and f"{n} trials" in html
    assert f"budget used</td><td>{spent:.4g} of {budget:g}" in html.replace('<td class="num">', "<td>")
    assert "when the run ends" in html or "none above the floor yet" in html
    assert not (run / "summary.json").exists()


def test_report_with_failed_trials_and_no_feasible_plan(copy_run):
    run = copy_run(n_records=6, summary=False)
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    for r in records[:4]:
        r["metrics"]["accuracy"] *= 0.5
        r["metrics"]["retention"] *= 0.5
        for k in ("base_right", "lost", "gained"):  # paired counts, where recorded, would bound the old retention
            r["metrics"].pop(k, None)
        r["feasible"], r["reward"] = False, r["metrics"]["retention"] - 1.99
    for r in records[4:]:
        r.update(status="failed", metrics=None, reward=None, feasible=False, error="TrialError: weights went NaN")
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    paths = write_report(run)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    floor = json.loads((run / "run.json").read_text())["min_retention"]
    assert f"No plan kept val retention ≥ {floor:.2%} in 6 trials so far." in md
    assert "Failed trials (2)" in md and "weights went NaN" in md
    assert "6 (2 failed, 0 feasible)" in md
    assert len(_images(html)) == 2  # no layer map without a best plan; the Pareto and progress plots stay


def test_report_of_an_empty_run_folder(copy_run):
    run = copy_run(summary=False)
    (run / "trials.jsonl").write_text("")
    md = write_report(run).markdown.read_text()
    assert "0 trials" in md and "No plan kept" in md


def test_api_and_cli_pick_run_or_sweep_and_refuse_other_folders(tmp_path, copy_run):
    run = copy_run(n_records=10, summary=False)
    assert modelopt.report(run).html == run / "report.html"
    with pytest.raises(LoadError, match="is neither a run folder"):
        modelopt.report(tmp_path / "run" / "..")
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert str(run / "report.html") in result.stdout
    assert_one_line_error(CliRunner().invoke(app, ["report", str(tmp_path / "nope")]), "nope", "does not exist")
    # A run.json that names no model was reported as a run of "?" (exit 0): refused in one line, nothing written.
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "run.json").write_text("{}")
    assert_one_line_error(CliRunner().invoke(app, ["report", str(tmp_path / "empty")]), "empty",
                          "is not a modelopt run folder (its run.json names no model)")
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["run.json"]


@pytest.mark.slow
def test_a_report_on_settings_every_verb_refuses_says_so_in_one_line(tmp_path, small_run):
    """`report RUN` on a run.json with bits ["four"] wrote a report and exited 0 without a word."""


    run = tmp_path / "run"
    shutil.copytree(small_run, run, ignore=shutil.ignore_patterns("report*"))
    raw = json.loads((run / "run.json").read_text())
    raw["compressors"]["quantize"]["bits"] = ["four"]
    (run / "run.json").write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match=r"run\.json': compressors\.quantize\.bits expects a list of integers .*; the "
                                         r"report is based on the journal and summary\.json alone") as caught:
        assert write_report(run).html.is_file()
    assert all("\n" not in str(w.message) for w in caught)
