"""Causal check of induction heads: ablate heads and measure the in-context loss gain that is left.

The in-context gain on ``[bos] x_1..x_n x_1..x_n`` is the mean next-token loss on the first half minus the
loss on the repeated half. Induction heads produce it, so ablating them should remove most of it, while
ablating a head with another job should not. Zero-ablation (the head's output removed) is off-distribution;
mean- and resample-ablation (:mod:`.ablate`) are the fairer measures, and a claim about k heads compares them
with k random heads (:func:`.ablate.compare_with_random`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
import torch.nn.functional as F

from ..data import first_occurrence_mask, repeated_sequences
from .ablate import ABLATIONS, ablate_heads

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["in_context_gain", "ablation_table"]


def in_context_gain(model: Transformer, tokens: torch.Tensor, half_len: int, *, bos: bool,
                    ablate: Iterable[tuple[int, int]] = (), method: str = "zero", reference: Any = None,
                    values: dict[int, torch.Tensor] | None = None, per_position: bool = False,
                    seed: int = 0) -> dict[str, float]:
    """Loss on the first and on the repeated half, with the given heads ablated (:func:`.ablate.ablate_heads`).

    Args:
        model: a causal decoder with an unembedding.
        tokens: ``[B, (1 if bos) + 2 * half_len]`` repeated sequences (random tokens or natural text).
        half_len: length of one half.
        bos: whether the sequences start with a BOS token.
        ablate: ``(layer, head)`` pairs to ablate.
        method: ``"zero"``, ``"mean"`` or ``"resample"``.
        reference: reference inputs for mean / resample (same distribution as ``tokens``, other samples).
        values: precomputed replacements (from :func:`.ablate.head_z_means` / :func:`.ablate.head_z_samples`).
        per_position: per-position means (mean-ablation).
        seed: the resample draw.

    Returns:
        ``{"first", "repeated", "gain"}`` in nats per token.

    Raises:
        ValueError: a head out of range, tokens of the wrong length, an unknown method or a missing reference.
    """
    T = (1 if bos else 0) + 2 * half_len
    if tokens.dim() != 2 or tokens.shape[1] != T:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}, expected [B, {T}] for half_len={half_len}")
    heads = list(ablate)
    p = next(model.parameters())
    with torch.no_grad(), contextlib.ExitStack() as stack:
        if heads:
            stack.enter_context(ablate_heads(model, heads, method, reference=reference, values=values,
                                             per_position=per_position, seed=seed))
        else:
            _check_method(method)
        logits = model(tokens.to(p.device)).float()  # [B, T, V]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten().to(p.device), reduction="none")
    loss = loss.view(tokens.shape[0], T - 1).cpu()  # [B, T-1]: loss of predicting token t+1 at position t
    first, rep = first_occurrence_mask(tokens.shape[0], half_len, bos=bos)
    f, r = float(loss[first].mean()), float(loss[rep].mean())
    return {"first": f, "repeated": r, "gain": f - r}


def _check_method(method: str) -> None:
    if method not in ABLATIONS:
        raise ValueError(f"method={method!r} is not one of {ABLATIONS}")


def ablation_table(model: Transformer, induction_heads: Iterable[tuple[int, int]], *, n_seqs: int = 64,
                   half_len: int = 25, seed: int = 1234, bos_id: int | None = None,
                   method: str = "zero") -> pd.DataFrame:
    """The gain with nothing ablated, with all ``induction_heads`` ablated, and with each head alone.

    Args:
        model: a causal decoder with an unembedding.
        induction_heads: the heads a classifier reported as induction heads.
        n_seqs, half_len, seed: the repeated random sequences used.
        bos_id: the model's BOS id (default: ``model.tokenizer.bos_id`` when present).
        method: ``"zero"``, ``"mean"`` or ``"resample"``; the reference distribution for the last two is
            ``n_seqs`` other repeated sequences (seed ``seed + 1``).

    Returns:
        DataFrame ``ablated, first, repeated, gain, gain_kept`` (``gain_kept`` = gain / unablated gain); the
        ``ablated`` column is ``"none"``, ``"induction heads"`` or ``"L{l}H{h}"``.

    Example:
        >>> ablation_table(model, [(1, 0), (1, 1), (1, 2), (1, 3)])
    """
    if bos_id is None:
        bos_id = getattr(getattr(model, "tokenizer", None), "bos_id", None)
    toks = repeated_sequences(n_seqs, half_len, model.cfg.d_vocab, seed=seed, bos_id=bos_id)
    bos = bos_id is not None
    _check_method(method)
    ref = None if method == "zero" else repeated_sequences(n_seqs, half_len, model.cfg.d_vocab, seed=seed + 1,
                                                           bos_id=bos_id)
    ind = sorted(set(map(tuple, induction_heads)))
    runs: list[tuple[str, list]] = [("none", []), ("induction heads", ind)]
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):  # every head alone, the reported induction heads included
            runs.append((f"L{layer}H{head}", [(layer, head)]))
    rows = []
    base = None
    for name, heads in runs:
        g = in_context_gain(model, toks, half_len, bos=bos, ablate=heads, method=method, reference=ref)
        base = g["gain"] if base is None else base
        rows.append({"ablated": name, **g, "gain_kept": g["gain"] / base})
    return pd.DataFrame(rows)
