"""NVIDIA's nvidia-modelopt also installs a package named `modelopt`: importing ours with it present
says so in one warning line. The clash is real metadata: a fake nvidia-modelopt dist-info on sys.path,
found by the real importlib.metadata in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import modelopt
from modelopt._name_clash import clash_message

ROOT = Path(modelopt.__file__).resolve().parents[1]  # the tree under test, first on the child's path


def _fake_nvidia_modelopt(site: Path, version: str = "0.99.0") -> Path:
    info = site / f"nvidia_modelopt-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-modelopt\nVersion: {version}\n")
    (info / "top_level.txt").write_text("modelopt\n")
    return site


def _import_modelopt(site: Path | None, *flags: str) -> subprocess.CompletedProcess[str]:
    path = [str(site)] if site is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *flags, "-c", "import modelopt"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_no_clash_in_this_environment():
    assert clash_message() is None


def test_the_clash_is_one_line_naming_both_packages_and_the_fix(tmp_path):
    site = _fake_nvidia_modelopt(tmp_path / "site")
    # As an error the warning stops the import at once: no need to load torch to read it.
    proc = _import_modelopt(site, "-W", "error::UserWarning")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("modelopt.errors.NameClashWarning: two packages named 'modelopt' are installed"), last
    assert f"from {ROOT / 'modelopt'}" in last
    assert "nvidia-modelopt 0.99.0" in last and str(site) in last
    assert last.endswith("install them in separate virtual environments")


@pytest.mark.slow
def test_without_the_fake_distribution_the_same_child_imports_cleanly(tmp_path):
    proc = _import_modelopt(tmp_path, "-W", "error::UserWarning")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_with_the_clash_the_package_still_imports_and_warns_once(tmp_path):
    proc = _import_modelopt(_fake_nvidia_modelopt(tmp_path / "site"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("NameClashWarning") == 1, proc.stderr
