"""Files written so a reader (or a killed writer) sees the old content or the new, never half.

Each write goes to a temporary file with a unique name beside its target, then `os.replace`s
it: two writers never share a temporary file, and a failed write leaves no temporary behind.
An `OSError` (a full disk, a read-only folder) becomes a `StorageError` naming the file.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from modelopt.errors import StorageError

# New files get the mode open() would give them (mkstemp's is 0600); read once, at import.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def write_atomic(path: str | Path, data: str | bytes, *, durable: bool = True) -> Path:
    """Writes `data` (str as UTF-8) to `path` atomically; `durable` also fsyncs it (survives a power cut).

    Raises:
        StorageError: the file could not be written; `path` keeps its old content.

    Example:
        >>> write_atomic(run_dir / "best_plan.yaml", text)
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise StorageError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    except BaseException:  # interrupted: no stray temporary either
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def save_atomic(path: str | Path, save: Callable[[IO[bytes]], object], *, durable: bool = True) -> Path:
    """Runs a writer that takes a file object (`torch.save`, `onnx.save`) into memory, then `write_atomic`s
    its bytes: a failed or interrupted save leaves `path` as it was.

    Raises:
        StorageError: the file could not be written; `path` keeps its old content.

    Example:
        >>> save_atomic(path, lambda f: torch.save(payload, f))
    """
    buf = io.BytesIO()
    save(buf)
    return write_atomic(path, buf.getvalue(), durable=durable)


def write_json_atomic(path: str | Path, obj: Any, *, durable: bool = True) -> None:
    """Writes JSON atomically (`write_atomic`); `durable=False` (compact, no fsync) is for state the
    journal can rebuild: it survives a killed process, only not a power cut.

    Raises:
        ValueError: `obj` holds a NaN or an infinity (JSON has neither); nothing is written.
        StorageError: the file could not be written.
    """
    # One dumps + write: json.dump streams small chunks and costs many times more (docs/runs-and-plans.md#run-folders).
    text = json.dumps(obj, indent=None if not durable else 1, separators=None if durable else (",", ":"),
                      allow_nan=False)
    write_atomic(path, text, durable=durable)
