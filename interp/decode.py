"""Decoding's fast paths: weights laid out for few-row products, and a hook-free decode step.

A decode step multiplies one row per sequence by every weight: a matrix-vector product bound by memory
bandwidth, plus a few dozen small operations per layer whose Python and dispatch cost is not small beside it
(on SmolLM2-135M, one row: ~6 ms of a ~50 ms step alone, about twice that in the loop, where streaming the
weights evicts the interpreter's working set from the caches). Two things here make it cheaper:

- :class:`DecodeLayout` (``_packed_linears``): a copy of every float32 CPU ``nn.Linear`` weight laid out for
  ``rows``-row inputs: MKL-packed from ``PACK_MIN_ROWS`` rows, transposed ``[in, out]`` below (MKL streams that
  layout faster than ``F.linear``'s ``[out, in]``); a gated MLP's gate and input weights share one fused
  ``[in, 2 * d_mlp]`` copy, so a step reads them in one product.
- :class:`LeanDecoder`: the decode step of a llama-family model (rotary, RMSNorm, pre-norm, SDPA) written as
  the few tensor operations it needs, over those copies. :meth:`Transformer.generate` uses it only while
  nothing can observe the difference: no hook attached anywhere, no head gates, no weight edited since the
  copies were made, no autograd. Otherwise every step runs the hooked forward pass. Its numbers equal the
  hooked pass's up to float rounding (the same operations; a product's summation order may differ).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import KVCache
from .rotary import apply_rotary, rotary_angles

# generate() multiplies each decode step's B rows by MKL-packed weights from this many rows (measured on a
# Xeon, 1 thread, SmolLM2-135M: 4-16 rows run ~1.5x faster) and for runs of at least this many steps (packing
# takes ~0.3 s there, one step saves ~30-50 ms at 4-8 rows). Fewer rows get the transposed layout (see
# TRANSPOSE_MIN_STEPS); Transformer.decoding() builds either once for many generate() calls.
PACK_MIN_ROWS = 4
PACK_MIN_STEPS = 8
# Below PACK_MIN_ROWS, generate() builds the transposed copies by itself for runs of at least this many steps:
# with LeanDecoder they save ~14 ms a step on SmolLM2-135M (one row, one thread: 46 against 60 ms) and cost
# ~0.7 s to build, so they pay from ~50 steps (measured: 64 new tokens 4.06 s against 4.26 s, 32 tokens 2.58 s
# against 2.34 s); the margin keeps noisy hosts on the right side.
TRANSPOSE_MIN_STEPS = 96
# ... and only when the packed copy (about the size of the weights) is small: a 7B float32 model is not doubled.
PACK_MAX_BYTES = 2 * 2**30


def _mkl_packing_available() -> bool:
    """True when this torch build has MKL's packed sgemm ops (x86 CPU builds); otherwise nothing is packed."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        return callable(torch.ops.mkl._mkl_reorder_linear_weight) and callable(torch.ops.mkl._mkl_linear)
    except (AttributeError, RuntimeError):
        return False


def _packed_mm(x: torch.Tensor, packed: torch.Tensor, mod: nn.Linear, rows: int) -> torch.Tensor:
    return torch.ops.mkl._mkl_linear(x, packed, mod.weight, mod.bias, rows)


def _transposed_mm(x: torch.Tensor, weight_t: torch.Tensor, mod: nn.Linear, rows: int) -> torch.Tensor:
    out = x @ weight_t  # [..., in] @ [in, out] -> [..., out]
    return out if mod.bias is None else out.add_(mod.bias)


def _plain_mm(x: torch.Tensor, weight: torch.Tensor, mod: nn.Linear, rows: int) -> torch.Tensor:
    return F.linear(x, weight, mod.bias)


