"""Hookable attention: MHA / GQA / MQA (``Attention``) and multi-head latent attention (``LatentAttention``).

Shape glossary (used in the comment at the end of every line that reshapes):

    B  batch                 T  query length            S  key length (cached + new)
    H  query heads           K  key/value heads         G  query heads per K/V head (H // K)
    D  head dim              R  decoupled rotary dim (MLA)
    C  K/V latent dim (MLA)  M  d_model

Two paths compute the same thing. The fast path calls ``torch.nn.functional.scaled_dot_product_attention``;
it runs whenever nothing needs the attention scores or pattern. The explicit path materialises
softmax(QK^T / sqrt(d) + mask) so that ``hook_attn_scores`` and ``hook_pattern`` can read or replace it, and
can process queries in chunks (``query_chunk``) so that a 16k-token pattern is never held at once.
Head gates and ``hook_z`` / ``hook_result`` act on z and work on both paths.

Learned sinks (``cfg.attn_sinks``, gpt-oss): head h has a logit ``sinks[h]`` that joins the softmax of every row
beside the real keys and writes nothing. The explicit path normalises each row over its keys and the sink:
``hook_pattern`` holds the real keys' probabilities (a row sums to ``1 - sink mass``, as transformers' eager
``output_attentions``) and ``hook_sink_mass`` ``[B, H, T]`` the sink's, so pattern row + sink mass = 1 (the
sink mass is for reading: z depends on the pattern only, so interventions go through ``hook_pattern``). The fused
path gives SDPA one more key, exactly: each query gets one more dimension holding ``sinks[h] / scale``, the
real keys a 0 there and the extra key a 1 (its score is the sink logit), and the extra key's value is zero.
That key is appended to a copy of K / V for the pass; the cache holds only the real keys.

ALiBi (``cfg.alibi_slopes``) adds ``slope_h * (k - q)`` to head h's scores on both paths (in SDPA as part of
its float mask). Keys always end at the last query's position (the cache returns its keys up to the newest), so
the distances come from the query and key counts alone, never from the pass's absolute positions: the traced
decode step keeps them.

Precision: in a bf16 / fp16 model the explicit path computes scores, mask, soft-cap and softmax in float32 (the
fused SDPA kernels keep them in float32 too), so ``hook_attn_scores`` and ``hook_pattern`` carry float32; only
the product with v uses the pattern rounded to the model's dtype. float32 and float64 models run it uncast.

A layer of a pruned model (:func:`interp.pruning.remove_heads`) may have its own head counts
(``cfg.layer_n_heads``) and, after a K/V group lost some but not all of its query heads, an index map from
query head to K/V head (``kv_index``); both paths then gather K/V per query head. With whole groups the
uniform grouped path is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .hooks import HookPoint
from .kv_cache import LayerKVCache
from .norms import HALF_DTYPES, RMSNorm
from .rotary import Rotary


@dataclass
class AttnMask:
    """Which keys each query may see, built once per forward pass and shared by all layers.

    Args:
        T: query length; S: key length (cached + new); start: absolute position of the first query.
        causal: apply the causal rule key_pos <= query_pos.
        key_keep: ``[B, S]`` bool, True for real tokens, False for padding; ``None`` when nothing is padded.
        padded_queries_see_all: self-attention only: a padding query ignores the padding mask (it still obeys
            the causal rule). Its output is meaningless either way; this keeps its pattern row a proper
            distribution (no NaN, nothing above the diagonal) instead of a row with no allowed key.
        window: sliding window W: the query at position p sees only keys p - W + 1 .. p (``None``: no window).
        key_start: absolute position of the first key (a windowed layer's cache holds only the last keys).
        chunk: chunked local attention C: the query at position p sees only keys from ``C * (p // C)`` on.

    :meth:`for_keys` derives a layer's mask (its window, the keys its cache returned) from the pass's mask.

    Masked scores get ``finfo(dtype).min`` rather than ``-inf`` (as Hugging Face does), so no row turns into NaN.
    """

    T: int
    S: int
    start: int
    causal: bool
    key_keep: torch.Tensor | None = None
    padded_queries_see_all: bool = False
    window: int | None = None
    key_start: int = 0
    chunk: int | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def for_keys(self, window: int | None, n_keys: int, chunk: int | None = None) -> AttnMask:
        """This pass's mask for a layer with sliding ``window`` (or attention ``chunk``) that attends to the last
        ``n_keys`` keys.

        Derived masks are kept (one per window, chunk and key count), so layers that share them build them once.
        """
        key_start = self.S - n_keys
        if window is not None and self.start + self.T <= window:
            window = None  # no query is far enough from position 0 for the window to exclude a key
        if chunk is not None and self.start + self.T <= chunk:
            chunk = None  # every query is in the first chunk
        if window is None and chunk is None and key_start == 0:
            return self
        key = ("for_keys", window, key_start, chunk)
        if key not in self._cache:
            self._cache[key] = AttnMask(T=self.T, S=self.S, start=self.start, causal=self.causal,
                                        key_keep=self.key_keep, padded_queries_see_all=self.padded_queries_see_all,
                                        window=window, key_start=key_start, chunk=chunk)
        return self._cache[key]

    def repeated(self, k: int) -> AttnMask:
        """This mask for ``k`` copies of the batch stacked along it (rows ``j B .. (j + 1) B`` are copy ``j``).

        Example:
            >>> import torch
            >>> from interp import AttnMask
            >>> m = AttnMask(T=2, S=2, start=0, causal=True, key_keep=torch.tensor([[True, False]]))
            >>> m.repeated(3).key_keep.shape
            torch.Size([3, 2])
        """
        if self.key_keep is None or k == 1:
            return self  # nothing in it depends on the batch
        return AttnMask(T=self.T, S=self.S, start=self.start, causal=self.causal,
                        key_keep=self.key_keep.repeat(k, 1),  # [k B, S]
                        padded_queries_see_all=self.padded_queries_see_all, window=self.window,
                        key_start=self.key_start, chunk=self.chunk)

    def chunk_triangle(self, q_slice: slice, n_keys: int, dtype: torch.dtype, device: torch.device
                       ) -> torch.Tensor | None:
        """The additive mask of a causal query chunk cut after its last query's key, as its last block: ``[c, c]``
        (0 on and below the diagonal, finfo.min above) for the last ``c`` keys, every earlier key being seen by
        every query of the chunk. None where that does not describe the mask (padding, a window, keys not cut
        at the chunk's last query, Llama 4's attention chunks). One block per chunk size and dtype serves every chunk and layer of the pass,
        where a ``[c, S]`` mask per chunk would be built and read again for every layer."""
        if (not self.causal or self.window is not None or self.chunk is not None or self.key_keep is not None
                or q_slice.stop is None):
            return None
        c = q_slice.stop - (q_slice.start or 0)
        if n_keys != self.start + q_slice.stop - self.key_start or n_keys < c:
            return None
        key = ("triangle", c, dtype, device)
        if key not in self._cache:
            upper = torch.ones(c, c, dtype=torch.bool, device=device).triu_(1)  # [c, c]: key after query
            self._cache[key] = torch.zeros(c, c, dtype=dtype, device=device).masked_fill_(upper, torch.finfo(dtype).min)
        return self._cache[key]

    def query_positions(self, T: int, device: torch.device) -> torch.Tensor:
        """``[T]`` float32: the absolute positions of this pass's ``T`` queries (not moved by padding).

        Example:
            >>> from interp import AttnMask
            >>> AttnMask(T=2, S=5, start=3, causal=True).query_positions(2, "cpu")
            tensor([3., 4.])
        """
        return torch.arange(self.start, self.start + T, device=device, dtype=torch.float32)

    @property
    def sdpa_is_causal(self) -> bool:
        """True when SDPA's built-in causal kernel is exactly this mask (no padding, no cache offset, no window)."""
        return (self.causal and self.key_keep is None and self.start == 0 and self.T == self.S and self.T > 1
                and self.window is None and self.chunk is None and self.key_start == 0)

    @property
    def trivial(self) -> bool:
        """True when every query may see every key."""
        if self.window is not None and self.S - self.key_start > self.window:
            return False
        if self.chunk is not None and self.key_start // self.chunk != (self.S - 1) // self.chunk:
            return False  # the last query's chunk starts after the first key
        return self.key_keep is None and (not self.causal or (self.T == 1 and self.start + 1 == self.S))

    def additive(self, dtype: torch.dtype, device: torch.device, q_slice: slice = slice(None)) -> torch.Tensor | None:
        """Additive mask ``[B or 1, 1, T', S]`` (0 where allowed, finfo.min where masked), or None."""
        if self.trivial:
            return None
        key = (dtype, device, q_slice.start, q_slice.stop)
        if key in self._cache:
            return self._cache[key]
        q_pos = torch.arange(self.start, self.start + self.T, device=device)[q_slice]  # [T']
        k_pos = torch.arange(self.key_start, self.S, device=device)  # [S'] the keys this layer attends to
        allowed = None
        if self.causal:
            allowed = k_pos[None, :] <= q_pos[:, None]  # [T', S']
            if self.window is not None:
                allowed &= k_pos[None, :] > q_pos[:, None] - self.window  # [T', S']
            if self.chunk is not None:
                allowed &= k_pos[None, :] // self.chunk == q_pos[:, None] // self.chunk  # [T', S']
            allowed = allowed[None, None]  # [1, 1, T', S']
        if self.key_keep is not None:
            key_keep = self.key_keep.to(device=device, dtype=torch.bool)
            keep = key_keep[:, None, None, self.key_start:]  # [B, 1, 1, S']
            if self.padded_queries_see_all:
                q_keep = key_keep[:, self.start:self.start + self.T][:, q_slice]  # [B, T']
                keep = keep | ~q_keep[:, None, :, None]  # [B, 1, T', S]
            allowed = keep if allowed is None else allowed & keep
            allowed = allowed.expand(-1, -1, len(q_pos), -1)  # [B, 1, T', S]
        if allowed is None:  # neither causal nor padded: trivial, so not reached
            return None
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
        if len(q_pos) == self.T:
            # Cache only whole-query masks (shared by all layers). Caching every query chunk's mask would keep
            # [T, S] alive for the whole pass and make query chunking's memory quadratic again.
            self._cache[key] = mask
        return mask


class _AttentionBase(nn.Module):
    """What every attention variant shares: hooks, head gates, the two attention paths and W_O."""

    def __init__(self, cfg: ModelConfig, *, cross: bool, layer: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.cross = cross
        self.causal = cfg.causal and not cross
        # Per-layer head count of a pruned model; cross-attention is never pruned and keeps cfg.n_heads.
        self.shape = cfg.layer(layer) if layer is not None and not cross else None
        self.n_heads = cfg.n_heads if self.shape is None else self.shape.n_heads
        # The width of what a head writes through W_O: MLA's value width may differ from its key width.
        self.d_head = cfg.v_head_dim if cfg.attention == "latent" else cfg.d_head
        self.W_O = nn.Linear(self.n_heads * self.d_head, cfg.d_model, bias=cfg.out_bias)
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()
        self.hook_result = HookPoint()
        # A multiplier per query head on z (before W_O): the handle pruning uses. None = all ones, no cost.
        self.gate: torch.Tensor | None = None
        # Explicit path only: process this many queries at a time (None = all at once).
        self.query_chunk: int | None = None
        # Sliding window of this layer (None: global); cross-attention never slides.
        self.window = None if cross or layer is None else cfg.window(layer)
        # Chunked local attention of this layer (Llama 4; None: not chunked).
        self.chunk = None if cross or layer is None else cfg.chunk(layer)
        self.softcap = cfg.attn_softcap
        # Learned sinks: one logit per query head (cfg.attn_sinks); None without them.
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if cfg.attn_sinks and not cross else None
        if self.sinks is not None:
            self.hook_sink_mass = HookPoint()
        # ALiBi slopes of this layer's heads: a plain tuple, not a buffer, so model.to(bf16) cannot round them.
        slopes = None if cross or layer is None else cfg.layer_alibi_slopes(layer)
        self.alibi_slopes: tuple[float, ...] | None = None if slopes is None else tuple(slopes)

    # --- per-head views of the output projection -----------------------------------------------------
    @property
    def W_O_heads(self) -> torch.Tensor:
        """``W_O`` split by head: ``[H, D, M]`` (head h writes ``z_h @ W_O_heads[h]``)."""
        H, D = self.n_heads, self.d_head
        return self.W_O.weight.T.reshape(H, D, -1)  # [H*D, M] -> [H, D, M]

    def set_gate(self, gate: torch.Tensor | None) -> None:
        """Set the per-head gate (``[H]``), or ``None`` to remove it."""
        if gate is not None:
            if not isinstance(gate, torch.Tensor):
                raise TypeError(f"gate must be a Tensor of shape [{self.n_heads}], got {type(gate).__name__}")
            if gate.shape != (self.n_heads,):
                raise ValueError(f"gate has shape {tuple(gate.shape)}, expected ({self.n_heads},)")
            if not gate.dtype.is_floating_point:
                raise TypeError(f"gate must be a floating-point tensor, got dtype {gate.dtype}")
            if not bool(torch.isfinite(gate).all()):
                raise ValueError(f"gate has non-finite values {gate.tolist()}; gates must be finite numbers")
        self.gate = gate

    # --- attention ------------------------------------------------------------------------------------
    def _needs_explicit(self) -> bool:
        # SDPA has no soft-capping: a soft-capped model always computes its scores explicitly.
        return (not self.cfg.use_sdpa or self.softcap is not None or self.hook_pattern.active
                or self.hook_attn_scores.active or (self.sinks is not None and self.hook_sink_mass.active))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask,
                scale: float | None = None) -> torch.Tensor:
        """q ``[B, H, T, Dq]``, k ``[B, K, S, Dq]``, v ``[B, K, S, Dv]`` -> z ``[B, H, T, Dv]``.

        ``mask`` is the pass's mask; the layer's window and the keys it was given (a windowed cache returns only
        the last ones) narrow it here. ``scale`` defaults to ``cfg.attn_scale``, else ``1 / sqrt(Dq)``.
        """
        if self.window is not None or self.chunk is not None:  # a global layer's mask is the pass's own
            mask = mask.for_keys(self.window, k.shape[2], self.chunk)
        if scale is None:
            scale = self.cfg.attn_scale or 1.0 / math.sqrt(q.shape[-1])
        kv_index = getattr(self, "kv_index", None)
        if kv_index is not None:
            # Unequal K/V groups (a partially pruned group): give every query head its own K/V copy.
            k = k.index_select(1, kv_index)  # [B, H, S, Dq]
            v = v.index_select(1, kv_index)  # [B, H, S, Dv]
        if not self._needs_explicit():
            n_kv = k.shape[1]
            causal = mask.sdpa_is_causal and self.alibi_slopes is None and self.sinks is None
            attn_mask = None if causal else self._sdpa_mask(mask, q, k.shape[2])  # [B or 1, 1 or H, T, S]
            if self.sinks is not None:
                return self._attend_sdpa_sink(q, k, v, attn_mask, scale)
            return F.scaled_dot_product_attention(
                q, k, v,
                attn_mask=attn_mask,
                is_causal=causal,
                scale=scale,
                enable_gqa=n_kv != q.shape[1],
            )
        T = q.shape[2]
        chunk = self.query_chunk or T
        if chunk >= T:
            return self._attend_explicit(q, k, v, mask, slice(0, T), scale)
        zs = [self._attend_explicit(q[:, :, i:i + chunk], k, v, mask, slice(i, min(i + chunk, T)), scale)
              for i in range(0, T, chunk)]
        return torch.cat(zs, dim=2)  # [B, H, T, Dv]

    def _attend_sdpa_sink(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add: torch.Tensor | None,
                          scale: float) -> torch.Tensor:
        """The fused kernel with each head's sink as one more key (see the module docstring): exact, since the
        extra dimension adds 0 to every real score and ``scale * sinks[h] / scale`` to the sink's."""
        B, H, T = q.shape[:3]
        K, S = k.shape[1], k.shape[2]
        assert self.sinks is not None  # only called for a layer with sinks
        D = self.d_head  # q, k and v's head size (sinks are refused with latent attention); an int, for tracing
        # q, k and v all padded with zeros to one head size P, a multiple of 8: the fused kernels need equal
        # sizes (else SDPA falls back to its unfused math path: on CPU ~1.4x this layer's attention time) and
        # CUDA's memory-efficient kernel an aligned one. Zeros change no score, and the output is cut to D.
        P = -(-(D + 1) // 8) * 8
        sink = (self.sinks.to(q.dtype) / scale).view(1, H, 1, 1).expand(B, H, T, 1)  # [B, H, T, 1]
        q = F.pad(torch.cat([q, sink], dim=-1), (0, P - D - 1))  # [B, H, T, P]: the sink logit at dim D
        corner = F.pad(k.new_ones(B, K, 1, 1), (D, P - D - 1, S, 0))  # [B, K, S+1, P]: 1 at the sink key's dim D
        k = F.pad(k, (0, P - D, 0, 1)) + corner  # [B, K, S+1, P]
        v = F.pad(v, (0, P - D, 0, 1))  # [B, K, S+1, P]: the sink writes nothing
        # ``add`` is the explicit mask (the causal kernel would misplace the sink column), ALiBi included.
        if add is not None:
            add = F.pad(add, (0, 1))  # [B or 1, 1, T, S+1]: every query sees its sink
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=scale, enable_gqa=K != H)  # [B, H, T, P]
        return z[..., :D]  # [B, H, T, D]

    def _sdpa_mask(self, mask: AttnMask, q: torch.Tensor, S: int) -> torch.Tensor | None:
        """The fused path's additive mask ``[B or 1, 1 or H, T, S]``: the pass's mask plus ALiBi's bias, or None."""
        add = mask.additive(q.dtype, q.device)
        if self.alibi_slopes is None:
            return add
        bias = self._alibi(slice(0, mask.T), mask.T, S, q.device).to(q.dtype)  # [1, H, T, S]
        return bias if add is None else bias + add

    def _alibi(self, q_slice: slice, T: int, S: int, device: torch.device) -> torch.Tensor:
        """ALiBi bias ``[1, H, T', S]`` in float32, ``slope_h * (k - q)``, for the queries ``q_slice`` of ``T``.

        The keys end at the last query, so query i sits ``T - 1 - i`` places before the last of the ``S`` keys.
        """
        slopes = torch.tensor(self.alibi_slopes, dtype=torch.float32, device=device)  # [H]
        k_off = torch.arange(S, device=device, dtype=torch.float32) - (S - 1)  # [S] offset from the last key
        q_off = torch.arange(q_slice.start, q_slice.stop, device=device, dtype=torch.float32) - (T - 1)  # [T']
        distance = k_off[None, :] - q_off[:, None]  # [T', S]
        return (slopes[:, None, None] * distance)[None]  # [H, T', S] -> [1, H, T', S]

    def _attend_explicit(self, q, k, v, mask: AttnMask, q_slice: slice, scale: float) -> torch.Tensor:
        B, H, T, Dq = q.shape
        K = k.shape[1]
        G = H // K
        S = k.shape[2]
        # Causal query chunk: its last query sees no key past its own position, so the keys after it are dropped
        # before QK^T (flash-attention style: a chunk of rows [c, n] instead of [c, S], half the work of a whole
        # causal pattern). Hooks still see [B, H, c, S] (the dropped scores are the mask's finfo.min and their
        # pattern weights exact zeros, as the unchunked softmax gives them), unless they all take cut rows.
        n_keys = min(S, mask.start + q_slice.stop - mask.key_start) if mask.causal and q_slice.stop is not None else S
        v_all = v
        if n_keys < S:
            k, v = k[:, :, :n_keys], v[:, :, :n_keys]  # [B, K, n, D]
        # Half precision (bf16 / fp16): scores, mask, soft-cap and softmax in float32, as the fused kernels keep
        # them (flash and memory-efficient SDPA accumulate q.k in float32 and never round the scores). Rounding
        # a score of 10 to bf16 moves it by up to 0.03, its softmax weight by 3 %. Only the pattern is rounded
        # to the model's dtype, for the product with v (as HF eager and flash do). float32 and float64 models
        # take the same lines with no cast at all.
        half = q.dtype in HALF_DTYPES
        if half:
            q, k = q.float(), k.float()
        # Group query heads under their K/V head instead of repeating K/V: no copy of the cache.
        # A power-of-two scale (1 / sqrt(64), say) goes on the queries, [c, Dq], which saves a pass over the chunk's
        # rows and rounds exactly as scaling the scores; any other scale multiplies the scores, as the naive formula
        # and HF eager do (on the queries it would round differently).
        on_queries = math.frexp(scale)[0] == 0.5
        qg = (q * scale if on_queries else q).reshape(B, K, G * T, Dq)  # [B, K, G*T, Dq]
        scores = qg @ k.transpose(-1, -2)  # [B, K, G*T, S]
        if not on_queries:
            scores = scores.mul_(scale)
        scores = scores.view(B, H, T, -1)  # [B, H, T, S]
        if self.softcap is not None:
            scores = torch.tanh(scores.div_(self.softcap)) * self.softcap  # before the mask, as Gemma 2
        if self.alibi_slopes is not None:
            # the bias of all S keys, cut to the keys this chunk computes (k may be truncated to n_keys)
            scores = scores.add_(self._alibi(q_slice, mask.T, S, scores.device)[..., :n_keys])
        triangle = mask.chunk_triangle(q_slice, n_keys, scores.dtype, scores.device)
        if triangle is not None:  # a causal chunk: only its last [c, c] block holds masked keys
            scores[..., n_keys - triangle.shape[0]:].add_(triangle)  # in place, on this pass's own buffer
        elif (add := mask.additive(scores.dtype, scores.device, q_slice)) is not None:
            scores = scores.add_(add[..., :n_keys])  # in place: this pass's own buffer (add's backward needs neither)
        # A hook's own padded tensor (edited in place or not) is read up to the chunk's keys; a new tensor a hook
        # returns may unmask any key, so it is used whole, with all of v. Hooks that all read cut rows
        # (QueryChunkHook(cut_rows=True): the streamed reducers) get the chunk's [B, H, c, n] as computed: no
        # padded [B, H, c, S] copy per chunk and layer, and a replacement they return covers the same keys.
        if self.hook_attn_scores.active:
            if n_keys < S and self.hook_attn_scores.takes_cut_rows:
                scores = self.hook_attn_scores(scores, q_slice.start)  # [B, H, c, n]
            else:
                padded = _pad_keys(scores, S, torch.finfo(scores.dtype).min)  # [B, H, c, S]
                returned = self.hook_attn_scores(padded, q_slice.start)
                scores, v = (returned[..., :n_keys], v) if returned is padded else (returned, v_all)
        if self.sinks is None:
            pattern = torch.softmax(scores, dim=-1)  # [B, H, c, n or S]
        else:
            pattern, sink_mass = _softmax_with_sink(scores, self.sinks.to(scores.dtype).view(1, H, 1, 1))
            # Read-only: the sink's value is zero, so z is the pattern's alone (edit hook_pattern to intervene).
            self.hook_sink_mass(sink_mass, q_slice.start)  # [B, H, c]
        if self.hook_pattern.active:
            if pattern.shape[-1] == v.shape[2] < S and self.hook_pattern.takes_cut_rows:
                pattern = self.hook_pattern(pattern, q_slice.start)  # [B, H, c, n]: the rows as computed
            else:
                padded = _pad_keys(pattern, S, 0.0)  # [B, H, c, S]
                returned = self.hook_pattern(padded, q_slice.start)
                pattern, v = (returned[..., :v.shape[2]], v) if returned is padded else (returned, v_all)
        if half:
            pattern = pattern.to(v.dtype)
        z = pattern.reshape(B, K, G * T, -1) @ v  # [B, K, G*T, Dv]
        return z.view(B, H, T, -1)  # [B, H, T, Dv]

    def _no_heads(self, x: torch.Tensor, cache: LayerKVCache | None) -> torch.Tensor:
        """A layer whose every head was removed writes only W_O's bias (zeros without one); its cache stores
        nothing but counts the positions, as every other layer's does."""
        if cache is not None:
            cache.advance(x.shape[1])
        out = x.new_zeros(*x.shape[:-1], self.cfg.d_model)  # [B, T, M]
        return out if self.W_O.bias is None else out + self.W_O.bias

    def _project_out(self, z: torch.Tensor) -> torch.Tensor:
        """z ``[B, H, T, D]`` -> hooks, gate, W_O -> ``[B, T, M]``."""
        B, H, T, D = z.shape
        z = z.transpose(1, 2)  # [B, T, H, D]
        z = self.hook_z(z)
        if self.gate is not None:
            z = z * self.gate.to(z.dtype).view(1, 1, H, 1)  # [B, T, H, D]
        if self.hook_result.active:
            # Each head's residual write z_h W_O[h]; summing them (plus bias) is the attention output.
            result = torch.einsum("bthd,hdm->bthm", z, self.W_O_heads)  # [B, T, H, M]
            result = self.hook_result(result)
            out = result.sum(dim=2)  # [B, T, M]
            return out if self.W_O.bias is None else out + self.W_O.bias
        return self.W_O(z.reshape(B, T, H * D))  # [B, T, H*D] -> [B, T, M]


class Attention(_AttentionBase):
    """Multi-head attention with ``n_kv_heads`` K/V heads: MHA (K = H), GQA (1 < K < H) or MQA (K = 1).

    Q, K and V come from one fused projection ``W_qkv`` (``[M] -> [(H + 2K) * D]``); for cross-attention the
    query rows are applied to ``x`` and the K/V rows to ``context``.

    Args:
        cfg: the model config.
        cross: keys and values come from a second sequence (no causal mask, no rotary, no cache).

    Example:
        >>> import torch
        >>> from interp import Attention, AttnMask, ModelConfig
        >>> cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=10, n_ctx=8)
        >>> attn = Attention(cfg)
        >>> attn(torch.randn(2, 5, 32), mask=AttnMask(T=5, S=5, start=0, causal=True)).shape
        torch.Size([2, 5, 32])
    """

    kv_index: torch.Tensor | None  # [H] the K/V head of each query head (unequal groups only), a buffer

    def __init__(self, cfg: ModelConfig, *, cross: bool = False, layer: int | None = None) -> None:
        super().__init__(cfg, cross=cross, layer=layer)
        H, D, M = self.n_heads, cfg.d_head, cfg.d_model
        K = cfg.n_kv_heads if self.shape is None else self.shape.n_kv_heads
        self.n_kv_heads = K
        self.W_qkv = nn.Linear(M, (H + 2 * K) * D, bias=cfg.attn_bias)
        shape = self.shape
        # Query head -> K/V head, only for unequal groups (None keeps the grouped, copy-free path).
        self.register_buffer("kv_index", None if shape is None or shape.uniform_groups
                             else torch.tensor(shape.kv_map, dtype=torch.long), persistent=False)
        self.rotary = None
        nope = layer is not None and layer in (cfg.nope_layers or ())  # a NoPE layer rotates nothing
        if cfg.positional == "rotary" and not cross and not nope:
            local_base = cfg.local_rotary_base if self.window is not None else None
            f32 = cfg.precision.rotary_float32
            self.rotary = (Rotary(cfg.rotary_dim, local_base, float32=f32) if local_base is not None
                           else Rotary(cfg.rotary_dim, cfg.rotary_base, cfg.rope_scaling, float32=f32))
        # QK-norm: RMSNorm of each head's query and key ("head") or of all heads' concatenation ("full"); the
        # rotated heads' norm ("head_after_rotary") only where the layer rotates (Llama 4's NoPE layers have none).
        self.qk_norm = "none" if cross or (cfg.qk_norm == "head_after_rotary" and self.rotary is None) else cfg.qk_norm
        # Llama 4's temperature tuning of the NoPE layers' queries: [scale, floor] (cfg.nope_temperature).
        self.temperature = cfg.nope_temperature if nope and not cross else None
        if self.qk_norm != "none":
            per_head = self.qk_norm in ("head", "head_after_rotary")
            f32 = cfg.precision.norm_weight_float32
            self.q_norm = RMSNorm(D if per_head else H * D, eps=cfg.norm_eps, weight_float32=f32)
            self.k_norm = RMSNorm(D if per_head else K * D, eps=cfg.norm_eps, weight_float32=f32)
            self.hook_q_normed = HookPoint()
            self.hook_k_normed = HookPoint()

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: AttnMask,
        context: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: LayerKVCache | None = None,
    ) -> torch.Tensor:
        """Args:
            x: ``[B, T, M]`` queries' residual stream.
            mask: the shared :class:`AttnMask`.
            context: ``[B, S, M]`` keys' residual stream for cross-attention.
            positions: ``[B, T]`` or ``[T]`` absolute positions (rotary only).
            cache: this layer's K/V cache; new K/V are appended at its own position (``mask.start``).

        Returns:
            ``[B, T, M]``.
        """
        B, T, _ = x.shape
        H, K, D = self.n_heads, self.n_kv_heads, self.d_head
        if H == 0:
            return self._no_heads(x, None if context is not None else cache)
        if context is None:
            q, k, v = self.W_qkv(x).split([H * D, K * D, K * D], dim=-1)
            S_new = T
        else:
            w, b = self.W_qkv.weight, self.W_qkv.bias
            q = F.linear(x, w[: H * D], None if b is None else b[: H * D])
            k, v = F.linear(context, w[H * D:], None if b is None else b[H * D:]).split([K * D, K * D], dim=-1)
            S_new = context.shape[1]
        q = self.hook_q(q.view(B, T, H, D))  # [B, T, H, D]
        k = self.hook_k(k.view(B, S_new, K, D))  # [B, S, K, D]
        v = self.hook_v(v.view(B, S_new, K, D))  # [B, S, K, D]
        if self.qk_norm == "head":
            q, k = self.hook_q_normed(self.q_norm(q)), self.hook_k_normed(self.k_norm(k))
        elif self.qk_norm == "full":
            q = self.hook_q_normed(self.q_norm(q.reshape(B, T, H * D)).view(B, T, H, D))  # [B, T, H, D]
            k = self.hook_k_normed(self.k_norm(k.reshape(B, S_new, K * D)).view(B, S_new, K, D))  # [B, S, K, D]
        if self.rotary is not None:
            q = self.rotary(q, positions)
            k = self.rotary(k, positions)
        if self.qk_norm == "head_after_rotary":  # Hunyuan normalises the rotated heads
            q, k = self.hook_q_normed(self.q_norm(q)), self.hook_k_normed(self.k_norm(k))
        if self.temperature is not None:
            scale, floor = self.temperature
            pos = mask.query_positions(T, q.device)  # [T] absolute
            factor = torch.log1p(torch.floor((pos + 1.0) / floor)) * scale + 1.0  # [T]
            q = (q * factor[:, None, None]).to(q.dtype)  # [B, T, H, D] * [T, 1, 1]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H|K, T|S, D]
        if cache is not None and context is None:
            k, v = cache.update(k, v)  # [B, K, S, D] up to start + T
        return self._project_out(self._attend(q, k, v, mask))


class LatentAttention(_AttentionBase):
    """Multi-head latent attention, as DeepSeek-V2/V3 define it: K and V are up-projected from a low-rank latent.

    Shapes: H heads, no-position query/key width D (``cfg.d_head``, DeepSeek's ``qk_nope_head_dim``), rotary
    width R (``cfg.rope_dim``, ``qk_rope_head_dim``), value width Dv (``cfg.v_head_dim``), latent C
    (``cfg.kv_latent_dim``, ``kv_lora_rank``), query latent Cq (``cfg.q_latent_dim``, ``q_lora_rank``, or direct
    query projection when None). Weights (HF names in brackets): ``W_dq`` [q_a_proj], ``q_norm``
    [q_a_layernorm], ``W_uq`` [q_b_proj] or ``W_q`` [q_proj] ``[H (D + R), .]``; ``W_dkv`` [kv_a_proj_with_mqa]
    ``[C + R, M]``; ``kv_norm`` [kv_a_layernorm]; ``W_ukv`` [kv_b_proj] ``[H (D + Dv), C]``, head h's rows are
    its key part ``W_UK[h]`` ``[D, C]`` then its value part ``W_UV[h]`` ``[Dv, C]``; ``W_O`` [o_proj].

    The cache stores only the normalised latent ``c_kv`` ``[B, S, C]`` and the shared rotated key ``[B, S, R]``.
    Scores use [no-position part | rotary part] and ``cfg.attn_scale`` (default ``1 / sqrt(D + R)``).
    RoPE rotates in the half-split layout; a checkpoint with interleaved rotary pairs (DeepSeek's
    ``rope_interleave``) is converted by permuting the rotary rows of ``W_uq`` / ``W_dkv``, which leaves every
    score unchanged.

    Two paths give the same numbers:

    * expanded (prefill, and any pass without a cache): ``k = [c_kv W_UK^T | k_rope]`` and ``v = c_kv W_UV^T``
      per head, then attention;
    * absorbed (``decode_path = "absorbed"``, the default, for single-token steps with a cache): ``W_UK`` is
      folded into the query (``q_lat = q_nope W_UK`` ``[B, H, 1, C]``) and ``W_UV`` into the output
      (``z = (p c_kv) W_UV^T``), so a step attends over the cached latent directly (one shared K/V head of
      width C + R, like MQA) and never expands K or V for the cached positions.

    Hooks: ``hook_q_latent`` ``[B, T, Cq]``, ``hook_kv_latent`` ``[B, S_new, C]``, ``hook_q`` ``[B, T, H, D+R]``
    (after RoPE), and on both paths ``hook_attn_scores`` / ``hook_pattern`` / ``hook_z`` ``[B, T, H, Dv]`` /
    ``hook_result``. ``hook_k`` ``[B, S, H, D+R]`` and ``hook_v`` ``[B, S, H, Dv]`` exist on the expanded path
    only: attaching either makes a step take the expanded path (with a cache they see every cached position,
    recomputed from the latent).
    """

    def __init__(self, cfg: ModelConfig, *, cross: bool = False, layer: int | None = None) -> None:
        super().__init__(cfg, cross=cross, layer=layer)
        H, D, M, C, R = self.n_heads, cfg.d_head, cfg.d_model, cfg.kv_latent_dim, cfg.rope_dim
        Dv = self.d_head
        self.n_kv_heads = H
        self.d_nope = D
        self.rope_dim = R if not cross else 0
        self.kv_latent_dim = C
        if cfg.q_latent_dim is not None:
            self.W_dq = nn.Linear(M, cfg.q_latent_dim, bias=False)
            self.q_norm = RMSNorm(cfg.q_latent_dim, eps=cfg.norm_eps,
                                  weight_float32=cfg.precision.norm_weight_float32)
            self.W_uq = nn.Linear(cfg.q_latent_dim, H * (D + self.rope_dim), bias=False)
        else:
            self.W_q = nn.Linear(M, H * (D + self.rope_dim), bias=cfg.attn_bias)
        self.W_dkv = nn.Linear(M, C + self.rope_dim, bias=False)  # fused: latent and shared rotary key
        self.kv_norm = RMSNorm(C, eps=cfg.norm_eps, weight_float32=cfg.precision.norm_weight_float32)
        self.W_ukv = nn.Linear(C, H * (D + Dv), bias=False)  # fused: no-position keys and values
        self.rotary = (Rotary(self.rope_dim, cfg.rotary_base, cfg.rope_scaling,
                              float32=cfg.precision.rotary_float32)
                       if self.rope_dim else None)
        self.hook_q_latent = HookPoint()
        self.hook_kv_latent = HookPoint()
        self.decode_path = "absorbed"

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: AttnMask,
        context: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: LayerKVCache | None = None,
    ) -> torch.Tensor:
        """Same arguments as :meth:`Attention.forward`."""
        B, T, _ = x.shape
        H, D, R, C, Dv = self.n_heads, self.d_nope, self.rope_dim, self.kv_latent_dim, self.d_head
        if H == 0:
            return self._no_heads(x, None if context is not None else cache)  # no head reads K/V: nothing cached
        if self.decode_path not in ("absorbed", "expanded"):
            raise ValueError(f"decode_path={self.decode_path!r} must be 'absorbed' or 'expanded'")
        if hasattr(self, "W_dq"):
            c_q = self.hook_q_latent(self.W_dq(x))  # [B, T, Cq]
            q = self.W_uq(self.q_norm(c_q))
        else:
            q = self.W_q(x)
        q = q.view(B, T, H, D + R)  # [B, T, H, D+R]
        kv_in = x if context is None else context
        c_kv, k_rope = self.W_dkv(kv_in).split([C, R], dim=-1)  # [B, S_new, C], [B, S_new, R]
        c_kv = self.hook_kv_latent(self.kv_norm(c_kv))
        if self.rotary is not None:
            q_nope, q_rope = q.split([D, R], dim=-1)
            q = torch.cat([q_nope, self.rotary(q_rope, positions)], dim=-1)  # [B, T, H, D+R]
            k_rope = self.rotary(k_rope.unsqueeze(2), positions).squeeze(2)  # [B, S_new, R]
        if cache is not None and context is None:
            c_kv, k_rope = cache.update(c_kv, k_rope)  # [B, S, C], [B, S, R]
        q = self.hook_q(q)
        # mask.T (a plain int, unlike x.shape under torch.fx) is the query count: the traced decode step keeps
        # the absorbed path.
        absorbed = (self.decode_path == "absorbed" and cache is not None and context is None and mask.T == 1
                    and not (self.hook_k.active or self.hook_v.active))
        if absorbed:
            return self._project_out(self._attend_absorbed(q, c_kv, k_rope, mask))
        S = c_kv.shape[1]
        k_nope, v = self.W_ukv(c_kv).view(B, S, H, D + Dv).split([D, Dv], dim=-1)  # [B, S, H, D], [B, S, H, Dv]
        k = torch.cat([k_nope, k_rope.unsqueeze(2).expand(B, S, H, R)], dim=-1)  # [B, S, H, D+R]
        k, v = self.hook_k(k), self.hook_v(v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T|S, D(+R)|Dv]
        return self._project_out(self._attend(q, k, v, mask))

    def _attend_absorbed(self, q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
                         mask: AttnMask) -> torch.Tensor:
        """q ``[B, T, H, D+R]``, c_kv ``[B, S, C]``, k_rope ``[B, S, R]`` -> z ``[B, H, T, Dv]``, K/V unexpanded.

        ``q_nope . (W_UK c) = (q_nope W_UK) . c``: the score of a head is its absorbed query against the shared
        latent, and ``sum_s p_s W_UV c_s = W_UV (sum_s p_s c_s)`` gives its value read-out.
        """
        H, D, R, C, Dv = self.n_heads, self.d_nope, self.rope_dim, self.kv_latent_dim, self.d_head
        up = self.W_ukv.weight.view(H, D + Dv, C)  # [H, D+Dv, C]
        w_uk, w_uv = up[:, :D], up[:, D:]  # [H, D, C], [H, Dv, C]
        q_nope, q_rope = q.split([D, R], dim=-1)  # [B, T, H, D], [B, T, H, R]
        q_lat = torch.einsum("bthd,hdc->bhtc", q_nope, w_uk)  # [B, H, T, C]
        q_cat = torch.cat([q_lat, q_rope.transpose(1, 2)], dim=-1)  # [B, H, T, C+R]
        k_cat = torch.cat([c_kv, k_rope], dim=-1).unsqueeze(1)  # [B, 1, S, C+R]: one shared key head
        # The scale is the expanded path's: the dot products are the same, only their width changed.
        scale = self.cfg.attn_scale or 1.0 / math.sqrt(D + R)
        z_lat = self._attend(q_cat, k_cat, c_kv.unsqueeze(1), mask, scale)  # [B, H, T, C]
        return torch.einsum("bhtc,hvc->bhtv", z_lat, w_uv)  # [B, H, T, Dv]


