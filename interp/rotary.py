"""Rotary position embeddings (RoPE), in the half-rotation convention of GPT-NeoX / Llama, with RoPE scaling.

RoPE scaling stretches a model's rotary frequencies past the context it was trained on. A scaling is a dict in
Hugging Face's ``rope_parameters`` vocabulary (``{"rope_type": "yarn", "factor": 4.0, ...}``, see
:data:`ROPE_SCALING_KEYS`); :func:`rope_frequencies` turns it into inverse frequencies and the attention factor
that multiplies the cosine and sine tables:

* ``linear``: positions divided by ``factor`` (all frequencies divided by it).
* ``llama3``: Llama 3.1's smooth split: low frequencies divided by ``factor``, high ones kept, a ramp between.
* ``dynamic``: NTK-aware: the base grows with the sequence length once it passes the original context, so the
  frequencies depend on the longest position of each forward pass.
* ``yarn``: NTK-by-parts interpolation plus the attention factor ``mscale`` (:func:`yarn_inv_freq`,
  :func:`yarn_attention_factor`; DeepSeek's ``mscale`` / ``mscale_all_dim`` variant included).
* ``longrope``: Phi-3's per-frequency factors, the short ones up to the original context and the long ones past
  it, with its own attention factor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .config import ROPE_SCALING_KEYS
from .norms import HALF_DTYPES

# The last (positions, cos, sin) computed, shared by every Rotary: all layers of a forward pass (and q and k)
# rotate by the same positions tensor, so their angles are computed once per pass, not twice per layer. Both the
# positions and the frequencies are recognised without reading their values: a value comparison waits for the
# device (on a GPU, one wait per layer stalls the whole pass), so the positions are matched by identity and
# version counter, and the frequencies by the settings that made them (see Rotary._freq_key).
_LAST: tuple | None = None
_LAST_LENGTH: tuple | None = None  # (positions, version, max + 1) for length-dependent frequencies


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, the same numbers, with the last two steps in place: both buffers
    are this call's own, and neither in-place step's backward needs the value it overwrites."""
    return (x * cos).add_(rotate_half(x).mul_(sin))


def rotary_angles(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                  attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosines and sines that rotate features at ``positions``.

    Args:
        positions: ``[T]`` or ``[B, T]`` absolute positions.
        inv_freq: ``[dim / 2]`` inverse frequencies (:attr:`Rotary.inv_freq`).
        dtype: of the returned tables.
        attention_factor: multiplies both tables (YaRN / LongRoPE; 1 for plain RoPE).

    Returns:
        ``(cos, sin)``, each ``[B|1, T, 1, dim]``.

    Example:
        >>> import torch
        >>> from interp.rotary import Rotary, rotary_angles
        >>> cos, sin = rotary_angles(torch.arange(5), Rotary(8).inv_freq, torch.float32)  # [1, 5, 1, 8] each
    """
    freqs = positions.to(torch.float32)[..., None] * inv_freq  # [(B,) T, dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [(B,) T, dim]
    if emb.dim() == 2:
        emb = emb[None]  # [1, T, dim]
    cos, sin = emb.cos(), emb.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    cos = cos[:, :, None, :].to(dtype)  # [B|1, T, 1, dim]
    sin = sin[:, :, None, :].to(dtype)  # [B|1, T, 1, dim]
    return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` features of ``x`` ``[B, T, heads, Dx]`` by :func:`rotary_angles`'
    tables; the rest pass through unchanged (partial rotary). Returns a new tensor of ``x``'s shape.

    Example:
        >>> import torch
        >>> from interp.rotary import Rotary, apply_rotary, rotary_angles
        >>> cos, sin = rotary_angles(torch.arange(5), Rotary(8).inv_freq, torch.float32)
        >>> apply_rotary(torch.randn(1, 5, 2, 8), cos, sin).shape
        torch.Size([1, 5, 2, 8])
    """
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return _rotate(x, cos, sin)
    return torch.cat((_rotate(x[..., :dim], cos, sin), x[..., dim:]), dim=-1)


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    """Plain RoPE inverse frequencies ``base ** (-2i / dim)`` for ``i < dim / 2`` (``[dim / 2]``, float32).

    Example:
        >>> from interp.rotary import default_inv_freq
        >>> default_inv_freq(4, 10000.0)
        tensor([1.0000, 0.0100])
    """
    return 1.0 / _wavelength_powers(dim, base)


def _wavelength_powers(dim: int, base: float) -> torch.Tensor:
    """``base ** (2i / dim)`` (``[dim / 2]``): scaled kinds divide these, not the inverses, for HF's rounding."""
    return base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


def llama3_inv_freq(dim: int, base: float, *, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_position_embeddings: int) -> torch.Tensor:
    """Llama 3.1's scaled frequencies: wavelengths longer than ``original / low_freq_factor`` are divided by
    ``factor``, those shorter than ``original / high_freq_factor`` are kept, and the band between is a linear
    blend (in ``original / wavelength``) of the two.

    Example:
        >>> from interp.rotary import llama3_inv_freq
        >>> llama3_inv_freq(8, 500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        ...                 original_max_position_embeddings=16).shape
        torch.Size([4])
    """
    inv_freq = default_inv_freq(dim, base)
    old = original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low_freq_factor, inv_freq / factor, inv_freq)
    if high_freq_factor == low_freq_factor:  # no band between the kept and the divided wavelengths (Llama 4 Scout)
        return scaled
    smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high_freq_factor) & (wavelen <= old / low_freq_factor)
    return torch.where(medium, blended, scaled)


