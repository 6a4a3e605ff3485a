"""Hugging Face converters: BERT, GPT-2, Llama-style and mixture-of-experts models to :class:`interp.Transformer`
(the other dense families are in :mod:`interp.zoo.hf_families`).

Each architecture has two pure functions, one from the HF config dict to a :class:`ModelConfig` and one
from the HF state dict to ours; neither imports ``transformers`` (MiniLM uses them on a bare safetensors
file). :func:`from_hf` wraps them for a model object, a local folder or (with hub access) a hub id.

Weight layouts, and what differs from ours:

* BERT (``BertModel``, also the ``bert.`` part of ``BertFor*``): post-LN encoder; Q, K, V are separate
  ``nn.Linear`` layers that we stack into ``W_qkv``. Task heads (pooler, MLM head) are dropped: the model
  returns the last hidden state (``unembed=False``).
* GPT-2 (``GPT2LMHeadModel`` / ``GPT2Model``): ``Conv1D`` stores weights as ``[in, out]``, the transpose of
  ``nn.Linear``; ``gelu_new`` is the tanh approximation; the unembedding is tied to ``wte``.
* Llama-style (``LlamaForCausalLM``, also ``mistral``, ``ministral``, ``qwen2``, ``qwen3`` and ``seed_oss``, which
  differ only in config values: Ministral's ``layer_types`` windows, Seed-OSS's separate ``attention_out_bias``):
  pre-RMSNorm, rotary embeddings in the rotate-half convention (as :mod:`interp.rotary`) with base ``rope_theta``, SwiGLU MLP
  (``down(silu(gate(x)) * up(x))``), grouped-query attention with ``num_key_value_heads``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..model import Transformer
from ..placement import build, check_dtype
from .checkpoint import assign_weights, check_finite, check_fits

StateDict = Mapping[str, torch.Tensor]

_HF_EXTRA = "pip install interp[hf]"


def _need(hf_cfg: Mapping[str, Any], key: str, arch: str) -> Any:
    if key not in hf_cfg or hf_cfg[key] is None:
        raise ValueError(f"{arch} config has no {key!r}; got keys {sorted(hf_cfg)}")
    return hf_cfg[key]


def _decoder_checks(hf_cfg: Mapping[str, Any], arch: str, *, rotary_head_dim: int | None = None) -> None:
    """Settings every decoder's transformers mask and RoPE code reads that interp does not reproduce.

    ``is_causal: false`` turns transformers' causal mask bidirectional (``masking_utils``); a family whose
    attention splits heads as ``hidden_size / num_attention_heads`` but whose RoPE reads ``head_dim``
    (``rotary_head_dim`` given: the width the attention uses) would rotate a different width.

    Raises:
        ValueError: naming the key and its value.
    """
    if hf_cfg.get("is_causal", True) is False:
        raise ValueError(f"{arch} is_causal=False (bidirectional attention) is not supported; interp's {arch} is "
                         "causal")
    if rotary_head_dim is None:
        return
    head_dim = hf_cfg.get("head_dim")
    if head_dim is not None and head_dim != rotary_head_dim:
        raise ValueError(f"{arch} head_dim={head_dim!r} is not supported: transformers' {arch} attention uses "
                         f"{rotary_head_dim} per head while its RoPE would read head_dim")


class _Source:
    """Reads HF tensors by name, stripping a model prefix, and names the missing one in its error."""

    def __init__(self, sd: StateDict, prefixes: tuple[str, ...], arch: str) -> None:
        self.arch = arch
        self.prefix = ""
        for p in prefixes:
            if any(k.startswith(p) for k in sd):
                self.prefix = p
                break
        self.sd = sd

    def __call__(self, key: str) -> torch.Tensor:
        full = self.prefix + key
        if full not in self.sd:
            raise ValueError(f"{self.arch} state dict has no tensor {full!r} (found e.g. {list(self.sd)[:4]})")
        return self.sd[full]

    def has(self, key: str) -> bool:
        return self.prefix + key in self.sd


# --- BERT -------------------------------------------------------------------------------------------------
def bert_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a BERT encoder from its HF config dict (``config.json`` / ``config.to_dict()``).

    Raises:
        ValueError: a setting this converter does not reproduce (relative position embeddings, an
            activation other than gelu/relu/gelu_new) or a missing key.

    Example:
        >>> import json, os; from interp.zoo.minilm import minilm_path
        >>> bert_config(json.load(open(os.path.join(minilm_path(), "config.json")))).normalization
        'post'
    """
    arch = "BERT"
    for key in ("is_decoder", "add_cross_attention"):  # a decoder BERT is causal; cross-attention needs an encoder
        if hf_cfg.get(key):
            raise ValueError(f"BERT {key}={hf_cfg[key]!r} is not supported (only False: an encoder)")
    pos = hf_cfg.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"BERT position_embedding_type={pos!r} is not supported (only 'absolute')")
    act = hf_cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "relu", "gelu_new"):
        raise ValueError(f"BERT hidden_act={act!r} is not supported (gelu, relu, gelu_new)")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=d_model // n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=act,
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=hf_cfg.get("max_position_embeddings", 512),
        n_token_types=hf_cfg.get("type_vocab_size", 2), normalization="post", embed_norm=True,
        positional="learned", causal=False, unembed=False, norm_eps=hf_cfg.get("layer_norm_eps", 1e-12),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def bert_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF BERT one (keys with or without the ``bert.`` prefix).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("bert.",), "BERT")
    out = {
        "W_E.weight": src("embeddings.word_embeddings.weight"),
        "W_pos.weight": src("embeddings.position_embeddings.weight"),
        "embed_ln.weight": src("embeddings.LayerNorm.weight"),
        "embed_ln.bias": src("embeddings.LayerNorm.bias"),
    }
    if cfg.n_token_types:
        out["W_tt.weight"] = src("embeddings.token_type_embeddings.weight")
    for i in range(cfg.n_layers):
        h, b = f"encoder.layer.{i}.", f"blocks.{i}."
        # HF keeps Q, K, V apart, each [H*D, M] with head h in rows h*D:(h+1)*D: stacked they are our W_qkv.
        for kind in ("weight", "bias"):
            out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                [src(h + f"attention.self.{n}.{kind}") for n in ("query", "key", "value")], dim=0)  # [3*H*D(, M)]
            out[b + f"attn.W_O.{kind}"] = src(h + f"attention.output.dense.{kind}")
            out[b + f"ln1.{kind}"] = src(h + f"attention.output.LayerNorm.{kind}")
            out[b + f"mlp.W_in.{kind}"] = src(h + f"intermediate.dense.{kind}")
            out[b + f"mlp.W_out.{kind}"] = src(h + f"output.dense.{kind}")
            out[b + f"ln2.{kind}"] = src(h + f"output.LayerNorm.{kind}")
    return out


