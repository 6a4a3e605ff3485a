"""Progress bars for the long library calls: on by default where someone watches (a terminal, a notebook).

Every long call takes ``progress: bool | None``: True or False force the bar on or off, None (the default)
shows it when stderr is a terminal or the code runs in a Jupyter kernel, so scripts piped to a file, tests
and doctests stay quiet. Bars are tqdm's (``tqdm.auto``: a widget in notebooks, text in terminals).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["bar", "enabled"]


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def enabled(progress: bool | None) -> bool:
    """Whether to show a bar: ``progress`` itself when given, else True in a terminal or a notebook.

    Example:
        >>> enabled(False), enabled(True)
        (False, True)
    """
    if progress is not None:
        return bool(progress)
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty()) or _in_notebook()


def bar(iterable: Iterable[Any] | None = None, *, desc: str, progress: bool | None, total: int | None = None,
        unit: str = "batch") -> Any:
    """A tqdm bar over ``iterable`` (or a manual one with ``total``), disabled unless :func:`enabled`.

    Example:
        >>> sum(bar(range(3), desc="demo", progress=False))
        3
    """
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, disable=not enabled(progress), leave=False)
