"""The hookable Transformer: embeddings, blocks (attention + optional MLP) and unembedding.

Decoder (causal, GPT-2 / Llama style) or encoder (bidirectional, BERT style) is a config value, as are the
norm placement, positional scheme and attention variant. Every intermediate passes through a named
:class:`~interp.hooks.HookPoint` (TransformerLens names).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, cast

import torch
import torch.nn.functional as F
from torch import nn

from . import weights as _weights
from .attention import AttnMask, make_attention
from .config import ModelConfig
from .hooks import HookedModule, HookPoint, NamesFilter
from .kv_cache import KVCache
from .moe import MoE, gated_unit
from .norms import RMSNorm

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle
    from typing_extensions import Unpack

    from .decode import DecodeLayout, _Traced
    from .generate import GenerateOptions
    from .streaming import Reducer
    from .trace import Trace


class ForwardOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`Transformer.forward`, which the methods that run it pass on
    (``run_with_cache``, ``run_with_hooks``); a test keeps the two lists equal."""

    attention_mask: torch.Tensor | None
    token_type_ids: torch.Tensor | None
    position_ids: torch.Tensor | None
    context: torch.Tensor | None
    context_mask: torch.Tensor | None
    kv_cache: KVCache | None
    start_at_layer: int | None
    stop_at_layer: int | None


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.normalization == "rms":
        return RMSNorm(cfg.d_model, eps=cfg.norm_eps, weight_float32=cfg.precision.norm_weight_float32)
    if cfg.normalization in ("pre", "post"):
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.Identity()


