"""The attention-level route: any transformers decoder that calls its attention through transformers'
``AttentionInterface``, with interp's attention hook points, head gates and :class:`~interp.trace.Trace`.

transformers 5 decoders compute queries, keys and values (after rotary and QK-norm) in their own attention
module and hand them to ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` together with the mask, the
scaling, the window, soft-cap and sinks; the function returns the per-head output before ``o_proj``. This
module registers one such function (``"interp_sdpa"`` / ``"interp_eager"``, the mask built as for the
implementation the model had) and wraps the model in :class:`RouteModel`, which offers what the analyses use of
an :class:`interp.Transformer`: ``run_with_cache``, ``run_with_hooks``, hooks under the same names
(``blocks.{l}.attn.hook_pattern`` ...), head gates, ``cfg`` with head counts per layer, tokens <-> text.

It is an adapter over transformers' own forward, not a second forward: with nothing hooked or gated inside
attention, the function calls the implementation the model had (``sdpa`` or the family's ``eager``) with the
same arguments, so the logits are transformers' to the bit. Recording scores or patterns, sinks and soft-caps
take the explicit path, which is the eager formula (patterns equal ``output_attentions`` of an eager model).

Shape glossary (as :mod:`interp.attention`): B batch, T queries, S keys, H query heads, K K/V heads,
D head width, M d_model.

What the route cannot do is refused by name, pointing to the native route (:func:`interp.zoo.hf.from_hf` for a
family with a converter): physical head removal (no fused ``W_qkv`` to slice), per-head weight views and
composition scores (the family's attention may hold norms, partial rotary or biases between the weights),
interp's KV cache and the fast decode step, query chunking.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import _AttentionBase
from ..config import LayerShape, head_sharing
from ..hooks import HookedModule, HookPoint, NamesFilter
from ..model import Transformer

__all__ = ["ROUTE_NAME", "RouteAttention", "RouteConfig", "RouteModel", "uses_attention_interface", "wrap"]

#: How the route names itself in warnings and refusals.
ROUTE_NAME = "interp.zoo.hf_route (the attention-level route)"
_NATIVE_HINT = ("it needs the native route: a family with a converter (interp.zoo.hf.CONVERTERS) loaded with "
                "interp.zoo.from_hf")
# The implementation a model had -> the name the route registers for it (the mask is built the same way).
_IMPL = {"sdpa": "interp_sdpa", "eager": "interp_eager"}
_REGISTERED = False
_UNKNOWN = "unknown on the attention-level route"


def refuse(what: str) -> ValueError:
    """The error for a feature the route does not offer (named, with the way to the native route).

    Example:
        >>> from interp.zoo.hf_route import refuse
        >>> str(refuse("remove_heads")).startswith("remove_heads is not available")
        True
    """
    return ValueError(f"{what} is not available on {ROUTE_NAME}: {_NATIVE_HINT}")


def _register() -> None:
    """Register the route's attention and mask functions with transformers (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    for impl, mask in (("sdpa", sdpa_mask), ("eager", eager_mask)):
        AttentionInterface.register(_IMPL[impl], _route_attention)
        AttentionMaskInterface.register(_IMPL[impl], mask)
    _REGISTERED = True


