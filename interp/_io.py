"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Every writer of interp's files (traces, checkpoints, the converted model cache, experiment results) goes
through :func:`atomic_path`: the content is written to a temporary file in the destination's own folder
(same file system, so the final ``os.replace`` is one atomic rename), flushed to disk with ``fsync``, then
renamed over the destination, and the folder itself is synced so that the rename survives a power cut.
A process killed mid-write (``kill -9``, out of memory) leaves the previous file untouched and at most a
hidden ``.<name>.*.tmp`` file beside it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems (and Windows) do not open folders: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write to; on a clean exit it replaces ``path`` atomically.

    Args:
        path: the destination (its parent folders are created).

    Yields:
        A path in the same folder as ``path``; write the whole content there (any writer that takes a path).

    Raises:
        OSError: the folder cannot be created or written; the destination is then left as it was.

    Example:
        >>> import tempfile, os
        >>> target = os.path.join(tempfile.mkdtemp(), "out.txt")
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_text("all or nothing")
        >>> open(target).read()
        'all or nothing'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make every written file private
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`); returns ``path`` as a Path.

    Example:
        >>> import tempfile, os
        >>> p = atomic_write_bytes(os.path.join(tempfile.mkdtemp(), "b.bin"), b"x")
        >>> p.read_bytes()
        b'x'
    """
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_path`); returns ``path`` as a Path.

    Example:
        >>> import tempfile, os
        >>> atomic_write_text(os.path.join(tempfile.mkdtemp(), "r.json"), "{}").read_text()
        '{}'
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]
