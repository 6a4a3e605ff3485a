"""Shared by the core tests: tiny models of every attention variant (built by ``helpers.tiny_model``, with random
biases and norms) and independent naive references."""

from __future__ import annotations

import math

import torch
from helpers import VARIANTS, tiny_model

import interp
from interp import Transformer

__all__ = ["VARIANTS", "make", "naive_attention", "naive_rotary"]  # VARIANTS: the shared one, for the core tests


def make(variant: str, *, causal: bool = True, seed: int = 0, **over) -> Transformer:
    model = tiny_model(seed, variant=variant, **{**dict(n_heads=8, d_head=6, d_vocab=37, n_ctx=24, causal=causal),
                                                 **over})
    # Random non-zero biases and norms so that every term is exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


# --- an independent, naive reference: loops over heads, explicit sin/cos pairs ------------------------
def naive_rotary(x: torch.Tensor, pos: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """Rotate feature pairs (i, i + dim/2) by pos * base^(-2i/dim); x [T, D]."""
    out = x.clone()
    half = dim // 2
    for i in range(half):
        theta = pos.double() * base ** (-2 * i / dim)
        c, s = torch.cos(theta).float(), torch.sin(theta).float()
        a, b = x[:, i], x[:, i + half]
        out[:, i] = a * c - b * s
        out[:, i + half] = b * c + a * s
    return out


def naive_attention(attn, x: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor):
    """One sequence x [T, M]; allowed [T, S] bool; returns (out [T, M], pattern [H, T, S])."""
    cfg = attn.cfg
    H, D = cfg.n_heads, cfg.d_head
    if isinstance(attn, interp.LatentAttention):
        R, C = attn.rope_dim, attn.kv_latent_dim
        if hasattr(attn, "W_dq"):
            q_all = attn.W_uq(attn.q_norm(attn.W_dq(x)))
        else:
            q_all = attn.W_q(x)
        down = attn.W_dkv(x)
        c_kv, k_r = attn.kv_norm(down[:, :C]), down[:, C:]
        if R:
            k_r = naive_rotary(k_r, positions, R, cfg.rotary_base)
        up = attn.W_ukv(c_kv)
        qs, ks, vs = [], [], []
        for h in range(H):
            q = q_all[:, h * (D + R):(h + 1) * (D + R)]
            if R:
                q = torch.cat([q[:, :D], naive_rotary(q[:, D:], positions, R, cfg.rotary_base)], -1)
            qs.append(q)
            ks.append(torch.cat([up[:, h * 2 * D:h * 2 * D + D], k_r], -1))
            vs.append(up[:, h * 2 * D + D:(h + 1) * 2 * D])
    else:
        K = cfg.n_kv_heads
        G = H // K
        W, b = attn.W_qkv.weight, attn.W_qkv.bias
        qkv = x @ W.T + (0 if b is None else b)
        qs, ks, vs = [], [], []
        for h in range(H):
            g = h // G
            q = qkv[:, h * D:(h + 1) * D]
            k = qkv[:, H * D + g * D:H * D + (g + 1) * D]
            v = qkv[:, (H + K) * D + g * D:(H + K) * D + (g + 1) * D]
            if attn.rotary is not None:
                q = naive_rotary(q, positions, cfg.rotary_dim, cfg.rotary_base)
                k = naive_rotary(k, positions, cfg.rotary_dim, cfg.rotary_base)
            qs.append(q), ks.append(k), vs.append(v)
    zs, pats = [], []
    for h in range(H):
        scores = qs[h] @ ks[h].T / math.sqrt(qs[h].shape[-1])
        scores = scores.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(scores, -1)
        pats.append(p)
        zs.append(p @ vs[h])
    out = torch.cat(zs, -1) @ attn.W_O.weight.T
    if attn.W_O.bias is not None:
        out = out + attn.W_O.bias
    return out, torch.stack(pats)
