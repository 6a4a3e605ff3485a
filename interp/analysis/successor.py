"""Successor heads (Gould et al. 2023, "Successor heads: recurring, interpretable attention heads in the wild"):
a head whose OV circuit maps an ordinal token to the next one (Monday -> Tuesday, 3 -> 4, January -> February).

Score: the succession score of the effective OV circuit (:mod:`.ov_circuit`). For every item of every ordinal
sequence but the last (:mod:`interp.data.ordinal`: numbers, number words, days, months, letters), read the head's
logits over *all* ordinal tokens (every task's, pooled) when it attends to the item; the item is a hit when its
successor has the top logit. The score is the share of hits. Chance is one over the pooled set (~1/75 on
SmolLM2's vocabulary).

Threshold ``successor_threshold = 0.5``: most successions are the head's top choice among all the ordinal tokens,
tens of times chance; Gould et al.'s successor heads reach a large majority of the tasks' items.
"""

from __future__ import annotations

from typing import Any

import torch

from ..data.ordinal import ordinal_token_sequences
from ..streaming import Reducer
from ._stream import head_counts
from .kinds import HeadKind, KindRun, register_kind, sampled_rows
from .ov_circuit import has_unembedding, ov_logits

__all__ = ["succession_scores"]


def succession_scores(model: Any, sequences: dict[str, list[int]] | list[list[int]]) -> torch.Tensor:
    """Per head and ordinal item, 1 when the head's effective OV circuit ranks the item's successor first among
    every ordinal token.

    Args:
        model: an interp Transformer with an unembedding.
        sequences: ordinal token sequences (``{task: ids}`` or a list of id lists), each in order.

    Returns:
        ``[L, H_max, n]`` float32 of 0/1 (NaN for heads a pruned layer lacks), ``n`` = items with a successor.

    Raises:
        ValueError: no sequence of at least 2 tokens, a token outside the vocabulary, or a model without an
            unembedding.

    Example:
        >>> from interp.analysis.successor import succession_scores
        >>> from interp.examples import model
        >>> hits = succession_scores(model, [[3, 4, 5, 6]])
        >>> hits.mean(-1)                 # [L, H] succession scores
    """
    seqs = list(sequences.values()) if isinstance(sequences, dict) else list(sequences)
    seqs = [[int(t) for t in s] for s in seqs if len(s) >= 2]
    if not seqs:
        raise ValueError(f"sequences={sequences!r}: need at least one ordinal sequence of 2 or more tokens")
    if not has_unembedding(model):
        raise ValueError("succession scores read the unembedding, and this model has none")
    V = model.unembed.weight.shape[0]
    bad = sorted({t for s in seqs for t in s if not 0 <= t < V})
    if bad:
        raise ValueError(f"ordinal tokens {bad[:10]} lie outside the vocabulary of {V} tokens")
    pool = torch.tensor(sorted({t for s in seqs for t in s}))  # [C]: every ordinal token
    items = torch.tensor([t for s in seqs for t in s[:-1]])  # [n]
    nxt = torch.tensor([t for s in seqs for t in s[1:]])  # [n]
    logits = ov_logits(model, items, pool)  # [L, H, n, C]
    top = pool.to(logits.device)[logits.nan_to_num(-torch.inf).argmax(-1)]  # [L, H, n]
    hits = (top == nxt.to(logits.device)).float()
    return hits.masked_fill(logits[..., 0].isnan(), torch.nan).cpu()


def _sequences(run: KindRun) -> tuple[dict[str, list[int]] | list[list[int]] | None, str]:
    given = run["ordinal_tokens"]
    if given is not None:
        return given, "the given ordinal_tokens"
    tok = getattr(run.model, "tokenizer", None)
    if tok is None:
        return None, "not measured: no tokenizer and no ordinal_tokens"
    seqs = ordinal_token_sequences(tok)
    return seqs, "ordinal sequences " + ", ".join(f"{k} ({len(v)})" for k, v in seqs.items())


def _rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    model = run.model
    seqs, probe = _sequences(run)
    if seqs is None or not has_unembedding(model):
        run.probes["successor"] = probe if seqs is None else "not measured: the model has no unembedding"
        return []
    run.probes["successor"] = probe + " (the weights' effective OV circuit)"
    hits = succession_scores(model, seqs)  # [L, H, n]
    threshold = run["successor_threshold"]
    return sampled_rows("successor", hits, head_counts(model), threshold, lambda s, score: (
        f"successor ranked first among the ordinal tokens for {int(s.sum())} of {len(s)} items"))


register_kind(HeadKind(
    "successor", ("successor",), "weights", None, _rows,
    threshold="successor_threshold=0.5",
    reason="most successions are the head's top choice among every ordinal token (chance: one over the pooled "
           "set, ~0.01-0.05)",
    source="Gould et al. 2023, Successor heads: recurring, interpretable attention heads in the wild",
    default=False, colour="#f39c12",
    defaults={"successor_threshold": 0.5, "ordinal_tokens": None}))
