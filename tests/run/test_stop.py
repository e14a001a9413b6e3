"""Ctrl-C after the anchors: the search stops after the trial in progress, the run certifies and keeps what it has,
and `--resume` continues the search (issue 60)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from modelopt.cli.app import app
from modelopt.testing.env import child_env
from modelopt.testing.journal import wait_for_trials


@pytest.mark.slow
def test_ctrl_c_after_the_anchors_keeps_a_certified_plan_and_resume_goes_on(tmp_path, fewer_data):
    run_dir = tmp_path / "run"
    # 8 or 4 bits per channel rounded to nearest, no batch norms re-estimated: four anchors, then trials of one unit
    # each (the budget is a number of trials), on 400 images whose 80 confirm images certify the INT8 anchor at 90 %.
    args = ["optimize", "--budget", "10", "--compressors", "quantize", "--bits", "8,4", "--granularity", "per_channel",
            "--norm-images", "0", "--data", str(fewer_data), "--min-retention", "0.9", "--out", str(run_dir),
            "--no-progress", "--reconstruct", "off", "--rounding", "nearest", "--latency", "none"]
    proc = subprocess.Popen([sys.executable, "-m", "modelopt", *args], env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    journal = run_dir / "trials.jsonl"
    wait_for_trials(run_dir, 6, proc)  # the four anchors and two of the search's trials
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 130, stderr
    assert "Best plan" in stdout and "--resume" in stderr and "Traceback" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best"]["confirmed"] and (run_dir / "best_plan.yaml").is_file()
    stopped_at = summary["n_trials"]
    assert stopped_at == journal.read_text().count("\n") < 10

    # The resume is the command line's, in this process (the signal was the other process's).
    done = CliRunner().invoke(app, [*args, "--resume", "--json"])
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["n_trials"] > stopped_at
