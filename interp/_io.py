"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Every writer of interp's files (traces, checkpoints, the converted model cache, experiment results) goes
through :func:`atomic_path`: the content is written to a temporary file in the destination's own folder
(same file system, so the final ``os.replace`` is one atomic rename), flushed to disk with ``fsync``, then
renamed over the destination, and the folder itself is synced so that the rename survives a power cut.
A process killed mid-write (``kill -9``, out of memory) leaves the previous file untouched and a hidden
``.<name>.<pid>-<host>.<random>.tmp<suffix>`` file beside it; the next save of the same name removes it (see
:func:`remove_stale_temporaries`: only temporaries whose writer is gone, never a live writer's).

safetensors files are written by :func:`write_safetensors` straight into that one temporary: safetensors' own
``save_file`` writes a second full-size temporary of its own (``.tmpXXXXXX``) that a kill would leave behind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import socket
import struct
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

#: A temporary whose writer ran on another host (a shared folder) is taken as stale only after this long.
FOREIGN_TEMP_AGE_S = 24 * 3600.0
#: An interp temporary written before the pid was part of its name (mkstemp's ``.<name>.<8 chars>.tmp``), or a
#: ``.tmpXXXXXX`` that safetensors' own writer left in a folder interp writes safetensors to, is stale after this
#: long (a live writer keeps its file's modification time fresh).
UNTAGGED_TEMP_AGE_S = 3600.0


def _host_tag() -> str:
    """8 hex digits naming this host, so that a pid is only ever judged on the host that owns it."""
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # this process: another thread may be writing that temporary right now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as e:  # EPERM: alive, owned by someone else
        return e.errno != errno.ESRCH
    return True


def _is_stale(tmp: Path, *, pid: int | None, host: str | None, now: float) -> bool:
    try:
        age = now - tmp.stat().st_mtime
    except OSError:
        return False  # gone already (its writer finished, or another sweep removed it)
    if pid is None:
        return age > UNTAGGED_TEMP_AGE_S
    if host != _host_tag():
        return age > FOREIGN_TEMP_AGE_S
    return not _pid_alive(pid)


def _looks_like_safetensors(path: Path) -> bool:
    """Whether a file starts as a safetensors file does (an 8-byte little-endian header length, then ``{``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and 0 < struct.unpack("<Q", head[:8])[0] < 2 ** 31


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove what killed writes of ``path`` left in its folder; returns the files removed.

    A temporary of :func:`atomic_path` is named ``.<name>.<pid>-<host>.<random>.tmp<suffix>``: it is stale when
    its writer's process no longer exists on this host (never this process's own: another thread may be writing
    it), or, written on another host, when it is older than :data:`FOREIGN_TEMP_AGE_S`. Older interp versions'
    ``.<name>.<random>.tmp<suffix>`` and, beside a ``.safetensors`` target, the ``.tmpXXXXXX`` files safetensors'
    own writer leaves (recognised by their safetensors header) are stale after :data:`UNTAGGED_TEMP_AGE_S`.
    Errors (a file removed meanwhile, a read-only folder) are ignored: cleaning up never fails a save.

    Args:
        path: the destination whose leftovers are removed.

    Returns:
        The paths removed.

    Example:
        >>> from pathlib import Path
        >>> from interp._io import _host_tag, remove_stale_temporaries
        >>> import tempfile, os
        >>> target = Path(tempfile.mkdtemp()) / "out.txt"
        >>> dead_pid = 999999999  # above any pid_max: no such process
        >>> killed = target.parent / f".out.txt.{dead_pid}-{_host_tag()}.abcdefgh.tmp.txt"
        >>> _ = killed.write_text("what a killed write left")
        >>> remove_stale_temporaries(target) == [killed], killed.exists()
        (True, False)
    """
    path = Path(path)
    tagged = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)-([0-9a-f]{{8}})\.[^.]+\.tmp{re.escape(path.suffix)}$")
    untagged = re.compile(rf"^\.{re.escape(path.name)}\.[^.]{{8}}\.tmp{re.escape(path.suffix)}$")
    st_own = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith("."):
            continue
        tmp = Path(entry.path)
        if m := tagged.match(name):
            stale = _is_stale(tmp, pid=int(m.group(1)), host=m.group(2), now=now)
        elif untagged.match(name):
            stale = _is_stale(tmp, pid=None, host=None, now=now)
        elif path.suffix == ".safetensors" and st_own.match(name):
            stale = _is_stale(tmp, pid=None, host=None, now=now) and _looks_like_safetensors(tmp)
        else:
            continue
        if stale:
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
    return removed


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
        >>> from interp._io import atomic_path
        >>> import tempfile, os
        >>> target = os.path.join(tempfile.mkdtemp(), "out.txt")
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_text("all or nothing")
        >>> open(target).read()
        'all or nothing'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)  # what earlier killed writes of this name left
    # The pid (and host) in the name says whose temporary it is; the suffix kept last: writers that pick the
    # format from it (plotly's write_image) still do.
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-{_host_tag()}.", suffix=f".tmp{path.suffix}",
                                dir=path.parent)
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
        >>> from interp._io import atomic_write_bytes
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
        >>> from interp._io import atomic_write_text
        >>> import tempfile, os
        >>> atomic_write_text(os.path.join(tempfile.mkdtemp(), "r.json"), "{}").read_text()
        '{}'
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


