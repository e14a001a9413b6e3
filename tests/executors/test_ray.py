"""The Ray executor on a real local cluster: the same trials as the local executor, a worker killed
mid-run costs only a retry, a plan that kills its workers is recorded as failed, and a driver killed
with plans in flight resumes with nothing lost or repeated.

One cluster serves the module (`cluster`): a start costs ~10 s on a loaded 2-core machine, and each run's
executor joins the running cluster and leaves it up. Only the killed driver starts its own, in its own process:
that its Ray processes die with it is what the test checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modelopt import api
from modelopt.cli.app import app
from modelopt.compressors import COMPRESSORS
from modelopt.config.build import build
from modelopt.config.run_config import RunConfig
from modelopt.executors import RayExecutor
from modelopt.run.layout import STATE, STATE_NEXT
from modelopt.run.runner import Runner
from modelopt.testing.env import child_env
from modelopt.testing.journal import wait_for_trials

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one test process runs the clusters

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# Quantize only, random search, no latency timing, a floor 60 val images can certify (`ray_data`, tests/executors/
# conftest.py; its budgets count val passes of 60 images, and give each run the trials it had on 169): seconds per run.
# No reconstruction of the finalists: it runs in the driver after the search, as in a local run
# (tests/reconstruct checks it), and was a third of each run's time here.
SMALL = dict(strategy="random", compressors=["quantize"], bits=[8, 4], granularity=["per_channel"], progress=False,
             min_retention=0.9, latency=None, report=False, reconstruct=False)
# The fault tests round to nearest: no GPTQ pass in the driver and in each worker (the test that compares Ray's
# trials and charges with the local executor's keeps GPTQ, whose preparations are what a worker charges).
FAULTS = {"rounding": ["nearest"]}


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster of two CPUs for the module's tests (each executor joins it and leaves it running).

    Its workers run the crash test's setup hook (`_worker_crash.arm`, importable through PYTHONPATH, as this
    checkout): the hook arms only the `crash_worker` compressor's "crash" choice, which no other test's plans have,
    so they score as on a cluster without it (the comparison with the local executor below would show it otherwise)."""
    os.environ.setdefault("RAY_worker_niceness", "0")
    with pytest.MonkeyPatch.context() as env:  # the cluster's processes inherit it; this process's is restored
        env.setenv("PYTHONPATH", f"{HERE}{os.pathsep}{child_env()['PYTHONPATH']}")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"worker_process_setup_hook": "_worker_crash.arm"})
    try:
        yield
    finally:
        ray.shutdown()


def _journal(run: Path) -> list[dict]:
    """Every line whole JSON, numbered 0..n-1, no plan twice."""
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    assert [r["number"] for r in records] == list(range(len(records)))
    assert len({r["plan_key"] for r in records}) == len(records)
    return records


def _scores(records: list[dict]) -> list[tuple]:
    """What a trial measured and cost, without its wall times (charges to 12 digits: a worker's sum of
    preparations, settled by the driver, may differ from the local sum in the last bit)."""
    def rounded(v):
        return round(v, 12) if isinstance(v, float) else v

    return [(r["plan_key"], r["status"], rounded(r["cost"]),
             None if r["metrics"] is None else {k: rounded(v) for k, v in r["metrics"].items() if k != "eval_seconds"})
            for r in records]


def test_ray_workers_give_the_local_executors_trials(cluster, ray_data, tmp_path):
    """Two Ray workers and the local executor asking two plans ahead: the same trials, charged the same
    (each worker charges its preparations in full; the driver charges each once, as a local run). MCTS:
    the strategy whose batched asks depend most on state (virtual loss on the paths in flight)."""
    kw = {**SMALL, "strategy": "mcts", "budget": 10, "workers": 2}  # the 4 anchors, then a batch of two asks
    local = api.optimize("cifar10_resnet20", ray_data, out=tmp_path / "local", executor="local", **kw)
    on_ray = api.optimize("cifar10_resnet20", ray_data, out=tmp_path / "ray", executor="ray", **kw)
    assert _scores(_journal(on_ray.run_dir)) == _scores(_journal(local.run_dir))
    assert on_ray.budget_used == pytest.approx(local.budget_used, abs=1e-9) and on_ray.budget_used >= 10
    assert on_ray.summary.preparation.charged == local.summary.preparation.charged


def _runner(data: Path, out: Path, budget: float, **settings) -> tuple[Runner, RayExecutor]:
    small = {k: v for k, v in SMALL.items() if k not in ("report", "progress")}
    config = RunConfig().replace(model="cifar10_resnet20", data=str(data), **{
        **small, "budget": budget, "workers": 2, "executor": "ray", **settings})
    built = build(config)
    executor = RayExecutor(built.config)
    return Runner(built.evaluator, built.strategy, built.objective, budget=budget, run_dir=out, config=built.config,
                  progress=False, fidelity=config.fidelity, executor=executor), executor