def dynamic_ntk_inv_freq(dim: int, base: float, *, factor: float, original_max_position_embeddings: int,
                         seq_len: int) -> torch.Tensor:
    """Dynamic NTK frequencies for a pass whose longest sequence is ``seq_len``: the base grows as
    ``base * (factor * L / original - (factor - 1)) ** (dim / (dim - 2))`` with ``L = max(seq_len, original)``
    (up to the original context the frequencies are the plain ones).

    Example:
        >>> import torch
        >>> from interp.rotary import default_inv_freq, dynamic_ntk_inv_freq
        >>> torch.equal(dynamic_ntk_inv_freq(8, 1e4, factor=2.0, original_max_position_embeddings=16, seq_len=9),
        ...             default_inv_freq(8, 1e4))
        True
    """
    length = max(seq_len, original_max_position_embeddings)
    grown = base * ((factor * length / original_max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    return default_inv_freq(dim, grown)


def yarn_inv_freq(dim: int, base: float, *, factor: float, original_max_position_embeddings: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True) -> torch.Tensor:
    """YaRN's NTK-by-parts frequencies: dimensions that rotate more than ``beta_fast`` times over the original
    context keep their frequency (extrapolation), those that rotate fewer than ``beta_slow`` times are divided by
    ``factor`` (interpolation), with a linear ramp between the two correction dimensions (rounded outwards
    when ``truncate``).

    Reused by every YaRN model (Qwen, DeepSeek's decoupled rotary key): the attention factor is separate,
    :func:`yarn_attention_factor`.

    Example:
        >>> from interp.rotary import yarn_inv_freq
        >>> yarn_inv_freq(8, 10000.0, factor=4.0, original_max_position_embeddings=16).shape
        torch.Size([4])
    """
    def correction_dim(rotations: float) -> float:
        # The dimension whose wavelength fits ``rotations`` times into the original context.
        return (dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [dim/2]
    powers = _wavelength_powers(dim, base)
    extrapolated = 1.0 / powers
    interpolated = 1.0 / (factor * powers)
    keep = 1 - ramp  # 1: keep the original frequency, 0: interpolate
    return interpolated * (1 - keep) + extrapolated * keep


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's attention factor, which multiplies the cosine and sine tables (so the scores by its square):
    ``0.1 * ln(factor) + 1``; DeepSeek's variant ``m(factor, mscale) / m(factor, mscale_all_dim)`` with
    ``m(s, k) = 0.1 * k * ln(s) + 1`` when both are given (1 for ``factor <= 1``).

    Example:
        >>> from interp.rotary import yarn_attention_factor
        >>> round(yarn_attention_factor(4.0), 6)
        1.138629
        >>> yarn_attention_factor(40.0, mscale=1.0, mscale_all_dim=1.0)
        1.0
    """
    def m(scale: float, k: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return float(m(factor, mscale) / m(factor, mscale_all_dim))
    return m(factor)


def longrope_attention_factor(factor: float, original_max_position_embeddings: int) -> float:
    """LongRoPE's attention factor ``sqrt(1 + ln(factor) / ln(original))`` (1 for ``factor <= 1``).

    Example:
        >>> from interp.rotary import longrope_attention_factor
        >>> round(longrope_attention_factor(32.0, 4096), 6)
        1.190238
    """
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_position_embeddings))


def rope_frequencies(dim: int, base: float, scaling: Mapping[str, Any] | None = None,
                     seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention factor of a RoPE with optional scaling.

    Args:
        dim: rotated features per head (even).
        base: the frequency base (``rope_theta``).
        scaling: ``None`` for plain RoPE, or a dict with ``rope_type`` and the keys :data:`ROPE_SCALING_KEYS`
            lists for it (validated by :class:`interp.ModelConfig`).
        seq_len: the longest sequence of the pass (max position + 1); only ``dynamic`` and ``longrope`` read it.

    Returns:
        ``(inv_freq [dim / 2] float32, attention_factor)``; the factor multiplies cos and sin.

    Raises:
        ValueError: an unknown ``rope_type``.

    Example:
        >>> import torch
        >>> from interp.rotary import default_inv_freq, rope_frequencies
        >>> inv, att = rope_frequencies(8, 1e4, {"rope_type": "linear", "factor": 2.0})
        >>> torch.allclose(inv, default_inv_freq(8, 1e4) / 2), att
        (True, 1.0)
    """
    if scaling is None:
        return default_inv_freq(dim, base), 1.0
    kind = scaling.get("rope_type")
    s = scaling
    if kind == "linear":
        return default_inv_freq(dim, base) / s["factor"], 1.0
    if kind == "llama3":
        return llama3_inv_freq(dim, base, factor=s["factor"], low_freq_factor=s["low_freq_factor"],
                               high_freq_factor=s["high_freq_factor"],
                               original_max_position_embeddings=s["original_max_position_embeddings"]), 1.0
    if kind == "dynamic":
        orig = s["original_max_position_embeddings"]
        return dynamic_ntk_inv_freq(dim, base, factor=s["factor"], original_max_position_embeddings=orig,
                                    seq_len=orig if seq_len is None else seq_len), 1.0
    if kind == "yarn":
        inv = yarn_inv_freq(dim, base, factor=s["factor"],
                            original_max_position_embeddings=s["original_max_position_embeddings"],
                            beta_fast=s.get("beta_fast") or 32.0, beta_slow=s.get("beta_slow") or 1.0,
                            truncate=s.get("truncate", True))
        att = s.get("attention_factor")
        if att is None:
            att = yarn_attention_factor(s["factor"], s.get("mscale"), s.get("mscale_all_dim"))
        return inv, float(att)
    if kind == "longrope":
        orig = s["original_max_position_embeddings"]
        long = seq_len is not None and seq_len > orig
        ext = torch.tensor(s["long_factor" if long else "short_factor"], dtype=torch.float32)  # [dim/2]
        att = s.get("attention_factor")
        if att is None:
            att = longrope_attention_factor(s.get("factor") or 1.0, orig)
        return 1.0 / (ext * _wavelength_powers(dim, base)), float(att)
    raise ValueError(f"rope_type={kind!r} is not a RoPE scaling interp implements; known: {sorted(ROPE_SCALING_KEYS)}")


def cache_needs_recompute(scaling: Mapping[str, Any] | None, cached: int, total: int) -> bool:
    """Whether a KV cache of ``cached`` positions must be recomputed before a pass that extends the sequence to
    ``total`` positions.

    LongRoPE rotates with its short factors while a pass stays within ``original_max_position_embeddings`` and
    with its long ones past it, so keys cached by passes inside the original context are rotated with factors
    the longer pass no longer uses. transformers' Phi-3 drops its cache then (the first time a generation
    reaches past the original context) and recomputes every key with the long factors; interp's cached
    ``generate`` does the same, so its tokens equal transformers' past the boundary. (Dynamic NTK also changes
    its frequencies with the length, but transformers keeps its cache there: so does interp.)

    Args:
        scaling: a :class:`~interp.config.ModelConfig`'s ``rope_scaling`` (None: plain RoPE).
        cached: positions the cache holds.
        total: positions after the pass.

    Example:
        >>> from interp.rotary import cache_needs_recompute
        >>> s = {"rope_type": "longrope", "original_max_position_embeddings": 16}
        >>> cache_needs_recompute(s, 16, 17), cache_needs_recompute(s, 15, 16), cache_needs_recompute(s, 17, 18)
        (True, False, False)
    """
    if scaling is None or scaling["rope_type"] != "longrope" or cached == 0:
        return False
    original = scaling["original_max_position_embeddings"]
    return cached <= original < total


def _same_positions(kept: tuple[torch.Tensor, torch.Tensor | None], positions: torch.Tensor) -> bool:
    """Whether ``positions`` is the tensor the last angles were computed for, with the same values (its version
    is in the memo's key; an inference tensor's kept copy is compared instead)."""
    ref, copy = kept
    return ref is positions and (copy is None or torch.equal(copy, positions))


class Rotary(nn.Module):
    """Rotate the first ``dim`` features of each head by position-dependent angles.

    Args:
        dim: rotated features per head (even); the rest pass through unchanged (partial rotary).
        base: the frequency base (10000 in most models).
        scaling: an optional RoPE scaling (see :func:`rope_frequencies`).
        float32: in bf16 / fp16, rotate in float32 with float32 angles and round once (OLMo 2's order) instead
            of in the input's dtype with rounded angles (Llama's). Ignored in float32.

    Attributes:
        inv_freq: the frequencies of a pass within the original context (``[dim / 2]``).
        attention_factor: multiplies cos and sin (YaRN's / LongRoPE's attention scale; 1 otherwise).
        length_dependent: True when the frequencies depend on the pass's longest position (``dynamic``,
            ``longrope``); each pass then uses those of ``max(positions) + 1``, as Hugging Face does.

    Example:
        >>> import torch
        >>> from interp.rotary import Rotary
        >>> rot = Rotary(8)
        >>> rot(torch.randn(1, 5, 2, 8), torch.arange(5)).shape
        torch.Size([1, 5, 2, 8])
    """

    inv_freq: torch.Tensor  # [dim / 2], a buffer

    def __init__(self, dim: int, base: float = 10000.0, scaling: Mapping[str, Any] | None = None, *,
                 float32: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.float32 = float32
        self.base = base
        self.scaling = None if scaling is None else dict(scaling)
        inv_freq, self.attention_factor = rope_frequencies(dim, base, self.scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.length_dependent = self.scaling is not None and self.scaling["rope_type"] in ("dynamic", "longrope")
        self._by_length: tuple[int, torch.Tensor] | None = None  # the last (seq_len, inv_freq) computed
        self._checked: tuple | None = None  # (inv_freq buffer, its version, whether it holds the settings' values)

    def frequencies(self, positions: torch.Tensor) -> torch.Tensor:
        """The inverse frequencies a pass over ``positions`` rotates with (``[dim / 2]``)."""
        if not self.length_dependent or positions.numel() == 0:
            return self.inv_freq
        global _LAST_LENGTH
        version = None if positions.is_inference() else positions._version
        known = _LAST_LENGTH  # every layer of a pass asks about the same positions: read their maximum once
        if known is not None and known[0] is positions and known[1] == version:
            seq_len = known[2]
        else:
            seq_len = int(positions.max()) + 1
            _LAST_LENGTH = (positions, version, seq_len)
        last = self._by_length
        if last is not None and last[0] == seq_len and last[1].device == self.inv_freq.device:
            return last[1]  # the same tensor object, so the shared angle cache below recognises it
        inv_freq, _ = rope_frequencies(self.dim, self.base, self.scaling, seq_len=seq_len)
        inv_freq = inv_freq.to(self.inv_freq.device)
        self._by_length = (seq_len, inv_freq)
        return inv_freq

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """x ``[B, T, heads, Dx]``, positions ``[B, T]`` or ``[T]`` (default ``arange(T)``) -> same shape."""
        B, T = x.shape[:2]
        if positions is None:
            positions = torch.arange(T, device=x.device)
        if self.float32 and x.dtype in HALF_DTYPES:
            cos, sin = self._cos_sin(positions, torch.float32)  # [B|1, T, 1, dim] each
            return apply_rotary(x.float(), cos, sin).to(x.dtype)
        cos, sin = self._cos_sin(positions, x.dtype)  # [B|1, T, 1, dim] each
        return apply_rotary(x, cos, sin)

    def _freq_key(self, inv_freq: torch.Tensor) -> tuple:
        """A key for ``inv_freq``'s values that reads no value: the settings that computed them while the buffer
        still holds them (checked once per buffer object and in-place edit), else this module's own tensor.
        Layers with the same settings then share one set of angles; an edited layer gets its own."""
        if inv_freq is not self.inv_freq and self._by_length is not None and inv_freq is self._by_length[1]:
            # length-dependent frequencies, computed from the settings and the pass's length alone
            return ("settings", self.dim, self.base, repr(self.scaling), self._by_length[0], inv_freq.dtype)
        buf = self.inv_freq
        stamp = (buf, None if buf.is_inference() else buf._version)
        checked = self._checked
        if checked is None or checked[0] is not stamp[0] or checked[1] != stamp[1]:
            expected = rope_frequencies(self.dim, self.base, self.scaling)[0].to(buf.dtype)
            pristine = (buf.device.type != "meta" and buf.shape == expected.shape
                        and torch.equal(buf.cpu(), expected))  # one read per buffer object and edit
            checked = self._checked = (*stamp, pristine)
        if checked[2]:
            return ("settings", self.dim, self.base, repr(self.scaling), None, buf.dtype)
        return ("buffer", self, buf._version if not buf.is_inference() else None)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        global _LAST
        inv_freq = self.frequencies(positions)
        # Inference-mode tensors cannot be saved for backward: a pass with autograd computes its own.
        key = (self._freq_key(inv_freq), inv_freq.device, dtype, positions.device, torch.is_inference_mode_enabled(),
               self.attention_factor, None if positions.is_inference() else positions._version)
        last = _LAST  # one read: another thread may replace it meanwhile
        if last is not None and last[1] == key and _same_positions(last[0], positions):
            return last[2], last[3]
        cos, sin = rotary_angles(positions, inv_freq, dtype, self.attention_factor)  # [B|1, T, 1, dim] each
        # An inference tensor has no version counter: on the CPU a copy is kept and compared by value (no wait
        # there); on a GPU its identity stands for its values (a tensor edited in place under inference mode
        # between two calls is not noticed: pass a new one, as the model does every pass).
        copy = positions.clone() if positions.is_inference() and positions.device.type == "cpu" else None
        _LAST = ((positions, copy), key, cos, sin)
        return cos, sin