# --- GPT-2 ------------------------------------------------------------------------------------------------
def gpt2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-2 decoder from its HF config dict.

    ``scale_attn_by_inverse_layer_idx`` (layer i's scores divided by i + 1) is folded into that layer's query
    rows by :func:`gpt2_state_dict_for`; ``reorder_and_upcast_attn`` computes the same scores in float32 (scaled
    before the product instead of after: the same numbers up to rounding).

    Raises:
        ValueError: unsupported settings (``scale_attn_weights=False``, cross-attention, an unknown activation)
            or a missing key.
    """
    arch = "GPT-2"
    _decoder_checks(hf_cfg, "gpt2")
    for key, bad in (("scale_attn_weights", False), ("add_cross_attention", True)):
        if hf_cfg.get(key, not bad) == bad:
            raise ValueError(f"GPT-2 {key}={bad} is not supported by the converter")
    act = hf_cfg.get("activation_function", "gelu_new")
    acts = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
    if act not in acts:
        raise ValueError(f"GPT-2 activation_function={act!r} is not supported ({sorted(acts)})")
    d_model = _need(hf_cfg, "n_embd", arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "n_layer", arch), d_model=d_model, n_heads=_need(hf_cfg, "n_head", arch),
        d_mlp=hf_cfg.get("n_inner") or 4 * d_model, activation=acts[act], d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "n_positions", arch), normalization="pre", positional="learned", causal=True,
        norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5), unembed=True,
        tie_embeddings=hf_cfg.get("tie_word_embeddings", True), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gpt2_state_dict(hf_sd: StateDict, cfg: ModelConfig, *, inverse_layer_scale: bool = False
                    ) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-2 one (``GPT2LMHeadModel`` or ``GPT2Model`` keys).

    ``inverse_layer_scale`` (``scale_attn_by_inverse_layer_idx``): layer i's query rows (weight and bias) are
    divided by i + 1, which divides its scores by i + 1 as transformers does.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("transformer.",), "GPT-2")
    out = {"W_E.weight": src("wte.weight"), "W_pos.weight": src("wpe.weight"),
           "ln_final.weight": src("ln_f.weight"), "ln_final.bias": src("ln_f.bias")}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        # Conv1D weights are [in, out]; nn.Linear wants [out, in]. c_attn's columns are [q | k | v], each
        # split by head in order, which is our W_qkv row order once transposed.
        for ours, theirs in (("attn.W_qkv", "attn.c_attn"), ("attn.W_O", "attn.c_proj"),
                             ("mlp.W_in", "mlp.c_fc"), ("mlp.W_out", "mlp.c_proj")):
            out[b + ours + ".weight"] = src(h + theirs + ".weight").T.contiguous()  # [in, out] -> [out, in]
            out[b + ours + ".bias"] = src(h + theirs + ".bias")
        if inverse_layer_scale and i:
            q_rows = cfg.n_heads * cfg.d_head  # the first rows of W_qkv are the queries
            for kind in ("weight", "bias"):
                w = out[b + f"attn.W_qkv.{kind}"].clone()
                w[:q_rows] /= i + 1
                out[b + f"attn.W_qkv.{kind}"] = w
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[b + ours + ".weight"] = src(h + theirs + ".weight")
            out[b + ours + ".bias"] = src(h + theirs + ".bias")
    if not cfg.tie_embeddings:
        out["W_U.weight"] = hf_sd["lm_head.weight"] if "lm_head.weight" in hf_sd else src("wte.weight")
        out["W_U.bias"] = torch.zeros(cfg.d_vocab)  # an untied W_U has a bias in interp; lm_head has none
    return out


def gpt2_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]:
    """The state-dict function of a GPT-2 config: :func:`gpt2_state_dict` with ``scale_attn_by_inverse_layer_idx``.

    Example:
        >>> gpt2_state_dict_for({"scale_attn_by_inverse_layer_idx": True}).keywords
        {'inverse_layer_scale': True}
    """
    return functools.partial(gpt2_state_dict,
                             inverse_layer_scale=bool(hf_cfg.get("scale_attn_by_inverse_layer_idx", False)))


# --- Llama-style ------------------------------------------------------------------------------------------
_LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "ministral", "seed_oss")


#: How each family's transformers classes decide which layers slide, read from their config and modelling code:
#: ``"every"`` (one window for all layers: Mistral, Mixtral, Phi-3; Qwen3-MoE when ``use_sliding_window``),
#: ``"above_max_window_layers"`` (Qwen2 / Qwen3: ``layer_types``, else layers from ``max_window_layers`` on, when
#: ``use_sliding_window``), ``"even_below_max_window_layers"`` (Qwen2-MoE: ``layer_types``, else the even layers
#: below ``max_window_layers``), ``"alternate"`` (Gemma 2: ``layer_types``, else the even layers) and
#: ``"pattern"`` (Gemma 3: ``layer_types``, else all but every ``sliding_window_pattern``-th), ``"layer_types"``
#: (Ministral: ``layer_types``, else every layer) and ``"every_fourth_full"`` (OLMo 3: ``layer_types``, else all
#: but every 4th layer). Starcoder 2 slides every layer. Any other family's
#: attention never slides in transformers' eager / SDPA paths (Llama, OLMoE, DeepSeek), whatever its config says.
WINDOW_RULES: dict[str, str] = {
    "mistral": "every", "mixtral": "every", "phi3": "every", "qwen3_moe": "every",
    "qwen2": "above_max_window_layers", "qwen3": "above_max_window_layers",
    "qwen2_moe": "even_below_max_window_layers", "gemma2": "alternate", "gemma3_text": "pattern",
    "ministral": "layer_types", "olmo3": "every_fourth_full", "starcoder2": "every",
}

#: The families whose config class keeps ``sliding_window`` only when ``use_sliding_window`` (default False).
_USE_SLIDING_WINDOW = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")


def sliding_windows(hf_cfg: Mapping[str, Any], arch: str) -> list[int | None] | None:
    """Each layer's sliding window from a HF config, by the rule of family ``arch`` (:data:`WINDOW_RULES`);
    ``None`` when no layer slides.

    Raises:
        ValueError: a layer type other than sliding or full attention (named with its layer), or a
            ``layer_types`` whose length is not ``num_hidden_layers``.

    Example:
        >>> cfg = {"num_hidden_layers": 3, "sliding_window": 4, "use_sliding_window": True, "max_window_layers": 1}
        >>> sliding_windows(cfg, "qwen2"), sliding_windows(cfg, "qwen3_moe"), sliding_windows(cfg, "llama")
        ([None, 4, 4], [4, 4, 4], None)
    """
    rule = WINDOW_RULES.get(arch)
    if rule is None:
        return None
    # Every key the family's rule reads is read, whatever the branch (the config-key audit records reads).
    window = hf_cfg.get("sliding_window")
    use = hf_cfg.get("use_sliding_window", False) if arch in _USE_SLIDING_WINDOW else True
    max_layers = hf_cfg.get("max_window_layers", 28) if "max_window_layers" in rule else None
    types = hf_cfg.get("layer_types")
    if not window or not use:  # Qwen2-MoE's config stores 0 for "no window"
        return None
    n_layers = _need(hf_cfg, "num_hidden_layers", arch)
    if types:
        if len(types) != n_layers:
            raise ValueError(f"{arch} layer_types has {len(types)} entries, num_hidden_layers={n_layers}")
        for i, kind in enumerate(types):
            if kind not in ("sliding_attention", "full_attention"):
                raise ValueError(f"{arch} layer_types[{i}]={kind!r} is not supported "
                                 "(only 'sliding_attention' and 'full_attention')")
        if rule == "every" and "full_attention" in types:
            # transformers' class ignores layer_types and slides every layer: such a checkpoint was made for
            # another class (Ministral), so neither reading is safe.
            raise ValueError(f"{arch} layer_types={types!r} with full-attention layers is not supported: "
                             f"transformers' {arch} ignores layer_types and slides every layer")
    if types and rule != "every":
        slides = [kind == "sliding_attention" for kind in types]
    elif rule in ("every", "layer_types"):
        slides = [True] * n_layers
    elif rule == "every_fourth_full":
        slides = [(i + 1) % 4 != 0 for i in range(n_layers)]
    elif rule == "above_max_window_layers":
        slides = [i >= max_layers for i in range(n_layers)]
    elif rule == "even_below_max_window_layers":
        slides = [i % 2 == 0 and i < max_layers for i in range(n_layers)]
    elif rule == "alternate":
        slides = [i % 2 == 0 for i in range(n_layers)]
    else:  # pattern
        pattern = hf_cfg.get("sliding_window_pattern") or 6
        slides = [(i + 1) % pattern != 0 for i in range(n_layers)]
    windows = [window if s else None for s in slides]
    return windows if any(w is not None for w in windows) else None


#: Which q/k/v and output-projection biases each family's transformers attention has: a config key it reads, or
#: a constant it hard-codes (Qwen2: q/k/v always biased, whatever ``attention_bias`` says; Mistral, Mixtral: never).
ATTENTION_BIASES: dict[str, tuple[str | bool, str | bool]] = {
    "llama": ("attention_bias", "attention_bias"), "qwen3": ("attention_bias", "attention_bias"),
    "qwen3_moe": ("attention_bias", "attention_bias"), "olmoe": ("attention_bias", "attention_bias"),
    "qwen2": (True, False), "qwen2_moe": ("qkv_bias", False), "mistral": (False, False), "mixtral": (False, False),
    "ministral": (False, False), "seed_oss": ("attention_bias", "attention_out_bias"),
    "granite": ("attention_bias", "attention_bias"),
}

#: The families whose dense MLP reads ``mlp_bias`` (the others hard-code no bias).
_MLP_BIAS_KEY = ("llama", "deepseek_v2", "seed_oss", "granite")

#: transformers' defaults for keys it reads with a default (``qkv_bias`` of Qwen2-MoE is True).
_BIAS_DEFAULTS = {"qkv_bias": True}


def _biases(hf_cfg: Mapping[str, Any], arch: str) -> tuple[bool, bool]:
    """``(attn_bias, out_bias)`` of family ``arch`` (:data:`ATTENTION_BIASES`)."""
    rules = ATTENTION_BIASES[arch]
    return tuple(rule if isinstance(rule, bool) else bool(hf_cfg.get(rule, _BIAS_DEFAULTS.get(rule, False)))
                 for rule in rules)  # type: ignore[return-value]


_ROPE_KINDS_HF = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")

#: The families whose attention rotates ``partial_rotary_factor`` of each head (the others rotate whole heads).
_PARTIAL_ROTARY = ("gpt_neox", "phi", "phi3")


def _where(hf_cfg: Mapping[str, Any]) -> str:
    """`` (in <folder>/config.json)`` when the config knows the folder or hub id it came from, else ``""``."""
    origin = hf_cfg.get("_name_or_path") or hf_cfg.get("name_or_path")
    return f" (in {origin}/config.json)" if origin else ""


def _positive(value: Any, what: str, arch: str, hf_cfg: Mapping[str, Any], *, integer: bool = False,
              zero: bool = False) -> float:
    """``value`` as a float after checking it is a finite number > 0 (an int > 0 when ``integer``; >= 0 when
    ``zero``).

    Raises:
        ValueError: naming ``what`` (the key), the value, the ``model_type`` and the file when known.
    """
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= 0 if zero else value > 0))
    if ok and integer and value != int(value):
        ok = False
    if not ok:
        need = "an integer >= 1" if integer else f"a finite number {'>=' if zero else '>'} 0"
        raise ValueError(f"model_type={arch!r}: {what}={value!r} must be {need}{_where(hf_cfg)}")
    return float(value)


def _rope(hf_cfg: Mapping[str, Any], arch: str, params: Mapping[str, Any] | None = None, *,
          default_theta: float = 10000.0) -> tuple[float, dict | None]:
    """``(rope_theta, rope_scaling)`` of a HF config: transformers 5's ``rope_parameters`` or 4.x's
    ``rope_theta`` + ``rope_scaling``, resolved into :class:`ModelConfig`'s explicit ``rope_scaling`` dict
    (defaults filled in as transformers fills them). ``params`` overrides the dict read (per-layer-type RoPE);
    ``default_theta`` is the base when the config gives none (GPT-NeoX's legacy ``rotary_emb_base``).

    Raises:
        ValueError: a RoPE kind interp does not implement, named with the supported ones; a ``rope_theta``, a
            factor or an original context that is missing, zero, negative or not finite; llama3's
            ``high_freq_factor`` not above its ``low_freq_factor``. Each message names the key, its value, the
            ``model_type`` and the config file when known.

    Example:
        >>> _rope({"rope_scaling": {"rope_type": "linear", "factor": 2}, "max_position_embeddings": 64}, "llama")
        (10000.0, {'rope_type': 'linear', 'factor': 2.0})
        >>> _rope({"rope_scaling": {"rope_type": "linear", "factor": 0}, "max_position_embeddings": 64}, "llama")
        Traceback (most recent call last):
        ...
        ValueError: model_type='llama': rope_scaling['factor']=0 must be a finite number > 0
    """
    rope = dict(params if params is not None else (hf_cfg.get("rope_parameters") or {}))
    field = "rope_parameters"
    legacy = hf_cfg.get("rope_scaling") or {}
    if not rope.get("rope_type") and legacy:
        rope = {**legacy, **rope}
        field = "rope_scaling"
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in _ROPE_KINDS_HF:
        raise ValueError(f"{arch} rope_type={kind!r} is not supported; supported: {list(_ROPE_KINDS_HF)}"
                         f"{_where(hf_cfg)}")

    def need(key: str, *, integer: bool = False, zero: bool = False) -> float:
        if rope.get(key) is None:
            raise ValueError(f"model_type={arch!r}: {field} of rope_type {kind!r} has no {key!r} (got keys "
                             f"{sorted(rope)}){_where(hf_cfg)}")
        return _positive(rope[key], f"{field}[{key!r}]", arch, hf_cfg, integer=integer, zero=zero)

    def optional(key: str, *, integer: bool = False) -> float | None:
        return None if rope.get(key) is None else need(key, integer=integer)

    partial = rope.get("partial_rotary_factor", 1.0)
    if kind != "default" and partial != 1.0 and arch not in _PARTIAL_ROTARY:
        # transformers' scaled-RoPE init rotates head_dim x partial_rotary_factor dims, but this family's attention
        # rotates whole heads (its default RoPE ignores the factor).
        raise ValueError(f"model_type={arch!r}: {field}['partial_rotary_factor']={partial!r} with rope_type "
                         f"{kind!r} is not supported (this family rotates whole heads){_where(hf_cfg)}")
    theta_key = f"{field}['rope_theta']" if rope.get("rope_theta") is not None else "rope_theta"
    theta = _positive(rope.get("rope_theta", hf_cfg.get("rope_theta", default_theta)), theta_key, arch, hf_cfg)
    if kind == "default":
        return theta, None
    max_pos = _need(hf_cfg, "max_position_embeddings", arch)
    orig_key = "original_max_position_embeddings"
    if rope.get(orig_key) is not None:
        orig: float | None = need(orig_key, integer=True)
    elif hf_cfg.get(orig_key) is not None:
        orig = _positive(hf_cfg[orig_key], orig_key, arch, hf_cfg, integer=True)
    else:
        orig = None
    scaling: dict[str, Any] = {"rope_type": kind}
    if kind == "linear":
        scaling["factor"] = need("factor")
    elif kind == "dynamic":
        # transformers grows the base past max_position_embeddings itself (the original context of dynamic NTK).
        scaling.update(factor=need("factor"), original_max_position_embeddings=max_pos)
    elif kind == "llama3":
        low, high = need("low_freq_factor"), need("high_freq_factor")
        if high <= low:
            raise ValueError(f"model_type={arch!r}: {field} high_freq_factor={rope['high_freq_factor']!r} must be "
                             f"above low_freq_factor={rope['low_freq_factor']!r}{_where(hf_cfg)}")
        scaling.update(factor=need("factor"), low_freq_factor=low, high_freq_factor=high,
                       original_max_position_embeddings=int(need(orig_key, integer=True)))
    elif kind == "yarn":
        orig = orig or max_pos
        factor = optional("factor") or max_pos / orig
        scaling.update(factor=float(factor), original_max_position_embeddings=int(orig))
        for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
            if rope.get(key) is not None:
                scaling[key] = need(key, zero=key.startswith("mscale"))  # mscale_all_dim 0: no extra scaling
        if rope.get("truncate") is not None:
            scaling["truncate"] = rope["truncate"]
    else:  # longrope
        orig = orig or max_pos
        for key in ("short_factor", "long_factor"):
            values = rope.get(key)
            if not isinstance(values, (list, tuple)) or not values:
                raise ValueError(f"model_type={arch!r}: {field}[{key!r}]={values!r} must be a non-empty list of "
                                 f"numbers{_where(hf_cfg)}")
            for i, v in enumerate(values):
                _positive(v, f"{field}[{key!r}][{i}]", arch, hf_cfg)
            scaling[key] = [float(v) for v in values]
        scaling.update(original_max_position_embeddings=int(orig), factor=float(optional("factor") or max_pos / orig))
        if rope.get("attention_factor") is not None:
            scaling["attention_factor"] = need("attention_factor")
    return theta, scaling


def _rope_context(n_ctx: int, scaling: dict | None) -> int:
    """Dynamic NTK exists to run past ``max_position_embeddings``: allow ``factor`` times that."""
    if scaling is not None and scaling["rope_type"] == "dynamic":
        return int(n_ctx * scaling["factor"])
    return n_ctx


#: A Llama-style MLP's ``hidden_act`` on its gate -> the gated activation (``gelu_new`` and ``gelu_pytorch_tanh``
#: are both the tanh approximation of GELU).
_GATED_ACTIVATIONS: dict[str, Any] = {"silu": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh",
                                      "gelu_new": "geglu_tanh"}


def _gated_activation(hf_cfg: Mapping[str, Any], arch: str) -> Any:
    """The gated activation a Llama-style family's ``hidden_act`` names (SiLU: SwiGLU; GELU: GeGLU).

    Raises:
        ValueError: another ``hidden_act``, named with its value.
    """
    act = hf_cfg.get("hidden_act", "silu")
    if act not in _GATED_ACTIVATIONS:
        raise ValueError(f"{arch} hidden_act={act!r} is not supported ({sorted(_GATED_ACTIVATIONS)})")
    return _GATED_ACTIVATIONS[act]


def llama_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Llama-style decoder (llama / mistral / qwen2 / qwen3) from its HF config dict.

    Sliding windows come per layer (:func:`sliding_windows`); Qwen3 adds per-head QK-norm.

    ``rotary_base`` comes from ``rope_parameters["rope_theta"]`` (transformers 5) or ``rope_theta`` (4.x), and
    RoPE scaling (``linear``, ``dynamic``, ``llama3``, ``yarn``, ``longrope``) becomes ``rope_scaling``.

    Raises:
        ValueError: another RoPE kind, an activation other than silu, an unknown layer type, or a missing key.
    """
    mtype = hf_cfg.get("model_type", "llama")
    arch = mtype  # mistral, qwen2 and the MoE families come through here too: errors name the real one
    _decoder_checks(hf_cfg, mtype)
    activation = _gated_activation(hf_cfg, mtype)
    n_ctx = _need(hf_cfg, "max_position_embeddings", arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    attn_bias, out_bias = _biases(hf_cfg, mtype)
    theta, scaling = _rope(hf_cfg, mtype)
    n_ctx = _rope_context(n_ctx, scaling)
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=activation,
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=n_ctx, normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        causal=True, attn_bias=attn_bias, out_bias=out_bias,
        mlp_bias=mtype in _MLP_BIAS_KEY and bool(hf_cfg.get("mlp_bias", False)), unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
        sliding_window=sliding_windows(hf_cfg, mtype), qk_norm="head" if mtype == "qwen3" else "none",
    )


def llama_state_dict(hf_sd: StateDict, cfg: ModelConfig, *, arch: str = "llama") -> dict[str, torch.Tensor]:
    """Our state dict from a HF Llama-style one (``LlamaForCausalLM`` or ``LlamaModel`` keys), with or
    without experts.

    Args:
        hf_sd: the HF state dict.
        cfg: from :func:`llama_config` or :func:`moe_config`.
        arch: the HF ``model_type`` the weights come from, which the errors name (``"qwen2_moe"``, ...).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), arch)
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
        out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
        if cfg.qk_norm != "none":  # Qwen3 (per head), Qwen3-MoE (per head), OLMoE (all heads)
            out[b + "attn.q_norm.weight"] = src(h + "self_attn.q_norm.weight")
            out[b + "attn.k_norm.weight"] = src(h + "self_attn.k_norm.weight")
        out.update(_mlp_weights(src, h, b + "mlp.", cfg, i))
    if not cfg.tie_embeddings:
        if "lm_head.weight" not in hf_sd:
            raise ValueError(f"{arch} state dict has no 'lm_head.weight' and tie_word_embeddings is False "
                             "(pass a *ForCausalLM model, not the bare *Model)")
        out["W_U.weight"] = hf_sd["lm_head.weight"]
        out["W_U.bias"] = torch.zeros(cfg.d_vocab)  # an untied W_U has a bias in interp; lm_head has none
    return out


def _llama_attention(src: _Source, h: str, b: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Separate q/k/v/o projections (``self_attn.{q,k,v,o}_proj``) stacked into our ``W_qkv`` and ``W_O``."""
    out = {}
    for kind in ("weight", "bias") if cfg.attn_bias else ("weight",):
        # q_proj [H*D, M], k_proj / v_proj [K*D, M]; K/V head j serves query heads j*G..(j+1)*G-1, as ours.
        out[b + f"attn.W_qkv.{kind}"] = torch.cat(
            [src(h + f"self_attn.{n}_proj.{kind}") for n in ("q", "k", "v")], dim=0)  # [(H+2K)*D(, M)]
    out[b + "attn.W_O.weight"] = src(h + "self_attn.o_proj.weight")
    if cfg.out_bias:
        out[b + "attn.W_O.bias"] = src(h + "self_attn.o_proj.bias")
    return out


# --- mixture of experts: Mixtral, Qwen-MoE, OLMoE (llama-style attention) ---------------------------------
_MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def _mlp_weights(src: _Source, h: str, b: str, cfg: ModelConfig, layer: int) -> dict[str, torch.Tensor]:
    """Layer ``layer``'s MLP: a dense SwiGLU MLP (``mlp.gate_proj/up_proj/down_proj``) or the experts."""
    if cfg.is_moe_layer(layer):
        return _moe_weights(src, h, b, cfg, layer)
    return _dense_weights(src, h + "mlp.", b, cfg)


def _dense_weights(src: _Source, h: str, b: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A SwiGLU MLP's ``{h}gate_proj/up_proj/down_proj`` (with biases when ``cfg.mlp_bias``) as ``{b}W_gate/W_in/W_out``."""
    out = {}
    for ours, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"), ("W_out", "down_proj")):
        for kind in (("weight", "bias") if cfg.mlp_bias else ("weight",)):
            out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    return out


def _expert_count_check(arch: str, key: str, tensor: torch.Tensor, axis: int, want: int, what: str) -> None:
    if tensor.shape[axis] != want:
        raise ValueError(f"{arch}: the config says {what}={want}, but {key!r} has shape {tuple(tensor.shape)} "
                         f"({tensor.shape[axis]} along axis {axis})")


def _moe_weights(src: _Source, h: str, b: str, cfg: ModelConfig, layer: int) -> dict[str, torch.Tensor]:
    """The router, experts and shared expert of one MoE layer.

    Reads the stacked layout of transformers 5 (``mlp.experts.gate_up_proj`` ``[E, 2F, M]``, gate rows first;
    ``mlp.experts.down_proj`` ``[E, M, F]``) or per-expert tensors as checkpoints store them
    (``mlp.experts.{e}.gate_proj/up_proj/down_proj``; Mixtral's ``block_sparse_moe.experts.{e}.w1/w3/w2``).
    """
    E, F_ = cfg.n_experts, cfg.d_expert
    arch = src.arch
    mlp = h + ("block_sparse_moe." if src.has(h + "block_sparse_moe.gate.weight") else "mlp.")
    router = src(mlp + "gate.weight")  # [E, M]
    _expert_count_check(arch, src.prefix + mlp + "gate.weight", router, 0, E, "n_experts")
    out = {b + "W_router": router}
    if src.has(mlp + "experts.gate_up_proj"):
        gate_up, down = src(mlp + "experts.gate_up_proj"), src(mlp + "experts.down_proj")  # [E, 2F, M], [E, M, F]
        _expert_count_check(arch, src.prefix + mlp + "experts.gate_up_proj", gate_up, 0, E, "n_experts")
        _expert_count_check(arch, src.prefix + mlp + "experts.gate_up_proj", gate_up, 1, 2 * F_, "2 x d_expert")
        _expert_count_check(arch, src.prefix + mlp + "experts.down_proj", down, 0, E, "n_experts")
        out[b + "W_gate"], out[b + "W_in"] = gate_up[:, :F_], gate_up[:, F_:]  # [E, F, M] each
        out[b + "W_out"] = down
    else:
        names = ("w1", "w3", "w2") if mlp.endswith("block_sparse_moe.") else ("gate_proj", "up_proj", "down_proj")
        stored = sum(1 for e in range(E + 1) if src.has(mlp + f"experts.{e}.{names[0]}.weight"))
        if stored != E:
            raise ValueError(f"{arch}: the config says n_experts={E}, but layer {layer} stores {stored} experts "
                             f"({src.prefix + mlp}experts.*.{names[0]}.weight)")
        for ours, theirs in zip(("W_gate", "W_in", "W_out"), names):
            out[b + ours] = torch.stack([src(mlp + f"experts.{e}.{theirs}.weight") for e in range(E)])  # [E, ., .]
    if cfg.router_choice_bias:
        out[b + "router_bias"] = src(mlp + "gate.e_score_correction_bias")
    if cfg.d_shared_expert:
        shared = mlp + ("shared_expert." if src.has(mlp + "shared_expert.up_proj.weight") else "shared_experts.")
        out.update(_dense_weights(src, shared, b + "shared.", cfg))
        if cfg.shared_expert_gate:
            out[b + "shared_gate.weight"] = src(mlp + "shared_expert_gate.weight")
    return out


def moe_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Mixtral, Qwen2-MoE, Qwen3-MoE or OLMoE decoder from its HF config dict.

    Attention, norms and RoPE as :func:`llama_config` (plus QK-norm: per head for Qwen3-MoE, over all heads
    for OLMoE; OLMoE's ``clip_qkv`` is refused); the MLPs become mixtures of experts (softmax router,
    top-k; Mixtral always renormalises the chosen weights, the others when ``norm_topk_prob``). Qwen2-MoE adds
    its sigmoid-gated shared expert and keeps dense MLPs on ``mlp_only_layers`` and off ``decoder_sparse_step``.
    Router jitter and the auxiliary load-balancing loss are training-only and ignored.

    Raises:
        ValueError: a setting this converter does not reproduce (named), or a missing key.

    Example:
        >>> from transformers import MixtralConfig
        >>> moe_config(MixtralConfig(num_local_experts=8).to_dict()).n_experts
        8
    """
    mtype = hf_cfg.get("model_type")
    arch = mtype
    if hf_cfg.get("clip_qkv") is not None:
        raise ValueError(f"{mtype} clip_qkv={hf_cfg['clip_qkv']!r} is not supported (only None)")
    base = llama_config(hf_cfg)
    if base.activation != "swiglu":  # other expert activations are not checked against transformers
        raise ValueError(f"{mtype} hidden_act={hf_cfg.get('hidden_act')!r} is not supported (only 'silu' for "
                         "mixture-of-experts models)")
    L = base.n_layers
    # config.json names it num_experts (Qwen, OLMoE) or num_local_experts (Mixtral; also some to_dict() outputs).
    key = "num_local_experts" if hf_cfg.get("num_local_experts") is not None else "num_experts"
    E = _need(hf_cfg, key, arch)
    other = hf_cfg.get("num_experts" if key == "num_local_experts" else "num_local_experts")
    if other is not None and other != E:
        raise ValueError(f"{arch} config gives two expert counts that disagree: num_local_experts="
                         f"{hf_cfg.get('num_local_experts')!r} and num_experts={hf_cfg.get('num_experts')!r}")
    fields: dict[str, Any] = dict(
        n_experts=E, n_experts_per_token=_need(hf_cfg, "num_experts_per_tok", arch),
        router_score="softmax", router_renormalize=mtype == "mixtral" or bool(hf_cfg.get("norm_topk_prob")),
        d_expert=base.d_mlp if mtype in ("mixtral", "olmoe") else _need(hf_cfg, "moe_intermediate_size", arch),
    )
    if mtype in ("qwen2_moe", "qwen3_moe"):
        step = hf_cfg.get("decoder_sparse_step", 1) or 1
        only = set(hf_cfg.get("mlp_only_layers") or [])
        dense = [i for i in range(L) if i in only or (i + 1) % step]
        fields["dense_mlp_layers"] = dense or None
    if mtype in ("qwen3_moe", "olmoe"):
        # RMSNorm of the queries and keys before RoPE: per head (Qwen3-MoE) or over all heads at once (OLMoE).
        fields["qk_norm"] = "head" if mtype == "qwen3_moe" else "full"
    if mtype == "qwen2_moe":
        shared = hf_cfg.get("shared_expert_intermediate_size") or 0
        fields.update(d_shared_expert=shared, shared_expert_gate=bool(shared))
    return dataclasses.replace(base, **fields)


# --- DeepSeek-V2 / V3: multi-head latent attention + experts ---------------------------------------------
_DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")


def deepseek_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a DeepSeek-V2 / V3 decoder (MLA attention, routed + shared experts).

    MLA: ``q_lora_rank`` (None: direct query projection), ``kv_lora_rank``, ``qk_nope_head_dim`` (our
    ``d_head``), ``qk_rope_head_dim``, ``v_head_dim``. Experts: V2 softmax scores, ``topk_method`` ``greedy`` or
    ``group_limited_greedy`` (group score = its best expert); V3 sigmoid scores with
    ``e_score_correction_bias`` for the choice, groups scored by their two best experts, ``norm_topk_prob``;
    both ``routed_scaling_factor``, ``n_shared_experts`` and dense first ``first_k_dense_replace`` layers.
    DeepSeek-V3's multi-token-prediction layers (``num_nextn_predict_layers``) are not part of the causal-LM
    forward pass (transformers drops them too): their weights, if present, are ignored.

    Raises:
        ValueError: a setting this converter does not reproduce (named with its value), or a missing key.

    Example:
        >>> from transformers import DeepseekV3Config
        >>> deepseek_config(DeepseekV3Config().to_dict()).kind
        'mla'
    """
    mtype = hf_cfg.get("model_type")
    arch = mtype
    _decoder_checks(hf_cfg, mtype)
    act = hf_cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{mtype} hidden_act={act!r} is not supported (only 'silu')")
    if hf_cfg.get("attention_bias"):
        raise ValueError(f"{mtype} attention_bias=True is not supported (DeepSeek's projections have no bias)")
    freq = hf_cfg.get("moe_layer_freq", 1)
    if freq != 1:
        raise ValueError(f"{mtype} moe_layer_freq={freq} is not supported (only 1: every layer after the dense ones)")
    v3 = mtype == "deepseek_v3"
    scoring = hf_cfg.get("scoring_func", "sigmoid" if v3 else "softmax")
    if scoring != ("sigmoid" if v3 else "softmax"):
        raise ValueError(f"{mtype} scoring_func={scoring!r} is not supported (transformers' {mtype} uses "
                         f"{'sigmoid' if v3 else 'softmax'})")
    method = hf_cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
    allowed = ("noaux_tc",) if v3 else ("greedy", "group_limited_greedy")
    if method not in allowed:
        raise ValueError(f"{mtype} topk_method={method!r} is not supported ({allowed})")
    if not v3 and hf_cfg.get("norm_topk_prob"):
        raise ValueError("deepseek_v2 norm_topk_prob=True is not supported (transformers' DeepSeek-V2 router "
                         "never renormalises)")
    L = _need(hf_cfg, "num_hidden_layers", arch)
    n_heads = _need(hf_cfg, "num_attention_heads", arch)
    nope, rope = _need(hf_cfg, "qk_nope_head_dim", arch), _need(hf_cfg, "qk_rope_head_dim", arch)
    # transformers' eager MLA repeats the keys num_attention_heads / num_key_value_heads times: only equal counts
    # run there. (Its head_dim is always set to qk_rope_head_dim by the config class, whatever config.json says.)
    eps = hf_cfg.get("rms_norm_eps", 1e-6)
    eps = 1e-6 if eps is None else eps
    # transformers' q_a_layernorm / kv_a_layernorm keep RMSNorm's default eps whatever the config says (a GGUF file
    # stores 1e-6 as a float32: 9.99999997e-07).
    if not math.isclose(eps, 1e-6, rel_tol=1e-6):
        raise ValueError(f"{mtype} rms_norm_eps={eps!r} is not supported: transformers' {mtype} normalises the MLA "
                         "latents with eps 1e-6 and the blocks with rms_norm_eps, and interp's model has one eps "
                         "(only 1e-6)")
    kv_heads = hf_cfg.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != n_heads:
        raise ValueError(f"{mtype} num_key_value_heads={kv_heads!r} is not supported (MLA needs "
                         f"num_attention_heads={n_heads})")
    grouped = v3 or method == "group_limited_greedy"
    groups = (hf_cfg.get("n_group") or 1) if grouped else 1
    first_dense = hf_cfg.get("first_k_dense_replace", 0) or 0
    E = _need(hf_cfg, "n_routed_experts", arch)
    d_expert = _need(hf_cfg, "moe_intermediate_size", arch)
    theta, scaling = _rope(hf_cfg, mtype)
    attn_scale = None
    if scaling is not None and scaling["rope_type"] == "yarn" and scaling.get("mscale_all_dim"):
        # DeepSeek's YaRN also rescales the softmax by mscale(factor, mscale_all_dim)**2.
        m = _yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])
        attn_scale = (nope + rope) ** -0.5 * m * m
    return ModelConfig(
        n_layers=L, d_model=_need(hf_cfg, "hidden_size", arch), n_heads=n_heads, attention="latent",
        d_head=nope, rope_dim=rope, v_head_dim=_need(hf_cfg, "v_head_dim", arch),
        kv_latent_dim=_need(hf_cfg, "kv_lora_rank", arch), q_latent_dim=hf_cfg.get("q_lora_rank"),
        positional="rotary", rotary_base=theta, rope_scaling=scaling, attn_scale=attn_scale,
        normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation="swiglu", d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), attn_bias=False, out_bias=False,
        # DeepSeek-V2's dense and shared-expert MLPs read mlp_bias; V3's hard-code none (the routed experts never).
        mlp_bias=mtype in _MLP_BIAS_KEY and bool(hf_cfg.get("mlp_bias", False)),
        unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)),
        pad_token_id=hf_cfg.get("pad_token_id"),
        n_experts=E, n_experts_per_token=_need(hf_cfg, "num_experts_per_tok", arch), d_expert=d_expert,
        router_score="sigmoid" if v3 else "softmax", router_renormalize=v3 and bool(hf_cfg.get("norm_topk_prob")),
        router_groups=groups, router_topk_groups=(hf_cfg.get("topk_group") or groups) if grouped else 1,
        router_group_score="top2_sum" if v3 else "max", router_choice_bias=v3,
        routed_scaling=float(hf_cfg.get("routed_scaling_factor", 1.0)),
        d_shared_expert=(hf_cfg.get("n_shared_experts") or 0) * d_expert,
        dense_mlp_layers=list(range(min(first_dense, L))) or None,
    )