def test_a_worker_killed_mid_run_costs_a_retry(cluster, ray_data, tmp_path):
    out = tmp_path / "run"
    runner, executor = _runner(ray_data, out, budget=11, **FAULTS)  # 6 trials: the kill comes after the 2nd
    killed: list[int] = []

    def kill_one_worker() -> None:  # SIGKILL a worker once two trials are journaled
        while not (out / "trials.jsonl").is_file() or len((out / "trials.jsonl").read_text().splitlines()) < 2:
            time.sleep(0.05)
        killed.append(executor.worker_pids()[0])
        os.kill(killed[0], signal.SIGKILL)

    thread = threading.Thread(target=kill_one_worker, daemon=True)
    thread.start()
    result = runner.run()
    thread.join(timeout=5)
    records = _journal(out)
    assert killed and sum(executor.deaths.values()) == 1
    assert all(r["status"] == "complete" for r in records)  # the lost plan was scored again, not failed
    assert result.budget_used >= 11 and sum(r["cost"] for r in records) == pytest.approx(result.budget_used)
    print(f"\nkilled worker pid {killed[0]}; {len(records)} trials, every plan once; retries {dict(executor.deaths)}")


def test_a_plan_that_kills_its_workers_twice_is_recorded_failed(cluster, ray_data, tmp_path):
    import _worker_crash  # tests/executors is on sys.path (pytest prepends a test file's folder)

    _worker_crash.register()
    try:
        out = tmp_path / "run"
        # The crashing plan is the 3rd asked (seed 0); 7.5 val passes of 60 images leave room for one plan after it.
        runner, executor = _runner(ray_data, out, budget=7.5, compressors=["quantize", "crash_worker"],
                                   confidence=0.0, **FAULTS)
        runner.run()
    finally:
        COMPRESSORS._items.pop("crash_worker", None)  # other tests see the registry as shipped
    records = _journal(out)
    crashed = [r for r in records if r["plan"].get("linear/crash_worker") == "crash"]
    assert crashed, "the random search never tried the crashing choice"
    for r in crashed:
        assert r["status"] == "failed" and "died 2 times" in r["error"] and r["cost"] == 1.0
        assert executor.deaths[r["plan_key"]] == 2
    assert any(r["status"] == "complete" for r in records)  # the search went on


def _ray_processes(session_pid: int) -> list[str]:
    """Command lines of Ray's processes whose session the driver `session_pid` started. In full (-ww): cut to the
    terminal's or 80 columns, as ps cuts them under pytest, no line reached the session's name, and none matched."""
    out = subprocess.run(["ps", "-e", "-ww", "-o", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if f"_{session_pid}/" in line or f"_{session_pid} " in line]


def _in_flight(run: Path, n_trials: int) -> list[dict]:
    """The plans (journal form) the killed driver had asked and not recorded (the state matching its journal)."""
    for name in (STATE_NEXT, STATE):
        path = run / name
        if path.is_file() and (state := json.loads(path.read_text()))["n_trials"] == n_trials:
            return state["in_flight"]
    raise AssertionError("no state matches the journal")


def test_a_driver_killed_with_plans_in_flight_resumes(cluster, ray_data, tmp_path):
    run = tmp_path / "run"
    args = ["optimize", "--data", str(ray_data), "--strategy", "mcts", "--compressors", "quantize", "--bits", "8,4",
            "--granularity", "per_channel", "--min-retention", "0.9", "--latency", "none", "--rounding", "nearest",
            "--reconstruct", "off", "--workers", "2", "--no-progress", "--out", str(run), "--budget", "15"]  # 8 trials
    # The driver to kill runs in a process of its own: not having one, it starts a Ray cluster of its own (the module's
    # cluster is this process's), whose processes must end with it.
    driver = subprocess.Popen([sys.executable, "-m", "modelopt", *args], cwd=tmp_path,
                              env=child_env(OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # The journal's 5th line is past the 4 anchors (INT8, INT4 and INT4's two hedges), which are scored one by
        # one before the search has plans in flight. Its Ray processes are looked for while the anchors are scored.
        wait_for_trials(run, 4, driver)
        assert _ray_processes(driver.pid), "the driver runs on a Ray cluster it did not start"
        wait_for_trials(run, 5, driver)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.wait(timeout=60)
    before = _journal(run)
    in_flight = _in_flight(run, len(before))
    assert in_flight, "the driver had no plan in flight when it was killed"
    deadline = time.monotonic() + 3  # Ray's processes go with their driver: within 3 s, or the test fails
    while (left := _ray_processes(driver.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], "the killed driver's Ray processes outlived it"
    # The resume, the same command line, runs in this process: its executor joins the module's cluster (a driver
    # whose process has one uses it), which spares a second process's start-up and a second cluster's.
    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output[-2000:]
    after = _journal(run)  # numbered 0..n-1, no plan twice
    assert after[: len(before)] == before and sum(r["cost"] for r in after) >= 15
    assert [r["plan"] for r in after[len(before): len(before) + len(in_flight)]] == in_flight
    print(f"\nkilled after {len(before)} trials with {len(in_flight)} in flight; resumed to {len(after)} trials")
