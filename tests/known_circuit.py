"""A hand-built attention-only model whose circuit is known by construction.

Residual stream (no norms, no biases), five subspaces of width ``V`` (the vocabulary)::

    [ token | S1 | S2 | S3 | S4 ]

Every query and key weight is 0, so every head attends uniformly to the positions up to its own.

- ``a0.h0`` copies the token (its value reads ``token``) into ``S1``;
- ``a1.h1`` copies ``S1`` into ``S2``; the unembedding reads ``S2`` only;
- distractors that carry the clean / corrupted difference but never reach the logits: ``a0.h1`` copies the
  token into ``S3``, ``a1.h0`` copies ``S3`` into ``S4`` (read by nothing).

The logits at the last position are the token frequencies weighted by position, so the metric
``logit[0] - logit[1]`` separates prompts of many 0s (clean) from prompts of many 1s (corrupted), and exactly
three edges carry it: ``input -> a0.h0<v>``, ``a0.h0 -> a1.h1<v>``, ``a1.h1 -> logits``.
"""

from __future__ import annotations

import torch

from interp.config import ModelConfig
from interp.model import Transformer

V = 4
CIRCUIT = {("input", "a0.h0<v>"), ("a0.h0", "a1.h1<v>"), ("a1.h1", "logits")}


@torch.no_grad()
def known_circuit_model() -> Transformer:
    """The model of the module docstring (float64)."""
    cfg = ModelConfig(n_layers=2, d_model=5 * V, n_heads=2, d_head=V, attn_only=True, causal=True, positional="none",
                      normalization="none", d_vocab=V, n_ctx=16, attn_bias=False, out_bias=False)
    model = Transformer(cfg).double()
    for p in model.parameters():
        p.zero_()
    eye = torch.eye(V, dtype=torch.float64)
    TOK, S1, S2, S3, S4 = (slice(i * V, (i + 1) * V) for i in range(5))
    model.embed.weight[:, TOK] = eye
    H, D = 2, V

    def head(layer: int, h: int, reads: slice, writes: slice) -> None:
        attn = model.blocks[layer].attn
        v_rows = slice(2 * H * D + h * D, 2 * H * D + (h + 1) * D)  # n_kv_heads = H: q, k, v blocks of H*D rows
        attn.W_qkv.weight[v_rows, reads] = eye
        attn.W_O.weight[writes, h * D:(h + 1) * D] = eye

    head(0, 0, TOK, S1)
    head(1, 1, S1, S2)
    head(0, 1, TOK, S3)
    head(1, 0, S3, S4)
    model.unembed.weight[:, S2] = eye
    return model.eval()


def known_circuit_task(n: int = 4, T: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, object]:
    """Clean prompts (mostly 0s), corrupted ones (mostly 1s) and the metric ``logit[0] - logit[1]`` (last
    position, mean over the batch)."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randint(2, V, (n, T), generator=gen)
    keep = torch.rand(n, T, generator=gen) < 0.3
    clean = torch.where(keep, noise, torch.zeros_like(noise))
    corrupted = torch.where(keep, noise, torch.ones_like(noise))

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return (logits[:, -1, 0] - logits[:, -1, 1]).mean()

    return clean, corrupted, metric
