"""What the streaming file readers of :mod:`interp.data` share: a source that is a path or the file's lines,
and a stream cut after its first items that closes the file however it ends."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")


def open_source(source: str | Path | Iterable[str], what: str, label: str) -> tuple[str, IO[bytes] | Iterator[str]]:
    """``(where, handle)`` for a reader: a path opened as bytes (so that a decoding error names its line), or the
    given lines as they are.

    Args:
        source: a path, or the file's lines.
        what: the format, for the error (``"CoNLL-U"``, ``"GAP"``).
        label: the ``where`` of given lines (``"<conllu>"``), the prefix of their errors.

    Returns:
        ``(where, handle)``: the path as text and the open file, or ``label`` and an iterator over the lines.

    Raises:
        FileNotFoundError: no file at the path.

    Example:
        >>> from interp.data._sources import open_source
        >>> where, handle = open_source(["# text = Hi", "1 Hi"], "CoNLL-U", "<conllu>")
        >>> where, list(handle)
        ('<conllu>', ['# text = Hi', '1 Hi'])
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no {what} file at {str(path)!r}")
        return str(path), path.open("rb")
    return label, iter(source)


def first_items(items: Iterator[T], handle: Any, limit: int | None) -> Iterator[T]:
    """The first ``limit`` items of ``items`` (all of them when None); ``handle`` is closed when the stream ends,
    fails or is closed early. Nothing past the last item is read (a reader stops at the item it yields).

    Args:
        items: the reader's items, read lazily from ``handle``.
        handle: the open file (anything with ``close``) or the given lines (nothing to close).
        limit: how many items at most; 0 closes the file without reading it.

    Yields:
        The items, one at a time.

    Example:
        >>> from interp.data._sources import first_items
        >>> list(first_items(iter("abc"), None, 2))
        ['a', 'b']
    """
    try:
        if limit == 0:
            return
        for n, item in enumerate(items, start=1):
            yield item
            if limit is not None and n >= limit:
                return
    finally:
        if hasattr(handle, "close"):
            handle.close()