@dataclass
class LaidOut:
    """One linear layer's decode copy: ``copy`` is ``weight`` (at ``version``) laid out by ``multiply``; with
    ``version`` None the "copy" is the weight itself, read live, so no edit can make it stale."""

    weight: torch.Tensor
    version: int | None
    copy: torch.Tensor
    multiply: Callable[..., torch.Tensor]

    def fresh(self, mod: nn.Linear) -> bool:
        """True while ``mod`` still holds the weight this copy was made from, unedited."""
        return mod.weight is self.weight and (self.version is None or self.weight._version == self.version)


def _layout_forward(mod: nn.Linear, laid: LaidOut, rows: int, x: torch.Tensor) -> torch.Tensor:
    # The copy has no autograd and knows nothing of later edits, and it serves only `rows`-row inputs (decode
    # steps): anything else, a prompt included, is multiplied exactly as in forward().
    if (torch.is_grad_enabled() or not laid.fresh(mod) or x.device != laid.copy.device
            or x.numel() != rows * x.shape[-1]):
        return F.linear(x, mod.weight, mod.bias)
    return laid.multiply(x, laid.copy, mod, rows)


@dataclass
class DecodeLayout:
    """The copies :func:`_packed_linears` made: per linear layer, and the fused gate/input copy of each gated
    MLP (``[in, 2 * d_mlp]``, transposed layout only; the two layers' copies are views into it)."""

    rows: int
    linears: dict[nn.Linear, LaidOut]
    fused_mlp: dict[nn.Module, torch.Tensor]

    def __len__(self) -> int:
        return len(self.linears)

    @classmethod
    def plain(cls, model: nn.Module, rows: int) -> DecodeLayout:
        """No copies: every linear layer's own weight, multiplied as ``F.linear`` does (any dtype, any device).
        What :class:`LeanDecoder` runs on outside :meth:`Transformer.decoding` and below ``PACK_MIN_ROWS``."""
        linears = {mod: LaidOut(mod.weight, None, mod.weight, _plain_mm)
                   for mod in model.modules() if isinstance(mod, nn.Linear)}
        return cls(rows=rows, linears=linears, fused_mlp={})


def _eligible(mod: nn.Module) -> bool:
    # Inference tensors (a model built under torch.inference_mode) have no version counter, so a copy could
    # not tell that the weight was edited since: they keep their own weights.
    w = getattr(mod, "weight", None)
    return (type(mod) is nn.Linear and "forward" not in mod.__dict__ and w.dtype == torch.float32
            and w.device.type == "cpu" and not w.is_inference())


@contextlib.contextmanager
def _packed_linears(model: nn.Module, *, rows: int, enabled: bool = True) -> Iterator[DecodeLayout]:
    """Within the block, every float32 CPU ``nn.Linear`` of ``model`` multiplies ``rows``-row inputs by a copy
    of its weight laid out for that many rows; yields the :class:`DecodeLayout` (empty when disabled or
    unavailable).

    Why: a decode step multiplies a few rows (one per sequence) by every weight. From ``PACK_MIN_ROWS`` rows
    the copy is MKL-packed: MKL's sgemm otherwise repacks the weight on every call, which at 4-16 rows costs
    about as much as the multiply itself. Below that it is the transposed ``[in, out]`` matrix, contiguous:
    the product is then a matrix-vector product bound by memory bandwidth, and MKL streams that layout faster
    than ``F.linear``'s ``[out, in]`` (SmolLM2-135M, 1 thread, one row: 45 ms per decode step instead of 50).
    A gated MLP's gate and input weights are transposed into one ``[in, 2 * d_mlp]`` matrix (each layer's copy
    is a view into it), which :class:`LeanDecoder` multiplies in one product. The copy costs one extra copy of
    the weights while the block runs and takes ~0.4 s to build for 540 MB, so one row only pays when many
    steps reuse it (:meth:`Transformer.decoding`). The results equal ``F.linear``'s up to float rounding (the
    summation order of a GEMM kernel). Every layer gets its own forward back on exit, also when the block
    raises.
    """
    layout = DecodeLayout(rows=rows, linears={}, fused_mlp={})
    try:
        if enabled and _mkl_packing_available():
            views: dict[nn.Linear, torch.Tensor] = {}
            if rows < PACK_MIN_ROWS:
                for mod in model.modules():
                    gate, inp = getattr(mod, "W_gate", None), getattr(mod, "W_in", None)
                    if (getattr(mod, "gated", False) and _eligible(gate) and _eligible(inp)
                            and (gate.bias is None) == (inp.bias is None)):
                        fused = torch.cat((gate.weight.detach().t(), inp.weight.detach().t()), dim=1)  # [in, 2F]
                        layout.fused_mlp[mod] = fused
                        views[gate], views[inp] = fused[:, :gate.out_features], fused[:, gate.out_features:]
            for mod in model.modules():
                if not _eligible(mod):
                    continue
                w = mod.weight
                if rows >= PACK_MIN_ROWS:
                    copy, multiply = torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), rows), _packed_mm
                else:
                    copy = views[mod] if mod in views else w.detach().t().contiguous()  # [out, in] -> [in, out]
                    multiply = _transposed_mm
                layout.linears[mod] = laid = LaidOut(w, w._version, copy, multiply)
                mod.forward = functools.partial(_layout_forward, mod, laid, rows)
        yield layout
    finally:
        for mod in layout.linears:
            del mod.forward


