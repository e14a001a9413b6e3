"""An exclusive lock on a run folder, held for the life of the run that writes it.

Two processes appending to one journal would number trials twice and spend the budget twice,
silently. `lock_run_folder` takes an advisory lock (``flock``) on ``<run>/.lock``; a second
`modelopt optimize` on the same folder, fresh or ``--resume``, is refused in one line naming it.
The kernel drops the lock when its holder exits, however it exits (SIGKILL included), so a killed
run never leaves the folder locked; the lock file itself stays and means nothing on its own.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import IO

from modelopt.errors import ConfigError, StorageError
from modelopt.run.layout import CONFIG, LOCK

try:
    import fcntl
except ImportError:  # Windows: msvcrt's byte-range lock does the same job
    fcntl = None  # type: ignore[assignment]
    import msvcrt

__all__ = ["LOCK", "RunFolderBusy", "RunLock", "check_started", "check_unlocked", "lock_run_folder"]


class RunFolderBusy(ConfigError):
    """Another process holds the run folder's lock."""


class RunLock:
    """The held lock; `release` (or the process's exit) frees it."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path, self._handle = path, handle

    @property
    def held(self) -> bool:
        return not self._handle.closed

    def release(self) -> None:
        if not self._handle.closed:
            self._handle.close()  # closing the descriptor drops the lock

    def remove_folder_if_empty(self) -> None:
        """Removes the lock file and its folder when the folder holds nothing else (a run refused before
        it wrote anything leaves no folder behind)."""
        folder = self.path.parent
        with contextlib.suppress(OSError):
            if [p.name for p in folder.iterdir()] == [self.path.name]:
                self.path.unlink()
                folder.rmdir()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(handle: IO[str]) -> bool:
    try:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):  # held elsewhere
            return False
        raise
    return True


def lock_run_folder(run_dir: str | Path, *, record: bool = True) -> RunLock:
    """Creates `run_dir` if needed and locks it for this process (`record`: writing its pid into the lock
    file, so a refused process can name the holder; a mere check writes nothing).

    Raises:
        RunFolderBusy: another process (or another run in this one) holds it.
        StorageError: the folder cannot be created or written (read-only, not a folder).

    Example:
        >>> with lock_run_folder("runs/r20"):
        ...     ...  # the only writer of runs/r20
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run folder {str(run_dir)!r} is a file; pass a folder to --out")
    path = run_dir / LOCK
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")
    except OSError as exc:
        raise StorageError(f"cannot write to run folder {str(run_dir)!r}: {exc.strerror or exc}; "
                           "pass a writable --out") from None
    if not _try_lock(handle):
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise RunFolderBusy(f"run folder {str(run_dir)!r} is in use by another modelopt process{who}; "
                            "wait for it to finish, or pass another --out")
    if not record:
        return RunLock(path, handle)
    with contextlib.suppress(OSError):  # who holds it, for the message above; the lock works without
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
    return RunLock(path, handle)


def check_unlocked(run_dir: str | Path) -> None:
    """Raises `RunFolderBusy` now if another process holds `run_dir` (a check before slow loading;
    the run still takes the lock itself when it opens the folder)."""
    run_dir = Path(run_dir)
    if (run_dir / LOCK).is_file():
        lock_run_folder(run_dir, record=False).release()


def check_started(run_dir: str | Path) -> None:
    """Raises `RunFolderBusy` when `run_dir` holds no settings (run.json) because the run that holds it is still
    loading its model and data: a reader's "not a run folder" would be wrong there. Reads only (the folder may be
    read-only to this user)."""
    run_dir = Path(run_dir)
    if (run_dir / CONFIG).is_file() or (who := _holder(run_dir)) is None:
        return
    raise RunFolderBusy(f"run folder {str(run_dir)!r} is in use by another modelopt process{who}, which is still "
                        f"loading and has not written its {CONFIG} yet; wait until its search starts, then run this "
                        "again")


def _holder(run_dir: Path) -> str | None:
    """' (pid N)' (or '' where the holder wrote none) while another process holds `run_dir`'s lock; else None."""
    try:
        handle = open(run_dir / LOCK, encoding="utf-8")
    except OSError:
        return None
    with handle:
        if _try_lock(handle):
            return None
        holder = handle.read().strip()
    return f" (pid {holder})" if holder.isdigit() else ""
