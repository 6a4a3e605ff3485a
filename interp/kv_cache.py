"""A static KV cache for token-by-token decoding (gpt-fast style: buffers allocated once, written in place).

Each layer's cache advances its own position as it is written (torchtune's ``KVCache.update``): callers hand
it the new entries, never a position, so no caller can leave it pointing at the wrong place.

Standard attention stores K and V per K/V head (``[B, K, S_max, D]``), so GQA/MQA shrink it by the group
size; multi-head latent attention stores only the latent ``[B, S_max, C]`` and the shared rotary key
``[B, S_max, R]``. A sliding-window layer (window W) keeps only the last W - 1 positions, all a later query
can see besides itself; a chunked layer (chunk C, Llama 4) keeps only its current chunk's positions, at most C - 1
(:class:`WindowLayerKVCache` for both).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .config import ModelConfig


class LayerKVCache:
    """One layer's buffers and how many positions they hold. ``update(*new)`` writes the new entries at that
    position, advances it, and returns views of everything written so far."""

    def __init__(self, buffers: list[torch.Tensor], seq_dims: list[int]) -> None:
        self.buffers = buffers
        self.seq_dims = seq_dims
        self.length = 0

    def update(self, *new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Append ``new`` (one tensor per buffer) and return each buffer up to the new length.

        Raises:
            ValueError: the new entries do not fit in the buffers (nothing is written then).
        """
        start, n = self.length, new[0].shape[self.seq_dims[0]]
        for buf, dim in zip(self.buffers, self.seq_dims):
            if start + n > buf.shape[dim]:
                raise ValueError(
                    f"KV cache overflow: writing {n} tokens at position {start} exceeds max_len={buf.shape[dim]}"
                )
        out = []
        for buf, dim, t in zip(self.buffers, self.seq_dims, new):
            buf.narrow(dim, start, n).copy_(t)
            out.append(buf.narrow(dim, 0, start + n))
        self.length = start + n
        return tuple(out)

    def advance(self, n: int) -> None:
        """Count ``n`` more positions without writing them (a layer with no heads stores nothing)."""
        if self.length + n > self.buffers[0].shape[self.seq_dims[0]]:
            raise ValueError(f"KV cache overflow: {self.length} + {n} positions exceed "
                             f"max_len={self.buffers[0].shape[self.seq_dims[0]]}")
        self.length += n


