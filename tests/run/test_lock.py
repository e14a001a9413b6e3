"""The run folder's lock: one writer per folder, refused in one line, freed by any exit of its holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modelopt.errors import StorageError
from modelopt.run.lock import LOCK, RunFolderBusy, check_started, check_unlocked, lock_run_folder
from modelopt.testing.env import child_env

REPO = Path(__file__).resolve().parents[2]


def test_a_second_lock_on_the_folder_is_refused_until_the_first_is_released(tmp_path):
    run = tmp_path / "run"
    first = lock_run_folder(run)  # creates the folder
    assert first.held and (run / LOCK).is_file()
    busy = rf"run folder '{run}' is in use by another modelopt process \(pid {os.getpid()}\)"
    with pytest.raises(RunFolderBusy, match=busy):
        lock_run_folder(run)  # flock conflicts across open files, even in one process
    with pytest.raises(RunFolderBusy):
        check_unlocked(run)
    first.release()
    assert not first.held
    check_unlocked(run)
    with lock_run_folder(run) as again:
        assert again.held
    assert not again.held


def test_the_lock_dies_with_its_holder_even_on_sigkill(tmp_path):
    run = tmp_path / "run"
    code = ("import sys, time; from modelopt.run.lock import lock_run_folder; "
            "l = lock_run_folder(sys.argv[1]); print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match=rf"\(pid {proc.pid}\)"):
            lock_run_folder(run)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 5
    while True:  # the kernel drops the lock with the process's files
        try:
            lock_run_folder(run).release()
            break
        except RunFolderBusy:
            assert time.time() < deadline, "the lock outlived its holder"
            time.sleep(0.05)


def test_an_unwritable_or_file_path_is_one_clear_error(tmp_path):
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc (Linux)")
    with pytest.raises(StorageError, match="cannot write to run folder '/proc/modelopt-run'"):
        lock_run_folder("/proc/modelopt-run")
    (tmp_path / "f").write_text("x")
    with pytest.raises(Exception, match="is a file; pass a folder to --out"):
        lock_run_folder(tmp_path / "f")


def test_a_run_folder_without_settings_is_busy_only_while_its_run_holds_it(tmp_path):
    """`check_started`: a folder whose run is still loading (locked, no run.json) is busy; one that is not locked, or
    holds its run.json (a run under way: its trials may be read), is not."""
    run = tmp_path / "run"
    check_started(run)  # no folder: nothing to say here
    with lock_run_folder(run):
        with pytest.raises(RunFolderBusy, match=rf"in use by another modelopt process \(pid {os.getpid()}\), which is "
                                                "still loading and has not written its run.json yet"):
            check_started(run)
        (run / "run.json").write_text("{}")
        check_started(run)
    (run / "run.json").unlink()
    check_started(run)  # released: a folder no run holds is the reader's to judge