def _lean_linears(model: nn.Module) -> list[nn.Linear]:
    """Every linear layer :meth:`LeanDecoder.step` multiplies by (the unembedding, then layer by layer)."""
    linears = [model.W_U]
    for block in model.blocks:
        linears += [block.attn.W_qkv, block.attn.W_O]
        if block.mlp is not None:
            linears += [block.mlp.W_in, block.mlp.W_out] + ([block.mlp.W_gate] if block.mlp.gated else [])
    return linears


def _rms_norm(x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
    """``norm(x)`` without the module call (what ``nn.RMSNorm.forward`` computes)."""
    return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)


@dataclass(eq=False)
class _LayerStep:
    """What :meth:`LeanDecoder.step` needs of one layer: its norms, head counts and products."""

    attn: nn.Module
    ln1: nn.Module
    H: int
    K: int
    D: int
    qkv: Callable[[torch.Tensor], torch.Tensor]  # [B, M] -> [B, (H + 2K) D]
    o_add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, z) -> x + z W_O
    ln2: nn.Module | None = None
    act: Callable[[torch.Tensor], torch.Tensor] | None = None
    d_mlp: int = 0
    gate_in: Callable[[torch.Tensor], torch.Tensor] | None = None  # [B, M] -> [B, 2F] (fused gate | input)
    gate: Callable[[torch.Tensor], torch.Tensor] | None = None  # [B, M] -> [B, F] (gated MLP, not fused)
    up: Callable[[torch.Tensor], torch.Tensor] | None = None  # [B, M] -> [B, F] (the MLP's input product)
    down_add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # (x, h) -> x + h W_out


