"""What the dashboard may read from the server's disk: files by path only inside the folder the operator serves
(``interp dashboard --files``), with size limits; uploads in a private folder per session.

Every refusal of a typed path (no served folder, a path outside it, a missing file, a FIFO or device, a symlink
out of it) gives one message, so the boxes cannot be used to probe which server paths exist. Limits are read from
the environment at every call, so a server started with other limits needs no code change.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import weakref
from pathlib import Path

import streamlit as st

import interp
from interp._io import atomic_write_bytes
from interp.app import FILES_ENV

#: Environment variable: the largest file (MB) the dashboard reads by path (default 2048).
MAX_FILE_ENV = "INTERP_DASHBOARD_MAX_FILE_MB"
#: Environment variable: the folder of saved pruning curves to list (default: a source checkout's
#: ``experiments/results``, when interp runs from one).
RESULTS_ENV = "INTERP_DASHBOARD_RESULTS"
#: The largest pruning-curve file (MB) the dashboard reads.
MAX_CURVE_MB = 20.0


def max_file_mb() -> float:
    """The largest file (MB) read by path: ``$INTERP_DASHBOARD_MAX_FILE_MB``, else 2048.

    Raises:
        ValueError: the variable is set to something that is not a positive number (the message names it).

    Example:
        >>> from interp.app.serving import max_file_mb
        >>> max_file_mb() > 0
        True
    """
    typed = os.environ.get(MAX_FILE_ENV, "").strip()
    if not typed:
        return 2048.0
    try:
        value = float(typed)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{MAX_FILE_ENV}={typed!r} is not a positive number of megabytes")
    return value


def served_folder() -> Path | None:
    """The folder users may read files from by path (``$INTERP_DASHBOARD_FILES``), or None.

    Example:
        >>> from interp.app.serving import served_folder
        >>> served_folder() is None or served_folder().is_dir()
        True
    """
    folder = os.environ.get(FILES_ENV, "").strip()
    return Path(folder).resolve() if folder and Path(folder).is_dir() else None


def served_file(typed: str, max_mb: float | None = None) -> Path:
    """The regular file ``typed`` names inside the served folder.

    Args:
        typed: a path relative to the served folder (or an absolute one inside it).
        max_mb: the size limit (default :func:`max_file_mb`).

    Returns:
        The file's resolved path.

    Raises:
        FileNotFoundError: the file is not available (one message for every reason).
        ValueError: the file is larger than ``max_mb``.

    Example:
        >>> from interp.app.serving import served_file
        >>> served_file("../etc/passwd")
        Traceback (most recent call last):
        FileNotFoundError: '../etc/passwd' is not available: ...
    """
    limit = max_file_mb() if max_mb is None else max_mb
    folder = served_folder()
    unavailable = FileNotFoundError(
        f"{typed!r} is not available: paths are read only inside the folder the operator serves "
        f"({'none' if folder is None else 'interp dashboard --files'}); upload the file instead")
    if folder is None or not typed.strip():
        raise unavailable
    try:
        path = (folder / typed.strip()).resolve(strict=True)
        info = path.stat()
    except (OSError, RuntimeError):
        raise unavailable from None
    if not path.is_relative_to(folder) or not stat.S_ISREG(info.st_mode):
        raise unavailable
    if info.st_size > limit * 2**20:
        raise ValueError(f"{typed!r} is {info.st_size / 2**20:.0f} MB, more than the {limit:.0f} MB this "
                         f"dashboard reads ({MAX_FILE_ENV})")
    return path


def served_model_ref(typed: str, prefix: str = "hf:") -> str:
    """The ``interp.load`` name of a Hugging Face / TransformerLens model typed in the sidebar.

    A name that looks like a local path (``/``, ``.`` or ``~`` first, a ``\\`` or a ``..``) must be a folder
    inside the served folder and becomes its absolute path; any other name is a hub id, which ``interp.load``
    takes strictly as one (``tmp/some/folder`` is never a folder relative to the server's working directory).

    Args:
        typed: what the user typed.
        prefix: ``"hf:"`` or ``"tl:"``.

    Returns:
        ``prefix`` + the hub id or the served folder's absolute path.

    Raises:
        FileNotFoundError: a path outside the served folder, or not a folder (one message for every reason).

    Example:
        >>> from interp.app.serving import served_model_ref
        >>> served_model_ref("org/model")
        'hf:org/model'
    """
    name = typed.strip()
    if not (name.startswith(("/", ".", "~")) or "\\" in name or ".." in name.split("/")):
        return prefix + name  # a hub id such as "gpt2" or "org/model"
    folder = served_folder()
    unavailable = FileNotFoundError(f"{name!r} is not available: local folders are read only inside the folder "
                                    "the operator serves (interp dashboard --files)")
    if folder is None:
        raise unavailable
    try:
        path = (folder / name).resolve(strict=True)
    except (OSError, RuntimeError):
        raise unavailable from None
    if not path.is_relative_to(folder) or not path.is_dir():
        raise unavailable
    return prefix + str(path)


def served_curves(typed: str) -> list[Path]:
    """The curve files ``typed`` names inside the served folder: a curve file, or a run folder written by
    ``interp prune --out DIR`` / ``run_experiment`` (its ``<method>.json`` curves; not ``summary.json`` nor the
    per-point files under ``partial/``).

    Args:
        typed: a file or folder path relative to the served folder.

    Returns:
        The curve files, each checked by :func:`served_file` (no link out of the folder).

    Raises:
        FileNotFoundError: the path is not available (see :func:`served_file`), or a folder without curves.
        ValueError: a file larger than :data:`MAX_CURVE_MB`.

    Example:
        >>> from interp.app.serving import served_curves
        >>> served_curves("../elsewhere.json")
        Traceback (most recent call last):
        FileNotFoundError: '../elsewhere.json' is not available: ...
    """
    folder = served_folder()
    if folder is not None and typed.strip():
        try:
            path: Path | None = (folder / typed.strip()).resolve(strict=True)
        except (OSError, RuntimeError):
            path = None
        if path is not None and path.is_dir() and path.is_relative_to(folder):
            files = sorted(f for f in path.glob("*.json") if f.name != "summary.json")
            if not files:
                raise FileNotFoundError(f"{typed!r} holds no pruning curve (<method>.json, as interp prune --out "
                                        "DIR writes)")
            return [served_file(str(f), MAX_CURVE_MB) for f in files]
    return [served_file(typed, MAX_CURVE_MB)]


def read_limited(path: Path, max_mb: float) -> bytes:
    """The bytes of a regular file, refusing more than ``max_mb`` (reads one byte past the limit to know).

    Args:
        path: the file.
        max_mb: the limit in megabytes.

    Returns:
        The file's bytes.

    Raises:
        ValueError: the file is larger than ``max_mb``.

    Example:
        >>> from pathlib import Path
        >>> from interp.app.serving import read_limited
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "x.json"
        >>> _ = p.write_text("[1]")
        >>> read_limited(p, 1.0)
        b'[1]'
    """
    limit = int(max_mb * 2**20)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path.name} is larger than the {max_mb:.0f} MB this dashboard reads")
    return data


def results_folder() -> Path | None:
    """The folder of saved pruning curves the "Load a saved curve" box lists, or None.

    ``$INTERP_DASHBOARD_RESULTS`` when set (a folder of ``prune_*`` runs), else ``experiments/results`` of the
    source checkout interp runs from (an editable install). A wheel install has no checkout: the folder above
    the package is then ``site-packages``, not the project, and nothing is listed.

    Returns:
        The folder, or None.

    Example:
        >>> from interp.app.serving import results_folder
        >>> results_folder() is None or results_folder().is_dir()
        True
    """
    named = os.environ.get(RESULTS_ENV, "").strip()
    if named:
        return Path(named).resolve() if Path(named).is_dir() else None
    root = Path(interp.__file__).resolve().parents[1]
    results = root / "experiments" / "results"
    return results if (root / "pyproject.toml").is_file() and results.is_dir() else None


def saved_curve_files(results: Path | None) -> list[str]:
    """Curve JSON files the pruning experiments wrote (``prune_*/<method>.json`` and ``prune_*.json`` under
    ``results``), relative to ``results``.

    Args:
        results: the folder (:func:`results_folder`), or None.

    Returns:
        Relative paths, sorted; empty when there is no such folder.

    Example:
        >>> from interp.app.serving import saved_curve_files
        >>> saved_curve_files(None)
        []
    """
    if results is None:
        return []
    files = [*results.glob("prune_*.json"), *results.glob("prune_*/*.json")]
    return sorted(str(p.relative_to(results)) for p in files if p.name != "summary.json")


class _SessionFolder:
    """A private temporary folder (mode 0700) that is deleted when the Streamlit session that owns it ends."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="interp-session-"))
        # Runs when the session's state is dropped (the browser tab closed) or, at the latest, at exit.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)


def session_folder() -> Path:
    """This session's private upload folder (created on first use, removed with the session)."""
    if "_upload_dir" not in st.session_state:
        st.session_state["_upload_dir"] = _SessionFolder()
    folder: _SessionFolder = st.session_state["_upload_dir"]
    return folder.path


def saved_upload(data: bytes) -> str:
    """Write an uploaded checkpoint into this session's private folder, named by its hash; returns its path."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = session_folder() / f"upload-{digest}.safetensors"
    if not path.exists():
        atomic_write_bytes(path, data)  # an interrupted write never leaves a truncated file under the hash
    return str(path)
