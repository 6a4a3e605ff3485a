"""Ordinal sequences for successor heads (Gould et al. 2023): numbers, number words, days, months and letters.

Licence: generated here from common knowledge (the order of the days, the months, the alphabet and the integers);
no third-party text, nothing downloaded. Public domain (CC0).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ORDINAL_SEQUENCES", "ordinal_token_sequences"]

#: Each task's items in order. Gould et al.'s tasks: numerals, number words, days, months, letters.
ORDINAL_SEQUENCES: dict[str, list[str]] = {
    "numbers": [str(i) for i in range(1, 21)],
    "number words": ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                     "twelve"],
    "days": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "months": ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
               "November", "December"],
    "letters": [chr(c) for c in range(ord("A"), ord("Z") + 1)],
}


def ordinal_token_sequences(tokenizer: Any, *, prefix: str = " ",
                            tasks: dict[str, list[str]] | None = None) -> dict[str, list[int]]:
    """Each ordinal task as token ids, keeping the longest run of consecutive items that are one token each.

    Args:
        tokenizer: an interp :class:`~interp.zoo.tokenizer.Tokenizer` (its ``backend``), a ``tokenizers``
            Tokenizer or a ``transformers`` tokenizer (anything with ``encode(text, add_special_tokens=False)``).
        prefix: put before every item (BPE vocabularies hold `` Monday``, with its space, as one token).
        tasks: ``{name: items in order}`` (default :data:`ORDINAL_SEQUENCES`).

    Returns:
        ``{task: [token id, ...]}`` for the tasks with at least 3 single-token items in a row.

    Raises:
        ValueError: no task has 3 single-token items in a row.

    Example:
        >>> from interp.data.ordinal import ordinal_token_sequences
        >>> from interp.examples import tok
        >>> sorted(ordinal_token_sequences(tok))     # MiniLM's word pieces
        ['days', 'letters', 'months', 'number words', 'numbers']
    """
    out: dict[str, list[int]] = {}
    for name, items in (tasks or ORDINAL_SEQUENCES).items():
        best: list[int] = []
        run: list[int] = []
        for item in items:
            ids = _ids(tokenizer, prefix + item)
            run = run + ids if len(ids) == 1 else []
            best = run if len(run) > len(best) else best
        if len(best) >= 3:
            out[name] = best
    if not out:
        raise ValueError(f"no ordinal task has 3 consecutive items that are one token each with prefix={prefix!r}")
    return out


def _ids(tokenizer: Any, text: str) -> list[int]:
    """``text``'s token ids without special tokens, from any of the tokenizers :func:`ordinal_token_sequences`
    takes."""
    enc = getattr(tokenizer, "backend", tokenizer).encode(text, add_special_tokens=False)
    return list(getattr(enc, "ids", enc))
