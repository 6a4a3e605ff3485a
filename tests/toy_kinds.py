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
- :func:`fv_model` (2 layers of 2 heads; residual ``[token V | position N | flag | task | junk | constant]``;
  ICL prompts ``[bos] x_1 y_1 .. x_k y_k x_q`` over :data:`FV_PAIRS`, ``y = x + 8``): ``L0H0`` a pair detector: at
  a label ``y`` it attends to the previous token only when that token is ``y``'s own input (else to BOS) and
  writes the flag; ``L1H0`` the function-vector head: at every position it attends to the flagged labels (else
  BOS) and writes the task direction; the unembedding gives the answer ``f(x_q)`` 4, a default token ``D`` 6,
  lowered by 12 times the task direction, so the task direction alone turns ``D`` into the answer. ``L0H1`` (a
  previous-token head) and ``L1H1`` (uniform attention) write only the junk dimension. Known AIE: ``L1H0`` large,
  every other head exactly 0 (``L0H0`` matters, but its last-position output is the same on clean and corrupted
  prompts: it works upstream of the function vector).
- :func:`name_mover_model` (1 layer of 4 heads; residual ``[token V | position N | output V | constant]``; IOI-like
  prompts with the indirect object at position 1, :func:`ioi_like_prompts`): ``L0H0`` a name mover (attends from
  every query to position 1 and writes ``onehot(t)``), ``L0H1`` a negative name mover (same attention, writes
  ``-onehot(t)``), ``L0H2`` copies but attends to position 2 (the subject), ``L0H3`` attends to position 1 and
  writes nothing.