def _yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention-temperature factor ``0.1 * mscale * ln(factor) + 1`` (1 without stretching)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _deinterleave(w: torch.Tensor, heads: int, width: int, rope: int) -> torch.Tensor:
    """Rows ``[heads * width, .]`` whose last ``rope`` rows per head hold interleaved rotary pairs
    ``(x0, x1), (x2, x3), ...`` -> the half-split layout ``(x0, x2, ..), (x1, x3, ..)`` our RoPE rotates.

    Applied to the query and to the shared key alike, it permutes both sides of every rotary dot product the
    same way: scores do not change, and the rotated values equal DeepSeek's (its interleaved rotation writes
    them out half-split too).
    """
    perm = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])  # [R]
    rows = w.reshape(heads, width, *w.shape[1:])  # [heads, width, ...]
    rows = torch.cat([rows[:, :width - rope], rows[:, width - rope:][:, perm]], dim=1)
    return rows.reshape(w.shape)


def _shape_check(arch: str, key: str, tensor: torch.Tensor, want: tuple[int, ...], why: str) -> None:
    if tuple(tensor.shape) != want:
        raise ValueError(f"{arch}: {key!r} has shape {tuple(tensor.shape)}, but the config's {why} "
                         f"need {want}")


def deepseek_state_dict(hf_sd: StateDict, cfg: ModelConfig, *, interleaved: bool = True,
                        arch: str = "deepseek_v3") -> dict[str, torch.Tensor]:
    """Our state dict from a HF DeepSeek-V2 / V3 one.

    Args:
        hf_sd: the HF state dict (``*ForCausalLM`` keys).
        cfg: from :func:`deepseek_config`.
        interleaved: the checkpoint's rotary dims come in interleaved pairs (DeepSeek-V2 always; V3 with
            ``rope_interleave``): their rows are permuted to the half-split layout (see :func:`_deinterleave`).
        arch: the HF ``model_type`` the weights come from, which the errors name.

    Raises:
        ValueError: a missing tensor, or MLA ranks / head widths / expert counts that do not match the tensors.
    """
    src = _Source(hf_sd, ("model.",), arch)
    H, D, R, C, Dv, M = (cfg.n_heads, cfg.d_head, cfg.rope_dim, cfg.kv_latent_dim, cfg.v_head_dim, cfg.d_model)
    Cq = cfg.q_latent_dim
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}

    def rope_rows(w: torch.Tensor, heads: int, width: int) -> torch.Tensor:
        return _deinterleave(w, heads, width, R) if interleaved else w

    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        a, at = h + "self_attn.", b + "attn."
        if Cq is None:
            w = src(a + "q_proj.weight")
            _shape_check(arch, src.prefix + a + "q_proj.weight", w, (H * (D + R), M),
                         f"num_attention_heads={H} x (qk_nope_head_dim={D} + qk_rope_head_dim={R}), hidden_size={M}")
            out[at + "W_q.weight"] = rope_rows(w, H, D + R)
        else:
            w_a, w_b = src(a + "q_a_proj.weight"), src(a + "q_b_proj.weight")
            _shape_check(arch, src.prefix + a + "q_a_proj.weight", w_a, (Cq, M), f"q_lora_rank={Cq}, hidden_size={M}")
            _shape_check(arch, src.prefix + a + "q_b_proj.weight", w_b, (H * (D + R), Cq),
                         f"num_attention_heads={H} x (qk_nope_head_dim={D} + qk_rope_head_dim={R}), q_lora_rank={Cq}")
            out[at + "W_dq.weight"] = w_a
            out[at + "q_norm.weight"] = src(a + "q_a_layernorm.weight")
            out[at + "W_uq.weight"] = rope_rows(w_b, H, D + R)
        w_dkv = src(a + "kv_a_proj_with_mqa.weight")
        _shape_check(arch, src.prefix + a + "kv_a_proj_with_mqa.weight", w_dkv, (C + R, M),
                     f"kv_lora_rank={C} + qk_rope_head_dim={R}, hidden_size={M}")
        out[at + "W_dkv.weight"] = rope_rows(w_dkv, 1, C + R)
        out[at + "kv_norm.weight"] = src(a + "kv_a_layernorm.weight")
        w_ukv = src(a + "kv_b_proj.weight")
        _shape_check(arch, src.prefix + a + "kv_b_proj.weight", w_ukv, (H * (D + Dv), C),
                     f"num_attention_heads={H} x (qk_nope_head_dim={D} + v_head_dim={Dv}), kv_lora_rank={C}")
        out[at + "W_ukv.weight"] = w_ukv
        w_o = src(a + "o_proj.weight")
        _shape_check(arch, src.prefix + a + "o_proj.weight", w_o, (M, H * Dv),
                     f"hidden_size={M}, num_attention_heads={H} x v_head_dim={Dv}")
        out[at + "W_O.weight"] = w_o
        out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
        out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
        out.update(_mlp_weights(src, h, b + "mlp.", cfg, i))
    if not cfg.tie_embeddings:
        if "lm_head.weight" not in hf_sd:
            raise ValueError(f"{arch} state dict has no 'lm_head.weight' and tie_word_embeddings is False")
        out["W_U.weight"] = hf_sd["lm_head.weight"]
        out["W_U.bias"] = torch.zeros(cfg.d_vocab)  # an untied W_U has a bias in interp; lm_head has none
    return out


