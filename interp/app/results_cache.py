"""The dashboard's results on disk, keyed by (model weights hash, data, options): a second visit is instant,
also after the server restarts.

One file per result, ``<folder>/<kind>/<sha256 of the key>.pkl``, written atomically
(:func:`interp._io.atomic_path`), so a reader sees a whole result or none, and two writers of one key (two
sessions, two servers) leave one whole file. Within one process a key is computed once at a time: a second
session asking for it waits for the first and reads its file.

The folder is ``$INTERP_DASHBOARD_CACHE``, else ``dashboard/`` in interp's cache folder (``$INTERP_CACHE``, else
``$XDG_CACHE_HOME/interp``, else ``~/.cache/interp``). Results are pickles, and reading a pickle runs code, so
the folder is created private (mode 0700) and never read when another user owns it or can write to it (the
dashboard then computes without the disk cache and says why). Delete the folder to clear it; the key includes
interp's version, so an upgrade starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import interp
from interp._io import atomic_path

#: Environment variable naming the dashboard's results folder.
CACHE_ENV = "INTERP_DASHBOARD_CACHE"
#: Bumped when the layout of a cached result changes, so old files are not read as new ones.
FORMAT = 1

_hash_lock = threading.Lock()
_hashes: weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, str]] = weakref.WeakKeyDictionary()
_key_locks_lock = threading.Lock()
_key_locks: dict[str, threading.Lock] = {}


def cache_folder() -> Path:
    """The results folder (``$INTERP_DASHBOARD_CACHE``, else ``<interp cache>/dashboard``); read at every call."""
    named = os.environ.get(CACHE_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    from interp.zoo.smollm2 import cache_dir

    return cache_dir() / "dashboard"


def usable_folder() -> tuple[Path | None, str]:
    """The results folder ready for use (created 0700 if missing), or ``(None, why not)``."""
    folder = cache_folder()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError as e:
        return None, f"the results folder {str(folder)!r} cannot be created ({e})"
    if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return None, (f"the results folder {str(folder)!r} is owned by another user or writable by others, and "
                      f"cached results are pickles (reading one runs code); set {CACHE_ENV} to a private folder")
    return folder, ""


def _versions(model: torch.nn.Module) -> int:
    # Every in-place change of a tensor bumps its version counter: a changed model is hashed again.
    return sum(t._version for t in (*model.parameters(), *model.buffers()))


def weights_hash(model: torch.nn.Module) -> str:
    """A hash of the model's weights and configuration: blake2b over every state-dict tensor's name, dtype,
    shape and bytes, plus every field of ``model.cfg``. Computed once per model and kept until a tensor changes in place.

    Args:
        model: any torch module (an interp Transformer).

    Returns:
        32 hex digits.

    Example:
        >>> import interp
        >>> from interp.app.results_cache import weights_hash
        >>> m = interp.load("random-tiny")
        >>> weights_hash(m) == weights_hash(interp.load("random-tiny")), len(weights_hash(m))
        (True, 32)
    """
    versions = _versions(model)
    with _hash_lock:
        known = _hashes.get(model)
    if known is not None and known[0] == versions:
        return known[1]
    h = hashlib.blake2b(digest_size=16)
    cfg = getattr(model, "cfg", None)
    to_json = getattr(cfg, "to_json", None)  # every field: a config's repr shows only what differs from defaults
    h.update((to_json() if callable(to_json) else repr(cfg)).encode())
    for name, t in model.state_dict().items():
        if not isinstance(t, torch.Tensor):
            continue
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        flat = t.detach().to("cpu").contiguous().reshape(-1)  # [numel], any dtype
        h.update(flat.view(torch.uint8).numpy().data if flat.numel() else b"")
    digest = h.hexdigest()
    with _hash_lock:
        _hashes[model] = (versions, digest)
    return digest


def file_digest(path: str | Path) -> str:
    """sha256 of a data file's bytes (treebanks and coreference files are small), for the key.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def key_of(kind: str, weights: str, options: dict[str, Any]) -> str:
    """The file name stem of a result: sha256 of the kind, the weights hash, the options and interp's version.

    Raises:
        TypeError: an option is not JSON-serialisable (tuples become lists).
    """
    text = json.dumps({"format": FORMAT, "interp": interp.__version__, "kind": kind, "weights": weights,
                       "options": options}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def path_of(kind: str, key: str, folder: Path) -> Path:
    return folder / kind / f"{key}.pkl"


def load(kind: str, key: str) -> tuple[bool, Any]:
    """``(True, result)`` when the result is on disk, else ``(False, None)`` (a damaged file counts as absent)."""
    folder, _ = usable_folder()
    if folder is None:
        return False, None
    path = path_of(kind, key, folder)
    try:
        with open(path, "rb") as f:
            return True, pickle.load(f)
    except FileNotFoundError:
        return False, None
    except Exception:  # noqa: BLE001 - a truncated or stale file is recomputed, never shown
        return False, None


def store(kind: str, key: str, value: Any) -> bool:
    """Write ``value`` atomically under ``key``; False (nothing written) when the folder is unusable."""
    folder, _ = usable_folder()
    if folder is None:
        return False
    path = path_of(kind, key, folder)
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError:
        return False
    return True


def _lock_for(key: str) -> threading.Lock:
    with _key_locks_lock:
        return _key_locks.setdefault(key, threading.Lock())


def cached(kind: str, key: str, compute: Callable[[], Any]) -> tuple[Any, bool]:
    """The result under ``key``, from disk, or computed by ``compute()`` and stored (errors are not stored).

    Args:
        kind: a folder name for this kind of result (``"head_report"``).
        key: from :func:`key_of`.
        compute: makes the result.

    Returns:
        ``(result, hit)``: hit is True when it came from disk (also when another session computed it meanwhile).

    Example:
        >>> import os
        >>> from interp.app.results_cache import CACHE_ENV, cached, key_of
        >>> import tempfile
        >>> os.environ[CACHE_ENV] = tempfile.mkdtemp()
        >>> k = key_of("demo", "w", {"n": 1})
        >>> cached("demo", k, lambda: [1, 2])[1], cached("demo", k, lambda: [3])
        (False, ([1, 2], True))
        >>> del os.environ[CACHE_ENV]
    """
    hit, value = load(kind, key)
    if hit:
        return value, True
    with _lock_for(key):  # one computation of a key at a time in this process; the others wait and read it
        hit, value = load(kind, key)
        if hit:
            return value, True
        value = compute()
        store(kind, key, value)
        return value, False


def clear(kind: str) -> None:
    """Delete every stored result of ``kind`` (in the current results folder)."""
    folder, _ = usable_folder()
    if folder is None:
        return
    for path in (folder / kind).glob("*.pkl"):
        path.unlink(missing_ok=True)
