"""Test fixtures: hand-built models whose sink, copy-suppression and successor heads are known by construction.

Every model is attention-only, without norms, with one-hot embeddings, so a head's job is set by its weights:

- :func:`sink_model` (1 layer, 3 heads; residual ``[token V | position N | not-first 1 | constant 1]``):
  ``L0H0`` a sink: a constant query matches the key of position 0, and its value reads the "not-first" flag,
  zero at position 0 (it attends to the first token and reads nothing there); ``L0H1`` a real first-token head:
  the same attention, but its value reads the constant, as large at position 0 as anywhere; ``L0H2`` a
  previous-token head.
- :func:`ov_model` (2 layers of 4 heads; residual ``[token V | output V]``; every layer-0 head and every query
  and key are zero, so attention is uniform and each head's job is its OV circuit alone, read in layer 1):
  ``L1H0`` copy-suppression (writes ``-onehot(t)``), ``L1H1`` successor over :data:`ORDINAL` (writes
  ``onehot(next(t))``), ``L1H2`` copying (writes ``onehot(t)``), ``L1H3`` a successor for the first half of
  each ordinal sequence only (score exactly 0.5: the borderline head of the uncertainty tests).
"""

from __future__ import annotations

import torch

from interp.config import ModelConfig
from interp.model import Transformer

__all__ = ["ORDINAL", "ov_model", "sink_model"]

#: The toy ordinal vocabulary of :func:`ov_model`: three "tasks" of consecutive token ids.
ORDINAL = [list(range(2, 10)), list(range(10, 17)), list(range(17, 29))]


def _rows(kind: str, head: int, H: int, D: int) -> slice:
    base = {"q": 0, "k": H * D, "v": 2 * H * D}[kind] + head * D  # W_qkv rows: [q heads | k heads | v heads]
    return slice(base, base + D)


@torch.no_grad()
def sink_model(d_vocab: int = 16, n_ctx: int = 24, *, sharpness: float = 20.0) -> Transformer:
    """The sink model of the module docstring (``d_model = V + N + 2``)."""
    V, N = d_vocab, n_ctx
    TOK, POS, FLAG, CONST = 0, V, V + N, V + N + 1
    M, H = V + N + 2, 3
    D = max(V, N)
    cfg = ModelConfig(n_layers=1, d_model=M, n_heads=H, d_head=D, attn_only=True, causal=True, positional="learned",
                      normalization="none", d_vocab=V, n_ctx=N, attn_bias=True, out_bias=False, use_sdpa=True)
    model = Transformer(cfg)
    for p in model.parameters():
        p.zero_()
    model.embed.weight[torch.arange(V), TOK + torch.arange(V)] = 1.0
    model.pos_embed.weight[torch.arange(N), POS + torch.arange(N)] = 1.0
    model.pos_embed.weight[1:, FLAG] = 1.0  # "not the first position"
    model.pos_embed.weight[:, CONST] = 1.0
    c = sharpness * D ** 0.5
    a = model.blocks[0].attn
    W, b = a.W_qkv.weight, a.W_qkv.bias
    for head, value_dim in ((0, FLAG), (1, CONST)):
        b[_rows("q", head, H, D).start] = c  # constant query ...
        W[_rows("k", head, H, D).start, POS + 0] = 1.0  # ... that matches the key of position 0
        W[_rows("v", head, H, D).start, value_dim] = 1.0
        a.W_O.weight[TOK + head, head * D] = 1.0  # writes its one value dimension somewhere
    j = torch.arange(N - 1)
    W[_rows("q", 2, H, D).start + j, POS + j + 1] = c  # head 2: query at i lights dimension i - 1 ...
    W[_rows("k", 2, H, D).start + torch.arange(N), POS + torch.arange(N)] = 1.0  # ... held by the key at i - 1
    W[_rows("v", 2, H, D).start + torch.arange(V), TOK + torch.arange(V)] = 1.0
    a.W_O.weight[TOK + torch.arange(V), 2 * D + torch.arange(V)] = 0.1
    model.name = "hand-built-sink"
    return model.eval()


def successor_of(t: int, *, first_half_only: bool = False) -> int | None:
    """The token after ``t`` in :data:`ORDINAL` (None for a last item, a non-ordinal token, or, with
    ``first_half_only``, an item in the second half of its sequence)."""
    for seq in ORDINAL:
        if t in seq[:-1]:
            i = seq.index(t)
            return None if first_half_only and i >= (len(seq) - 1) // 2 else seq[i + 1]
    return None


@torch.no_grad()
def ov_model(d_vocab: int = 32, n_ctx: int = 16) -> Transformer:
    """The OV-circuit model of the module docstring (``d_model = 2 V``)."""
    V = d_vocab
    TOK, OUT = 0, V
    M, H, D = 2 * V, 4, V
    cfg = ModelConfig(n_layers=2, d_model=M, n_heads=H, d_head=D, attn_only=True, causal=True, positional="learned",
                      normalization="none", d_vocab=V, n_ctx=n_ctx, attn_bias=False, out_bias=False, use_sdpa=True)
    model = Transformer(cfg)
    for p in model.parameters():
        p.zero_()
    model.embed.weight[torch.arange(V), TOK + torch.arange(V)] = 1.0
    a = model.blocks[1].attn
    W, W_O = a.W_qkv.weight, a.W_O.weight  # [3 H D, M], [M, H D]
    for head in range(H):
        W[_rows("v", head, H, D).start + torch.arange(V), TOK + torch.arange(V)] = 1.0  # value: the token
    t = torch.arange(V)
    W_O[OUT + t, 0 * D + t] = -1.0  # L1H0: copy suppression
    W_O[OUT + t, 2 * D + t] = 1.0  # L1H2: copying
    for tok in range(V):
        nxt = successor_of(tok)
        if nxt is not None:
            W_O[OUT + nxt, 1 * D + tok] = 1.0  # L1H1: successor
        half = successor_of(tok, first_half_only=True)
        if half is not None:
            W_O[OUT + half, 3 * D + tok] = 1.0  # L1H3: successor on half the items
    model.unembed.weight[t, OUT + t] = 1.0
    model.name = "hand-built-ov"
    return model.eval()