def _deepseek_state_dict(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict]:
    mtype = str(hf_cfg.get("model_type"))
    interleaved = mtype == "deepseek_v2" or bool(hf_cfg.get("rope_interleave", True))
    return lambda sd, cfg: deepseek_state_dict(sd, cfg, interleaved=interleaved, arch=mtype)


# --- dispatch ---------------------------------------------------------------------------------------------
Converter = tuple[Callable[[Mapping[str, Any]], ModelConfig], Callable[[StateDict, ModelConfig], dict]]
CONVERTERS: dict[str, Converter] = {
    "bert": (bert_config, bert_state_dict),
    "gpt2": (gpt2_config, gpt2_state_dict),
    **{t: (llama_config, functools.partial(llama_state_dict, arch=t)) for t in _LLAMA_TYPES},
    **{t: (moe_config, functools.partial(llama_state_dict, arch=t)) for t in _MOE_TYPES},
    **{t: (deepseek_config, deepseek_state_dict) for t in _DEEPSEEK_TYPES},
}


#: The families the converters take, in short, for help texts (:func:`converter` lists every ``model_type``
#: when it refuses one).
FAMILIES = "BERT, GPT-2, Llama, Qwen, Gemma, Phi, Mixtral, DeepSeek and other families"


def _register_dense_families() -> None:
    # The other dense families live in their own module, which reads this one's helpers.
    from . import native_bloom, native_gpt_neo, native_mpt
    from .hf_families import CONVERTERS_DENSE

    CONVERTERS.update(CONVERTERS_DENSE)
    CONVERTERS["bloom"] = (native_bloom.bloom_config, native_bloom.bloom_state_dict)
    CONVERTERS["mpt"] = (native_mpt.mpt_config, native_mpt.mpt_state_dict)
    CONVERTERS["gpt_neo"] = (native_gpt_neo.gpt_neo_config, native_gpt_neo.gpt_neo_state_dict)