def _route_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The function transformers calls in every attention layer of a wrapped model."""
    attn = module.__dict__.get("_interp_route")
    if attn is None:
        raise ValueError(f"{type(module).__name__} runs with attn_implementation="
                         f"{module.config._attn_implementation!r} but was not wrapped by {ROUTE_NAME}; "
                         "wrap the model with interp.zoo.hf_route.wrap")
    return attn.attend(module, query, key, value, attention_mask, **kwargs)


def _original_function(module: nn.Module, impl: str) -> Callable[..., Any]:
    """The attention function ``module`` called before it was wrapped (sdpa, or its family's eager)."""
    from transformers import AttentionInterface

    if impl == "eager":
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise ValueError(f"{type(module).__name__}: its module has no eager_attention_forward to call")
        return fn
    found: Any = AttentionInterface._global_mapping[impl]
    return found


def uses_attention_interface(hf_model: nn.Module) -> bool:
    """Whether a transformers model's attention goes through ``AttentionInterface`` (what the route needs).

    Example:
        >>> from interp.zoo.hf_route import uses_attention_interface
        >>> from transformers import OlmoConfig, OlmoForCausalLM
        >>> uses_attention_interface(OlmoForCausalLM(OlmoConfig(num_hidden_layers=1, hidden_size=16,
        ...     intermediate_size=32, num_attention_heads=2, vocab_size=20)))
        True
    """
    for m in hf_model.modules():
        src = sys.modules.get(type(m).__module__)
        if src is not None and "ALL_ATTENTION_FUNCTIONS" in vars(src) and type(m).__name__.endswith("Attention"):
            return True
    return False


def _causal_allowed(T: int, S: int, device: torch.device) -> torch.Tensor:
    """``[1, 1, T, S]`` bool: the plain causal rule for T queries that end at key S - 1."""
    q = torch.arange(S - T, S, device=device)
    return (torch.arange(S, device=device)[None, :] <= q[:, None])[None, None]  # [1, 1, T, S]


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, K, S, D]`` -> ``[B, K*G, S, D]``, each K/V head repeated for its G query heads (as transformers)."""
    if groups == 1:
        return x
    B, K, S, D = x.shape
    return x[:, :, None].expand(B, K, groups, S, D).reshape(B, K * groups, S, D)  # [B, H, S, D]


class RouteAttention(nn.Module):
    """interp's attention hook points and head gate around one transformers attention module.

    Hooks (TransformerLens names and shapes): ``hook_q`` ``[B, T, H, D]``, ``hook_k`` / ``hook_v``
    ``[B, S, K, D]`` (after rotary and norms, as transformers hands them over), ``hook_attn_scores`` and
    ``hook_pattern`` ``[B, H, T, S]``, ``hook_z`` ``[B, T, H, D]``, ``hook_result`` ``[B, T, H, M]`` (through
    the module's output projection split per head). With learned sinks (gpt-oss) the pattern holds the real
    keys' probabilities, as transformers' ``output_attentions``: the sink's mass is ``1 - pattern.sum(-1)``.

    Attributes:
        n_heads, n_kv_heads, d_head: found by a first pass (0 heads on a layer without attention).
        gate: ``[H]`` multiplier on z before the output projection, or None.
    """

    def __init__(self, n_heads: int, n_kv_heads: int, d_head: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()
        self.hook_z, self.hook_result = HookPoint(), HookPoint()
        self.gate: torch.Tensor | None = None
        # transformers' modules, held outside the module tree (they belong to the wrapped model's).
        self._refs: dict[str, Any] = {"o_proj": None, "fast": None}
        self._pending: torch.Tensor | None = None  # hook_result's replacement of the output projection's output

    set_gate = _AttentionBase.set_gate  # one validation of gates for both routes

    @property
    def W_O(self) -> nn.Linear:
        """The module's output projection (``o_proj`` / ``out_proj`` / ``dense``...), a ``[M, H*D]`` linear."""
        o_proj = self._refs["o_proj"]
        if o_proj is None:
            raise refuse("per-head writes (hook_result) of a model whose output projection was not found")
        return o_proj

    @property
    def W_O_heads(self) -> torch.Tensor:
        """The output projection split by head: ``[H, D, M]`` (head h writes ``z_h @ W_O_heads[h]``)."""
        return self.W_O.weight.T.reshape(self.n_heads, self.d_head, -1)  # [H*D, M] -> [H, D, M]

    @property
    def W_qkv(self) -> torch.Tensor:
        raise refuse("the fused W_qkv (per-head weight views, composition scores, remove_heads)")

    def _explicit(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, *, dropout: float, scaling: float | None,
                  softcap: float | None, sinks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' eager formula with the score and pattern hooks: z ``[B, T, H, D]``, pattern."""
        B, H, T, _ = q.shape
        S = k.shape[2]
        scale = q.shape[-1] ** -0.5 if scaling is None else scaling
        k, v = _repeat_kv(k, H // k.shape[1]), _repeat_kv(v, H // v.shape[1])  # [B, H, S, D]
        scores = torch.matmul(q, k.transpose(2, 3)) * scale  # [B, H, T, S]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap  # before the mask, as the eager functions do
        if mask is None:  # the sdpa mask leaves a plain causal mask to the kernel
            mask = _causal_allowed(T, S, q.device)
        if mask.dtype == torch.bool:  # the additive mask eager_mask builds from the same bool mask
            mask = torch.zeros(mask.shape, dtype=scores.dtype, device=q.device).masked_fill_(
                ~mask, torch.finfo(scores.dtype).min)
        scores = self.hook_attn_scores(scores + mask[:, :, :, :S])
        if sinks is None:
            pattern = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:  # gpt-oss: a per-head sink logit takes softmax mass and is dropped
            sink = sinks.reshape(1, -1, 1, 1).expand(B, -1, T, -1)  # [B, H, T, 1]
            both = torch.cat([scores, sink.to(scores.dtype)], dim=-1)  # [B, H, T, S + 1]
            both = both - both.max(dim=-1, keepdim=True).values
            pattern = F.softmax(both, dim=-1, dtype=both.dtype)[..., :-1]  # [B, H, T, S]
        pattern = self.hook_pattern(pattern)
        pattern_v = F.dropout(pattern, p=dropout, training=module.training).to(v.dtype)
        z = torch.matmul(pattern_v, v).transpose(1, 2).contiguous()  # [B, T, H, D]
        return z, pattern

    def _needs_explicit(self, kwargs: dict[str, Any]) -> bool:
        return (self.hook_attn_scores.active or self.hook_pattern.active or kwargs.get("s_aux") is not None
                or kwargs.get("softcap") is not None or bool(kwargs.get("output_attentions")))

    def attend(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """What the attention function returns: z ``[B, T, H, D]`` (before ``o_proj``) and the pattern or None.

        ``query`` ``[B, H, T, D]``, ``key`` / ``value`` ``[B, K, S, D]``, ``mask`` the model's mask for this
        layer (bool, additive or None: plain causal).
        """
        fast = self._refs["fast"]
        if self.hook_q.active:
            query = self.hook_q(query.transpose(1, 2)).transpose(1, 2)  # [B, T, H, D] for the hook
        if self.hook_k.active:
            key = self.hook_k(key.transpose(1, 2)).transpose(1, 2)  # [B, S, K, D] for the hook
        if self.hook_v.active:
            value = self.hook_v(value.transpose(1, 2)).transpose(1, 2)  # [B, S, K, D] for the hook
        weights: Any = None
        if self._needs_explicit(kwargs):
            z, weights = self._explicit(module, query, key, value, mask, dropout=kwargs.get("dropout", 0.0),
                                        scaling=kwargs.get("scaling"), softcap=kwargs.get("softcap"),
                                        sinks=kwargs.get("s_aux"))
        else:  # nothing reads the pattern: the implementation the model had, with the same arguments
            z, weights = fast(module, query, key, value, mask, **kwargs)
        B, T, H, D = z.shape
        if self.hook_z.active:
            z = self.hook_z(z)
        if self.gate is not None:
            z = z * self.gate.to(z.dtype).view(1, 1, H, 1)  # [B, T, H, D]
        if self.hook_result.active:
            # Each head's residual write z_h W_O[h]; their sum (plus bias) replaces o_proj's output.
            result = self.hook_result(torch.einsum("bthd,hdm->bthm", z, self.W_O_heads))  # [B, T, H, M]
            out = result.sum(dim=2)  # [B, T, M]
            bias = self.W_O.bias
            self._pending = out if bias is None else out + bias
        return z, weights

    def _o_proj_hook(self, _module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
        pending, self._pending = self._pending, None
        return pending

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}, kv_heads={self.n_kv_heads}, d_head={self.d_head}"


class RouteBlock(nn.Module):
    """The hook points of one decoder layer: ``hook_resid_pre`` (the layer's input), ``hook_attn_out`` (the
    attention module's output), ``hook_resid_post`` (the layer's output), and its :class:`RouteAttention`."""

    def __init__(self, attn: RouteAttention) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()
        self.mlp = None  # the family's MLP is not addressed by the route


@dataclass
class RouteConfig:
    """What analyses read of ``model.cfg``, for a model on the route (head counts per layer, windows, sizes).

    Example:
        >>> from interp.zoo.hf_route import RouteConfig
        >>> cfg = RouteConfig(n_layers=2, d_model=16, d_vocab=20, n_ctx=32, layer_n_heads=[4, 0],
        ...                   layer_n_kv_heads=[2, 0], d_head=4, windows=[None, None])
        >>> cfg.n_heads, cfg.layer(0).kv_map, cfg.layer(1).n_heads
        (4, (0, 0, 1, 1), 0)
    """

    n_layers: int
    d_model: int
    d_vocab: int
    n_ctx: int
    layer_n_heads: list[int]
    layer_n_kv_heads: list[int]
    d_head: int
    windows: list[int | None]
    model_type: str = ""
    # Fixed for the route: a causal decoder whose blocks interp does not describe further.
    causal: bool = True
    attn_only: bool = False
    unembed: bool = True
    n_experts: int = 0
    attention: str = "standard"
    # The family's norms and block layout stay transformers' business: analyses that need them refuse, quoting this.
    normalization: str = _UNKNOWN
    parallel_block: str = _UNKNOWN
    sublayer_norm: str = _UNKNOWN
    qk_norm: str = _UNKNOWN
    cross_attention: bool = False
    final_softcap: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_heads(self) -> int:
        return max(self.layer_n_heads, default=0)

    @property
    def n_kv_heads(self) -> int:
        return max(self.layer_n_kv_heads, default=0)

    @property
    def kind(self) -> str:
        """``"mha"``, ``"gqa"`` or ``"mqa"`` (as :attr:`interp.ModelConfig.kind`)."""
        return head_sharing(self.n_heads, self.n_kv_heads)

    def heads_in_layer(self, layer: int) -> int:
        return self.layer(layer).n_heads

    def layer(self, layer: int) -> LayerShape:
        """The attention shape of ``layer`` (0 heads on a layer without attention)."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer={layer!r} is outside [0, {self.n_layers})")
        h, k = self.layer_n_heads[layer], self.layer_n_kv_heads[layer]
        return LayerShape(n_heads=h, n_kv_heads=k, d_head=self.d_head,
                          kv_map=tuple(i // (h // k) for i in range(h)) if h else ())

    def kv_map(self, layer: int) -> list[int]:
        return list(self.layer(layer).kv_map)

    def window(self, layer: int) -> int | None:
        return self.windows[layer]

    def is_moe_layer(self, layer: int) -> bool:
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"route": ROUTE_NAME, "model_type": self.model_type, "n_layers": self.n_layers,
                "d_model": self.d_model, "d_vocab": self.d_vocab, "n_ctx": self.n_ctx,
                "layer_n_heads": self.layer_n_heads, "layer_n_kv_heads": self.layer_n_kv_heads,
                "d_head": self.d_head, "windows": self.windows}

    def to_json(self) -> str:
        import json

        return json.dumps(self.to_dict(), sort_keys=True)


def _decoder_layers(hf_model: nn.Module, n_layers: int) -> nn.ModuleList:
    """The ModuleList of the model's ``n_layers`` decoder layers."""
    found = [m for name, m in hf_model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers
             and name.split(".")[-1] in ("layers", "h", "blocks", "layer", "decoder_layers")]
    if len(found) != 1:
        raise ValueError(f"{type(hf_model).__name__}: cannot tell its list of {n_layers} decoder layers "
                         f"(found {len(found)} candidates); {ROUTE_NAME} needs one")
    return found[0]


def _output_projection(module: nn.Module, width: int) -> nn.Linear | None:
    """The linear child of an attention module that reads the ``width = H * D`` wide per-head output."""
    preferred = ("o_proj", "out_proj", "dense", "c_proj", "wo", "o")
    linears = [(n, m) for n, m in module.named_children() if isinstance(m, nn.Linear) and m.in_features == width]
    linears.sort(key=lambda nm: preferred.index(nm[0]) if nm[0] in preferred else len(preferred))
    return linears[0][1] if linears else None


_MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "ffn")


def _norm_view(norm: nn.Module, d_model: int) -> tuple[nn.Module | None, str]:
    """A torch RMSNorm or LayerNorm that shares ``norm``'s weights and computes what it computes on a random
    input (checked), with its ``cfg.normalization`` name; ``(None, "")`` when neither does (Gemma's ``1 + w``)."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if weight is not None and not isinstance(weight, nn.Parameter):
        return None, ""
    # OLMo's LayerNorm hard-codes its eps: try the usual ones where the module does not say.
    eps_values = [eps] if isinstance(eps, float) else [1e-5, 1e-6]
    g = torch.Generator().manual_seed(0)
    p = next(norm.parameters(), None)
    x = (torch.randn(2, 5, d_model, generator=g) * 3 + 1).to(_device(norm), p.dtype if p is not None else None)
    candidates: list[tuple[nn.Module, str]] = []
    for e in eps_values:
        candidates.append((nn.RMSNorm(d_model, eps=e, elementwise_affine=weight is not None), "rms"))
        if isinstance(bias, nn.Parameter) or bias is None:
            candidates.append((nn.LayerNorm(d_model, eps=e, elementwise_affine=weight is not None,
                                            bias=bias is not None), "pre"))
    with torch.no_grad():
        want = norm(x)
        for view, kind in candidates:
            if weight is not None:
                view.weight = weight  # shared: the view reads the family's parameters
            if kind == "pre" and bias is not None:
                view.bias = bias
            view.to(x.device)
            if view(x).shape == want.shape and torch.allclose(view(x), want, rtol=1e-5, atol=1e-5):
                return view, kind
    return None, ""


def _hidden(x: Any) -> torch.Tensor:
    """A layer's or attention module's output tensor (a tensor, or the first item of a tuple)."""
    return x[0] if isinstance(x, (tuple, list)) else x


def _with_hidden(x: Any, h: torch.Tensor) -> Any:
    return (h, *x[1:]) if isinstance(x, tuple) else h


class RouteModel(HookedModule):
    """A transformers decoder on the attention-level route: the analyses' view of an interp Transformer.

    Build it with :func:`wrap` (or :func:`interp.zoo.load` / :func:`interp.zoo.from_hf`, which fall back to it
    for a family without a native converter). ``model.native`` is False; ``model.hf`` is the wrapped
    transformers model (its weights are the route's, not copies).

    Example:
        >>> import torch
        >>> from interp.zoo.hf_route import wrap
        >>> from transformers import OlmoConfig, OlmoForCausalLM
        >>> hf = OlmoForCausalLM(OlmoConfig(num_hidden_layers=2, hidden_size=16, intermediate_size=32,
        ...                                 num_attention_heads=4, vocab_size=40))
        >>> model = wrap(hf)
        >>> logits, trace = model.run_with_cache(torch.tensor([[1, 2, 3]]), names_filter="*hook_pattern")
        >>> trace.pattern(1).shape, model.native
        (torch.Size([1, 4, 3, 3]), False)
    """

    native = False

    def __init__(self, hf_model: Any, *, name: str | None = None, tokenizer: Any = None) -> None:
        super().__init__()
        _register()
        hf_cfg = hf_model.config
        text_cfg = hf_cfg.get_text_config() if hasattr(hf_cfg, "get_text_config") else hf_cfg
        impl = hf_cfg._attn_implementation
        if impl in _IMPL.values():
            raise ValueError(f"{type(hf_model).__name__} is already wrapped by {ROUTE_NAME}")
        if impl not in _IMPL:
            raise ValueError(f"{type(hf_model).__name__} runs attn_implementation={impl!r}; {ROUTE_NAME} wraps "
                             f"models that run {sorted(_IMPL)} (load it with attn_implementation='sdpa')")
        if not uses_attention_interface(hf_model):
            raise ValueError(f"model_type={hf_cfg.model_type!r} ({type(hf_model).__name__}) computes attention "
                             f"in its own code, not through transformers' AttentionInterface: {ROUTE_NAME} "
                             f"cannot reach it; it needs a native converter (interp.zoo.hf.CONVERTERS)")
        n_layers = text_cfg.num_hidden_layers
        self.hf: Any = hf_model.eval()
        self.name = name or getattr(hf_cfg, "name_or_path", "") or hf_cfg.model_type
        self.tokenizer = tokenizer
        self._impl = impl
        layers = _decoder_layers(hf_model, n_layers)
        modules = self._discover(hf_model, impl, layers)
        attns = []
        for module, (H, K, D) in modules:
            attn = RouteAttention(H, K, D)
            if module is not None:
                object.__setattr__(module, "_interp_route", attn)  # plain attribute: not a submodule
                attn._refs["fast"] = _original_function(module, impl)
                attn._refs["o_proj"] = _output_projection(module, H * D)
                o_proj = attn._refs["o_proj"]
                if o_proj is not None:
                    o_proj.register_forward_hook(attn._o_proj_hook)
            attns.append(attn)
        self.blocks: list[RouteBlock] = nn.ModuleList(RouteBlock(a) for a in attns)  # type: ignore[assignment]
        self.hook_embed = HookPoint()
        windows = [getattr(m, "sliding_window", None) if m is not None else None for m, _ in modules]
        self.cfg = RouteConfig(
            n_layers=n_layers, d_model=text_cfg.hidden_size, d_vocab=text_cfg.vocab_size,
            n_ctx=getattr(text_cfg, "max_position_embeddings", None) or 2048,
            layer_n_heads=[s[0] for _, s in modules], layer_n_kv_heads=[s[1] for _, s in modules],
            d_head=max((s[2] for _, s in modules), default=0), windows=windows, model_type=hf_cfg.model_type)
        self._install_layer_hooks(layers, [m for m, _ in modules])
        self._enter: Callable[[int, torch.Tensor], torch.Tensor] | None = None
        self._additive_layout(layers, [m for m, _ in modules])
        self.setup_hooks()

    # --- construction ---------------------------------------------------------------------------------
    def _discover(self, hf_model: Any, impl: str, layers: nn.ModuleList
                  ) -> list[tuple[nn.Module | None, tuple[int, int, int]]]:
        """Each decoder layer's attention module and its (H, K, D), from one short pass through the route."""
        seen: list[tuple[nn.Module, tuple[int, int, int]]] = []

        def probe(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  mask: torch.Tensor | None, **kwargs: Any) -> Any:
            seen.append((module, (query.shape[1], key.shape[1], value.shape[-1])))
            return _original_function(module, impl)(module, query, key, value, mask, **kwargs)

        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        # A probe registered under its own name: the route's function must stay the one for wrapped models.
        AttentionInterface.register("interp_probe", probe)
        mask_fn: Any = AttentionMaskInterface._global_mapping[impl]
        AttentionMaskInterface.register("interp_probe", mask_fn)
        hf_model.set_attn_implementation("interp_probe")
        try:
            with torch.no_grad():
                hf_model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=_device(hf_model)), use_cache=False)
        finally:
            hf_model.set_attn_implementation(_IMPL[impl])
        by_layer: list[tuple[nn.Module | None, tuple[int, int, int]]] = [(None, (0, 0, 0))] * len(layers)
        for module, shape in seen:
            owner = [i for i, layer in enumerate(layers) if any(m is module for m in layer.modules())]
            if len(owner) != 1:
                raise ValueError(f"{type(module).__name__} is called by the model but is not inside one decoder "
                                 f"layer; {ROUTE_NAME} maps one attention module to each layer")
            if by_layer[owner[0]][0] is not None and by_layer[owner[0]][0] is not module:
                raise ValueError(f"decoder layer {owner[0]} calls two attention modules; {ROUTE_NAME} maps one")
            by_layer[owner[0]] = (module, shape)
        if all(m is None for m, _ in by_layer):
            raise ValueError(f"{type(hf_model).__name__}: no layer called AttentionInterface; {ROUTE_NAME} cannot "
                             f"reach its attention, and {_NATIVE_HINT}")
        return by_layer

    def _additive_layout(self, layers: nn.ModuleList, attn_modules: Sequence[nn.Module | None]) -> None:
        """Offer the residual decomposition (``hook_mlp_out``, ``cfg.normalization``, a torch view of the final
        norm) only where one pass shows that it holds: every layer adds its attention module's and its MLP's
        outputs to the residual as they are, the final norm is a plain RMSNorm or LayerNorm, and the logits
        are the unembedding of the normed residual. Anything else (post-sublayer norms, residual multipliers,
        logit scaling, mixers without attention) leaves it off, and direct logit attribution refuses by name."""
        mlps = [next((m for n, m in layer.named_children() if n in _MLP_NAMES), None) for layer in layers]
        norm = self.ln_final
        unembed = self.unembed
        if norm is None or unembed is None or any(m is None for m in [*mlps, *attn_modules]):
            return
        view, kind = _norm_view(norm, self.cfg.d_model)
        if view is None:
            return
        seen: dict[tuple[int, str], torch.Tensor] = {}
        handles = []
        for i, (layer, attn, mlp) in enumerate(zip(layers, attn_modules, mlps)):
            for key, module in (("attn", attn), ("mlp", mlp), ("post", layer)):
                handles.append(module.register_forward_hook(  # type: ignore[union-attr]
                    lambda _m, _i, out, k=(i, key): seen.__setitem__(k, _hidden(out).detach())))
            handles.append(layer.register_forward_pre_hook(
                lambda _m, args, kwargs, k=(i, "pre"): seen.__setitem__(
                    k, (args[0] if args else kwargs["hidden_states"]).detach()), with_kwargs=True))
        try:
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, self.cfg.d_vocab, (1, 6), generator=g).to(_device(self.hf))
            with torch.no_grad():
                logits = self.hf(input_ids=ids, use_cache=False).logits
        finally:
            for h in handles:
                h.remove()

        def close(a: torch.Tensor, b: torch.Tensor) -> bool:
            return bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-4 * float(b.abs().max()) + 1e-6))

        for i in range(len(layers)):
            if not close(seen[i, "pre"] + seen[i, "attn"] + seen[i, "mlp"], seen[i, "post"]):
                return
        with torch.no_grad():
            if not close(unembed(view(seen[len(layers) - 1, "post"])), logits):
                return
        self.__dict__["_norm_view"] = view  # not a submodule: its weights are the HF model's
        self.cfg.normalization = kind
        self.cfg.sublayer_norm = "input"
        self.cfg.parallel_block = "unknown"  # sequential or parallel: DLA needs neither, resid_mid is not offered
        for block, mlp in zip(self.blocks, mlps):
            block.__dict__["mlp"] = mlp  # a reference, not a submodule: the weights stay the HF model's
            block.hook_mlp_out = HookPoint()
            mlp.register_forward_hook(self._post_hook(block.hook_mlp_out))  # type: ignore[union-attr]

    def _install_layer_hooks(self, layers: nn.ModuleList, attn_modules: Sequence[nn.Module | None]) -> None:
        """Torch hooks that feed the block hook points (each returns at once while its point has no hook)."""
        emb = self.hf.get_input_embeddings()
        emb.register_forward_hook(lambda _m, _i, out: self.hook_embed(out) if self.hook_embed.active else None)
        for i, (layer, block) in enumerate(zip(layers, self.blocks)):
            layer.register_forward_pre_hook(self._pre_hook(i, block), with_kwargs=True)
            layer.register_forward_hook(self._post_hook(block.hook_resid_post))
            module = attn_modules[i]
            if module is not None:
                module.register_forward_hook(self._post_hook(block.hook_attn_out))

    def _pre_hook(self, layer: int, block: RouteBlock) -> Callable[..., Any]:
        def pre(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            if not block.hook_resid_pre.active and self._enter is None:
                return None
            x = args[0] if args else kwargs["hidden_states"]
            if self._enter is not None:
                x = self._enter(layer, x)
            x = block.hook_resid_pre(x)
            if args:
                return (x, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": x}
        return pre

    @staticmethod
    def _post_hook(hook: HookPoint) -> Callable[..., Any]:
        def post(_module: nn.Module, _inputs: Any, output: Any) -> Any:
            if not hook.active:
                return None
            return _with_hidden(output, hook(_hidden(output)))
        return post

    # --- forward --------------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
        """Logits ``[B, T, d_vocab]`` of transformers' forward, with the route's hooks and gates.

        Args:
            tokens: ``[B, T]`` (or ``[T]``) ids.
            attention_mask: ``[B, T]`` 1 for real tokens, 0 for padding.

        Raises:
            TypeError / ValueError: tokens that are not ids of the vocabulary; ``kv_cache`` (refused by name).
        """
        with self.lock:
            return self._forward(tokens, attention_mask=attention_mask, **kwargs)

    def _forward(self, tokens: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                 token_type_ids: Any = None, position_ids: torch.Tensor | None = None, context: Any = None,
                 context_mask: Any = None, kv_cache: Any = None, start_at_layer: int | None = None,
                 stop_at_layer: int | None = None,
                 enter: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        # The contract of Transformer._forward, which activation patching calls: from start_at_layer on the
        # input is the residual entering that layer, stop_at_layer gives the residual leaving layer stop - 1,
        # and enter(i, x) (patching's growing pass) gives the residual entering layer i, with more rows at each
        # layer that patches start at.
        if kv_cache is not None:
            raise refuse("interp's KV cache (per-position patching from a prefix, generate's decode step)")
        if token_type_ids is not None or context is not None or context_mask is not None:
            raise refuse("token types and cross-attention context")
        first, stop = Transformer._layer_range(self, start_at_layer, stop_at_layer)  # type: ignore[arg-type]
        if start_at_layer is None and enter is None and stop_at_layer is None:
            tokens = self._check_tokens(tokens)
            return self.hf(input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids,
                           use_cache=False).logits
        return self._layer_range_pass(tokens, attention_mask, first, stop, start_at_layer is not None, enter)

    def _layer_range_pass(self, x: torch.Tensor, attention_mask: torch.Tensor | None, first: int, stop: int,
                          from_residual: bool, enter: Callable[[int, torch.Tensor], torch.Tensor] | None
                          ) -> torch.Tensor:
        """Layers ``first .. stop - 1`` over transformers' forward, which keeps one batch size for the whole pass
        and always runs from the embedding: the rows entering layer ``first`` (and those that join at higher
        layers through ``enter``) are set there; what the layers below computed for them is never read. Returns
        the residual leaving layer ``stop - 1`` (``[rows, T, M]``), or the logits when ``stop`` is the last
        layer and the input were tokens with no growing pass."""
        L = self.cfg.n_layers
        entering: dict[int, torch.Tensor] = {}  # layer -> [rows present, T, M], rows added there and before
        if from_residual:
            h = x
            B, T = x.shape[:2]
            tokens = torch.zeros(B, T, dtype=torch.long, device=x.device)  # stand-ins below `first`
        else:
            tokens = self._check_tokens(x)
            B, T = tokens.shape
            h = None
        for i in range(first, stop):
            if enter is not None:
                h = enter(i, h)  # type: ignore[arg-type]  # patching's enter reads x only above `first`
            if h is not None:
                entering[i] = h
        rows = max((v.shape[0] for v in entering.values()), default=B)
        joined = {i: (entering[i - 1].shape[0] if i - 1 in entering else 0) for i in entering}

        def enter_rows(i: int, hidden: torch.Tensor) -> torch.Tensor:
            if i not in entering or entering[i].shape[0] == joined[i]:
                return hidden
            hidden = hidden.clone()
            hidden[joined[i]:entering[i].shape[0]] = entering[i][joined[i]:].to(hidden.dtype)  # rows joining here
            return hidden

        out: dict[str, torch.Tensor] = {}
        handle = None
        if stop < L or from_residual or enter is not None:
            layers = _decoder_layers(self.hf, L)
            if stop == 0:  # nothing runs: the input is the output
                return x
            handle = layers[stop - 1].register_forward_hook(
                lambda _m, _i, output: out.__setitem__("resid", _hidden(output)))
        mask = None if attention_mask is None else attention_mask.repeat(rows // B, 1)  # [rows, T]
        self._enter = enter_rows
        try:
            logits = self.hf(input_ids=tokens.repeat(rows // B, 1), attention_mask=mask, use_cache=False,
                             logits_to_keep=1 if handle is not None else 0).logits
        finally:
            self._enter = None
            if handle is not None:
                handle.remove()
        return out["resid"] if handle is not None else logits

    def unembed_residual(self, resid: torch.Tensor) -> torch.Tensor:
        """The model's output head on the residual leaving the last layer (``[..., T, d_model]`` to logits):
        the final norm and unembedding where one pass showed that they give the logits, otherwise
        transformers' own tail (a pass whose last layer's output is ``resid``)."""
        view = self.__dict__.get("_norm_view")
        unembed = self.unembed
        if view is not None and unembed is not None:
            return unembed(view(resid))
        flat = resid.reshape(-1, *resid.shape[-2:])  # [B, T, M]
        layers = _decoder_layers(self.hf, self.cfg.n_layers)
        handle = layers[-1].register_forward_hook(lambda _m, _i, output: _with_hidden(output, flat))
        # The stand-in layers must not run the caller's hooks (a patching pass calls this inside its hooks).
        points = [m for m in self.modules() if isinstance(m, HookPoint)]
        saved = [p._fns for p in points]
        for p in points:
            p._fns = []
        try:
            tokens = torch.zeros(flat.shape[:2], dtype=torch.long, device=flat.device)  # [B, T] stand-ins
            logits = self.hf(input_ids=tokens, use_cache=False).logits  # [B, T, V]
        finally:
            handle.remove()
            for p, fns in zip(points, saved):
                p._fns = fns
        return logits.reshape(*resid.shape[:-1], logits.shape[-1])  # [..., T, V]

    def _check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return Transformer._check_tokens(self, tokens)  # type: ignore[arg-type]  # reads cfg.d_vocab only

    # --- gates and hooks (shared with interp.Transformer) -----------------------------------------------
    set_head_gates = Transformer.set_head_gates
    _set_head_gates = Transformer._set_head_gates
    run_with_cache = Transformer.run_with_cache

    def run_with_hooks(self, *args: Any, fwd_hooks: Sequence[tuple[NamesFilter, Any]] = (), **kwargs: Any):
        """Run with hooks attached; they are removed afterwards, also on error."""
        with self.hooks(fwd_hooks):
            return self(*args, **kwargs)

    # --- tokens (shared with interp.Transformer) --------------------------------------------------------
    to_tokens = Transformer.to_tokens
    to_string = Transformer.to_string
    to_str_tokens = Transformer.to_str_tokens
    to_single_token = Transformer.to_single_token
    _need_tokenizer = Transformer._need_tokenizer

    # --- the model's own embedding, final norm and unembedding ------------------------------------------
    @property
    def embed(self) -> nn.Module:
        return self.hf.get_input_embeddings()

    @property
    def unembed(self) -> nn.Module | None:
        return self.hf.get_output_embeddings()

    @property
    def W_E(self) -> torch.Tensor:
        embed: Any = self.embed
        return embed.weight

    @property
    def W_U(self) -> torch.Tensor | None:
        unembed: Any = self.unembed
        return None if unembed is None else unembed.weight.T

    @property
    def ln_final(self) -> nn.Module | None:
        """The family's final norm: a torch ``RMSNorm`` / ``LayerNorm`` sharing its weights where one pass showed
        it computes the same (what direct logit attribution reads), else the family's own module (the base
        model's ``norm`` / ``final_layernorm`` / ``ln_f`` ...), or None when it has none under those names."""
        if self.__dict__.get("_norm_view") is not None:
            return self.__dict__["_norm_view"]
        base = getattr(self.hf, "base_model", self.hf)
        for name in ("norm", "final_layernorm", "ln_f", "norm_f", "final_norm", "embedding_norm"):
            module = getattr(base, name, None)
            if isinstance(module, nn.Module):
                return module
        return None

    W_pos = None
    embed_ln = None

    # --- refused by name ----------------------------------------------------------------------------------
    def make_cache(self, *args: Any, **kwargs: Any) -> Any:
        raise refuse("interp's KV cache (make_cache)")

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise refuse("interp's generate and its fast decode step (use model.hf.generate)")

    def decoding(self, *args: Any, **kwargs: Any) -> Any:
        raise refuse("the fast decode step (decoding)")

    def set_query_chunk(self, chunk: int | None) -> None:
        if chunk is not None:
            raise refuse(f"query chunking (set_query_chunk({chunk!r}))")

    W_Q = property(lambda self: _refused("per-head weight views (W_Q)"))
    W_K = property(lambda self: _refused("per-head weight views (W_K)"))
    W_V = property(lambda self: _refused("per-head weight views (W_V)"))
    W_O = property(lambda self: _refused("per-head weight views (W_O)"))
    QK = property(lambda self: _refused("per-head weight views (QK)"))
    OV = property(lambda self: _refused("per-head weight views (OV)"))

    def extra_repr(self) -> str:
        return f"name={self.name!r}, route={ROUTE_NAME!r}, model_type={self.cfg.model_type!r}, " \
               f"layers={self.cfg.n_layers}, heads={self.cfg.layer_n_heads}"


def _refused(what: str) -> Any:
    raise refuse(what)


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


_WARNED: set[str] = set()


def wrap(hf_model: nn.Module, *, name: str | None = None, tokenizer: Any = None, warn: bool = False) -> RouteModel:
    """Put a transformers decoder on the attention-level route (in place: its attention implementation becomes
    the route's; its weights are shared, not copied).

    Args:
        hf_model: a ``*ForCausalLM`` whose attention runs through ``AttentionInterface`` with ``sdpa`` or
            ``eager``.
        name: ``model.name`` (default: the HF ``name_or_path`` or ``model_type``).
        tokenizer: an interp Tokenizer, a ``tokenizers.Tokenizer`` or a HF fast tokenizer to attach
            (``model.to_tokens``).
        warn: say once per ``model_type`` that the model took the route (what the loaders do).

    Returns:
        The :class:`RouteModel` (eval mode).

    Raises:
        ValueError: a model whose attention does not go through the interface, another attention
            implementation, a model already wrapped, or decoder layers that cannot be told apart.

    Example:
        >>> from interp.zoo.hf_route import wrap
        >>> from transformers import OlmoConfig, OlmoForCausalLM
        >>> model = wrap(OlmoForCausalLM(OlmoConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32,
        ...                                         num_attention_heads=2, vocab_size=20)))
        >>> model.cfg.layer_n_heads
        [2]
    """
    from .tokenizer import as_tokenizer as _wrap_tokenizer

    model = RouteModel(hf_model, name=name, tokenizer=_wrap_tokenizer(tokenizer))
    mtype = model.cfg.model_type
    if warn and mtype not in _WARNED:
        _WARNED.add(mtype)
        warnings.warn(f"model_type={mtype!r} has no native converter: it runs on {ROUTE_NAME} (transformers' "
                      f"forward with interp's attention hooks; remove_heads, weight views and the fast decode "
                      f"step need the native route)", stacklevel=3)
    return model.eval()

