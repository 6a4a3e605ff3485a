"""Progress bars for the long library calls: on by default where someone watches (a terminal, a notebook).

Every long call takes ``progress: bool | None``: True or False force the bar on or off, None (the default)
shows it when stderr is a terminal or the code runs in a Jupyter kernel, so scripts piped to a file, tests
and doctests stay quiet. Bars are tqdm's (``tqdm.auto``: a widget in notebooks, text in terminals).

An application that draws its own progress (the dashboard) wraps a call in :func:`listen`: every bar the call
opens in that thread then reports a :class:`Event` to the callback (its label, steps done, total, and for
:func:`~interp.streaming.stream` the reducers being filled, so the caller can draw partial results), also
where no terminal watches. ``progress=False`` still silences everything.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "bar", "enabled", "listen", "listening"]


@dataclass(frozen=True)
class Event:
    """One progress report to a :func:`listen` callback.

    Attributes:
        desc: the bar's label (``"classify_heads: induction"``).
        done: steps done, fractional inside a step when the caller reports that (a forward pass, layer by layer).
        total: the number of steps, or None when unknown.
        state: what the call is filling in (for :func:`~interp.streaming.stream`: its reducers), or None.
    """

    desc: str
    done: float
    total: int | None
    state: Any = None

    @property
    def fraction(self) -> float | None:
        """``done / total`` in [0, 1], or None without a total."""
        return None if not self.total else min(1.0, max(0.0, self.done / self.total))


_LISTENERS: contextvars.ContextVar[tuple[Callable[[Event], None], ...]] = contextvars.ContextVar(
    "interp_progress_listeners", default=())


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _watched() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty()) or _in_notebook()


def listening() -> bool:
    """Whether a :func:`listen` callback is active in this thread (context)."""
    return bool(_LISTENERS.get())


@contextlib.contextmanager
def listen(callback: Callable[[Event], None]) -> Iterator[None]:
    """Report every bar opened inside the block (in this thread) to ``callback``, one :class:`Event` a step.

    Context-local (a :mod:`contextvars` variable): another thread, for example another dashboard session,
    neither sees this callback nor reports to it. Blocks nest; every active callback gets every event.

    Args:
        callback: called with an :class:`Event` when a bar starts and after each step.

    Example:
        >>> from interp.progress import bar, listen
        >>> seen = []
        >>> with listen(lambda e: seen.append((e.desc, e.done, e.total))):
        ...     sum(bar(range(3), desc="demo", progress=None))
        3
        >>> seen
        [('demo', 0, 3), ('demo', 1, 3), ('demo', 2, 3), ('demo', 3, 3)]
    """
    token = _LISTENERS.set((*_LISTENERS.get(), callback))
    try:
        yield
    finally:
        _LISTENERS.reset(token)


def enabled(progress: bool | None) -> bool:
    """Whether to show a bar: ``progress`` itself when given, else True in a terminal, a notebook or under
    :func:`listen`.

    Example:
        >>> from interp.progress import enabled
        >>> enabled(False), enabled(True)
        (False, True)
    """
    if progress is not None:
        return bool(progress)
    return _watched() or listening()


class _Reported:
    """A tqdm bar that also reports each step to the active :func:`listen` callbacks."""

    def __init__(self, inner: Any, desc: str, total: int | None, state: Any,
                 listeners: tuple[Callable[[Event], None], ...]) -> None:
        self._inner, self._desc, self._total, self._state, self._listeners = inner, desc, total, state, listeners
        self._done = 0

    def _emit(self, done: float) -> None:
        event = Event(self._desc, done, self._total, self._state)
        for callback in self._listeners:
            callback(event)

    def within(self, fraction: float) -> None:
        """Report progress inside the current step (``fraction`` of it done)."""
        self._emit(self._done + min(1.0, max(0.0, fraction)))

    def __iter__(self) -> Iterator[Any]:
        self._emit(0)
        for item in self._inner:
            yield item
            self._done += 1
            self._emit(self._done)

    def update(self, n: int = 1) -> None:
        self._inner.update(n)
        self._done += n
        self._emit(self._done)

    def __enter__(self) -> _Reported:
        self._emit(0)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:  # set_postfix, close, n, ... are tqdm's
        return getattr(self._inner, name)


def bar(iterable: Iterable[Any] | None = None, *, desc: str, progress: bool | None, total: int | None = None,
        unit: str = "batch", state: Any = None) -> Any:
    """A tqdm bar over ``iterable`` (or a manual one with ``total``), disabled unless :func:`enabled`.

    Under :func:`listen` the bar also reports every step to the callbacks (with ``state``, what the caller is
    filling in); the text bar itself is then drawn only where a terminal or a notebook watches.

    Example:
        >>> from interp.progress import bar
        >>> sum(bar(range(3), desc="demo", progress=False))
        3
    """
    from tqdm.auto import tqdm

    listeners = _LISTENERS.get()
    if not listeners or not enabled(progress):
        return tqdm(iterable, desc=desc, total=total, unit=unit, disable=not enabled(progress), leave=False)
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    inner = tqdm(iterable, desc=desc, total=total, unit=unit, disable=not _watched(), leave=False)
    return _Reported(inner, desc, total, state, listeners)