def converter(hf_cfg: Mapping[str, Any]) -> Converter:
    """The config and state-dict functions for a HF config's ``model_type``.

    Raises:
        ValueError: an unsupported ``model_type`` (the supported ones are listed).

    Example:
        >>> make_cfg, make_sd = converter({"model_type": "qwen2_moe"})
        >>> make_cfg.__name__, make_sd.keywords
        ('moe_config', {'arch': 'qwen2_moe'})
    """
    mtype = hf_cfg.get("model_type")
    _register_dense_families()
    if mtype not in CONVERTERS:
        raise ValueError(f"model_type={mtype!r} is not supported; supported: {sorted(CONVERTERS)}")
    make_cfg, make_sd = CONVERTERS[mtype]
    if mtype in _DEEPSEEK_TYPES:
        make_sd = _deepseek_state_dict(hf_cfg)  # the rotary layout is a config setting
    else:
        from .hf_families import STATE_DICT_FOR_CONFIG

        if mtype in STATE_DICT_FOR_CONFIG:  # scalars folded into the weights are config settings (Granite, Cohere)
            make_sd = STATE_DICT_FOR_CONFIG[mtype](hf_cfg)
    return make_cfg, make_sd


def source_dtype(hf_sd: StateDict) -> torch.dtype | None:
    """The floating dtype that holds most of a state dict's values (a bf16 checkpoint with a few float32
    buffers is bf16), or None when it has no floating tensors. Meta-device tensors count as well (their
    shapes and dtypes are all it reads).

    Example:
        >>> source_dtype({"w": torch.zeros(4, dtype=torch.bfloat16), "b": torch.zeros(1)})
        torch.bfloat16
    """
    counts: dict[torch.dtype, int] = {}
    for t in hf_sd.values():
        if t.is_floating_point():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    return max(counts, key=counts.__getitem__) if counts else None


