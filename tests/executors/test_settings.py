"""Executor settings: checked before any model loads, one line each; recorded in run.json."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from modelopt.cli.app import app
from modelopt.config.run_config import RunConfig
from modelopt.errors import ConfigError
from modelopt.executors.on_ray import import_ray
from modelopt.testing.cli import assert_one_line_error


@pytest.mark.parametrize("flags,needle", [
    (["--workers", "0"], "workers must be a number of plans in flight from 1 to 4096, like 2; got 0"),
    # Ray refused a 400-digit CPU count with a traceback after the run folder was made; the digits are not echoed
    (["--workers", "1" + "0" * 400], "workers must be a number of plans in flight from 1 to 4096, like 2; got an "
                                     "integer too large for a float"),
    (["--workers", "4097"], "from 1 to 4096, like 2; got 4097"),
    (["--executor", "dask"], "unknown executor 'dask'; choose one of local, ray"),
    (["--executor", "local", "--ray-address", "auto"], "ray_address 'auto' needs executor 'ray', not 'local'"),
])
def test_bad_executor_settings_are_one_line(tmp_path, flags, needle):
    args = ["optimize", "--reconstruct", "off", "--budget", "2", "--no-progress", "--out", str(tmp_path / "r"), *flags]
    result = CliRunner().invoke(app, args)
    assert_one_line_error(result, needle)
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


def test_more_than_one_worker_means_ray_unless_told_otherwise():
    fresh = RunConfig()
    assert fresh.replace().executor == "local"
    assert fresh.replace(workers=2).executor == "ray"
    assert fresh.replace(workers=2, executor="local").executor == "local"
    assert fresh.replace(ray_address="auto").executor == "ray"
    resumed = fresh.replace().replace(workers=3)  # `--resume --workers 3`
    assert (resumed.executor, resumed.workers) == ("ray", 3)


def test_run_json_keeps_the_executor_settings():
    config = RunConfig(executor="ray", workers=4, ray_address="auto")
    again = RunConfig.from_json(config.to_json())
    assert (again.executor, again.workers, again.ray_address) == ("ray", 4, "auto")
    assert RunConfig.from_json({k: v for k, v in config.to_json().items() if k != "workers"}).workers == 1


def test_ray_not_installed_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as when the `distributed` extra is not installed
    with pytest.raises(ConfigError, match=r"needs Ray: pip install 'modelopt\[distributed\]'"):
        import_ray()


def test_workers_without_ray_is_one_line_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    args = ["optimize",
        "--reconstruct", "off", "--budget", "2", "--no-progress", "--out", str(tmp_path / "r"), "--workers", "2"]
    result = CliRunner().invoke(app, args)
    assert_one_line_error(result, "--workers N, --ray-address) needs Ray: pip install 'modelopt[distributed]'")