# --- safetensors, written in place ---------------------------------------------------------------------
_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
#: safetensors' ``Dtype`` enum in declaration order (its writer sorts by it, descending).
_ST_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
             "I64", "U64")


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: str | Path,
                      metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``tensors`` as a safetensors file at ``path``, one tensor at a time, without a temporary of its own.

    The file is what ``safetensors.torch.save_file`` writes (a little-endian 8-byte header length, the JSON
    header padded with spaces to a multiple of 8, then each tensor's bytes), read back by any safetensors
    reader. Unlike ``save_file``, which writes to a ``.tmpXXXXXX`` beside ``path`` and renames it, it writes
    ``path`` itself: called on :func:`atomic_path`'s temporary, a killed save leaves one temporary, not two.
    Only one tensor's bytes are held in memory at a time, beyond the tensors themselves.

    Args:
        tensors: name -> tensor (contiguous or not; moved to the host one at a time).
        path: the file to write (typically an :func:`atomic_path` temporary).
        metadata: str -> str entries for the header's ``__metadata__``.

    Returns:
        ``path`` as a Path.

    Raises:
        TypeError: a metadata entry that is not str -> str, or a tensor of a dtype safetensors has no name for.

    Example:
        >>> import torch
        >>> from interp._io import write_safetensors
        >>> import tempfile, os
        >>> from safetensors.torch import load_file
        >>> p = write_safetensors({"w": torch.arange(3.0)}, os.path.join(tempfile.mkdtemp(), "w.safetensors"))
        >>> load_file(p)["w"].tolist()
        [0.0, 1.0, 2.0]
    """
    header: dict[str, object] = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"safetensors metadata must map str -> str, got {k!r}: {type(v).__name__}")
        header["__metadata__"] = dict(metadata)
    for k, t in tensors.items():
        if t.dtype not in _ST_DTYPES:
            raise TypeError(f"tensor {k!r} has dtype {t.dtype}, which safetensors cannot store")
    # safetensors' own order (its dtype enum, descending, then the name): the same bytes as save_file, and every
    # tensor aligned to its element size.
    names = sorted(tensors, key=lambda k: (-_ST_ORDER.index(_ST_DTYPES[tensors[k].dtype]), k))
    offset = 0
    for k in names:
        t = tensors[k]
        n = t.numel() * t.element_size()
        header[k] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for k in names:
            flat = tensors[k].detach().contiguous().cpu().reshape(-1)  # [numel]
            if flat.numel():
                f.write(flat.view(torch.uint8).numpy().data)  # [bytes]: written from the tensor's memory, no copy
    return Path(path)


# --- integrity records for safetensors files -----------------------------------------------------------
def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (any dtype, bfloat16 included).

    Example:
        >>> import torch
        >>> from interp._io import tensor_sha256
        >>> tensor_sha256(torch.zeros(2))[:12]   # the 8 zero bytes of two float32 zeros
        'af5570f5a181'
    """
    flat = t.detach().contiguous().cpu().reshape(-1)  # [numel]
    return hashlib.sha256(flat.view(torch.uint8).numpy().data if flat.numel() else b"").hexdigest()


def tensor_record(tensors: Mapping[str, torch.Tensor]) -> str:
    """A JSON record of each tensor's dtype, shape and sha256, for a file's header.

    A file damaged on disk (bytes overwritten) or a header edited by hand (a dtype changed from F32 to
    I32 reinterprets the same bytes) then fails :func:`check_tensor_record` instead of loading garbage.

    Example:
        >>> import json
        >>> import torch
        >>> from interp._io import tensor_record
        >>> json.loads(tensor_record({"w": torch.zeros(2)}))["w"][:2]
        ['float32', [2]]
    """
    return json.dumps({k: [str(t.dtype).removeprefix("torch."), list(t.shape), tensor_sha256(t)]
                       for k, t in sorted(tensors.items())})


def check_tensor_record(record: str, tensors: Mapping[str, torch.Tensor], where: str, *,
                        partial: bool = False) -> None:
    """Check tensors read from a file against the :func:`tensor_record` stored in its header.

    ``partial``: ``tensors`` are some of the file's (a pipeline rank reads its own layers only); each is checked.

    Raises:
        ValueError: the record is unreadable or lists other tensors, or a tensor's dtype, shape or bytes
            differ from it; the message names the file and the tensors.

    Example:
        >>> import torch
        >>> from interp._io import check_tensor_record, tensor_record
        >>> t = {"w": torch.ones(3)}
        >>> check_tensor_record(tensor_record(t), t, "x.safetensors")
    """
    try:
        entries = json.loads(record)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: the integrity record in the header is not valid JSON: {e}") from e
    if not isinstance(entries, dict) or not (set(tensors) <= set(entries) if partial else set(entries) == set(tensors)):
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


__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "check_tensor_record",
           "remove_stale_temporaries", "tensor_record", "tensor_sha256", "write_safetensors"]
