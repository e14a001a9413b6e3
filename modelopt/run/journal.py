"""Append-only JSONL journal: one line per trial, flushed and fsynced as it is written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from modelopt.errors import LoadError


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

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        raw = self.path.read_bytes()
        records, good_end = [], 0
        for line in raw.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # torn final write: the trial never finished being recorded
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if good_end + len(line) == len(raw):
                    break
                raise LoadError(f"journal {str(self.path)!r} is corrupt at record {len(records) + 1}") from None
            good_end += len(line)
        if good_end < len(raw):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
        return records

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def write_json_atomic(path: str | Path, obj: Any, *, durable: bool = True) -> None:
    """Writes JSON so a reader sees the old file or the new one, never half of one.

    `durable=False` skips fsync: the file still survives a killed process (the kernel has
    it), only not a power cut; for state that the journal can rebuild.
    """
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        # One dumps + write: json.dump streams small chunks and costs ~10x more (search overhead).
        f.write(json.dumps(obj, indent=None if not durable else 1, separators=None if durable else (",", ":"),
                           allow_nan=False))
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
