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
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch


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
    # The suffix kept last: writers that pick the format from it (plotly's write_image) still do.
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
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


# --- integrity records for safetensors files -----------------------------------------------------------
def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (any dtype, bfloat16 included).

    Example:
        >>> tensor_sha256(torch.zeros(2))[:12]   # the 8 zero bytes of two float32 zeros
        'af5570f5a181'
    """
    flat = t.detach().contiguous().cpu().reshape(-1)  # [numel]
    return hashlib.sha256(flat.view(torch.uint8).numpy() if flat.numel() else b"").hexdigest()


def tensor_record(tensors: Mapping[str, torch.Tensor]) -> str:
    """A JSON record of each tensor's dtype, shape and sha256, for a file's header.

    A file damaged on disk (bytes overwritten) or a header edited by hand (a dtype changed from F32 to
    I32 reinterprets the same bytes) then fails :func:`check_tensor_record` instead of loading garbage.

    Example:
        >>> json.loads(tensor_record({"w": torch.zeros(2)}))["w"][:2]
        ['float32', [2]]
    """
    return json.dumps({k: [str(t.dtype).removeprefix("torch."), list(t.shape), tensor_sha256(t)]
                       for k, t in sorted(tensors.items())})


def check_tensor_record(record: str, tensors: Mapping[str, torch.Tensor], where: str) -> None:
    """Check tensors read from a file against the :func:`tensor_record` stored in its header.

    Raises:
        ValueError: the record is unreadable or lists other tensors, or a tensor's dtype, shape or bytes
            differ from it; the message names the file and the tensors.

    Example:
        >>> t = {"w": torch.ones(3)}
        >>> check_tensor_record(tensor_record(t), t, "x.safetensors")
    """
    try:
        entries = json.loads(record)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: the integrity record in the header is not valid JSON: {e}") from e
    if not isinstance(entries, dict) or set(entries) != set(tensors):
        raise ValueError(f"{where}: the integrity record in the header does not list the file's tensors")
    bad = []
    for k, t in tensors.items():
        entry = entries[k]
        if not isinstance(entry, list) or len(entry) != 3:
            raise ValueError(f"{where}: the integrity record of tensor {k!r} is malformed")
        dtype, shape, digest = entry
        if dtype != str(t.dtype).removeprefix("torch.") or shape != list(t.shape):
            raise ValueError(f"{where}: tensor {k!r} is stored as {str(t.dtype).removeprefix('torch.')} "
                             f"{list(t.shape)} but was written as {dtype} {shape}: the header was altered")
        if tensor_sha256(t) != digest:
            bad.append(k)
    if bad:
        raise ValueError(f"{where} is damaged: the bytes of tensor(s) {bad[:5]} do not match the sha256 "
                         f"recorded when it was written; delete the file and write it again")


__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "check_tensor_record", "tensor_record",
           "tensor_sha256"]