def _clamped_gate(x: torch.Tensor) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU is a function of gate and up together (:func:`interp.moe.gated_unit`), never of
    the gate alone: this entry only keeps ``_ACT`` total over the activations."""
    return x


_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),  # Arcee's / Nemotron's squared ReLU
    "silu": F.silu,
    "swiglu": F.silu,
    "geglu": F.gelu,
    "geglu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "swiglu_clamped": _clamped_gate,
}
# In-place versions, used where nothing else holds the input (the gate's fresh output, without autograd).
_ACT_INPLACE: dict[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]] = {
    F.silu: lambda t: F.silu(t, inplace=True),
    F.relu: F.relu_,
}


class MLP(nn.Module):
    """Two-layer MLP, or a gated one (``swiglu``/``geglu``: ``W_out(act(W_gate x) * W_in x)``; ``swiglu_clamped``:
    ``W_out(gated_unit(W_gate x, W_in x))``).

    ``d_hidden`` overrides ``cfg.d_mlp`` (a mixture of experts' shared expert has its own width).
    """

    def __init__(self, cfg: ModelConfig, d_hidden: int | None = None) -> None:
        super().__init__()
        F_ = cfg.d_mlp if d_hidden is None else d_hidden
        self.gated = cfg.activation in ("swiglu", "geglu", "geglu_tanh", "swiglu_clamped")
        self.act = _ACT[cfg.activation]
        self.unit = gated_unit(cfg, self.act)
        self.W_in = nn.Linear(cfg.d_model, F_, bias=cfg.mlp_bias)
        if self.gated:
            self.W_gate = nn.Linear(cfg.d_model, F_, bias=cfg.mlp_bias)
        self.W_out = nn.Linear(F_, cfg.d_model, bias=cfg.mlp_bias)
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is _clamped_gate:
            h = self.unit(self.W_gate(x), self.W_in(x))
        elif self.gated and not torch.is_grad_enabled():
            # Without autograd nothing needs the gate's pre-activation: act and multiply in place (two fewer
            # [B, T, d_mlp] buffers per layer; the same numbers).
            h = _ACT_INPLACE.get(self.act, self.act)(self.W_gate(x)).mul_(self.W_in(x))
        elif self.gated:
            h = self.act(self.W_gate(x)) * self.W_in(x)
        else:
            h = self.act(self.W_in(x))
        return self.W_out(self.hook_post(h))


def make_mlp(cfg: ModelConfig, layer: int | None) -> nn.Module:
    """The MLP of ``layer``: a :class:`~interp.moe.MoE` on a mixture-of-experts layer, else a dense :class:`MLP`."""
    if layer is None or not cfg.is_moe_layer(layer):
        return MLP(cfg)
    shared = MLP(cfg, d_hidden=cfg.d_shared_expert) if cfg.d_shared_expert else None
    return MoE(cfg, shared, _ACT[cfg.activation])


class Block(nn.Module):
    """One layer: attention (+ cross-attention) + MLP, with pre-norm, post-norm (BERT) or no norm.

    A pre-norm block may also normalise each sublayer's output (``cfg.sublayer_norm``: ``ln1_post`` /
    ``ln2_post``, Gemma's sandwich and OLMo 2's output-only norms) or run attention and MLP in parallel on the
    same residual (``cfg.parallel_block``: GPT-NeoX, Falcon, Phi).
    """

    def __init__(self, cfg: ModelConfig, layer: int | None = None) -> None:
        super().__init__()
        self.post_norm = cfg.normalization == "post"
        self.parallel = cfg.parallel_block != "none"
        norm_in = cfg.sublayer_norm != "output"  # OLMo 2 normalises only the sublayers' outputs
        norm_out = cfg.sublayer_norm != "input"
        self.ln1 = make_norm(cfg) if norm_in else nn.Identity()
        self.attn = make_attention(cfg, layer=layer)
        if norm_out:
            self.ln1_post = make_norm(cfg)
            self.hook_attn_out_pre_norm = HookPoint()
        if cfg.cross_attention:
            self.ln_cross = make_norm(cfg)
            self.cross_attn = make_attention(cfg, cross=True)
            self.hook_cross_attn_out = HookPoint()
        self.mlp = None if cfg.attn_only else make_mlp(cfg, layer)
        if self.mlp is not None:
            # A one-norm parallel block feeds the MLP ln1's output: it has no ln2.
            if cfg.parallel_block != "one_norm":
                self.ln2 = make_norm(cfg) if norm_in else nn.Identity()
            if norm_out:
                self.ln2_post = make_norm(cfg)
                self.hook_mlp_out_pre_norm = HookPoint()
            self.hook_mlp_out = HookPoint()
            if not self.parallel:
                self.hook_resid_mid = HookPoint()
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def _sublayer(self, x, norm, fn, hook, out_norm=None, out_hook=None):
        if self.post_norm:
            return norm(x + hook(fn(x)))
        y = fn(norm(x))
        if out_norm is not None:
            y = out_norm(out_hook(y))
        return x + hook(y)

    def forward(self, x, *, mask, positions, cache, context, context_mask) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        attend = lambda h: self.attn(h, mask=mask, positions=positions, cache=cache)  # noqa: E731
        if self.parallel and self.mlp is not None:  # (a parallel block always has its MLP: the config says so)
            # Both sublayers read the same residual; a one-norm block normalises it once for both.
            h = self.ln1(x)
            attn_out = self.hook_attn_out(attend(h))
            mlp_out = self.hook_mlp_out(self.mlp(h if not hasattr(self, "ln2") else self.ln2(x)))
            return self.hook_resid_post(x + attn_out + mlp_out)
        x = self._sublayer(x, self.ln1, attend, self.hook_attn_out, getattr(self, "ln1_post", None),
                           getattr(self, "hook_attn_out_pre_norm", None))
        if context is not None:
            x = self._sublayer(x, self.ln_cross, lambda h: self.cross_attn(h, mask=context_mask, context=context),
                               self.hook_cross_attn_out)
        if self.mlp is not None:
            x = self.hook_resid_mid(x)
            x = self._sublayer(x, self.ln2, self.mlp, self.hook_mlp_out, getattr(self, "ln2_post", None),
                               getattr(self, "hook_mlp_out_pre_norm", None))
        return self.hook_resid_post(x)


class Transformer(HookedModule):
    """A decoder or encoder transformer whose every intermediate is hookable.

    Args:
        cfg: a :class:`ModelConfig`.

    Example:
        >>> import torch
        >>> from interp import ModelConfig, Transformer
        >>> cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, d_vocab=50, n_ctx=32, positional="rotary")
        >>> model = Transformer(cfg)
        >>> logits, trace = model.run_with_cache(torch.tensor([[1, 2, 3]]), names_filter="*hook_pattern")
        >>> trace.pattern(0).shape
        torch.Size([1, 4, 3, 3])
    """

    #: The native route (interp's own forward); :class:`interp.zoo.hf_route.RouteModel` has False.
    native = True
    #: A hub model's branch, tag or commit (``interp.load("hf:ID", revision=...)``); recordings store it.
    revision: str | None = None
    #: The weight layout of an open :func:`interp.decode.decoding` block (None outside one).
    _decode_layout: DecodeLayout | None = None
    _decode_trace: _Traced | None = None  # the traced decode step (interp.decode), kept for the next generate()
    #: The device-hop hooks :func:`interp.placement.place` installed (absent on a model never placed).
    _placement_handles: list[RemovableHandle]
    #: A model read by :func:`interp.zoo.load_checkpoint`: the file's metadata (less config and tokenizer), and
    #: whether its integrity record was there and matched.
    checkpoint_metadata: dict[str, str]
    checkpoint_verified: bool

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        # The weight modules keep the names W_E / W_pos / W_U (state-dict keys "W_E.weight"...); the attributes of
        # those names are TransformerLens-style tensors (properties below), the modules are embed / pos_embed /
        # unembed. A model without the module simply has no entry (assigning None would hit the property).
        # nn.Module.__setattr__ registers the module: the attribute of that name is the read-only tensor property.
        nn.Module.__setattr__(self, "W_E", nn.Embedding(cfg.d_vocab, cfg.d_model))
        if cfg.positional == "learned":
            nn.Module.__setattr__(self, "W_pos", nn.Embedding(cfg.n_ctx, cfg.d_model))
        self.W_tt = nn.Embedding(cfg.n_token_types, cfg.d_model) if cfg.n_token_types else None
        self.embed_ln = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.embed_norm else None
        # Typed as the list of Blocks it holds (nn.ModuleList indexes to a bare Module for type checkers).
        self.blocks: list[Block] = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))  # type: ignore[assignment]
        # Pre-norm models normalise the final residual; post-norm ones already ended on a norm.
        self.ln_final = make_norm(cfg) if cfg.normalization in ("pre", "rms") else None
        if cfg.unembed:
            # A tied unembedding shares W_E's weight: allocate none of its own (a [d_vocab, d_model] copy would
            # be built and initialised only to be dropped, a peak of twice the embedding's bytes).
            unembed = nn.Linear(cfg.d_model, cfg.d_vocab, bias=not cfg.tie_embeddings,
                                device="meta" if cfg.tie_embeddings else None)
            nn.Module.__setattr__(self, "W_U", unembed)
            if cfg.tie_embeddings:
                unembed.weight = self.embed.weight
        self.hook_embed = HookPoint()
        self.hook_pos_embed = HookPoint()
        self.tokenizer: Any = None
        self.name: str = "transformer"
        self.setup_hooks()

    # --- forward --------------------------------------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
    ) -> torch.Tensor:
        """Run the model.

        Args:
            tokens: ``[B, T]`` (or ``[T]``) integer token ids; with ``start_at_layer``, the residual stream
                ``[B, T, d_model]`` entering that block instead.
            attention_mask: ``[B, S]`` 1 for real tokens, 0 for padding, where S = cached + T.
            token_type_ids: ``[B, T]`` segment ids (models with ``n_token_types``).
            position_ids: ``[B, T]`` absolute positions (default: cache length + ``arange(T)``).
            context: ``[B, S_ctx, d_model]`` sequence for cross-attention (``cfg.cross_attention``).
            context_mask: ``[B, S_ctx]`` padding mask of the context.
            kv_cache: a :class:`KVCache` from :meth:`make_cache`; new K/V are appended and its length grows.
            start_at_layer: TransformerLens' ``start_at_layer``: skip the embedding and blocks ``0 ..
                start_at_layer - 1`` and feed ``tokens`` (a residual) to block ``start_at_layer`` (inclusive;
                negative counts from the end: -1 runs the last block and the unembedding). None: from the tokens.
            stop_at_layer: TransformerLens' ``stop_at_layer``: run blocks up to ``stop_at_layer - 1`` and return
                the residual stream entering block ``stop_at_layer`` (exclusive: 0 returns the embedding,
                ``n_layers`` the last block's output before the final norm; negative counts from the end). None:
                the whole model, through the unembedding.

        Returns:
            Logits ``[B, T, d_vocab]``, or final hidden states ``[B, T, d_model]`` when ``cfg.unembed`` is False;
            with ``stop_at_layer``, the residual stream ``[B, T, d_model]`` there.

        Raises:
            TypeError: tokens are not integers (a residual is not floating point with ``start_at_layer``).
            ValueError: shapes do not fit, tokens are out of the vocabulary, the sequence exceeds ``n_ctx``, a
                layer index is outside the model or ``start_at_layer`` is after ``stop_at_layer``, or a
                ``kv_cache`` with a pass that skips layers (their caches would fall behind).

        Example:
            >>> import torch
            >>> from interp import ModelConfig, Transformer
            >>> model = Transformer(ModelConfig(n_layers=3, d_model=16, n_heads=2, d_vocab=11, n_ctx=8))
            >>> tokens = torch.tensor([[1, 2, 3]])
            >>> resid = model(tokens, stop_at_layer=1)                      # the residual entering block 1
            >>> torch.allclose(model(resid, start_at_layer=1), model(tokens))
            True
        """
        start, stop = self._layer_range(start_at_layer, stop_at_layer)
        if kv_cache is not None and (start > 0 or stop < self.cfg.n_layers):
            raise ValueError(f"kv_cache with start_at_layer={start_at_layer} / stop_at_layer={stop_at_layer}: the "
                             f"layers outside {start}..{stop - 1} would not store this pass's keys and values")
        # Hooks and gates are shared state: hold the model's lock so a pass never mixes another thread's.
        with self.lock:
            return self._forward(tokens, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                 position_ids=position_ids, context=context, context_mask=context_mask,
                                 kv_cache=kv_cache, start_at_layer=start_at_layer, stop_at_layer=stop_at_layer)

    def _layer_range(self, start_at_layer: int | None, stop_at_layer: int | None) -> tuple[int, int]:
        """``start_at_layer`` / ``stop_at_layer`` (TransformerLens' names, negative from the end) as the blocks
        ``start .. stop - 1`` that run."""
        L = self.cfg.n_layers
        bounds = []
        for name, value, default in (("start_at_layer", start_at_layer, 0), ("stop_at_layer", stop_at_layer, L)):
            if value is None:
                bounds.append(default)
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not -L <= value <= L:
                raise ValueError(f"{name}={value!r} must be an int in [{-L}, {L}] ({L} layers)")
            bounds.append(value + L if value < 0 else value)
        if bounds[0] > bounds[1]:
            raise ValueError(f"start_at_layer={start_at_layer} comes after stop_at_layer={stop_at_layer}")
        return bounds[0], bounds[1]

    def _forward(self, tokens: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                 context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None,
                 kv_cache: KVCache | None = None, start_at_layer: int | None = None, stop_at_layer: int | None = None,
                 enter: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        # forward without the lock and the cache check. enter(i, x) -> x (activation patching's growing pass only):
        # called before every block i from start_at_layer on with the residual about to enter it, returns the one
        # that enters; a layer may replace or add rows, k B rows that share the mask and positions of the input's
        # B rows. A cache then holds, in each layer, as many rows as enter gives that layer.
        cfg = self.cfg
        first, stop = self._layer_range(start_at_layer, stop_at_layer)
        if start_at_layer is None:
            tokens = self._check_tokens(tokens)
            B, T = tokens.shape
        else:
            tokens = self._check_residual(tokens, start_at_layer)
            B, T = tokens.shape[:2]
            if token_type_ids is not None:
                raise ValueError(f"token_type_ids given with start_at_layer={start_at_layer}: token types are "
                                 "part of the embedding, which a pass from a residual skips")
        start = 0 if kv_cache is None else kv_cache.length
        S = start + T
        if S > cfg.n_ctx:
            raise ValueError(f"sequence length {S} (cached {start} + new {T}) exceeds the model's n_ctx={cfg.n_ctx}")
        if kv_cache is not None and enter is None and kv_cache.batch_size != B:
            raise ValueError(f"kv_cache holds batch_size={kv_cache.batch_size}, tokens have batch {B}")
        key_keep = _check_mask("attention_mask", attention_mask, (B, S))
        if position_ids is None and cfg.positions_from_mask and key_keep is not None:
            # OPT: position = real tokens before this one (the mask covers the cached keys too).
            counted = key_keep.long().cumsum(-1) - 1  # [B, S]
            positions = counted[:, start:S].clamp(min=0).to(tokens.device)  # [B, T]
        elif position_ids is None:
            positions = torch.arange(start, S, device=tokens.device)
        else:
            positions = _check_ids("position_ids", position_ids, ((B, T), (T,)), cfg.n_ctx, "n_ctx")
        x = self._embed(tokens, positions, token_type_ids) if start_at_layer is None else tokens  # [B, T, M]
        mask = AttnMask(T=T, S=S, start=start, causal=cfg.causal, key_keep=key_keep, padded_queries_see_all=True)
        ctx_mask = None
        if context is not None:
            if not cfg.cross_attention:
                raise ValueError("context given but cfg.cross_attention is False")
            if context.dim() != 3 or context.shape[0] != B or context.shape[2] != cfg.d_model:
                raise ValueError(f"context has shape {tuple(context.shape)}, expected ({B}, S_ctx, {cfg.d_model})")
            ctx_keep = _check_mask("context_mask", context_mask, (B, context.shape[1]))
            ctx_mask = AttnMask(T=T, S=context.shape[1], start=0, causal=False, key_keep=ctx_keep)
        elif cfg.cross_attention:
            raise ValueError("cfg.cross_attention is True: pass context=[B, S_ctx, d_model]")
        try:
            masks = {B: mask}  # by the rows of the residual (a growing pass repeats the mask of B rows)
            for i in range(first, stop):
                if enter is not None:
                    x = enter(i, x)  # [k B, T, M]
                    if x.shape[0] not in masks:
                        masks[x.shape[0]] = mask.repeated(x.shape[0] // B)
                x = self.blocks[i](x, mask=masks[x.shape[0]], positions=positions, context=context,
                                   context_mask=ctx_mask, cache=None if kv_cache is None else kv_cache.layers[i])
        except BaseException:
            if kv_cache is not None:
                kv_cache.rewind(start)  # the layers advanced themselves: a pass that stopped leaves none ahead
            raise
        return x if stop_at_layer is not None else self.unembed_residual(x)

    def unembed_residual(self, resid: torch.Tensor) -> torch.Tensor:
        """The model's output head on a residual stream: the final norm, the unembedding and the final soft-cap
        (what :meth:`forward` does after the last block; ``forward(..., stop_at_layer=n_layers)`` gives its input).

        Args:
            resid: ``[..., d_model]``, e.g. ``[B, T, d_model]`` or only the last position ``[B, 1, d_model]``.

        Returns:
            Logits ``[..., d_vocab]``; for a model without unembedding (``cfg.unembed`` False), the final
            hidden states ``[..., d_model]``.

        Example:
            >>> import torch
            >>> from interp import ModelConfig, Transformer
            >>> model = Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=11, n_ctx=8))
            >>> tokens = torch.tensor([[1, 2, 3]])
            >>> resid = model(tokens, stop_at_layer=2)
            >>> torch.allclose(model.unembed_residual(resid[:, -1:]), model(tokens)[:, -1:], atol=1e-6)
            True
        """
        x = resid
        if self.ln_final is not None:
            x = self.ln_final(x)
        if self.unembed is None:
            return x
        logits = self.unembed(x)
        if self.cfg.final_softcap is not None:
            logits = torch.tanh(logits / self.cfg.final_softcap) * self.cfg.final_softcap  # Gemma 2's final soft-cap
        return logits

    def _check_residual(self, resid: torch.Tensor, start_at_layer: int) -> torch.Tensor:
        if not isinstance(resid, torch.Tensor) or not resid.dtype.is_floating_point:
            what = resid.dtype if isinstance(resid, torch.Tensor) else type(resid).__name__
            raise TypeError(f"with start_at_layer={start_at_layer} the input is the residual stream [B, T, "
                            f"d_model] (floating point), got {what}")
        if resid.dim() != 3 or resid.shape[0] == 0 or resid.shape[1] == 0 or resid.shape[2] != self.cfg.d_model:
            raise ValueError(f"with start_at_layer={start_at_layer} the input is the residual stream [B, T, "
                             f"{self.cfg.d_model}], got shape {tuple(resid.shape)}")
        return resid

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """The residual stream entering block 0: ``[B, T, M]``.

        Also the embedding of the traced decode step (:mod:`interp.decode`): it reads no shape as Python
        numbers, so that ``torch.fx`` can trace it.
        """
        cfg = self.cfg
        x = self.embed(tokens)  # [B, T, M]
        if cfg.embed_scale != 1.0:
            x = x * cfg.embed_scale  # Gemma's sqrt(d_model): the residual starts at the scaled embedding
        x = self.hook_embed(x)
        if self.pos_embed is not None:
            x = x + self.hook_pos_embed(self.pos_embed(positions)).expand_as(x)  # [T, M] or [B, T, M] -> [B, T, M]
        if self.W_tt is None and token_type_ids is not None:
            raise ValueError(f"token_type_ids given but model {self.name!r} has no token types "
                             f"(cfg.n_token_types={cfg.n_token_types})")
        if self.W_tt is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(tokens)
            else:
                token_type_ids = _check_ids("token_type_ids", token_type_ids, (tuple(tokens.shape),),
                                            cfg.n_token_types, "n_token_types")
            x = x + self.W_tt(token_type_ids)
        if self.embed_ln is not None:
            x = self.embed_ln(x)
        return x

    def _check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"tokens must be a torch.Tensor of ints, got {type(tokens).__name__}")
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
            raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        if tokens.dim() == 1:
            tokens = tokens[None]
        if tokens.dim() != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must have shape [batch, pos] with batch > 0 and pos > 0, "
                             f"got {tuple(tokens.shape)}")
        if tokens.dtype != torch.long:
            tokens = tokens.long()  # uint8 / int32 ids: nn.Embedding indexes with int64 only
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.cfg.d_vocab:
            raise ValueError(f"token ids must be in [0, {self.cfg.d_vocab}), got min {lo} and max {hi}")
        return tokens

    # --- decoding -------------------------------------------------------------------------------------
    def make_cache(self, batch_size: int = 1, max_len: int | None = None) -> KVCache:
        """A :class:`KVCache` matching this model's dtype and device (each layer's with its block's device)."""
        p = next(self.parameters())
        devices = [next(b.parameters()).device for b in self.blocks]
        device = p.device if all(d == p.device for d in devices) else devices
        return KVCache(self.cfg, batch_size=batch_size, max_len=max_len, dtype=p.dtype, device=device)

    def generate(self, tokens: torch.Tensor | str, max_new_tokens: int,
                 **kwargs: Unpack[GenerateOptions]) -> torch.Tensor | str | tuple[torch.Tensor | str, Trace]:
        """Generate ``max_new_tokens`` after ``tokens``: :func:`interp.generate.generate` (greedy by default;
        sampling, stop tokens, hooks during generation and the trace of the result are documented there).

        Args:
            tokens: prompt ids ``[B, T]`` (or ``[T]``), or a prompt text, as TransformerLens takes: text is
                tokenized with :meth:`to_tokens` and the result comes back as text.
            max_new_tokens: how many tokens to append.
            kwargs: the options of :func:`interp.generate.generate`.

        Returns:
            Ids in, ids out: ``[B, T + new]``. Text in, text out: the prompt and its continuation decoded
            without special tokens. With ``return_trace=True``, ``(ids or text, trace)``.

        Raises:
            ValueError: text for a model without a tokenizer, and the errors of :func:`interp.generate.generate`.

        Example:
            >>> import torch
            >>> from interp import ModelConfig, Transformer
            >>> from interp.zoo.induction import TokenIdTokenizer
            >>> _ = torch.manual_seed(0)  # the random weights; a continuation with the BOS id would print fewer words
            >>> model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=11, n_ctx=16))
            >>> model.generate(torch.tensor([[1, 2, 3]]), 4, temperature=0.8, seed=0).shape
            torch.Size([1, 7])
            >>> model.tokenizer = TokenIdTokenizer(11, bos_id=0)
            >>> text = model.generate("t1 t2 t3", 4)
            >>> text.startswith("t1 t2 t3 "), len(text.split())
            (True, 7)
        """
        from .generate import generate

        if not isinstance(tokens, str):
            return generate(self, tokens, max_new_tokens, **kwargs)
        out = generate(self, self.to_tokens(tokens), max_new_tokens, **kwargs)
        ids = out[0] if isinstance(out, tuple) else out  # [1, T + new]
        text = self._need_tokenizer().decode(ids[0].tolist(), skip_special_tokens=True)
        return (text, out[1]) if isinstance(out, tuple) else text

    def decoding(self, batch_size: int = 1) -> contextlib.AbstractContextManager[Transformer]:
        """Lay the weights out once for decoding ``batch_size`` sequences, for every :meth:`generate` in the
        block: :func:`interp.decode.decoding`.

        Example:
            >>> import torch
            >>> from interp import ModelConfig, Transformer
            >>> model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=11, n_ctx=16))
            >>> with model.decoding(batch_size=1):
            ...     outs = [model.generate(torch.tensor([p]), 4) for p in ([1, 2], [3, 4])]
        """
        from .decode import decoding

        return decoding(self, batch_size)

    # --- gates ----------------------------------------------------------------------------------------
    def set_head_gates(self, gates: torch.Tensor | Sequence[torch.Tensor] | None) -> None:
        """Set a multiplier for every head, or ``None`` to remove all gates.

        Args:
            gates: ``[n_layers, n_heads]``, or (for a model whose layers have their own head counts after
                :func:`interp.pruning.remove_heads`) a list of ``n_layers`` tensors of shape ``[H_layer]``.

        Raises:
            ValueError: wrong shape.
        """
        L = self.cfg.n_layers
        counts = [block.attn.n_heads for block in self.blocks]
        with self.lock:
            self._set_head_gates(gates, L, counts)

    def _set_head_gates(self, gates, L: int, counts: list[int]) -> None:
        if gates is not None:
            if isinstance(gates, torch.Tensor):
                if len(set(counts)) != 1 or gates.shape != (L, counts[0]):
                    want = f"({L}, {counts[0]})" if len(set(counts)) == 1 else f"a list of [H_layer] tensors {counts}"
                    raise ValueError(f"gates must have shape {want}, got {tuple(gates.shape)}")
            elif isinstance(gates, (list, tuple)):
                if len(gates) != L:
                    raise ValueError(f"gates is a list of {len(gates)} tensors, expected one per layer ({L})")
            else:
                raise ValueError(f"gates must be a Tensor of shape ({L}, H) or a list of tensors, "
                                 f"got {type(gates).__name__}")
        # Validate every layer's gate before setting any, so a bad one leaves the model as it was.
        before = [block.attn.gate for block in self.blocks]
        try:
            for layer, block in enumerate(self.blocks):
                block.attn.set_gate(None if gates is None else gates[layer])
        except (TypeError, ValueError):
            for block, gate in zip(self.blocks, before):
                block.attn.gate = gate
            raise

    def set_query_chunk(self, chunk: int | None) -> None:
        """Compute explicit-path attention ``chunk`` queries at a time (bounds pattern memory)."""
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int)):
            raise TypeError(f"query chunk must be an int or None, got {chunk!r}")
        if chunk is not None and chunk <= 0:
            raise ValueError(f"query chunk must be > 0, got {chunk}")
        for block in self.blocks:
            block.attn.query_chunk = chunk

    # --- weight views (interp/weights.py; TL layout, GQA K/V repeated per query head) -----------------
    W_Q = property(lambda self: _weights.stacked(self, "W_Q"), doc="Query weights ``[L, H, M, D]``.")
    W_K = property(lambda self: _weights.stacked(self, "W_K"), doc="Key weights ``[L, H, M, D]``, per query head.")
    W_V = property(lambda self: _weights.stacked(self, "W_V"), doc="Value weights ``[L, H, M, D]``, per query head.")
    W_O = property(lambda self: _weights.stacked(self, "W_O"), doc="Output weights ``[L, H, D, M]``.")
    QK = property(lambda self: _weights.QK(self), doc="``W_Q W_K^T`` per head, factored ``[L, H, M, M]``.")
    OV = property(lambda self: _weights.OV(self), doc="``W_V W_O`` per head, factored ``[L, H, M, M]``.")

    # --- recording ------------------------------------------------------------------------------------
    def run_with_cache(self, tokens: torch.Tensor, *, names_filter: NamesFilter = None,
                       layers: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                       device: torch.device | str | None = None, reducers: Sequence[Reducer] = (),
                       offload: str | None = None, **kwargs: Unpack[ForwardOptions]) -> tuple[torch.Tensor, Trace]:
        """Run the model and record the selected hook points.

        Args:
            tokens: as :meth:`forward`.
            names_filter: a hook name, glob pattern, list, or predicate; ``None`` records everything.
            layers, dtype, device, reducers, offload: the recording options of :func:`interp.streaming.record`.
            kwargs: the keyword arguments of :meth:`forward` (:class:`ForwardOptions`).

        Returns:
            ``(output, trace)``; ``trace[name]`` is the recorded tensor.

        Example:
            >>> from interp.examples import model, tokens
            >>> logits, cache = model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_pattern"])
            >>> cache["blocks.0.attn.hook_pattern"].shape
        """
        from .streaming import record

        return record(self, tokens, names_filter=names_filter, layers=layers, dtype=dtype, device=device,
                      reducers=reducers, offload=offload, **kwargs)

    # --- TransformerLens-style weights and tokens ----------------------------------------------------
    # The weights are views of the modules' parameters (no copy: editing one edits the other, gradients flow).
    @property
    def embed(self) -> nn.Embedding:
        """The token embedding module (its parameter is stored as ``W_E.weight``)."""
        # Registered in __init__; a quantized model's is an interp.quantized.QuantizedEmbedding with the same
        # weight / forward interface.
        return cast(nn.Embedding, self._modules["W_E"])

    @property
    def pos_embed(self) -> nn.Embedding | None:
        """The learned position embedding module (``W_pos.weight``), or ``None`` (rotary / no positions)."""
        return cast("nn.Embedding | None", self._modules.get("W_pos"))

    @property
    def unembed(self) -> nn.Linear | None:
        """The unembedding module (``W_U.weight`` ``[d_vocab, d_model]``), or ``None`` for an encoder."""
        return cast("nn.Linear | None", self._modules.get("W_U"))

    @property
    def W_E(self) -> torch.Tensor:
        """Token embeddings ``[d_vocab, d_model]`` (TransformerLens' ``W_E``; the embedding's own parameter).

        Example:
            >>> from interp import ModelConfig, Transformer
            >>> Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=11, n_ctx=4)).W_E.shape
            torch.Size([11, 8])
        """
        return self.embed.weight

    @property
    def W_pos(self) -> torch.Tensor | None:
        """Learned position embeddings ``[n_ctx, d_model]``, or ``None`` for models without them (rotary)."""
        return None if self.pos_embed is None else self.pos_embed.weight

    @property
    def W_U(self) -> torch.Tensor | None:
        """The unembedding ``[d_model, d_vocab]`` (TransformerLens' ``W_U``: ``resid @ model.W_U`` gives logits
        less ``b_U``), a transposed view of the linear's weight; ``None`` for a model without unembedding.

        Example:
            >>> from interp import ModelConfig, Transformer
            >>> model = Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=11, n_ctx=4))
            >>> model.W_U.shape, model.W_U.data_ptr() == model.unembed.weight.data_ptr()
            (torch.Size([8, 11]), True)
        """
        return None if self.unembed is None else self.unembed.weight.T

    @property
    def b_U(self) -> torch.Tensor | None:
        """The unembedding bias ``[d_vocab]``; zeros (a new tensor) when the unembedding has none (tied
        embeddings), as in TransformerLens; ``None`` for a model without unembedding."""
        if self.unembed is None:
            return None
        if self.unembed.bias is not None:
            return self.unembed.bias
        w = self.unembed.weight
        return torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (no special tokens added).

        Args:
            string: e.g. ``" Paris"`` (byte-level tokenizers keep the leading space in the token).

        Returns:
            The token id.

        Raises:
            ValueError: the model has no tokenizer, or ``string`` is not exactly one token (the pieces named).

        Example:
            >>> from interp import ModelConfig, Transformer
            >>> from interp.zoo.induction import TokenIdTokenizer
            >>> model = Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=11, n_ctx=4))
            >>> model.tokenizer = TokenIdTokenizer(11, bos_id=0)
            >>> model.to_single_token("t7")
            7
        """
        if not isinstance(string, str):
            raise TypeError(f"to_single_token takes a str, got {type(string).__name__}")
        ids = self._need_tokenizer().to_tokens(string, prepend_bos=False, special_tokens=False)[0].tolist()
        if len(ids) != 1:
            pieces = self._need_tokenizer().to_str_tokens(ids)
            raise ValueError(f"{string!r} is {len(ids)} tokens {pieces!r} for {self.name!r}, not one")
        return ids[0]

    def to_string(self, tokens: int | Sequence[int] | torch.Tensor) -> str | list[str]:
        """Token ids back to text, special tokens kept (TransformerLens' ``to_string``).

        Args:
            tokens: one id, a sequence of ids (``[T]``), or a batch ``[B, T]``.

        Returns:
            One string, or a list of ``B`` strings for a batch.

        Raises:
            ValueError: the model has no tokenizer, or ``tokens`` has more than 2 dimensions.

        Example:
            >>> import torch
            >>> from interp import ModelConfig, Transformer
            >>> from interp.zoo.induction import TokenIdTokenizer
            >>> model = Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=11, n_ctx=4))
            >>> model.tokenizer = TokenIdTokenizer(11, bos_id=0)
            >>> model.to_string(torch.tensor([[0, 3, 5]]))
            ['<bos> t3 t5']
        """
        tok = self._need_tokenizer()
        ids = torch.as_tensor(tokens)
        if ids.dim() > 2:
            raise ValueError(f"to_string takes ids [T] or [B, T], got shape {tuple(ids.shape)}")
        if ids.dim() == 2:
            return [tok.decode(row.tolist(), skip_special_tokens=False) for row in ids]
        return tok.decode(ids.reshape(-1).tolist(), skip_special_tokens=False)  # a 0-d id as [1]

    # --- tokenizer helpers ----------------------------------------------------------------------------
    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(f"model {self.name!r} has no tokenizer; pass token ids instead")
        return self.tokenizer

    def to_tokens(self, text: str | Sequence[str], *, max_length: int | None = None,
                  prepend_bos: bool | None = None) -> torch.Tensor:
        """Tokenize text (with the model's special tokens) to ``[B, T]`` ids; pads a batch with pad ids.

        Text longer than the model's context is truncated to ``cfg.n_ctx`` tokens with a warning naming the limit.

        Args:
            text: one string or a list of strings.
            max_length: truncate to this many ids (default: ``cfg.n_ctx``, with a warning).
            prepend_bos: ``None`` (default): the special tokens the model's tokenizer adds (SmolLM2 adds none,
                BERT ``[CLS] ... [SEP]``); ``True``: start every sequence with the BOS id unless it already does;
                ``False``: drop the leading special token the tokenizer adds (trailing ones, BERT's ``[SEP]``, stay).

        Example:
            >>> from interp import ModelConfig, Transformer
            >>> from interp.zoo.induction import TokenIdTokenizer
            >>> model = Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=11, n_ctx=4))
            >>> model.tokenizer = TokenIdTokenizer(11, bos_id=0)
            >>> model.to_tokens("t3 t5").tolist(), model.to_tokens("t3 t5", prepend_bos=False).tolist()
            ([[0, 3, 5]], [[3, 5]])
        """
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise ValueError(f"max_length={max_length!r} must be a positive int or None (the model's n_ctx)")
        if prepend_bos is not None and not isinstance(prepend_bos, bool):
            raise TypeError(f"prepend_bos must be True, False or None, got {prepend_bos!r}")
        tok = self._need_tokenizer()
        bos = {} if prepend_bos is None else {"prepend_bos": prepend_bos}
        if max_length is not None:
            return tok.to_tokens(text, max_length=max_length, **bos)
        n_ctx = self.cfg.n_ctx
        ids = tok.to_tokens(text, max_length=n_ctx + 1, **bos)  # one token over says whether anything was cut
        if ids.shape[1] > n_ctx:
            warnings.warn(f"input truncated to {n_ctx} tokens, the context limit of {self.name!r} (n_ctx={n_ctx})",
                          stacklevel=2)
            ids = tok.to_tokens(text, max_length=n_ctx, **bos)
        return ids

    def to_str_tokens(self, tokens: str | torch.Tensor) -> list[str]:
        """The token strings of one sequence (text or ids)."""
        tok = self._need_tokenizer()
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens)
        if isinstance(tokens, torch.Tensor):
            if tokens.dim() == 2:
                if tokens.shape[0] != 1:
                    raise ValueError(f"to_str_tokens takes one sequence, got batch {tokens.shape[0]}")
                tokens = tokens[0]
            return tok.to_str_tokens(tokens.tolist())
        return tok.to_str_tokens(tokens)

    def extra_repr(self) -> str:
        c = self.cfg
        heads = c.n_heads if c.layer_n_heads is None else c.layer_n_heads
        text = (f"name={self.name!r}, kind={c.kind}, layers={c.n_layers}, heads={heads}, "
                f"kv_heads={c.n_kv_heads}, d_model={c.d_model}, causal={c.causal}")
        if c.n_experts:
            # A mixture of experts stores all E experts but runs k per token: both counts describe its size.
            from .flops import parameter_counts

            n = parameter_counts(c)
            text += (f", experts={c.n_experts} (top-{c.n_experts_per_token}), "
                     f"params={n['total']:,} total / {n['active']:,} active per token")
        from .quantized import quantized_weights

        kept = quantized_weights(self)
        if kept:  # weights that stay in GGUF blocks: what they take, against float32
            stored = sum(w.nbytes for _, w in kept)
            kinds = "/".join(dict.fromkeys(k for _, w in kept for k in w.kinds))
            text += (f", quantized={len(kept)} weights in {kinds} blocks: {stored:,} bytes "
                     f"({sum(w.rows * w.cols * 4 for _, w in kept):,} in float32)")
        return text


def _check_mask(name: str, mask: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor | None:
    """Validate a [B, S] padding mask; returns it as bool, or None when nothing is masked."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {shape}")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        bad = mask[(mask != 0) & (mask != 1)].flatten()[:3].tolist()
        raise ValueError(f"{name} must hold only 0 (padding) and 1 (keep), got values such as {bad}")
    keep = mask.bool()
    return None if bool(keep.all()) else keep


def _check_ids(name: str, ids: torch.Tensor, shapes: tuple[tuple[int, ...], ...], size: int,
               size_name: str) -> torch.Tensor:
    """Validate integer ids (positions, token types) against their allowed shapes and range [0, size)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of ints, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise TypeError(f"{name} must be integer ids, got dtype {ids.dtype}")
    if tuple(ids.shape) not in shapes:
        raise ValueError(f"{name} has shape {tuple(ids.shape)}, expected {shapes[0]}")
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= size:
            raise ValueError(f"{name} must be in [0, {size_name}={size}), got min {lo} and max {hi}")
    return ids.long()
