"""The page side of the disk cache: a page's computation, keyed by (model weights hash, data, options), runs
once under a progress bar and is read from disk afterwards (:mod:`interp.app.results_cache` stores the files)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from interp import progress
from interp.app import results_cache
from interp.app.model_picker import ModelKey, model_hash
from interp.app.progress_view import no_partial, run_with_progress


class DiskCached(Protocol):
    """A page computation wrapped by :func:`disk_cached`."""

    def __call__(self, key: ModelKey, *args: Any,
                 partial: Callable[[progress.Event], Any] = ...) -> dict[str, Any]: ...

    def stored(self, key: ModelKey, *args: Any) -> bool: ...

    def clear(self) -> None: ...


class _Wrapper:
    def __init__(self, fn: Callable[..., Any], kind: str, label: str,
                 options: Callable[..., dict[str, Any]] | None) -> None:
        self.fn, self.kind, self.label, self.options = fn, kind, label, options
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__

    def _key(self, key: ModelKey, args: tuple[Any, ...]) -> str:
        opts = (self.options(*args) if self.options is not None
                else {"args": [list(a) if isinstance(a, tuple) else a for a in args]})
        return results_cache.key_of(self.kind, model_hash(key), opts)

    def __call__(self, key: ModelKey, *args: Any,
                 partial: Callable[[progress.Event], Any] = no_partial) -> dict[str, Any]:
        ckey = self._key(key, args)

        def compute() -> dict[str, Any]:
            t0 = time.perf_counter()
            value = run_with_progress(self.label, lambda: self.fn(key, *args), partial)
            return {"value": value, "seconds": time.perf_counter() - t0}

        out, hit = results_cache.cached(self.kind, ckey, compute)
        return {**out, "cached": hit}

    def stored(self, key: ModelKey, *args: Any) -> bool:
        """Whether the result of these arguments is on disk already (read without computing)."""
        return bool(results_cache.load(self.kind, self._key(key, args))[0])

    def clear(self) -> None:
        results_cache.clear(self.kind)


def disk_cached(kind: str, label: str,
                options: Callable[..., dict[str, Any]] | None = None) -> Callable[[Callable[..., Any]], DiskCached]:
    """Cache a page computation ``fn(key, *args)`` on disk under (weights hash of ``key``'s model, options).

    Args:
        kind: the results-cache kind (a folder of its own).
        label: the progress bar's caption while it computes.
        options: ``options(*args)`` gives the JSON options of the key (default: the arguments as they are).

    Returns:
        A decorator; the wrapper returns ``{"value", "seconds", "cached"}``, ``.stored(key, *args)`` says whether
        that result is on disk, and ``.clear()`` drops every stored result of the kind.
    """
    def decorate(fn: Callable[..., Any]) -> DiskCached:
        return _Wrapper(fn, kind, label, options)

    return decorate


def cost_caption(result: dict[str, Any], what: str) -> str:
    """One line under a figure: the data it used and what it cost (or that it came from the disk cache).

    Example:
        >>> from interp.app.disk_cache import cost_caption
        >>> cost_caption({"seconds": 1.25, "cached": True}, "data: 4 sequences")
        'data: 4 sequences; computed in 1.2 s on its first view, now read from the disk cache'
    """
    took = f"computed in {result['seconds']:.1f} s"
    return f"{what}; {took} on its first view" + (", now read from the disk cache" if result["cached"] else "")


def file_option(path: str | None) -> dict[str, Any] | None:
    """A data file as a cache option: its path and content hash (an edited file is another key)."""
    return None if not path else {"path": str(path), "sha256": results_cache.file_digest(path)}