"""

from __future__ import annotations

import torch

from interp.config import ModelConfig
from interp.model import Transformer

__all__ = ["FV_PAIRS", "ORDINAL", "fv_model", "ioi_like_prompts", "name_mover_model", "ov_model", "sink_model"]

#: The toy ordinal vocabulary of :func:`ov_model`: three "tasks" of consecutive token ids.
ORDINAL = [list(range(2, 10)), list(range(10, 17)), list(range(17, 29))]


def _rows(kind: str, head: int, H: int, D: int) -> slice:
    base = {"q": 0, "k": H * D, "v": 2 * H * D}[kind] + head * D  # W_qkv rows: [q heads | k heads | v heads]
    return slice(base, base + D)


@torch.no_grad()
def _blank(cfg: ModelConfig, *, pos: int | None = None) -> Transformer:
    """A model of ``cfg`` whose weights are all zero but one-hot token embeddings (dims ``0 .. V-1``) and, with
    ``pos``, one-hot position embeddings from dim ``pos``: the start of every hand-built model here."""
    model = Transformer(cfg)
    for p in model.parameters():
        p.zero_()
    V, N = cfg.d_vocab, cfg.n_ctx
    model.embed.weight[torch.arange(V), torch.arange(V)] = 1.0
    if pos is not None:
        model.pos_embed.weight[torch.arange(N), pos + torch.arange(N)] = 1.0
    return model


@torch.no_grad()
def sink_model(d_vocab: int = 16, n_ctx: int = 24, *, sharpness: float = 20.0) -> Transformer:
    """The sink model of the module docstring (``d_model = V + N + 2``)."""
    V, N = d_vocab, n_ctx
    TOK, POS, FLAG, CONST = 0, V, V + N, V + N + 1
    M, H = V + N + 2, 3
    D = max(V, N)
    cfg = ModelConfig(n_layers=1, d_model=M, n_heads=H, d_head=D, attn_only=True, causal=True, positional="learned",
                      normalization="none", d_vocab=V, n_ctx=N, attn_bias=True, out_bias=False, use_sdpa=True)
    model = _blank(cfg, pos=POS)
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
    model = _blank(cfg)
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


#: The toy ICL task of :func:`fv_model`: inputs 2..9, each mapped to itself + 8.
FV_PAIRS = {"shift": [(x, x + 8) for x in range(2, 10)]}
FV_DEFAULT = 31  # the "don't know" token of fv_model


@torch.no_grad()
def fv_model(d_vocab: int = 32, n_ctx: int = 16, *, sharpness: float = 20.0) -> Transformer:
    """The function-vector model of the module docstring."""
    V, N = d_vocab, n_ctx
    TOK, POS, FLAG, TASK, JUNK, CONST = 0, V, V + N, V + N + 1, V + N + 2, V + N + 3
    M, H = V + N + 4, 2
    D = V + N + 1  # query/key blocks: [token V | position N | bos 1]
    cfg = ModelConfig(n_layers=2, d_model=M, n_heads=H, d_head=D, attn_only=True, causal=True, positional="learned",
                      normalization="none", d_vocab=V, n_ctx=N, attn_bias=False, out_bias=False, use_sdpa=True)
    model = _blank(cfg, pos=POS)
    model.pos_embed.weight[:, CONST] = 1.0
    c = sharpness * D ** 0.5
    pairs = FV_PAIRS["shift"]
    # L0H0, the pair detector: query at a label y -> its input's token dim + the previous position; a constant
    # query on BOS at 1.5 c; a key holds its token, its position, and "I am position 0".
    a0 = model.blocks[0].attn
    W, W_O = a0.W_qkv.weight, a0.W_O.weight
    q, k, v = _rows("q", 0, H, D).start, _rows("k", 0, H, D).start, _rows("v", 0, H, D).start
    for x, y in pairs:
        W[q + x, TOK + y] = c
        W[k + x, TOK + x] = 1.0
    j = torch.arange(N - 1)
    W[q + V + j, POS + j + 1] = c  # the query at i lights position i - 1 ...
    W[k + V + torch.arange(N), POS + torch.arange(N)] = 1.0  # ... held by the key at i - 1
    W[q + V + N, CONST] = 1.5 * c
    W[k + V + N, POS + 0] = 1.0
    for x, _ in pairs:
        W[v, TOK + x] = 1.0  # value: "the attended token is an input"
    W_O[FLAG, 0 * D + 0] = 1.0
    # L0H1, a previous-token head writing the junk dimension.
    q, k, v = _rows("q", 1, H, D).start, _rows("k", 1, H, D).start, _rows("v", 1, H, D).start
    W[q + V + j, POS + j + 1] = c
    W[k + V + torch.arange(N), POS + torch.arange(N)] = 1.0
    W[v + torch.arange(V), TOK + torch.arange(V)] = 1.0
    W_O[JUNK, 1 * D + torch.arange(V)] = 0.1
    # L1H0, the function-vector head: flagged positions at c, BOS at 0.5 c; its value reads the flag.
    a1 = model.blocks[1].attn
    W, W_O = a1.W_qkv.weight, a1.W_O.weight
    q, k, v = _rows("q", 0, H, D).start, _rows("k", 0, H, D).start, _rows("v", 0, H, D).start
    W[q, CONST], W[k, FLAG] = c, 1.0
    W[q + 1, CONST], W[k + 1, POS + 0] = 0.5 * c, 1.0
    W[v, FLAG] = 1.0
    W_O[TASK, 0] = 1.0
    # L1H1: uniform attention (zero query and key), writes the junk dimension from the token.
    v = _rows("v", 1, H, D).start
    W[v + torch.arange(V), TOK + torch.arange(V)] = 1.0
    W_O[JUNK, 1 * D + torch.arange(V)] = 0.1
    U = model.unembed.weight  # [V, M]
    for x, y in pairs:
        U[y, TOK + x] = 4.0
    U[FV_DEFAULT, CONST] = 6.0
    U[FV_DEFAULT, TASK] = -12.0
    model.name = "hand-built-function-vector"
    return model.eval()


def ioi_like_prompts(n: int = 8, *, names: range = range(2, 10), seed: int = 0):
    """IOI-like prompts ``[bos] IO S f f S f END`` (IO always at position 1) for :func:`name_mover_model`:
    a TaskPrompts with answers (IO, S); fillers and END come from 10..23."""
    from interp.data.circuit_tasks import TaskPrompts

    gen = torch.Generator().manual_seed(seed)
    rows, answers = [], []
    for _ in range(n):
        io, s = (names[i] for i in torch.randperm(len(names), generator=gen)[:2].tolist())
        f = torch.randint(10, 23, (3,), generator=gen).tolist()
        rows.append([0, io, s, f[0], f[1], s, f[2], 23])
        answers.append([io, s])
    clean = torch.tensor(rows)  # [n, 8]
    return TaskPrompts("ioi-like", clean, clean.clone(), answers=torch.tensor(answers))


@torch.no_grad()
def name_mover_model(d_vocab: int = 24, n_ctx: int = 16, *, sharpness: float = 20.0) -> Transformer:
    """The name-mover model of the module docstring."""
    V, N = d_vocab, n_ctx
    TOK, POS, OUT, CONST = 0, V, V + N, 2 * V + N
    M, H, D = 2 * V + N + 1, 4, V
    cfg = ModelConfig(n_layers=1, d_model=M, n_heads=H, d_head=D, attn_only=True, causal=True, positional="learned",
                      normalization="none", d_vocab=V, n_ctx=N, attn_bias=False, out_bias=False, use_sdpa=True)
    model = _blank(cfg, pos=POS)
    model.pos_embed.weight[:, CONST] = 1.0
    c = sharpness * D ** 0.5
    a = model.blocks[0].attn
    W, W_O = a.W_qkv.weight, a.W_O.weight
    t = torch.arange(V)
    for head, position, sign in ((0, 1, 1.0), (1, 1, -1.0), (2, 2, 1.0), (3, 1, 0.0)):
        W[_rows("q", head, H, D).start, CONST] = c  # a constant query ...
        W[_rows("k", head, H, D).start, POS + position] = 1.0  # ... matching one position's key
        W[_rows("v", head, H, D).start + t, TOK + t] = 1.0  # value: the token
        W_O[OUT + t, head * D + t] = sign
    model.unembed.weight[t, OUT + t] = 1.0
    model.name = "hand-built-name-mover"
    return model.eval()