class WindowLayerKVCache(LayerKVCache):
    """A sliding-window or chunked layer's buffers: only the positions a later query can see, oldest first.

    A window W keeps the last ``capacity`` (= W - 1) positions; a chunk C (``chunk``) keeps the positions of the
    current chunk, ``length % C`` of them (at most C - 1), and forgets a chunk once the next one begins.
    ``update(*new)`` returns the kept positions followed by the new ones (positions ``length - kept .. length +
    T - 1``; the attention reads the first key's position off the count), keeps what the next query can see and
    advances ``length``. Memory is bounded by the window or chunk, however long the decoding runs. The positions
    that were dropped are gone, so a rewind to anywhere but 0 cannot be undone: the next update after one raises
    instead of attending to the wrong keys.

    Example:
        >>> import torch
        >>> from interp.kv_cache import WindowLayerKVCache
        >>> cache = WindowLayerKVCache([torch.zeros(1, 1, 3, 2)], [2], chunk=4)  # [B, K, C - 1, D]
        >>> [cache.update(torch.ones(1, 1, n, 2))[0].shape[2] for n in (3, 1, 2)]  # positions 0-2, 3, 4-5
        [3, 4, 2]
    """

    def __init__(self, buffers: list[torch.Tensor], seq_dims: list[int], chunk: int | None = None) -> None:
        super().__init__(buffers, seq_dims)
        self.chunk = chunk
        self._written = 0  # the length the buffers' contents belong to

    def _visible(self, length: int, capacity: int) -> int:
        """How many positions before ``length`` the query at position ``length`` sees (what the buffers hold)."""
        return length % self.chunk if self.chunk is not None else min(length, capacity)

    def update(self, *new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Append ``new`` and return the kept positions followed by it.

        Raises:
            RuntimeError: the cache was rewound to a length other than 0 since the last update.
        """
        start = self.length
        if start not in (0, self._written):
            what = "chunk" if self.chunk is not None else "window"
            raise RuntimeError(f"a {what} layer's KV cache was rewound from {self._written} to {start} positions: "
                               f"the positions that left its {what} are gone; reset() the cache and run the prompt "
                               f"again")
        end = start + new[0].shape[self.seq_dims[0]]
        out = []
        for buf, dim, t in zip(self.buffers, self.seq_dims, new):
            capacity = buf.shape[dim]
            held = self._visible(start, capacity)  # positions start - held .. start - 1
            full = torch.cat([buf.narrow(dim, 0, held), t], dim=dim) if held else t  # [.., held + T, ..]
            keep = self._visible(end, capacity)  # the next query's: never more than full holds
            buf.narrow(dim, 0, keep).copy_(full.narrow(dim, full.shape[dim] - keep, keep))
            out.append(full)
        self.length = self._written = end
        return tuple(out)

    def advance(self, n: int) -> None:
        """Count ``n`` more positions (a windowed or chunked layer keeps what it can see, not every position)."""
        self.length = self._written = self.length + n


class KVCache:
    """K/V (or latent) buffers for every layer; :attr:`length` is how many positions are filled.

    Args:
        cfg: the model config (decides what is stored: per-KV-head K/V, or the MLA latent).
        batch_size: sequences decoded together.
        max_len: the most positions the cache holds (defaults to ``cfg.n_ctx``).
        dtype, device: of the buffers; ``device`` may be a list with one device per layer (a model split over
            devices keeps each layer's cache with its block).

    Example:
        >>> from interp.examples import model, tokens
        >>> cache = model.make_cache(batch_size=2)
        >>> logits = model(tokens, kv_cache=cache)          # prefill
        >>> logits = model(logits[:, -1:].argmax(-1), kv_cache=cache)      # one step
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
        self.layers: list[LayerKVCache] = []
        devices = [device] * cfg.n_layers if isinstance(device, (str, torch.device)) else list(device)
        if len(devices) != cfg.n_layers:
            raise ValueError(f"device lists {len(devices)} devices for a model with {cfg.n_layers} layers")
        for layer in range(cfg.n_layers):
            shapes: list[tuple[int, ...]]
            if cfg.attention == "latent":
                width = 1 if cfg.layer(layer).n_heads else 0  # a layer without heads caches nothing
                shapes = [(batch_size, max_len, width * cfg.kv_latent_dim), (batch_size, max_len, width * cfg.rope_dim)]
                seq_dims = [1, 1]
            else:
                # A pruned model may keep a different number of K/V heads in each layer; a windowed layer keeps
                # only the window's last W - 1 positions, a chunked one its chunk's, at most C - 1.
                span = cfg.window(layer) or cfg.chunk(layer)
                length = max_len if span is None else min(max_len, span - 1)
                shapes = [(batch_size, cfg.layer(layer).n_kv_heads, length, cfg.d_head)] * 2
                seq_dims = [2, 2]
            bufs = [torch.zeros(s, dtype=dtype, device=devices[layer]) for s in shapes]
            if cfg.cache_bounded(layer):
                self.layers.append(WindowLayerKVCache(bufs, seq_dims, chunk=cfg.chunk(layer)))
            else:
                self.layers.append(LayerKVCache(bufs, seq_dims))

    @property
    def length(self) -> int:
        """Positions filled so far: every layer advances its own count as a forward pass writes it.

        Raises:
            RuntimeError: the layers disagree (a pass that raised midway, and :meth:`rewind` was not called).
        """
        lengths = {layer.length for layer in self.layers}
        if len(lengths) != 1:
            raise RuntimeError(f"KV cache layers hold different lengths {sorted(lengths)}: a forward pass stopped "
                               f"midway; call cache.rewind(n) or cache.reset()")
        return lengths.pop()

    def rewind(self, length: int) -> None:
        """Forget every position from ``length`` on, in every layer (the buffers are kept and overwritten).

        Raises:
            ValueError: ``length`` is negative or beyond ``max_len``.
        """
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.max_len:
            raise ValueError(f"length={length!r} must be an int in [0, max_len={self.max_len}]")
        for layer in self.layers:
            layer.length = min(layer.length, length)

    def reset(self) -> None:
        """Forget every stored position (buffers are kept and overwritten)."""
        self.rewind(0)

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the buffers."""
        return sum(b.numel() * b.element_size() for layer in self.layers for b in layer.buffers)

    @property
    def nbytes_per_token(self) -> int:
        """Bytes one position takes across all layers and the batch (windowed layers' fixed buffers spread over
        ``max_len``)."""
        return self.nbytes // self.max_len

    @property
    def nbytes_used(self) -> int:
        """Bytes holding the ``length`` positions filled so far."""
        return self.nbytes_per_token * self.length

    def __repr__(self) -> str:
        return (f"KVCache(kind={self.cfg.kind}, layers={self.cfg.n_layers}, batch={self.batch_size}, "
                f"length={self.length}/{self.max_len}, bytes={self.nbytes})")
