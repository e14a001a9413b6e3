"""The Ray executor on a real local cluster: the same trials as the local executor, a worker killed
mid-run costs only a retry, a plan that kills its workers is recorded as failed, and a driver killed
with plans in flight resumes with nothing lost or repeated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from modelopt import api
from modelopt.compressors import COMPRESSORS
from modelopt.config.build import build
from modelopt.config.run_config import RunConfig
from modelopt.executors import RayExecutor
from modelopt.run.layout import STATE, STATE_NEXT
from modelopt.run.runner import Runner

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one test process runs the clusters

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# Quantize only, random search, no latency timing, a floor 338 val images can certify: seconds per run.
# No reconstruction of the finalists: it runs in the driver after the search, as in a local run
# (tests/reconstruct checks it), and was a third of each run's time here.
SMALL = dict(strategy="random", compressors=["quantize"], bits=[8, 4], granularity=["per_channel"], progress=False,
             min_retention=0.9, latency=None, report=False, reconstruct=False)
# The fault tests round to nearest: no GPTQ pass in the driver and in each worker (the test that compares Ray's
# trials and charges with the local executor's keeps GPTQ, whose preparations are what a worker charges).
FAULTS = {"rounding": ["nearest"]}


@pytest.fixture
def cluster():
    """A local Ray cluster of two CPUs for one test (the executor joins it and leaves it running)."""
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
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


def test_ray_workers_give_the_local_executors_trials(cluster, small_data, tmp_path):
    """Two Ray workers and the local executor asking two plans ahead: the same trials, charged the same
    (each worker charges its preparations in full; the driver charges each once, as a local run). MCTS:
    the strategy whose batched asks depend most on state (virtual loss on the paths in flight)."""
    kw = {**SMALL, "strategy": "mcts", "budget": 7, "workers": 2}
    local = api.optimize("cifar10_resnet20", small_data, out=tmp_path / "local", executor="local", **kw)
    on_ray = api.optimize("cifar10_resnet20", small_data, out=tmp_path / "ray", executor="ray", **kw)
    assert _scores(_journal(on_ray.run_dir)) == _scores(_journal(local.run_dir))
    assert on_ray.budget_used == pytest.approx(local.budget_used, abs=1e-9) and on_ray.budget_used >= 7
    assert on_ray.summary.preparation.charged == local.summary.preparation.charged


def _runner(small_data, out: Path, budget: float, **settings) -> tuple[Runner, RayExecutor]:
    small = {k: v for k, v in SMALL.items() if k not in ("report", "progress")}
    config = RunConfig().replace(model="cifar10_resnet20", data=str(small_data), **{
        **small, "budget": budget, "workers": 2, "executor": "ray", **settings})
    built = build(config)
    executor = RayExecutor(built.config)
    return Runner(built.evaluator, built.strategy, built.objective, budget=budget, run_dir=out, config=built.config,
                  progress=False, fidelity=config.fidelity, executor=executor), executor


def test_a_worker_killed_mid_run_costs_a_retry(cluster, small_data, tmp_path):
    out = tmp_path / "run"
    runner, executor = _runner(small_data, out, budget=8, **FAULTS)
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
    assert result.budget_used >= 8 and sum(r["cost"] for r in records) == pytest.approx(result.budget_used)
    print(f"\nkilled worker pid {killed[0]}; {len(records)} trials, every plan once; retries {dict(executor.deaths)}")


def test_a_plan_that_kills_its_workers_twice_is_recorded_failed(small_data, tmp_path, monkeypatch):
    import _worker_crash  # tests/executors is on sys.path (pytest prepends a test file's folder)

    _worker_crash.register()
    monkeypatch.setenv("PYTHONPATH", f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("RAY_worker_niceness", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"worker_process_setup_hook": "_worker_crash.arm"})
    try:
        out = tmp_path / "run"
        runner, executor = _runner(small_data, out, budget=5, compressors=["quantize", "crash_worker"],
                                   confidence=0.0, **FAULTS)
        runner.run()
    finally:
        ray.shutdown()
        COMPRESSORS._items.pop("crash_worker", None)  # other tests see the registry as shipped
    records = _journal(out)
    crashed = [r for r in records if r["plan"].get("linear/crash_worker") == "crash"]
    assert crashed, "the random search never tried the crashing choice"
    for r in crashed:
        assert r["status"] == "failed" and "died 2 times" in r["error"] and r["cost"] == 1.0
        assert executor.deaths[r["plan_key"]] == 2
    assert any(r["status"] == "complete" for r in records)  # the search went on


def _ray_processes(session_pid: int) -> list[str]:
    """Command lines of Ray's processes whose session the driver `session_pid` started."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if f"_{session_pid}/" in line or f"_{session_pid} " in line]


def _in_flight(run: Path, n_trials: int) -> list[dict]:
    """The plans (journal form) the killed driver had asked and not recorded (the state matching its journal)."""
    for name in (STATE_NEXT, STATE):
        path = run / name
        if path.is_file() and (state := json.loads(path.read_text()))["n_trials"] == n_trials:
            return state["in_flight"]
    raise AssertionError("no state matches the journal")


def test_a_driver_killed_with_plans_in_flight_resumes(small_data, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "modelopt", "optimize", "--data", str(small_data), "--strategy", "mcts",
           "--compressors", "quantize", "--bits", "8,4", "--granularity", "per_channel", "--min-retention", "0.9",
           "--latency", "none", "--rounding", "nearest", "--reconstruct", "off", "--workers", "2", "--no-progress",
           "--out", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen([*cmd, "--budget", "10"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        # Generous for a loaded machine: the wait ends on the journal's 5th line, past the 4 anchors (INT8, INT4
        # and INT4's two hedges), which are scored one by one before the search has plans in flight.
        deadline = time.monotonic() + 900
        while not (run / "trials.jsonl").is_file() or len((run / "trials.jsonl").read_text().splitlines()) < 5:
            assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, (f"waited 900 s for the journal's 5th line in {run}; load "
                                                 f"{os.getloadavg()}")
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.wait(timeout=60)
    before = _journal(run)
    in_flight = _in_flight(run, len(before))
    assert in_flight, "the driver had no plan in flight when it was killed"
    time.sleep(3)
    assert _ray_processes(driver.pid) == [], "the killed driver's Ray processes outlived it"
    resumed = subprocess.run([*cmd, "--budget", "10", "--resume"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _journal(run)  # numbered 0..n-1, no plan twice
    assert after[: len(before)] == before and sum(r["cost"] for r in after) >= 10
    assert [r["plan"] for r in after[len(before): len(before) + len(in_flight)]] == in_flight
    print(f"\nkilled after {len(before)} trials with {len(in_flight)} in flight; resumed to {len(after)} trials")