class LeanDecoder:
    """The hook-free decode step of a llama-family model over a :class:`DecodeLayout` (copies of the weights,
    or with :meth:`DecodeLayout.plain` the weights themselves).

    One step embeds the last token of each of ``rows`` sequences, runs every layer as the handful of tensor
    operations it needs (RMSNorm, the fused Q/K/V product, rotary on Q and K together, the in-place cache
    write, SDPA, the output product added to the residual, RMSNorm, the gate/input product, the activation,
    the output product added to the residual) and returns the next-token logits. It calls no module, no hook
    and no wrapper, which the hooked forward pass does a dozen times per layer.

    Build with :meth:`build` (``None`` for a model it does not cover); check :meth:`usable` before each run.

    Example:
        >>> with model.decoding(batch_size=1):  # generate() builds and uses it by itself
        ...     model.generate(model.to_tokens("The capital of France is"), 16)
    """

    def __init__(self, model: nn.Module, layout: DecodeLayout) -> None:
        self.model, self.layout, self.rows = model, layout, layout.rows
        self.layers: list[_LayerStep] = []
        self._checked = _lean_linears(model)  # every layer whose copy a step reads
        self._inv_freq = model.blocks[0].attn.rotary.inv_freq
        self._ln_final = model.ln_final
        self._embed = model.W_E.weight
        self._unembed = self._product(model.W_U)
        for block in model.blocks:
            attn, mlp = block.attn, block.mlp
            layer = _LayerStep(attn=attn, ln1=block.ln1, H=attn.n_heads, K=attn.n_kv_heads, D=attn.d_head,
                               qkv=self._product(attn.W_qkv), o_add=self._product_add(attn.W_O))
            if mlp is not None:
                layer.ln2, layer.act, layer.d_mlp = block.ln2, mlp.act, mlp.W_in.out_features
                layer.down_add = self._product_add(mlp.W_out)
                if mlp in layout.fused_mlp:
                    layer.gate_in = self._fused(mlp)
                else:
                    layer.up = self._product(mlp.W_in)
                    layer.gate = self._product(mlp.W_gate) if mlp.gated else None
            self.layers.append(layer)

    @staticmethod
    def unsupported(model: nn.Module) -> str | None:
        """Why :class:`LeanDecoder` does not cover ``model`` (``None`` when it does)."""
        cfg = getattr(model, "cfg", None)
        if cfg is None or not hasattr(model, "blocks"):
            return "not an interp Transformer"
        checks = [
            (cfg.attention == "standard", f"attention={cfg.attention!r}"),
            (cfg.causal and cfg.unembed, "not a causal decoder with an unembedding"),
            (cfg.normalization == "rms" and not cfg.embed_norm, f"normalization={cfg.normalization!r}"),
            (getattr(model, "W_pos", None) is None and getattr(model, "W_tt", None) is None,
             "learned position or token-type embeddings"),
            (not cfg.cross_attention, "cross-attention"),
            (cfg.use_sdpa, "use_sdpa=False"),
            (not getattr(model, "_placement_handles", None), "layers placed on several devices"),
        ]
        for ok, why in checks:
            if not ok:
                return why
        first = model.blocks[0].attn.rotary
        for i, block in enumerate(model.blocks):
            attn = block.attn
            if attn.rotary is None or first is None:
                return "no rotary embedding"
            if not torch.equal(attn.rotary.inv_freq, first.inv_freq):
                return f"layer {i} rotates with other frequencies than layer 0"
            if attn.n_heads == 0 or getattr(attn, "kv_index", None) is not None:
                return f"layer {i} has no heads or unequal K/V groups"
        return None

    @classmethod
    def build(cls, model: nn.Module, layout: DecodeLayout) -> LeanDecoder | None:
        """A decoder over ``layout``'s copies, or ``None`` when the model is not covered (see
        :meth:`unsupported`) or a layer it needs has no copy (not float32 on CPU, or no MKL)."""
        if cls.unsupported(model) is not None or not cls._covers(model, layout):
            return None
        return cls(model, layout)

    @classmethod
    def for_generate(cls, model: nn.Module, layout: DecodeLayout, rows: int) -> LeanDecoder | None:
        """The decoder a ``rows``-sequence :meth:`Transformer.generate` runs past its prompt: over ``layout``'s
        copies when they serve ``rows`` rows and every layer it needs, else over the weights themselves;
        ``None`` when the model is not covered or a step could be observed (see :meth:`usable`)."""
        if cls.unsupported(model) is not None:
            return None
        if layout.rows != rows or not cls._covers(model, layout):
            layout = DecodeLayout.plain(model, rows)
        decoder = cls(model, layout)
        return decoder if decoder.usable(rows) else None

    @staticmethod
    def _covers(model: nn.Module, layout: DecodeLayout) -> bool:
        return all(lin in layout.linears for lin in _lean_linears(model))

    def usable(self, rows: int) -> bool:
        """True when a step may skip the hooked forward: ``rows`` sequences, no autograd, no hook attached, no
        head gate, and every weight still the one its copy was made from."""
        return (rows == self.rows and not torch.is_grad_enabled()
                and not any(hp._fns for hp in self.model.hook_dict.values())
                and all(layer.attn.gate is None for layer in self.layers)
                and all(self.layout.linears[lin].fresh(lin) for lin in self._checked))

    # --- products over the copies (h is [rows, in]) ----------------------------------------------------
    def _product(self, mod: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
        laid, rows = self.layout.linears[mod], self.rows
        return lambda h: laid.multiply(h, laid.copy, mod, rows)

    def _product_add(self, mod: nn.Linear) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``(x, h) -> x + mod(h)``: one ``addmm`` when the copy is a plain transposed matrix and there is no
        bias (the residual is added as the product is written)."""
        laid = self.layout.linears[mod]
        if laid.multiply is _transposed_mm and mod.bias is None:
            return lambda x, h: torch.addmm(x, h, laid.copy)  # [rows, M] + [rows, in] @ [in, M]
        if laid.multiply is _plain_mm and mod.bias is None:
            return lambda x, h: torch.addmm(x, h, laid.copy.t())  # [rows, M] + [rows, in] @ [out, in]^T
        product = self._product(mod)
        return lambda x, h: x + product(h)

    def _fused(self, mlp: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        fused = self.layout.fused_mlp[mlp]
        if mlp.W_gate.bias is None:
            return lambda h: h @ fused  # [rows, in] @ [in, 2F]
        bias = torch.cat((mlp.W_gate.bias.detach(), mlp.W_in.bias.detach()))  # [2F]
        return lambda h: (h @ fused).add_(bias)

    # --- the step --------------------------------------------------------------------------------------
    def step(self, ids: torch.Tensor, position: int, cache: KVCache) -> torch.Tensor:
        """One decode step: ``ids`` ``[rows]`` (each sequence's last token, at ``position``) -> logits
        ``[rows, d_vocab]``; writes every layer's K/V at ``position`` and sets ``cache.length``."""
        B = ids.shape[0]
        x = F.embedding(ids, self._embed)  # [B, M]
        positions = torch.arange(position, position + 1, device=ids.device)  # as the hooked pass builds them
        cos, sin = rotary_angles(positions, self._inv_freq, x.dtype)  # [1, 1, 1, R] each
        for layer, layer_cache in zip(self.layers, cache.layers):
            H, K, D = layer.H, layer.K, layer.D
            qkv = layer.qkv(_rms_norm(x, layer.ln1))  # [B, (H + 2K) D]
            # q and k rotate in one call: rotary is elementwise, so together or apart gives the same numbers.
            qk = apply_rotary(qkv[:, :(H + K) * D].view(B, 1, H + K, D), cos, sin)  # [B, 1, H + K, D]
            v = qkv[:, (H + K) * D:].view(B, 1, K, D).transpose(1, 2)  # [B, K, 1, D]
            k, v = layer_cache.update(position, qk[:, :, H:].transpose(1, 2), v)  # [B, K, S, D] each
            q = qk[:, :, :H].transpose(1, 2)  # [B, H, 1, D]
            z = F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(D), enable_gqa=K != H)
            x = layer.o_add(x, z.reshape(B, H * D))  # [B, H, 1, D] -> [B, H*D]; plus the residual
            if layer.ln2 is not None:
                h = _rms_norm(x, layer.ln2)
                if layer.gate_in is not None:
                    gate_in = layer.gate_in(h)  # [B, 2F]
                    h = layer.act(gate_in[:, :layer.d_mlp]).mul_(gate_in[:, layer.d_mlp:])  # [B, F]
                elif layer.gate is not None:
                    h = layer.act(layer.gate(h)).mul_(layer.up(h))  # [B, F]
                else:
                    h = layer.act(layer.up(h))  # [B, F]
                x = layer.down_add(x, h)
        cache.length = position + 1
        return self._unembed(_rms_norm(x, self._ln_final))  # [B, d_vocab]
