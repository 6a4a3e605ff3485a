"""Positional heads: where, relative to the query, each head puts its attention (Voita et al., 2019).

For every head this measures, over a dataset streamed batch by batch, the attention mass and the argmax
frequency at each relative offset in a window (``-3..+3`` by default), at the first token ([CLS]/BOS) and at
delimiter tokens ([SEP], end punctuation), plus the confidence (mean max weight). Voita et al.'s criterion:
a head is positional when its argmax lands on the same relative offset at least 90% of the time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..data import Batch
from ..streaming import stream
from ._stream import TargetReducer, heads_of, key_allowed, offset_targets, zeros64

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["positional_scores", "offset_label", "default_delimiter_ids", "PositionalReducer"]

_END_PUNCT = (".", "!", "?", ";", ":")


def offset_label(offset: int) -> str:
    """``-1`` -> ``"-1"``, ``2`` -> ``"+2"``, ``0`` -> ``"0"`` (the column/kind suffix of an offset)."""
    return "0" if offset == 0 else f"{offset:+d}"


def default_delimiter_ids(model: Transformer) -> list[int]:
    """Ids of the separator token and of end punctuation in the model's tokenizer (empty without one)."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return []
    ids = []
    sep = getattr(tok, "sep_token_id", None)
    if sep is not None:
        ids.append(int(sep))
    backend = getattr(tok, "backend", None)
    if backend is not None and hasattr(backend, "token_to_id"):
        for p in _END_PUNCT:
            i = backend.token_to_id(p)
            if i is not None:
                ids.append(int(i))
    return sorted(set(ids))


class PositionalReducer(TargetReducer):
    """The streaming piece of :func:`positional_scores`: targets at relative offsets, the first token and
    delimiters, prepared from each batch's tokens and mask.

    Args:
        model: the model whose patterns are folded.
        window: offsets ``-window..+window`` are measured.
        delimiter_ids: token ids that count as delimiters (default :func:`default_delimiter_ids`).
        tie_tol: an argmax is unique when the top weight beats the runner-up by more than this.

    Example:
        >>> from interp import stream
        >>> from interp.analysis.positional import PositionalReducer
        >>> from interp.examples import model, tokens
        >>> red = PositionalReducer(model)
        >>> stream(model, tokens, [red]); red.table()
    """

    def __init__(self, model: Transformer, *, window: int = 3, delimiter_ids: Iterable[int] | None = None,
                 tie_tol: float = 1e-6) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window={window!r} must be an int >= 0")
        self.offsets = list(range(-window, window + 1))
        super().__init__(model, [offset_label(o) for o in self.offsets] + ["first", "delimiter"], tie_tol=tie_tol)
        self.delims = default_delimiter_ids(model) if delimiter_ids is None else [int(i) for i in delimiter_ids]
        self.state["n_sequences"] = zeros64(device=self.state["rows"].device)

    def begin_batch(self, batch: Batch) -> None:
        super().begin_batch(batch)
        tokens = batch.tokens
        self._is_delim = torch.isin(tokens, torch.tensor(self.delims, dtype=torch.long)) if self.delims else (
            torch.zeros_like(tokens, dtype=torch.bool))  # [B, S]
        self.state["n_sequences"] += len(batch)

    def targets(self, batch: Batch, rows: slice) -> dict[str, torch.Tensor]:
        T = batch.tokens.shape[1]
        allowed = key_allowed(batch.tokens, batch.mask, self.model.cfg.causal, rows)  # [B, T', S]
        out = {offset_label(o): offset_targets(T, o, rows)[None] & allowed for o in self.offsets}
        q = torch.arange(T)[rows]  # [T']
        # Query 0 excluded: attending to itself is not evidence of a first-token head.
        first = (torch.arange(T)[None, :] == 0) & (q[:, None] > 0)  # [T', S]
        out["first"] = first[None] & allowed
        not_self = torch.arange(T)[None, :] != q[:, None]  # a delimiter attending to itself is offset 0
        out["delimiter"] = self._is_delim[:, None, :] & not_self[None] & allowed
        return out

    def table(self) -> pd.DataFrame:
        """The :func:`positional_scores` table of what was folded so far.

        Raises:
            ValueError: nothing was folded yet (no batch reached the reducer), instead of an all-NaN table.
        """
        if int(self.state["n_sequences"]) == 0:
            raise ValueError("PositionalReducer.table(): no sequence was folded (n_sequences=0); run "
                             "stream(model, batches, [reducer]) over non-empty batches first")
        res = self.result()
        cats = self.categories
        rows: list[dict[str, Any]] = []
        for layer, head in heads_of(self.model):
            row: dict[str, Any] = {"layer": layer, "head": head}
            for cat in cats:
                row[f"mass_{cat}"] = float(res[cat]["mass"][layer, head])
                row[f"argmax_{cat}"] = float(res[cat]["argmax"][layer, head])
            row["confidence"] = float(res["confidence"][layer, head])
            freq = {o: row[f"argmax_{offset_label(o)}"] for o in self.offsets}
            freq = {o: f for o, f in freq.items() if f == f}  # drop NaN (no valid rows)
            best = max(freq, key=lambda o: freq[o]) if freq else 0
            row["best_offset"] = best
            row["best_argmax"] = freq.get(best, float("nan"))
            rows.append(row)
        df = pd.DataFrame(rows)
        df.attrs["rows"] = {cat: res[cat]["rows"] for cat in cats}
        df.attrs["n_sequences"] = int(self.state["n_sequences"])
        df.attrs["delimiter_ids"] = self.delims
        return df