def _softmax_with_sink(scores: torch.Tensor, sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax of each row of ``scores`` ``[B, H, c, n]`` over its keys and one more logit ``sink``
    ``[1, H, 1, 1]`` that is not a key: the keys' part ``[B, H, c, n]`` and the sink's part ``[B, H, c]``.

    One fused ``torch.softmax`` of the keys, rescaled; no second softmax and no widened copy. The keys' own
    normaliser is ``Z = sum_j exp(s_j - max_j s_j) = 1 / max_j softmax(s)_j`` (the max key's weight is
    ``exp(0) / Z``), so the sink takes ``sigmoid(d)`` of the row and each key ``softmax(s) * sigmoid(-d)``, with
    ``d = sink - logsumexp(s) = sink - max s + log max softmax(s)``, stable for any sink. Why not the
    textbook ``exp(s - top) / total``: on CPU ``torch.exp`` of masked scores (``finfo.min`` minus the top) takes
    a slow path, about 8x a plain softmax of the same row (``experiments/benchmarks/bench_gpt_oss.py``).

    Example:
        >>> s = torch.tensor([[[[1.0, 2.0, torch.finfo(torch.float32).min]]]])  # [1, 1, 1, 3]
        >>> p, m = _softmax_with_sink(s, torch.tensor(0.5).view(1, 1, 1, 1))
        >>> ref = torch.softmax(torch.tensor([1.0, 2.0, 0.5]), -1)  # keys 1, 2 (the masked one 0) and the sink
        >>> torch.allclose(p[0, 0, 0, :2], ref[:2]) and float(p[0, 0, 0, 2]) == 0.0 and torch.allclose(m, ref[2])
        True
    """
    pattern = torch.softmax(scores, dim=-1)  # [B, H, c, n]
    d = sink - scores.amax(dim=-1, keepdim=True) + pattern.amax(dim=-1, keepdim=True).log()  # [B, H, c, 1]
    keys_share = torch.sigmoid(-d)  # [B, H, c, 1]
    # In place unless autograd needs softmax's output (its backward reads it): no second [B, H, c, n] buffer.
    pattern = pattern * keys_share if pattern.requires_grad else pattern.mul_(keys_share)
    return pattern, torch.sigmoid(d).squeeze(-1)  # [B, H, c, n], [B, H, c]


def _pad_keys(x: torch.Tensor, n_keys: int, fill: float) -> torch.Tensor:
    """``x`` ``[B, H, c, n]`` widened to ``[B, H, c, n_keys]`` with ``fill`` on the new keys (``x`` itself when
    nothing is missing)."""
    if x.shape[-1] == n_keys:
        return x
    out = x.new_empty((*x.shape[:-1], n_keys))  # [B, H, c, S]
    out[..., : x.shape[-1]] = x
    out[..., x.shape[-1]:] = fill
    return out


def make_attention(cfg: ModelConfig, *, cross: bool = False, layer: int | None = None) -> _AttentionBase:
    """The attention module that ``cfg.attention`` names (with ``layer``'s own head counts, if any)."""
    cls = LatentAttention if cfg.attention == "latent" else Attention
    return cls(cfg, cross=cross, layer=layer)
