"""The knowledge store on disk: one versioned JSON file of what runs learned, one entry per run.

A store path names either a JSON file (``k.json``) or a folder (anything else), which then holds
``knowledge.json``. The file is replaced atomically (`modelopt._files.write_json_atomic`), so a
reader sees the old store or the new, never half; writers (runs of a sweep finishing together)
take an advisory lock on ``<file>.lock`` around read-merge-write, so none loses another's entry.
Each run's entry is keyed by host and run folder: recording a resumed run again replaces its entry.
A file that cannot be read as a store is refused in one line (`LoadError`) naming it and what is
wrong; a missing one is an empty store (a first run has nothing to start from).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelopt._files import write_json_atomic
from modelopt._version import __version__
from modelopt.errors import LoadError, StorageError
from modelopt.knowledge.lessons import RunLessons

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; concurrent writers may then drop each other's entries
    fcntl = None  # type: ignore[assignment]

__all__ = ["FORMAT", "STORE_FILE", "STORE_VERSION", "Store", "read_store", "record", "store_file"]

FORMAT = "modelopt-knowledge"
STORE_VERSION = 1
STORE_FILE = "knowledge.json"  # inside a store folder


def store_file(path: str | Path) -> Path:
    """The JSON file a store path names: itself when it ends in .json, else ``<folder>/knowledge.json``."""
    path = Path(path)
    return path if path.suffix.lower() == ".json" else path / STORE_FILE


@dataclass(frozen=True)
class Store:
    """Every run's lessons in a store, by run id (``host:run folder``)."""

    runs: dict[str, RunLessons] = field(default_factory=dict)

    def with_run(self, lessons: RunLessons) -> Store:
        return Store({**self.runs, lessons.run: lessons})

    def merged(self, other: Store) -> Store:
        """Both stores' runs (the other's entry wins for a run both hold): stores of several machines become one."""
        return Store({**self.runs, **other.runs})

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": STORE_VERSION, "written_by": __version__,
                "runs": {run: lessons.to_json() for run, lessons in self.runs.items()}}


def _refuse(file: Path, what: str) -> LoadError:
    return LoadError(f"knowledge store {str(file)!r} {what}; move it away (or pass another --knowledge) to start "
                     "a new store")


def _parse(file: Path, raw: Any) -> Store:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise _refuse(file, f"is not a modelopt knowledge store (no \"format\": \"{FORMAT}\")")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _refuse(file, f"has version {version!r}, not a positive integer")
    if version > STORE_VERSION:
        raise _refuse(file, f"was written by a newer modelopt (store version {version}; this one reads up to "
                      f"{STORE_VERSION})")
    runs = raw.get("runs")
    if not isinstance(runs, dict):
        raise _refuse(file, "has no runs mapping")
    out = {}
    for run, entry in runs.items():
        try:
            out[run] = RunLessons.from_json(run, entry)
        except (ValueError, KeyError, TypeError) as exc:
            raise _refuse(file, f"has a damaged entry for run {run!r} ({exc})") from None
    return Store(out)


def read_store(path: str | Path) -> Store:
    """The store at `path` (a file or a folder; see `store_file`); an empty one when there is none yet.

    Raises:
        LoadError: the file exists but is not a readable knowledge store (one line, naming it).

    Example:
        >>> store = read_store("runs/knowledge")
        >>> sorted(store.runs)
    """
    file = store_file(path)
    if not file.exists():
        return Store()
    if file.is_dir():
        raise LoadError(f"knowledge store {str(file)!r} is a folder; name a .json file or the folder holding "
                        f"{STORE_FILE}")
    try:
        raw = json.loads(file.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise LoadError(f"cannot read knowledge store {str(file)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _refuse(file, "is not text (not UTF-8): damaged, or not a knowledge store") from None
    except json.JSONDecodeError as exc:
        raise _refuse(file, f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    return _parse(file, raw)


@contextlib.contextmanager
def _locked(file: Path) -> Iterator[None]:
    """Holds an exclusive advisory lock on ``<file>.lock`` (blocking: a writer's turn takes milliseconds)."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        handle = open(file.with_name(file.name + ".lock"), "a")  # closed below, which unlocks
    except OSError as exc:
        raise StorageError(f"cannot lock knowledge store {str(file)!r}: {exc.strerror or exc}") from None
    try:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()


def record(path: str | Path, lessons: RunLessons) -> Store:
    """Adds (or replaces) one run's lessons in the store at `path`, under its lock; returns the new store.

    Raises:
        LoadError: the store there is not readable (it is left as it is).
        StorageError: it could not be written.
    """
    file = store_file(path)
    with _locked(file):
        store = read_store(file).with_run(lessons)
        write_json_atomic(file, store.to_json())
    return store