def positional_scores(
    model: Transformer,
    tokens_or_batches: Any,
    *,
    window: int = 3,
    delimiter_ids: Iterable[int] | None = None,
    batch_size: int = 32,
    tie_tol: float = 1e-6,
) -> pd.DataFrame:
    """Per head: attention mass and argmax frequency at relative offsets, the first token and delimiters.

    Rows are averaged only over queries where the target exists and may be attended to (for offset -1,
    every real query but the first; for a causal model, offset +1 has no valid row at all and is NaN).
    The first-token statistics skip query 0, which in a causal model can only attend to itself and would
    otherwise hand every head a free hit. An argmax counts only when it is unique (see
    :class:`~interp.analysis._stream.TargetReducer`).

    Args:
        model: an interp Transformer.
        tokens_or_batches: a LongTensor ``[N, T]``, or an iterable of batches (tensors, ``(tokens, mask)``
            tuples or dicts with ``tokens`` / ``attention_mask``); streamed batch by batch.
        window: offsets ``-window..+window`` are measured.
        delimiter_ids: token ids that count as delimiters; default: the tokenizer's [SEP] and end
            punctuation (``. ! ? ; :``), none for a model without tokenizer.
        batch_size: rows per forward pass when ``tokens_or_batches`` is one tensor.
        tie_tol: an argmax is unique when the top weight beats the runner-up by more than this.

    Returns:
        DataFrame with one row per head: ``layer, head``, ``mass_{o}`` and ``argmax_{o}`` for each offset
        label (``-3 .. -1, 0, +1 .. +3``), ``mass_first, argmax_first, mass_delimiter, argmax_delimiter``,
        ``confidence``, ``best_offset`` (the offset with the highest argmax frequency) and ``best_argmax``;
        ``df.attrs`` holds ``rows`` (valid queries per statistic) and ``n_sequences``.

    Raises:
        ValueError: an empty dataset, a negative window, or sequences longer than the model's context.
        TypeError: the data are not token ids.

    Example:
        >>> import torch
        >>> from interp.analysis.positional import positional_scores
        >>> from interp.examples import model
        >>> df = positional_scores(model, torch.randint(0, 100, (16, 32)))
        >>> df.loc[df.best_argmax >= 0.9, ["layer", "head", "best_offset"]]
    """
    red = PositionalReducer(model, window=window, delimiter_ids=delimiter_ids, tie_tol=tie_tol)
    stream(model, tokens_or_batches, [red], batch_size=batch_size, name="tokens_or_batches")
    return red.table()