def convert(hf_cfg: Mapping[str, Any], hf_sd: StateDict, *, name: str = "hf-model",
            dtype: torch.dtype | None = None, device: torch.device | str | None = None,
            source: str | None = None, allow_unused: bool = False) -> Transformer:
    """Build an :class:`interp.Transformer` from a HF config dict and state dict (no ``transformers`` needed).

    Check before allocate: the config's layer count is compared with the weights' layers, then the converter
    runs on meta-device tensors of the weights' shapes and dtypes and the result is fitted to a model whose
    parameters are on the meta device (:func:`interp.zoo.hf_weights.check_weights`). Only then is each tensor
    read (once: a :class:`~interp.zoo.hf_weights.StoredWeights` reads it from disk when the converter asks),
    checked for NaN / infinite values and assigned as the model's parameter, so a conversion peaks near the
    weights' own bytes.

    Args:
        hf_cfg: the HF config as a dict (``config.json`` contents); ``model_type`` picks the converter.
        hf_sd: the HF state dict: a model's (its tensors are copied, never shared) or a folder's
            :class:`~interp.zoo.hf_weights.StoredWeights` (read lazily, assigned without a copy).
        name: the model's ``name``.
        dtype: the parameters' dtype (default: the source's, see :func:`source_dtype`: bf16 stays bf16).
        device: where to build the model (default: where the source tensors are; the CPU for a folder).
        source: the folder or model named in errors (default: "Hugging Face <model_type> weights").
        allow_unused: accept tensors the converter does not read (a TransformerLens bridge adds its own views
            of the weights); by default each one is refused by name.

    Returns:
        The converted model in eval mode.

    Raises:
        TypeError: ``dtype`` is not a floating-point torch.dtype.
        ValueError: unsupported ``model_type`` (the supported ones are listed), unsupported settings, layer
            counts that disagree, missing, unexpected or non-floating tensors, shape mismatches (tensor named
            with both shapes), or a tensor holding NaN / infinite values (named with the count).

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=8))
        >>> convert(hf.config.to_dict(), hf.state_dict()).cfg.n_layers
        1
    """
    from .hf_weights import StoredWeights, check_layers, check_weights

    check_dtype(dtype)
    mtype = hf_cfg.get("model_type")
    named = source is not None  # a folder or model object: its name goes before the converter's refusals
    source = source or f"Hugging Face {mtype} weights"
    make_cfg, make_sd = converter(hf_cfg)
    cfg = make_cfg(hf_cfg)
    lazy = isinstance(hf_sd, StoredWeights)
    check_layers(hf_cfg, cfg.n_layers, set(hf_sd), source=source)
    meta = hf_sd.meta() if lazy else {k: torch.empty(t.shape, dtype=t.dtype, device="meta") for k, t in hf_sd.items()}
    if dtype is None:
        dtype = source_dtype(meta) or torch.float32
    if device is None:  # where the source weights are (a HF model on a GPU converts on that GPU)
        device = "cpu" if lazy else next((t.device for t in hf_sd.values() if t.is_floating_point()), None)
    target = torch.device(device if device is not None else "cpu")
    shapes = check_weights(hf_cfg, cfg, make_sd, meta, dtype=dtype, source=source, allow_unused=allow_unused,
                           wrap_converter_errors=named)
    model = build(cfg, dtype=dtype, device=target, meta_weights=True)
    check_fits(model, shapes, source=f"{source} (converted)")
    if not lazy:  # a model's own tensors: the same NaN / inf policy as a folder's and a GGUF file's
        hf_sd = _FiniteChecked(hf_sd, source)
    try:
        ours = make_sd(hf_sd, cfg)
    finally:
        if lazy:
            hf_sd.close()
    # A model object's tensors are copied (our weights never share storage with it); a folder's are ours.
    assign_weights(model, ours, dtype=dtype, device=target, source=source, copy=not lazy)
    del ours
    model.name = name
    return model.eval()


