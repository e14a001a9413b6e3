"""The sweep's tables are rewritten atomically: a failed write leaves the tables of the last good one."""

from __future__ import annotations

import os
import shutil

import pytest

from modelopt.errors import StorageError
from modelopt.sweep.table import SEEDS_CSV, TABLE_CSV, TABLE_MD, make_table

TABLES = (TABLE_MD, TABLE_CSV, SEEDS_CSV)


@pytest.mark.slow
@pytest.mark.xdist_group("small_sweep")  # the test process that makes small_sweep for the sweep report
def test_a_failed_rewrite_leaves_the_old_tables_whole(small_sweep, small_workload, tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    shutil.copytree(small_sweep, out)
    old = {name: (out / name).read_bytes() for name in TABLES}
    assert all(old.values())
    before = sorted(os.listdir(out))

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(StorageError, match=f"cannot write .*{TABLE_MD}.*No space left"):
        make_table(out, workloads={"resnet20": small_workload}, device="cpu")
    assert {name: (out / name).read_bytes() for name in TABLES} == old
    assert sorted(os.listdir(out)) == before  # no temporary left behind
    monkeypatch.undo()
    make_table(out, workloads={"resnet20": small_workload}, device="cpu")
    assert (out / TABLE_MD).read_text() == old[TABLE_MD].decode()  # the same runs give the same table
