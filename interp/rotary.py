"""Rotary position embeddings (RoPE), in the half-rotation convention of GPT-NeoX / Llama."""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotate the first ``dim`` features of each head by position-dependent angles.

    Args:
        dim: rotated features per head (even); the rest pass through unchanged (partial rotary).
        base: the frequency base (10000 in most models).

    Example:
        >>> rot = Rotary(8)
        >>> rot(torch.randn(1, 5, 2, 8), torch.arange(5)).shape
        torch.Size([1, 5, 2, 8])
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """x ``[B, T, heads, Dx]``, positions ``[B, T]`` or ``[T]`` (default ``arange(T)``) -> same shape."""
        B, T = x.shape[:2]
        if positions is None:
            positions = torch.arange(T, device=x.device)
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq  # [(B,) T, dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [(B,) T, dim]
        if emb.dim() == 2:
            emb = emb[None]  # [1, T, dim]
        cos = emb.cos()[:, :, None, :].to(x.dtype)  # [B|1, T, 1, dim]
        sin = emb.sin()[:, :, None, :].to(x.dtype)  # [B|1, T, 1, dim]
        if self.dim == x.shape[-1]:
            return x * cos + rotate_half(x) * sin
        x_rot, x_pass = x[..., : self.dim], x[..., self.dim:]
        return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)