class _FiniteChecked(dict):
    """A state dict whose tensors are checked for NaN / infinite values when the converter reads them."""

    def __init__(self, sd: StateDict, source: str) -> None:
        super().__init__(sd)
        self.source = source

    def __getitem__(self, key: str) -> torch.Tensor:
        t = super().__getitem__(key)
        check_finite(t, key, self.source)
        return t


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"loading Hugging Face models needs transformers: {_HF_EXTRA}") from e
    return transformers


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """A model folder's ``config.json`` as the dict the converters read.

    With ``transformers`` installed the dict is its config class's ``to_dict()`` (the defaults of keys the file
    leaves out filled in as transformers fills them); without it, the file as it is. Only the config is read.

    Args:
        folder: the model folder.

    Returns:
        The config dict (``model_type`` included).

    Raises:
        FileNotFoundError: no ``config.json``.
        ValueError: not valid JSON, not an object, no ``model_type``, or a value transformers refuses (its
            message is quoted after the file's name).

    Example:
        >>> import json; (tmp / "m").mkdir(); _ = (tmp / "m" / "config.json").write_text('{"model_type": 3')
        >>> read_hf_config(tmp / "m")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: .../m/config.json: not valid JSON: Expecting ',' delimiter: line 1 column 17 (char 16)
    """
    import json

    file = Path(folder) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{folder}: no config.json")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: must hold a JSON object, got a JSON {type(raw).__name__}")
    if not isinstance(raw.get("model_type"), str):
        raise ValueError(f"{file}: key 'model_type' must name the model family (a string), got "
                         f"{raw.get('model_type')!r}")
    try:
        tf = _transformers()
    except ImportError:
        return raw
    try:
        return tf.AutoConfig.from_pretrained(str(folder)).to_dict()
    except Exception as e:  # noqa: BLE001 - transformers / huggingface_hub validators raise their own types
        raise ValueError(f"{file} (model_type={raw['model_type']!r}): transformers refuses the config: "
                         f"{_plain(str(e))}") from e


