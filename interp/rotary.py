"""Rotary position embeddings (RoPE), in the half-rotation convention of GPT-NeoX / Llama."""

from __future__ import annotations

import torch
from torch import nn

# The last (positions, cos, sin) computed, shared by every Rotary: all layers of a forward pass (and q and k)
# rotate by the same positions, so their angles are computed once per pass, not twice per layer. A copy of the
# positions is kept and compared by value (inference tensors have no version counter to detect edits).
_LAST: tuple | None = None


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, the same numbers, with the last two steps in place: both buffers
    are this call's own, and neither in-place step's backward needs the value it overwrites."""
    return (x * cos).add_(rotate_half(x).mul_(sin))


def rotary_angles(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosines and sines that rotate features at ``positions``.

    Args:
        positions: ``[T]`` or ``[B, T]`` absolute positions.
        inv_freq: ``[dim / 2]`` inverse frequencies (:attr:`Rotary.inv_freq`).
        dtype: of the returned tables.

    Returns:
        ``(cos, sin)``, each ``[B|1, T, 1, dim]``.

    Example:
        >>> cos, sin = rotary_angles(torch.arange(5), Rotary(8).inv_freq, torch.float32)  # [1, 5, 1, 8] each
    """
    freqs = positions.to(torch.float32)[..., None] * inv_freq  # [(B,) T, dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [(B,) T, dim]
    if emb.dim() == 2:
        emb = emb[None]  # [1, T, dim]
    cos = emb.cos()[:, :, None, :].to(dtype)  # [B|1, T, 1, dim]
    sin = emb.sin()[:, :, None, :].to(dtype)  # [B|1, T, 1, dim]
    return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` features of ``x`` ``[B, T, heads, Dx]`` by :func:`rotary_angles`'
    tables; the rest pass through unchanged (partial rotary). Returns a new tensor of ``x``'s shape.

    Example:
        >>> cos, sin = rotary_angles(torch.arange(5), Rotary(8).inv_freq, torch.float32)
        >>> apply_rotary(torch.randn(1, 5, 2, 8), cos, sin).shape
        torch.Size([1, 5, 2, 8])
    """
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return _rotate(x, cos, sin)
    return torch.cat((_rotate(x[..., :dim], cos, sin), x[..., dim:]), dim=-1)


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
        cos, sin = self._cos_sin(positions, x.dtype)  # [B|1, T, 1, dim] each
        return apply_rotary(x, cos, sin)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        global _LAST
        # Inference-mode tensors cannot be saved for backward: a pass with autograd computes its own.
        key = (self.dim, self.inv_freq.dtype, self.inv_freq.device, dtype, positions.device,
               torch.is_inference_mode_enabled())
        last = _LAST  # one read: another thread may replace it meanwhile
        if (last is not None and last[1] == key and last[0].shape == positions.shape
                and torch.equal(last[0], positions)
                and (last[2] is self.inv_freq or torch.equal(last[2], self.inv_freq))):
            return last[3], last[4]
        cos, sin = rotary_angles(positions, self.inv_freq, dtype)  # [B|1, T, 1, dim] each
        _LAST = (positions.clone(), key, self.inv_freq, cos, sin)
        return cos, sin
