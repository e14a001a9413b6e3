"""Append-only JSONL journal: one line per trial, flushed and fsynced as it is written, and `Record`,
the one form a line is read back as (no search space needed; `Record.trial` rebuilds the live `Trial`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelopt._files import write_json_atomic
from modelopt.errors import LoadError, StorageError
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.trial import Trial, TrialStatus
from modelopt.plan.space import SearchSpace

__all__ = ["TRIAL_VERSION", "Journal", "Record", "read_json", "read_records", "write_json_atomic"]

TRIAL_VERSION = 1  # the line format's version, written as "v" on every line


@dataclass(frozen=True)
class Record:
    """One journal line: a trial as the run folder holds it, its plan in the journal's flat JSON form.

    Readers of a run (reports, sweeps, export) use it as it is; the runner's resume turns it back
    into a live `Trial` with `trial(space)`.

    Example:
        >>> rec = Record.of(trial)
        >>> Record.from_json(rec.to_json()) == rec
        True
    """

    number: int
    plan_key: str
    plan: dict[str, Any] = field(hash=False)  # {decision name: JSON form of the choice}; plan_key names it
    status: TrialStatus
    metrics: Metrics | None  # None for a failed trial
    reward: float | None  # None for a failed trial (and for a NaN or an infinity read back)
    feasible: bool
    cost: float  # budget charged, in full-evaluation equivalents
    seconds: float  # wall time of the evaluation
    strategy: str
    seed: int
    version: str  # the package version that scored it
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Completed with metrics (a failed trial has none)."""
        return self.status is TrialStatus.COMPLETE and self.metrics is not None

    @property
    def scored(self) -> Metrics:
        """The metrics of a trial that completed (check `ok` first: a failed one raises)."""
        if self.metrics is None:
            raise ValueError(f"trial {self.number} failed ({self.error}); it has no metrics")
        return self.metrics

    @classmethod
    def of(cls, trial: Trial) -> Record:
        """The line a trial is journaled as."""
        reward = None if trial.reward is None or math.isnan(trial.reward) else trial.reward
        return cls(number=trial.number, plan_key=trial.plan.key, plan=trial.plan.to_flat(), status=trial.status,
                   metrics=trial.metrics, reward=reward, feasible=trial.feasible, cost=trial.cost,
                   seconds=trial.seconds, strategy=trial.strategy, seed=trial.seed, version=trial.version,
                   error=trial.error)

    def to_json(self) -> dict[str, Any]:
        """The journal line (keys in the order every journal has them)."""
        return {
            "v": TRIAL_VERSION,
            "number": self.number,
            "plan_key": self.plan_key,
            "plan": self.plan,
            "status": self.status.value,
            "metrics": None if self.metrics is None else self.metrics.to_dict(),
            "reward": self.reward,
            "feasible": self.feasible,
            "cost": self.cost,
            "seconds": self.seconds,
            "strategy": self.strategy,
            "seed": self.seed,
            "version": self.version,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Record:
        """A journal line; fields that lines written before them lack take their defaults."""
        metrics = None if d.get("metrics") is None else Metrics.from_dict(d["metrics"])
        reward = d.get("reward")
        return cls(
            number=int(d["number"]),
            plan_key=str(d.get("plan_key", "")),
            plan=dict(d.get("plan") or {}),
            status=TrialStatus(d.get("status", TrialStatus.FAILED.value)),
            metrics=metrics,
            reward=None if reward is None or not math.isfinite(float(reward)) else float(reward),
            feasible=bool(d.get("feasible", False)),
            cost=float(d.get("cost", 0.0)),
            seconds=float(d.get("seconds", 0.0)),
            strategy=str(d.get("strategy", "")),
            seed=int(d.get("seed", 0)),
            version=str(d.get("version", "")),
            error=d.get("error"),
        )

    def trial(self, space: SearchSpace) -> Trial:
        """The live trial, its plan rebuilt in `space` (the one the run searched)."""
        return Trial(number=self.number, plan=space.plan_from_flat(self.plan), status=self.status,
                     metrics=self.metrics, reward=self.reward, feasible=self.feasible, cost=self.cost,
                     seconds=self.seconds, strategy=self.strategy, seed=self.seed, version=self.version,
                     error=self.error)


class Journal:
    """The one record of a run. A line cut short by a kill is dropped on the next open.

    Example:
        >>> j = Journal(run_dir / "trials.jsonl")
        >>> j.append(Record.of(trial))
        >>> [r.number for r in j.records()]
        [0]
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

    def records(self) -> list[Record]:
        """The finished trials; a line torn by a kill is cut off the file (the writer's reader).

        Raises:
            LoadError: a line before the last is damaged.
        """
        if not self.path.is_file():
            return []
        raw = self.path.read_bytes()
        lines, good_end = _parse(raw, self.path)
        if good_end < len(raw):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
        return _records(lines, self.path)

    def append(self, record: Record) -> None:
        """Appends one line, fsynced. If the write fails (a full disk), the partial line is cut off
        again, so the journal holds exactly the trials before it.

        Raises:
            ValueError: `record` holds a NaN or an infinity; nothing is written.
            StorageError: the line could not be written.
        """
        line = (json.dumps(record.to_json(), separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
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
            n = self.check()
            raise StorageError(
                f"cannot append to the journal {str(self.path)!r}: {exc.strerror or exc}; it keeps the {n} "
                "trials before this one: free space and rerun with --resume"
            ) from None
        finally:
            os.close(fd)


def read_records(path: str | Path) -> list[Record]:
    """A journal's finished trials by number, read without touching the file (a torn or damaged
    last line is skipped: the run may still be writing it): for readers of a run that may still be running,
    or copied elsewhere.

    Raises:
        LoadError: a line before the last is damaged (naming it): what follows it would be silently lost,
            and a report or export would state another run than the one that ran.

    Example:
        >>> sum(r.cost for r in read_records(run_dir / "trials.jsonl"))
    """
    path = Path(path)
    if not path.is_file():
        return []
    lines, _ = _parse(path.read_bytes(), path)
    return sorted(_records(lines, path), key=lambda r: r.number)


def _records(lines: list[Any], path: Path) -> list[Record]:
    """The journal's lines as records; a line that is JSON but not a trial record (a field missing or of the wrong
    kind) is damage, named by its line as a line that is not JSON is."""
    out = []
    for n, d in enumerate(lines):
        try:
            out.append(Record.from_json(d))
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            what = f"field {exc.args[0]!r} is missing" if isinstance(exc, KeyError) else (
                "it is not a JSON object" if not isinstance(d, dict) else f"a field is wrong ({exc})")
            raise LoadError(f"journal {str(path)!r} is damaged at line {n + 1}: {what} (the {n} trials before it "
                            f"are intact): keep them with `head -n {n} {path} > kept && mv kept {path}` (then resume "
                            "or read it again), or start afresh with another --out") from None
    return out


def _parse(raw: bytes, path: Path, *, strict: bool = True) -> tuple[list[dict[str, Any]], int]:
    """(lines as JSON, bytes they span): lines up to the first one that is torn (no newline) or, at the
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
                            f"intact): keep them with `head -n {n} {path} > kept && mv kept {path}` (then resume or "
                            "read it again), or start afresh with another --out") from None
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
