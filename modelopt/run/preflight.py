"""What can be checked about a run's folder before its model and data load (which takes seconds to minutes):
whether it can be written and is free, and holds a run only when that run is resumed. The runner checks the same
things again when it opens the folder; this only makes a bad option fail at once."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from modelopt.errors import ConfigError, StorageError
from modelopt.run.journal import Journal
from modelopt.run.layout import CONFIG, JOURNAL
from modelopt.run.lock import check_unlocked


def check_run_folder(out: str | Path | None, *, resume: bool | None = None) -> None:
    """Raises if `out` cannot hold a run: a file, not writable, or locked by another process; with
    `resume` given, also a folder holding a run that is not to be resumed, or whose journal is damaged.

    A folder that does not exist yet is checked through its nearest existing parent.
    """
    if out is None:
        return
    path = Path(out)
    _check_writable(path)
    check_unlocked(path)
    if resume is not None:
        check_journal(path, resume)


def check_journal(path: Path, resume: bool) -> None:
    """A run folder that already holds trials needs `resume`; its journal must then read cleanly."""
    journal = Journal(path / JOURNAL)
    if not (journal.exists() or (path / CONFIG).exists()):
        return
    n = journal.check()  # a damaged line: LoadError, with the way out
    if not resume:
        raise ConfigError(f"run folder {str(path)!r} already holds a run ({n} trials); pass --resume to continue "
                          "it, or another --out")


def _check_writable(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run folder {str(path)!r} is a file; pass a folder to --out")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:  # a real write (os.access says yes to root even where the file system says no)
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        where = "" if existing == path else f" (in {str(existing)!r})"
        raise StorageError(f"cannot write to run folder {str(path)!r}{where}: {exc.strerror or exc}; "
                           "pass a writable --out") from None
