"""A static KV cache for token-by-token decoding (gpt-fast style: buffers allocated once, written in place).

Standard attention stores K and V per K/V head (``[B, K, S_max, D]``), so GQA/MQA shrink it by the group
size; multi-head latent attention stores only the latent ``[B, S_max, C]`` and the shared rotary key
``[B, S_max, R]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .config import ModelConfig


class LayerKVCache:
    """One layer's buffers. ``update(start, *new)`` writes the new entries at ``start`` and returns views of
    everything up to ``start + T``."""

    def __init__(self, buffers: list[torch.Tensor], seq_dims: list[int]) -> None:
        self.buffers = buffers
        self.seq_dims = seq_dims

    def update(self, start: int, *new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = []
        for buf, dim, t in zip(self.buffers, self.seq_dims, new):
            n = t.shape[dim]
            if start + n > buf.shape[dim]:
                raise ValueError(
                    f"KV cache overflow: writing {n} tokens at position {start} exceeds max_len={buf.shape[dim]}"
                )
            buf.narrow(dim, start, n).copy_(t)
            out.append(buf.narrow(dim, 0, start + n))
        return tuple(out)


class KVCache:
    """K/V (or latent) buffers for every layer, plus how many positions are filled.

    Args:
        cfg: the model config (decides what is stored: per-KV-head K/V, or the MLA latent).
        batch_size: sequences decoded together.
        max_len: the most positions the cache holds (defaults to ``cfg.n_ctx``).
        dtype, device: of the buffers; ``device`` may be a list with one device per layer (a model split over
            devices keeps each layer's cache with its block).

    Example:
        >>> cache = model.make_cache(batch_size=1)
        >>> logits = model(prompt, kv_cache=cache)          # prefill
        >>> logits = model(next_token, kv_cache=cache)      # one step
        >>> cache.nbytes_used
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        batch_size: int,
        max_len: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | Sequence[torch.device | str] = "cpu",
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be > 0")
        max_len = cfg.n_ctx if max_len is None else max_len
        if max_len <= 0 or max_len > cfg.n_ctx:
            raise ValueError(f"max_len={max_len} must be in [1, n_ctx={cfg.n_ctx}]")
        self.cfg = cfg
        self.batch_size = batch_size
        self.max_len = max_len
        self.length = 0
        self.layers: list[LayerKVCache] = []
        devices = [device] * cfg.n_layers if isinstance(device, (str, torch.device)) else list(device)
        if len(devices) != cfg.n_layers:
            raise ValueError(f"device lists {len(devices)} devices for a model with {cfg.n_layers} layers")
        for layer in range(cfg.n_layers):
            if cfg.attention == "latent":
                width = 1 if cfg.layer(layer).n_heads else 0  # a layer without heads caches nothing
                shapes = [(batch_size, max_len, width * cfg.kv_latent_dim), (batch_size, max_len, width * cfg.rope_dim)]
                seq_dims = [1, 1]
            else:
                # A pruned model may keep a different number of K/V heads in each layer.
                shapes = [(batch_size, cfg.layer(layer).n_kv_heads, max_len, cfg.d_head)] * 2
                seq_dims = [2, 2]
            bufs = [torch.zeros(s, dtype=dtype, device=devices[layer]) for s in shapes]
            self.layers.append(LayerKVCache(bufs, seq_dims))

    def reset(self) -> None:
        """Forget every stored position (buffers are kept and overwritten)."""
        self.length = 0

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the buffers."""
        return sum(b.numel() * b.element_size() for layer in self.layers for b in layer.buffers)

    @property
    def nbytes_per_token(self) -> int:
        """Bytes one position takes across all layers and the batch."""
        return self.nbytes // self.max_len

    @property
    def nbytes_used(self) -> int:
        """Bytes holding the ``length`` positions filled so far."""
        return self.nbytes_per_token * self.length

    def __repr__(self) -> str:
        return (f"KVCache(kind={self.cfg.kind}, layers={self.cfg.n_layers}, batch={self.batch_size}, "
                f"length={self.length}/{self.max_len}, bytes={self.nbytes})")
