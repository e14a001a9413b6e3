"""Shared fixtures: the real ResNet-20 workload on the bundled CIFAR-10 sample, built once.

A test module's costly fixtures (an evaluator whose caches its tests share) are session-scoped, not module-scoped:
pytest-xdist hands a test process tests of several modules in turn, and pytest tears a module's fixtures down
whenever the next test is another module's, so a module fixture was rebuilt each time its module came back."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _share_the_cores() -> None:
    """Under pytest-xdist each test process gets its share of the cores as torch threads, and so do the
    runs it starts in subprocesses (OMP_NUM_THREADS): n processes of all-core OpenMP pools on n cores
    spin against each other and run far slower than one thread each."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, _cores() // workers))


_share_the_cores()  # before anything imports torch


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one test process per core and one more. Many slow tests wait on a subprocess or a
    Ray cluster that uses a core of its own, and the extra process keeps the cores busy meanwhile."""
    return _cores() + 1


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--dist loadgroup`: the tests of one `xdist_group` go to one test process. pytest-xdist names a test's group
    in its node id (`...@group`), and xdist 3.8 writes that id to `item._nodeid`, which pytest 9.2 no longer reads
    (it keeps the id in `item._id`): every group was silently ignored, and the Ray clusters, the shared sweeps and
    the heads fitted once per group were started, made and fitted in every test process. Here the id is written
    where this pytest reads it (a no-op where xdist's own write took)."""
    if not getattr(config.option, "loadgroup", False) or not hasattr(items[0] if items else None, "_id"):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "data" / "cifar10").is_dir():
        pytest.skip(f"needs the shared CIFAR-10 data and checkpoints in {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def resnet20_workload():
    from modelopt.api import build_workload

    return build_workload("cifar10_resnet20", "cifar10-exact-sample", device="cpu")


# ---- small real runs that report, export and storage tests read (built once per session) ----


@pytest.fixture(scope="session")
def small_data(tmp_path_factory) -> Path:
    """The bundled sample's 846 CIFAR-10 test images as an .npz (split 20/40/40 % calib/val/test): fast trials."""
    import numpy as np

    from modelopt.data.sample import SAMPLE_PATH

    path = tmp_path_factory.mktemp("small_data") / "cifar10_846.npz"
    with np.load(SAMPLE_PATH) as f:
        np.savez(path, x=f["test_x"], y=f["test_y"])
    return path


@pytest.fixture(scope="session")
def small_workload(small_data):
    from modelopt.api import build_workload

    return build_workload("cifar10_resnet20", str(small_data), device="cpu")


# The floor the small runs search under: low enough that a few hundred val images certify plans.
SMALL_FLOOR = 0.9


def _built_once(tmp_path_factory, name: str, build) -> Path:
    """What `build(folder)` returns, built in a folder every xdist worker of the session shares, by the first worker
    that asks (the others wait for it): a session fixture's run is made once per session, not once per worker."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, done = shared / f"built_{name}", shared / f"built_{name}.done"
    with FileLock(str(shared / f"built_{name}.lock")):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            done.write_text(str(build(folder).relative_to(folder)))
    return folder / done.read_text()


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, request) -> Path:
    """A finished MCTS run (quantize, budget 18: 12+ trials) of ResNet-20 on `small_data`, as `modelopt optimize`
    leaves it (journal, summary, best plan, layer table). Read-only: copy what a test changes."""
    import modelopt

    def build(folder: Path) -> Path:
        out = folder / "run"
        modelopt.optimize(request.getfixturevalue("small_workload"), strategy="mcts", budget=18,
                          min_retention=SMALL_FLOOR, seed=0, out=out, progress=False, compressors=["quantize"],
                          report=False)
        return out

    return _built_once(tmp_path_factory, "small_run", build)


@pytest.fixture(scope="session")
def small_curve_run(tmp_path_factory, request) -> Path:
    """A finished run with a certified curve (floors 95, 90 and 85 %; quantize, budget 6, no reconstruction) of
    ResNet-20 on `small_data`: its ~170 confirm images certify these floors. Read-only: copy what a test changes."""
    import modelopt

    def build(folder: Path) -> Path:
        out = folder / "run"
        modelopt.optimize(request.getfixturevalue("small_workload"), budget=6, out=out, progress=False, seed=0,
                          min_retention=SMALL_FLOOR, floors=[0.95, 0.85], reconstruct=False, compressors=["quantize"],
                          report=False)
        return out

    return _built_once(tmp_path_factory, "small_curve_run", build)


@pytest.fixture(scope="session")
def small_sweep(tmp_path_factory, request) -> Path:
    """A finished sweep (random and MCTS, seeds 0 and 1, budget 4) on `small_workload`: its folder
    holds sweep.json, table.md and runs/resnet20/<strategy>/seed<k>/. Read-only."""
    from modelopt.sweep import run_sweep

    def build(root: Path) -> Path:
        (root / "small.yaml").write_text(
            "name: small\nout: small\nmodels:\n  - name: resnet20\n    model: cifar10_resnet20\n"
            f"strategies: [random, mcts]\nbudgets: [4]\nseeds: [0, 1]\nmin_retention: {SMALL_FLOOR}\n"
            "compressors: [quantize]\ndevice: cpu\nreconstruct: false\nlatency: none\n")  # no test reads timings
        run_sweep(root / "small.yaml", progress=False,
                  workloads={"resnet20": request.getfixturevalue("small_workload")})
        return root / "small"

    return _built_once(tmp_path_factory, "small_sweep", build)
