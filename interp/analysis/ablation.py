"""Causal check of induction heads: zero-ablate heads and measure the in-context loss gain that is left.

The in-context gain on ``[bos] x_1..x_n x_1..x_n`` is the mean next-token loss on the first half minus the
loss on the repeated half. Induction heads produce it, so zero-ablating them (head gates at 0, i.e. their
output removed from the residual stream) should remove most of it, while ablating a head with another job
should not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.nn.functional as F

from ..data import first_occurrence_mask, repeated_sequences

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["in_context_gain", "ablation_table"]


def in_context_gain(model: Transformer, tokens: torch.Tensor, half_len: int, *, bos: bool,
                    ablate: Iterable[tuple[int, int]] = ()) -> dict[str, float]:
    """Loss on the first and on the repeated half, with the given heads zero-ablated.

    Args:
        model: a causal decoder with an unembedding.
        tokens: ``[B, (1 if bos) + 2 * half_len]`` repeated sequences.
        half_len: length of one half.
        bos: whether the sequences start with a BOS token.
        ablate: ``(layer, head)`` pairs whose output is zeroed.

    Returns:
        ``{"first", "repeated", "gain"}`` in nats per token.

    Raises:
        ValueError: a head out of range, or tokens of the wrong length.
    """
    L = model.cfg.n_layers
    T = (1 if bos else 0) + 2 * half_len
    if tokens.dim() != 2 or tokens.shape[1] != T:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}, expected [B, {T}] for half_len={half_len}")
    ablate = list(ablate)
    p = next(model.parameters())
    gates = [torch.ones(model.cfg.layer(layer).n_heads) for layer in range(L)]
    for layer, head in ablate:
        if not (0 <= layer < L and 0 <= head < len(gates[layer])):
            raise ValueError(f"head ({layer}, {head}) is outside a model with {L} layers and "
                             f"{[len(g) for g in gates]} heads per layer")
        gates[layer][head] = 0.0
    if ablate:
        model.set_head_gates([g.to(p) for g in gates])
    try:
        with torch.no_grad():
            logits = model(tokens.to(p.device)).float()  # [B, T, V]
    finally:
        if ablate:
            model.set_head_gates(None)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten().to(p.device), reduction="none")
    loss = loss.view(tokens.shape[0], T - 1).cpu()  # [B, T-1]: loss of predicting token t+1 at position t
    first, rep = first_occurrence_mask(tokens.shape[0], half_len, bos=bos)
    f, r = float(loss[first].mean()), float(loss[rep].mean())
    return {"first": f, "repeated": r, "gain": f - r}


def ablation_table(model: Transformer, induction_heads: Iterable[tuple[int, int]], *, n_seqs: int = 64,
                   half_len: int = 25, seed: int = 1234, bos_id: int | None = None) -> pd.DataFrame:
    """The gain with nothing ablated, with all ``induction_heads`` ablated, and with each head alone.

    Args:
        model: a causal decoder with an unembedding.
        induction_heads: the heads a classifier reported as induction heads.
        n_seqs, half_len, seed: the repeated random sequences used.
        bos_id: the model's BOS id (default: ``model.tokenizer.bos_id`` when present).

    Returns:
        DataFrame ``ablated, first, repeated, gain, gain_kept`` (``gain_kept`` = gain / unablated gain); the
        ``ablated`` column is ``"none"``, ``"induction heads"`` or ``"L{l}H{h}"``.

    Example:
        >>> ablation_table(model, report.heads("induction"))
    """
    if bos_id is None:
        bos_id = getattr(getattr(model, "tokenizer", None), "bos_id", None)
    toks = repeated_sequences(n_seqs, half_len, model.cfg.d_vocab, seed=seed, bos_id=bos_id)
    bos = bos_id is not None
    ind = sorted(set(map(tuple, induction_heads)))
    runs: list[tuple[str, list]] = [("none", []), ("induction heads", ind)]
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):  # every head alone, the reported induction heads included
            runs.append((f"L{layer}H{head}", [(layer, head)]))
    rows = []
    base = None
    for name, heads in runs:
        g = in_context_gain(model, toks, half_len, bos=bos, ablate=heads)
        base = g["gain"] if base is None else base
        rows.append({"ablated": name, **g, "gain_kept": g["gain"] / base})
    return pd.DataFrame(rows)
