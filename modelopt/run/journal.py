"""Append-only JSONL journal: one line per trial, flushed and fsynced as it is written."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from modelopt._files import write_json_atomic
from modelopt.errors import LoadError, StorageError


class Journal:
    """The one record of a run. A line cut short by a kill is dropped on the next open.

    Example:
        >>> j = Journal(run_dir / "trials.jsonl")
        >>> j.append({"number": 0, ...})
        >>> j.read()
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def check(self) -> int:
        """The number of finished trials, the file untouched (a torn last line is not counted).

        Raises:
            LoadError: a line before the last is damaged (it says how to keep the trials before it).
        """
        if not self.path.is_file():
            return 0
        return len(_parse(self.path.read_bytes(), self.path)[0])

    def read(self) -> list[dict[str, Any]]:
        """The finished trials; a line torn by a kill is cut off the file (the writer's reader)."""
        if not self.path.is_file():
            return []
        raw = self.path.read_bytes()
        records, good_end = _parse(raw, self.path)
        if good_end < len(raw):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
        return records

    def append(self, record: dict[str, Any]) -> None:
        """Appends one line, fsynced. If the write fails (a full disk), the partial line is cut off
        again, so the journal holds exactly the trials before it.

        Raises:
            ValueError: `record` holds a NaN or an infinity; nothing is written.
            StorageError: the line could not be written.
        """
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise StorageError(f"cannot write the journal {str(self.path)!r}: {exc.strerror or exc}") from None
        start = os.fstat(fd).st_size  # one writer (the run folder's lock): where this line begins
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
                os.fsync(fd)
            n = len(self.read())
            raise StorageError(
                f"cannot append to the journal {str(self.path)!r}: {exc.strerror or exc}; it keeps the {n} "
                "trials before this one: free space and rerun with --resume"
            ) from None
        finally:
            os.close(fd)


__all__ = ["Journal", "write_json_atomic"]


def read_journal(path: str | Path) -> list[dict[str, Any]]:
    """A journal's finished trials by number, read without touching the file (a torn or damaged
    last line is skipped): for readers of a run that may still be running, or copied elsewhere."""
    path = Path(path)
    if not path.is_file():
        return []
    records, _ = _parse(path.read_bytes(), path, strict=False)
    return sorted(records, key=lambda r: int(r["number"]))


def _parse(raw: bytes, path: Path, *, strict: bool = True) -> tuple[list[dict[str, Any]], int]:
    """(records, bytes they span): lines up to the first one that is torn (no newline) or, at the
    end of the file (or anywhere unless `strict`), not JSON; a bad line before the end is corruption."""
    records: list[dict[str, Any]] = []
    good_end = 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # torn final write: the trial never finished being recorded
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if not strict or good_end + len(line) == len(raw):
                break
            n = len(records)
            raise LoadError(f"journal {str(path)!r} is damaged at line {n + 1} (the {n} trials before it are "
                            f"intact): keep them with `head -n {n} {path} > kept && mv kept {path}` and "
                            "resume, or start afresh with another --out") from None
        good_end += len(line)
    return records, good_end


def read_json(path: str | Path) -> dict[str, Any] | None:
    """A run or sweep folder's JSON file (summary, layer table, sweep.json), or None when it is
    missing, unreadable or not a JSON object (a report reads what is there)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (ValueError, OSError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return doc if isinstance(doc, dict) else None
