"""A minimal plain-PyTorch GPT-style decoder (fused QKV, ``scaled_dot_product_attention``, pre-LN, GELU MLP),
built with the same weights as an interp Transformer, as the speed reference of benchmark 0 (issue 2).

Nothing here is hookable: it is what a forward pass costs with no instrumentation at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import interp

SIZES = {
    # name: (layers, d_model, heads, d_mlp, d_vocab, n_ctx)
    # A small vocabulary so that the blocks, not the unembedding matmul, dominate the time.
    "minilm": (6, 384, 12, 1536, 4096, 512),
    "gpt2": (12, 768, 12, 3072, 50257, 1024),
    "tiny": (2, 64, 4, 256, 1000, 128),
}


class RefBlock(nn.Module):
    def __init__(self, d: int, h: int, d_mlp: int) -> None:
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d_mlp)
        self.out = nn.Linear(d_mlp, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, M = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(M, dim=-1)
        q, k, v = (t.view(B, T, self.h, M // self.h).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]
        x = x + self.proj(z.transpose(1, 2).reshape(B, T, M))  # [B, T, M]
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class RefDecoder(nn.Module):
    def __init__(self, layers: int, d: int, h: int, d_mlp: int, d_vocab: int, n_ctx: int) -> None:
        super().__init__()
        self.W_E = nn.Embedding(d_vocab, d)
        self.W_pos = nn.Embedding(n_ctx, d)
        self.blocks = nn.ModuleList(RefBlock(d, h, d_mlp) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.W_U = nn.Linear(d, d_vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.W_E(tokens) + self.W_pos(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            x = b(x)
        return self.W_U(self.ln_f(x))


def build_pair(size: str = "minilm", seed: int = 0) -> tuple[interp.Transformer, RefDecoder]:
    """An interp decoder and the reference decoder holding identical weights (both in eval mode).

    Raises:
        ValueError: unknown size, or the two models disagree (max |diff| > 1e-4) on a random input.
    """
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of {sorted(SIZES)}")
    L, d, h, d_mlp, V, n_ctx = SIZES[size]
    torch.manual_seed(seed)
    cfg = interp.ModelConfig(n_layers=L, d_model=d, n_heads=h, d_mlp=d_mlp, d_vocab=V, n_ctx=n_ctx,
                             activation="gelu", normalization="pre", positional="learned")
    ours = interp.Transformer(cfg).eval()
    ref = RefDecoder(L, d, h, d_mlp, V, n_ctx).eval()
    with torch.no_grad():
        ref.W_E.weight.copy_(ours.embed.weight)
        ref.W_pos.weight.copy_(ours.pos_embed.weight)
        for rb, ob in zip(ref.blocks, ours.blocks):
            for dst, src in ((rb.ln1, ob.ln1), (rb.ln2, ob.ln2), (rb.qkv, ob.attn.W_qkv), (rb.proj, ob.attn.W_O),
                             (rb.fc, ob.mlp.W_in), (rb.out, ob.mlp.W_out)):
                dst.load_state_dict(src.state_dict())
        ref.ln_f.load_state_dict(ours.ln_final.state_dict())
        ref.W_U.load_state_dict(ours.unembed.state_dict())
        x = torch.randint(0, V, (2, 16))
        diff = (ours(x) - ref(x)).abs().max().item()
    if diff > 1e-4:
        raise ValueError(f"reference and interp disagree: max |diff| = {diff:.3g}")
    return ours, ref
