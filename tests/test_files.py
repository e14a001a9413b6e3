"""Atomic writes: a unique temporary per write, nothing left behind on failure, one clear error."""

from __future__ import annotations

import json
import os
import threading

import pytest

from modelopt._files import write_atomic, write_json_atomic
from modelopt.errors import StorageError


def test_each_write_has_its_own_temporary_and_leaves_none(tmp_path, monkeypatch):
    seen: list[str] = []
    real = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    for i in range(3):
        write_atomic(tmp_path / "best_plan.yaml", f"v{i}\n")
    assert len(set(seen)) == 3 and all(s.endswith(".tmp") for s in seen)  # never one shared name
    assert (tmp_path / "best_plan.yaml").read_text() == "v2\n"
    assert os.listdir(tmp_path) == ["best_plan.yaml"]
    assert oct((tmp_path / "best_plan.yaml").stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode


def test_concurrent_writers_never_tear_a_file(tmp_path):
    path = tmp_path / "summary.json"
    docs = [{"writer": w, "pad": "x" * 200_000} for w in range(4)]
    errors: list[BaseException] = []

    def write(doc):
        try:
            for _ in range(10):
                write_json_atomic(path, doc, durable=False)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(d,)) for d in docs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert json.loads(path.read_text()) in docs  # whole, one writer's
    assert os.listdir(tmp_path) == ["summary.json"]


def test_a_failed_write_is_one_error_and_leaves_the_old_file(tmp_path):
    (tmp_path / "report.md").mkdir()  # os.replace onto a folder fails after the temporary is written
    with pytest.raises(StorageError, match=r"cannot write .*report\.md"):
        write_atomic(tmp_path / "report.md", "# report")
    assert sorted(os.listdir(tmp_path)) == ["report.md"]
    with pytest.raises(StorageError, match="cannot write"):
        write_atomic(tmp_path / "missing" / "x.json", "{}")


def test_nan_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError):
        write_json_atomic(tmp_path / "run.json", {"budget": float("nan")})
    assert os.listdir(tmp_path) == []


def test_save_atomic_writes_what_the_writer_wrote_or_leaves_the_old_file(tmp_path):
    from modelopt._files import save_atomic

    path = save_atomic(tmp_path / "model.pt", lambda f: f.write(b"old"))
    assert path.read_bytes() == b"old"

    def crashes(f):
        f.write(b"half")
        raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError, match="the writer failed"):
        save_atomic(path, crashes)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.pt"]
