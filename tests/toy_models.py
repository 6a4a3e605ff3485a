"""Test fixture: a hand-built 2-layer model whose heads are known by construction, the classifiers' ground truth.

Residual stream (no norms, attention only), four one-hot subspaces of width ``d_vocab`` or ``n_ctx``::

    [ token (V) | position (N) | previous token (V) | output (V) ]

- ``L0H0`` previous-token head: the query at position i looks for the key with position i - 1 (positions are
  one-hot learned embeddings) and copies that key's token into the "previous token" subspace.
- ``L0H1`` first-token head: a constant query (its bias) matches the key of position 0; it writes nothing.
- ``L1H0`` induction head: its query is the current token, its key the "previous token" subspace written by
  L0H0 (K-composition), so it attends to the token after an earlier occurrence of the current token; it
  copies that token into the "output" subspace, which the unembedding reads (it raises the attended token).
- ``L1H1`` a control head with small random weights: no structure.
"""

from __future__ import annotations

import torch

from interp.config import ModelConfig
from interp.model import Transformer

__all__ = ["hand_built_model", "HAND_BUILT_KINDS"]

#: The kinds :func:`interp.analysis.classify_heads` must report for :func:`hand_built_model`, and no others.
HAND_BUILT_KINDS = {
    (0, 0): {"positional:-1", "previous-token"},
    (0, 1): {"positional:first"},
    (1, 0): {"induction"},
}


@torch.no_grad()
def hand_built_model(d_vocab: int = 32, n_ctx: int = 32, *, sharpness: float = 20.0, seed: int = 0) -> Transformer:
    """Build the known-answer model described in the module docstring.

    Args:
        d_vocab: vocabulary size (V).
        n_ctx: context length (N); positions are one-hot, so ``d_model = 3 V + N``.
        sharpness: attention logit of a matching key (others get 0); 20 puts ~all weight on the match.
        seed: seed of the control head's random weights.

    Returns:
        A causal, attention-only :class:`~interp.Transformer` with 2 layers of 2 heads.

    Example:
        >>> model = hand_built_model()
        >>> model(torch.randint(0, 32, (1, 10))).shape
        torch.Size([1, 10, 32])
    """
    V, N = d_vocab, n_ctx
    D = max(V, N)
    TOK, POS, PREV, OUT = 0, V, V + N, 2 * V + N
    M = 3 * V + N
    cfg = ModelConfig(n_layers=2, d_model=M, n_heads=2, d_head=D, attn_only=True, causal=True, positional="learned",
                      normalization="none", d_vocab=V, n_ctx=N, attn_bias=True, out_bias=False, use_sdpa=True)
    model = Transformer(cfg)
    for p in model.parameters():
        p.zero_()
    model.embed.weight[torch.arange(V), TOK + torch.arange(V)] = 1.0
    model.pos_embed.weight[torch.arange(N), POS + torch.arange(N)] = 1.0
    c = sharpness * D ** 0.5  # scores are divided by sqrt(D)
    H = 2

    def rows(kind: str, head: int) -> slice:
        base = {"q": 0, "k": H * D, "v": 2 * H * D}[kind] + head * D  # W_qkv rows: [q heads | k heads | v heads]
        return slice(base, base + D)

    # Layer 0.
    a0 = model.blocks[0].attn
    Wq, Wk, Wv = a0.W_qkv.weight[rows("q", 0)], a0.W_qkv.weight[rows("k", 0)], a0.W_qkv.weight[rows("v", 0)]
    j = torch.arange(N - 1)
    Wq[j, POS + j + 1] = c  # query at position i lights dimension i - 1 ...
    Wk[torch.arange(N), POS + torch.arange(N)] = 1.0  # ... which the key at position i - 1 holds
    Wv[torch.arange(V), TOK + torch.arange(V)] = 1.0  # value: the key's token
    W_O = a0.W_O.weight  # [M, H*D]
    W_O[PREV + torch.arange(V), 0 * D + torch.arange(V)] = 1.0  # head 0 writes into "previous token"
    a0.W_qkv.bias[rows("q", 1).start + 0] = c  # head 1: constant query ...
    a0.W_qkv.weight[rows("k", 1).start + 0, POS + 0] = 1.0  # ... matches the key of position 0
    # Layer 1.
    a1 = model.blocks[1].attn
    Wq, Wk, Wv = a1.W_qkv.weight[rows("q", 0)], a1.W_qkv.weight[rows("k", 0)], a1.W_qkv.weight[rows("v", 0)]
    Wq[torch.arange(V), TOK + torch.arange(V)] = c  # query: my token
    Wk[torch.arange(V), PREV + torch.arange(V)] = 1.0  # key: the token before you (written by L0H0)
    Wv[torch.arange(V), TOK + torch.arange(V)] = 1.0  # value: your token
    a1.W_O.weight[OUT + torch.arange(V), 0 * D + torch.arange(V)] = 1.0  # written where the unembedding reads
    g = torch.Generator().manual_seed(seed)
    for kind in ("q", "k", "v"):
        a1.W_qkv.weight[rows(kind, 1)] = 0.1 * torch.randn(D, M, generator=g)
    a1.W_O.weight[:, D:2 * D] = 0.1 * torch.randn(M, D, generator=g)
    model.unembed.weight[torch.arange(V), OUT + torch.arange(V)] = 1.0
    model.name = "hand-built-induction"
    return model.eval()