def _tokenizer_for(source: str):
    """Our Tokenizer for a local folder or hub id, or None when none can be found.

    Raises:
        ValueError: a ``tokenizer.json`` the tokenizers library cannot read (its message after the file).
    """
    from .tokenizer import Tokenizer

    folder = Path(source)
    if (folder / "tokenizer.json").is_file():
        try:
            return Tokenizer.from_file(folder / "tokenizer.json")
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises a plain Exception
            raise ValueError(f"{folder / 'tokenizer.json'}: cannot be read as a tokenizer: {e}") from e
    try:
        hf_tok = _transformers().AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        return None
    backend = getattr(hf_tok, "backend_tokenizer", None)
    return None if backend is None else Tokenizer(backend, pad_token_id=hf_tok.pad_token_id)


def from_hf(model_or_path: Any, *, tokenizer: Any = None, name: str | None = None,
            device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Transformer:
    """Convert a Hugging Face model of a supported family (:data:`FAMILIES`; :func:`converter` lists every
    ``model_type``) to an :class:`interp.Transformer`; a decoder of any other family is put on the
    attention-level route (:func:`interp.zoo.hf_route.wrap`, a warning says so once per family).

    A local folder is read directly, not through ``transformers``' ``from_pretrained`` (which fills missing
    weights with a random initialisation and only warns): ``config.json`` (:func:`read_hf_config`) and the
    weights' headers are checked against each other before anything is allocated, then each tensor is read
    once, shard by shard, into the model (see :func:`convert` and :mod:`interp.zoo.hf_weights`). Users with hub
    access can pass a hub id (``"gpt2"``, ``"TinyLlama/TinyLlama-1.1B-Chat-v1.0"``); its snapshot is downloaded
    and read the same way. A model object is converted as it is (no download), with the same checks.

    Args:
        model_or_path: a ``transformers.PreTrainedModel`` (``BertModel``, ``GPT2LMHeadModel``,
            ``LlamaForCausalLM``, ...), a local folder, or a hub id.
        tokenizer: a :class:`interp.zoo.tokenizer.Tokenizer`, a ``tokenizers.Tokenizer`` or a HF fast
            tokenizer to attach; default: the folder's / hub id's tokenizer, none for a model object.
        name: ``model.name`` (default: the path, or the HF ``name_or_path``).
        device: where to put the converted model.
        dtype: the parameters' dtype (default: the weights' own; a bf16 checkpoint stays bf16).

    Returns:
        The converted model (eval mode; BERT models return hidden states, ``cfg.unembed`` False), or a
        :class:`interp.zoo.hf_route.RouteModel` (``model.native`` False) for a family without a converter.

    Raises:
        ImportError: a hub id was given and ``transformers`` / ``huggingface_hub`` is missing
            (``pip install interp[hf]``).
        TypeError: ``model_or_path`` is neither a HF model nor a path/str, or ``dtype`` is not floating
            (checked first).
        FileNotFoundError: a folder without ``config.json`` or weights.
        ValueError: unsupported architecture or settings, a weight file outside the folder, or weights that
            do not fit (each tensor named with both shapes or dtypes).

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = from_hf(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4)))
        >>> model = from_hf("gpt2")   # with hub access  # doctest: +SKIP
    """
    from .hf_weights import open_weights

    check_dtype(dtype)
    _register_dense_families()
    if isinstance(model_or_path, (str, Path)):
        source = str(model_or_path)
        folder = Path(source)
        if not (folder / "config.json").is_file() and not folder.is_absolute():
            from . import hub_source  # a hub id: its downloaded snapshot

            _transformers()  # hub models come with the hf extra (its tokenizers, hub access)
            folder = Path(hub_source(source))
        hf_cfg = read_hf_config(folder)
        if tokenizer is None:
            tokenizer = _tokenizer_for(str(folder))
        if hf_cfg.get("model_type") not in CONVERTERS:  # no native converter: the attention-level route
            return _route_folder(folder, hf_cfg, name=name or source, tokenizer=tokenizer, dtype=dtype, device=device)
        weights = open_weights(folder)
        model = convert(hf_cfg, weights, name=name or source, dtype=dtype, device=device, source=str(folder))
    elif hasattr(model_or_path, "config") and hasattr(model_or_path, "state_dict"):
        hf_model = model_or_path
        name = name or getattr(hf_model.config, "name_or_path", "") or hf_model.config.model_type
        if hf_model.config.model_type not in CONVERTERS:  # no native converter: the attention-level route
            from .hf_route import wrap

            return wrap(hf_model.to(device=device, dtype=dtype), name=name, tokenizer=_wrap_tokenizer(tokenizer),
                        warn=True)
        model = convert(hf_model.config.to_dict(), hf_model.state_dict(), name=name, dtype=dtype, device=device,
                        source=f"Hugging Face {type(hf_model).__name__} ({name})")
    else:
        raise TypeError(f"from_hf takes a Hugging Face model, a local folder or a hub id, "
                        f"got {type(model_or_path).__name__}")
    model.tokenizer = _wrap_tokenizer(tokenizer)
    return model


def _route_folder(folder: Path, hf_cfg: Mapping[str, Any], *, name: str, tokenizer: Any,
                  dtype: torch.dtype | None, device: torch.device | str | None) -> Any:
    """A folder of a family without a converter, loaded by transformers for the attention-level route; refused
    when transformers reports a missing, unexpected or mis-shaped weight (which it would fill with random values
    and only warn about)."""
    from .hf_route import wrap

    tf = _transformers()
    try:
        hf_model, info = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype or "auto",
                                                                 output_loading_info=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{folder}: its weights are a pickle file that cannot be loaded safely; convert them to "
                         f"model.safetensors first ({_plain(str(e).splitlines()[0])})") from e
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{folder}: transformers could not load this {hf_cfg.get('model_type')!r} model: "
                         f"{_plain(str(e).splitlines()[0] if str(e) else type(e).__name__)}") from e
    bad = [f"{what.replace('_', ' ')}: {sorted(map(str, info.get(what) or []))[:8]}"
           for what in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(what)]
    if bad:
        raise ValueError(f"{folder}: the weights do not match config.json (model_type "
                         f"{hf_cfg.get('model_type')!r}): {'; '.join(bad)}")
    if device is not None:
        hf_model = hf_model.to(device)
    return wrap(hf_model, name=name, tokenizer=_wrap_tokenizer(tokenizer), warn=True)


def _plain(text: str) -> str:
    """``text`` without terminal colour codes (torch's pickle errors carry them)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _wrap_tokenizer(tokenizer: Any):
    from tokenizers import Tokenizer as HFTok

    from .tokenizer import Tokenizer

    if tokenizer is None or isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, HFTok):
        return Tokenizer(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, HFTok):
        return Tokenizer(backend, pad_token_id=getattr(tokenizer, "pad_token_id", None))
    raise TypeError(f"tokenizer must be an interp Tokenizer, a tokenizers.Tokenizer or a HF fast tokenizer, "
                    f"got {type(tokenizer).__name__}")
