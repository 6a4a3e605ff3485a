"""Hugging Face converters for the dense decoder families beyond Llama: Gemma 1/2/3, GPT-NeoX (Pythia),
GPT-BigCode (StarCoder), Falcon, Phi-1/2, Phi-3 and OLMo 2 (Llama, Mistral, Qwen2 and Qwen3 are in
:mod:`interp.zoo.hf`). Like those, each is a pair of pure functions (HF config dict -> :class:`ModelConfig`,
HF state dict -> ours) registered in :data:`interp.zoo.hf.CONVERTERS`; none imports ``transformers``.

What each family needs of the core, and how its weights map:

* Gemma: RMSNorm ``x * (1 + w)`` (the converter stores ``1 + w``, the same numbers in an ``nn.RMSNorm``; in
  bf16 the weight multiplies in float32 before one rounding, ``norm_weight_float32``, as Gemma's own norm does),
  embeddings times ``sqrt(d_model)`` (``embed_scale``), gated tanh-GELU MLP (``geglu_tanh``), tied unembedding.
  Gemma 2 adds sandwich norms (``sublayer_norm="sandwich"``), ``query_pre_attn_scalar`` (``attn_scale``),
  attention and final soft-caps and alternating sliding-window layers; Gemma 3 adds QK-norm and a separate
  RoPE base for its local layers (``local_rotary_base``).
* GPT-NeoX / Pythia: parallel attention and MLP with two LayerNorms, partial rotary, a fused QKV whose rows
  are grouped per head (``[q_h, k_h, v_h]`` for each head h), reordered into our ``[q | k | v]``.
* GPT-BigCode / StarCoder: GPT-2 with ``nn.Linear`` weights and multi-query attention (one K/V head).
* Falcon: parallel block with one shared LayerNorm (7B: MQA) or two (``new_decoder_architecture``: grouped
  K/V, fused QKV ordered per K/V group as ``[q_1 .. q_G, k, v]``); ``alibi=True`` (up to 8 heads) replaces RoPE
  with ALiBi (``alibi_slopes``, divided by ``sqrt(d_head)`` as transformers does).
* Phi-1/2: parallel block with one LayerNorm, partial rotary, biased unembedding.
* Phi-3: Llama with fused ``qkv_proj`` and ``gate_up_proj``, optional sliding window and LongRoPE.
* OLMo (1): Llama with non-parametric LayerNorms, stored as weight 1 and bias 0; ``clip_qkv`` is refused.
* Arcee: Llama with an ungated squared-ReLU MLP (``activation="relu2"``).
* Hunyuan v1 dense: Llama with per-head QK-norm after RoPE (``qk_norm="head_after_rotary"``) and NTK-alpha
  RoPE folded into the base.
* SmolLM3: Llama with layers without positions (``nope_layers``, from ``no_rope_layers``).
* EXAONE 4: OLMo 2's weights and output-only norms with per-head QK-norm; sliding layers rotate, global ones
  have no positions (``nope_layers``) when any layer slides.
* Granite: Llama with ``embedding_multiplier`` (``embed_scale``), ``attention_multiplier`` (``attn_scale``) and
  ``residual_multiplier`` / ``logits_scaling`` folded into the output projections and the unembedding.
* GLM / GLM-4: (GLM-4 only) sandwich norms, fused ``gate_up_proj``, partial rotary on interleaved pairs (query and key rows
  reordered to halves: the same scores).
* StableLM: pre-LayerNorm, partial rotary, optional q/k/v biases and parallel block; ``qk_layernorm`` refused.
* ERNIE 4.5 (dense): Llama with ``use_bias`` and RoPE on interleaved pairs (rows reordered to halves).
* Cohere (Command-R): parallel block with one bias-free LayerNorm (bias 0), interleaved RoPE reordered to
  halves, ``logit_scale`` folded into an untied ``W_U``; ``use_qk_norm`` refused. Cohere 2: sliding layers
  rotate, global ones have no positions (``nope_layers``).
* GPT-J: parallel block with one LayerNorm, interleaved partial RoPE (rows reordered to halves), biased head.
* OPT (pre-LayerNorm sizes): learned positions past OPT's offset of 2, ReLU MLP; ``project_in`` / ``project_out``
  and post-LayerNorm OPT-350m refused.
* Starcoder 2: pre-LayerNorm, ``use_bias`` on every projection, tanh-GELU MLP, one window on every layer.
* OLMo 2 / OLMo 3: norms on the sublayers' outputs only (``sublayer_norm="output"``) and QK-norm over all heads;
  its RMSNorm, like Gemma's, multiplies by the weight before rounding (``norm_weight_float32``), and in bf16
  its rotary embedding rotates in float32 and rounds once (``rotary_float32``). OLMo 3 adds sliding layers
  (``layer_types``) whose RoPE base is their own (``local_rotary_base``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import ModelConfig, alibi_slopes
from .hf import (
    StateDict,
    _decoder_checks,
    _dense_weights,
    _gated_activation,
    _llama_attention,
    _need,
    _rope,
    _Source,
    gpt2_state_dict_for,
    llama_state_dict,
    sliding_windows,
)

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_new")


def _refuse(arch: str, hf_cfg: Mapping[str, Any], settings: tuple[tuple[str, Any, Any], ...]) -> None:
    """Raise naming the first setting whose value is not the one the converter reproduces."""
    for key, default, supported in settings:
        value = hf_cfg.get(key)
        value = default if value is None else value
        if value != supported:
            raise ValueError(f"{arch} {key}={value!r} is not supported by the converter (only {supported!r})")


def _shaped(src: _Source, key: str, shape: tuple[int, ...]) -> torch.Tensor:
    """``src(key)`` after checking its shape (a fused tensor is split by the config's sizes)."""
    t = src(key)
    if tuple(t.shape) != shape:
        raise ValueError(f"{src.arch} tensor {src.prefix + key!r} has shape {tuple(t.shape)}, the config "
                         f"implies {shape}")
    return t


def _per_head_qkv(w: torch.Tensor, H: int, D: int) -> torch.Tensor:
    """Rows grouped per head ``[q_h, k_h, v_h]`` (GPT-NeoX, BigCode MHA, Falcon MHA) -> ``[q | k | v]``."""
    rest = w.shape[1:]
    return w.reshape(H, 3, D, *rest).transpose(0, 1).reshape(3 * H * D, *rest)  # [H, 3, D, ..] -> [3HD, ..]


def _lm_head(hf_sd: StateDict, src: _Source, cfg: ModelConfig, arch: str, key: str = "lm_head.weight",
             bias: str | None = None) -> dict[str, torch.Tensor]:
    """The untied unembedding (and its bias: zeros when the HF head has none)."""
    if cfg.tie_embeddings:
        return {}
    if key not in hf_sd:
        raise ValueError(f"{arch} state dict has no {key!r} and the config does not tie the embeddings "
                         "(pass a *ForCausalLM model, not the bare *Model)")
    out = {"W_U.weight": hf_sd[key]}
    out["W_U.bias"] = hf_sd[bias] if bias is not None else torch.zeros(cfg.d_vocab, dtype=hf_sd[key].dtype)
    return out


# --- Gemma 1 / 2 / 3 --------------------------------------------------------------------------------------
def gemma_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Gemma, Gemma 2 or Gemma 3 text decoder from its HF config dict.

    Raises:
        ValueError: an unsupported setting (activation, bidirectional attention, RoPE kind on the local layers),
            or a missing key.

    Example:
        >>> cfg = gemma_config({"model_type": "gemma2", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        ...                     "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                     "max_position_embeddings": 64, "sliding_window": 8, "query_pre_attn_scalar": 16,
        ...                     "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        ...                     "layer_types": ["sliding_attention", "full_attention"]})
        >>> cfg.sliding_window, cfg.attn_softcap, cfg.sublayer_norm
        ([8, None], 50.0, 'sandwich')
    """
    mtype = hf_cfg.get("model_type", "gemma")
    arch = mtype
    _decoder_checks(hf_cfg, arch)
    act = hf_cfg.get("hidden_activation") or hf_cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if mtype == "gemma" and act == "gelu":
        act = "gelu_pytorch_tanh"  # transformers reads Gemma 1's legacy "gelu" as the tanh approximation
    acts = {"gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu": "geglu"}
    if act not in acts:
        raise ValueError(f"{arch} hidden_activation={act!r} is not supported ({sorted(acts)})")
    _refuse(arch, hf_cfg, (("use_bidirectional_attention", False, False),))
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = hf_cfg.get("head_dim") or d_model // n_heads
    rope = hf_cfg.get("rope_parameters") or {}
    local_base = None
    if mtype == "gemma3_text" and "full_attention" in rope:
        theta, scaling = _rope(hf_cfg, arch, rope["full_attention"])
        local_theta, local_scaling = _rope(hf_cfg, arch, rope.get("sliding_attention") or {"rope_type": "default"})
        if local_scaling is not None:
            raise ValueError(f"{arch} sliding_attention rope_type={local_scaling['rope_type']!r} is not supported "
                             "(local layers rotate with plain RoPE)")
        local_base = local_theta
    else:
        theta, scaling = _rope(hf_cfg, arch)
    windows = sliding_windows(hf_cfg, arch) if mtype != "gemma" else None
    if local_base is not None and windows is None:
        local_base = None
    later = mtype != "gemma"
    scalar = hf_cfg.get("query_pre_attn_scalar") if later else None
    attn_bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=acts[act], d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        local_rotary_base=local_base, sliding_window=windows,
        attn_scale=None if scalar is None else float(scalar) ** -0.5,
        # Gemma 3's config class carries attn_logit_softcapping, but its attention never applies it.
        attn_softcap=hf_cfg.get("attn_logit_softcapping") if mtype == "gemma2" else None,
        final_softcap=hf_cfg.get("final_logit_softcapping") if later else None,
        qk_norm="head" if mtype == "gemma3_text" else "none",
        sublayer_norm="sandwich" if later else "input", embed_scale=d_model ** 0.5, norm_weight_float32=True,
        attn_bias=attn_bias, out_bias=attn_bias, mlp_bias=False, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gemma_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Gemma / Gemma 2 / Gemma 3 text one; every RMSNorm weight ``w`` becomes ``1 + w``.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.language_model.", "model."), "Gemma")

    def norm(key: str) -> torch.Tensor:
        return src(key) + 1  # Gemma's RMSNorm scales by (1 + w)

    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": norm("norm.weight")}
    sandwich = cfg.sublayer_norm == "sandwich"
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        out[b + "ln1.weight"] = norm(h + "input_layernorm.weight")
        if sandwich:
            out[b + "ln1_post.weight"] = norm(h + "post_attention_layernorm.weight")
            out[b + "ln2.weight"] = norm(h + "pre_feedforward_layernorm.weight")
            out[b + "ln2_post.weight"] = norm(h + "post_feedforward_layernorm.weight")
        else:
            out[b + "ln2.weight"] = norm(h + "post_attention_layernorm.weight")
        if cfg.qk_norm != "none":
            out[b + "attn.q_norm.weight"] = norm(h + "self_attn.q_norm.weight")
            out[b + "attn.k_norm.weight"] = norm(h + "self_attn.k_norm.weight")
        out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, "Gemma"))
    return out


# --- OLMo 2 -----------------------------------------------------------------------------------------------
def _per_type_rope(hf_cfg: Mapping[str, Any], arch: str,
                   windows: list[int | None] | None) -> tuple[float, dict | None, float | None]:
    """``(rotary_base, rope_scaling, local_rotary_base)`` of a config whose ``rope_parameters`` may hold one dict
    per layer type (Gemma 3, OLMo 3): the full-attention layers' RoPE, and the sliding layers' plain base.

    Raises:
        ValueError: scaled RoPE on the sliding layers, or sliding-layer RoPE that differs while no layer slides.
    """
    rope = hf_cfg.get("rope_parameters") or {}
    if "full_attention" not in rope:
        theta, scaling = _rope(hf_cfg, arch)
        return theta, scaling, None
    theta, scaling = _rope(hf_cfg, arch, rope["full_attention"])
    local_theta, local_scaling = _rope(hf_cfg, arch, rope.get("sliding_attention") or {"rope_type": "default"})
    if local_scaling is not None:
        raise ValueError(f"{arch} sliding_attention rope_type={local_scaling['rope_type']!r} is not supported "
                         "(local layers rotate with plain RoPE)")
    if windows is None:
        types = hf_cfg.get("layer_types") or []
        if "sliding_attention" in types and local_theta != theta:
            raise ValueError(f"{arch} layer_types has sliding layers but sliding_window=None, and their "
                             f"rope_theta={local_theta!r} differs from the full layers' {theta!r}: not supported")
        return theta, scaling, None
    return theta, scaling, local_theta


def olmo2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an OLMo 2 or OLMo 3 decoder: norms after each sublayer only, QK-norm over all
    heads; OLMo 3 adds sliding-window layers (``layer_types``) with their own RoPE base.

    Raises:
        ValueError: an unsupported setting (activation, RoPE kind) or a missing key.

    Example:
        >>> cfg = olmo2_config({"model_type": "olmo3", "hidden_size": 64, "num_attention_heads": 4,
        ...                     "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                     "max_position_embeddings": 64, "sliding_window": 8,
        ...                     "layer_types": ["sliding_attention", "full_attention"],
        ...                     "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
        ...                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})
        >>> cfg.sliding_window, cfg.rotary_base, cfg.local_rotary_base
        ([8, None], 500000.0, 10000.0)
    """
    arch = hf_cfg.get("model_type", "olmo2")
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("attention_bias", False, False),))
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    windows = sliding_windows(hf_cfg, arch)
    theta, scaling, local_base = _per_type_rope(hf_cfg, arch, windows)
    return ModelConfig(
        sliding_window=windows, local_rotary_base=local_base,
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads, n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=_gated_activation(hf_cfg, arch),
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="rms", norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=theta,
        rope_scaling=scaling, qk_norm="full", sublayer_norm="output", norm_weight_float32=True, rotary_float32=True,
        attn_bias=False, out_bias=False, mlp_bias=False, unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def olmo2_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF OLMo 2 one.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "OLMo 2/3")
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        out[b + "attn.q_norm.weight"] = src(h + "self_attn.q_norm.weight")
        out[b + "attn.k_norm.weight"] = src(h + "self_attn.k_norm.weight")
        out[b + "ln1_post.weight"] = src(h + "post_attention_layernorm.weight")
        out[b + "ln2_post.weight"] = src(h + "post_feedforward_layernorm.weight")
        out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, "OLMo 2/3"))
    return out


# --- Phi-3 ------------------------------------------------------------------------------------------------
def phi3_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Phi-3 decoder (fused projections, optional sliding window and LongRoPE).

    Raises:
        ValueError: an unsupported setting (activation, RoPE kind) or a missing key.
    """
    arch = "phi3"
    _decoder_checks(hf_cfg, arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    # transformers' Phi-3 attention and rotary read head_dim when the config has one (else hidden / heads).
    d_head = hf_cfg.get("head_dim") or d_model // n_heads
    theta, scaling = _rope(hf_cfg, arch)
    rope = hf_cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", hf_cfg.get("partial_rotary_factor", 1.0))
    rotary_dim = int(d_head * partial)
    # transformers' Phi-3 drops its generation cache at the top-level original_max_position_embeddings while its
    # RoPE switches factors at rope_parameters': interp does both at one boundary, so the two must agree.
    top = hf_cfg.get("original_max_position_embeddings")
    if scaling is not None and top is not None and top != scaling["original_max_position_embeddings"]:
        raise ValueError(f"{arch} original_max_position_embeddings={top!r} differs from rope_parameters' "
                         f"{scaling['original_max_position_embeddings']!r}: not supported")
    if scaling is not None and scaling["rope_type"] == "longrope":
        for key in ("short_factor", "long_factor"):
            if len(scaling[key]) != rotary_dim // 2:
                raise ValueError(f"{arch} rope_parameters[{key!r}] has {len(scaling[key])} factors, but head_dim="
                                 f"{d_head} x partial_rotary_factor={partial} rotates {rotary_dim} dims, which need "
                                 f"{rotary_dim // 2}")
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=_gated_activation(hf_cfg, arch), d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rotary_dim=rotary_dim, rope_scaling=scaling, sliding_window=sliding_windows(hf_cfg, arch),
        attn_bias=False, out_bias=False, mlp_bias=False, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def phi3_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Phi-3 one: ``qkv_proj`` rows are already ``[q | k | v]``; ``gate_up_proj``
    rows are ``[gate | up]``.

    Raises:
        ValueError: a tensor is absent or a fused one's shape disagrees with the config (both named).
    """
    src = _Source(hf_sd, ("model.",), "Phi-3")
    H, K, D, M, F = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model, cfg.d_mlp
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out[b + "attn.W_qkv.weight"] = _shaped(src, h + "self_attn.qkv_proj.weight", ((H + 2 * K) * D, M))
        out[b + "attn.W_O.weight"] = src(h + "self_attn.o_proj.weight")
        out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
        out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
        gate, up = _shaped(src, h + "mlp.gate_up_proj.weight", (2 * F, M)).split([F, F], dim=0)  # [F, M] each
        out[b + "mlp.W_gate.weight"], out[b + "mlp.W_in.weight"] = gate, up
        out[b + "mlp.W_out.weight"] = src(h + "mlp.down_proj.weight")
    out.update(_lm_head(hf_sd, src, cfg, "Phi-3"))
    return out


# --- GPT-NeoX / Pythia ------------------------------------------------------------------------------------
def gpt_neox_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-NeoX / Pythia decoder (parallel block, partial rotary).

    Raises:
        ValueError: an unsupported setting (activation, RoPE kind) or a missing key.
    """
    arch = "gpt_neox"
    act = hf_cfg.get("hidden_act", "gelu")
    acts = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_fast": "gelu_new", "gelu_pytorch_tanh": "gelu_new",
            "relu": "relu"}
    if act not in acts:
        raise ValueError(f"{arch} hidden_act={act!r} is not supported ({sorted(acts)})")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = d_model // n_heads
    _decoder_checks(hf_cfg, arch, rotary_head_dim=d_head)
    rope = hf_cfg.get("rope_parameters") or {}
    pct = rope.get("partial_rotary_factor", hf_cfg.get("rotary_pct", 1.0))
    legacy_base = hf_cfg.get("rotary_emb_base")
    theta, scaling = _rope(hf_cfg, arch, default_theta=legacy_base or 10000.0)
    bias = bool(hf_cfg.get("attention_bias", True))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=acts[act],
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="pre", norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rotary_dim=int(d_head * pct), rope_scaling=scaling,
        parallel_block="two_norms" if hf_cfg.get("use_parallel_residual", True) else "none",
        attn_bias=bias, out_bias=bias, mlp_bias=True, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gpt_neox_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-NeoX one; the fused QKV's per-head row groups are reordered.

    Raises:
        ValueError: a tensor is absent or the fused QKV's shape disagrees with the config (both named).
    """
    src = _Source(hf_sd, ("gpt_neox.",), "GPT-NeoX")
    H, D, M = cfg.n_heads, cfg.d_head, cfg.d_model
    out = {"W_E.weight": src("embed_in.weight"), "ln_final.weight": src("final_layer_norm.weight"),
           "ln_final.bias": src("final_layer_norm.bias")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out[b + "attn.W_qkv.weight"] = _per_head_qkv(
            _shaped(src, h + "attention.query_key_value.weight", (3 * H * D, M)), H, D)
        if cfg.attn_bias:
            out[b + "attn.W_qkv.bias"] = _per_head_qkv(
                _shaped(src, h + "attention.query_key_value.bias", (3 * H * D,)), H, D)
            out[b + "attn.W_O.bias"] = src(h + "attention.dense.bias")
        out[b + "attn.W_O.weight"] = src(h + "attention.dense.weight")
        for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"),
                             ("mlp.W_in", "mlp.dense_h_to_4h"), ("mlp.W_out", "mlp.dense_4h_to_h")):
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    key = "embed_out.weight" if "embed_out.weight" in hf_sd else "lm_head.weight"
    out.update(_lm_head(hf_sd, src, cfg, "GPT-NeoX", key))
    return out


# --- GPT-BigCode / StarCoder ------------------------------------------------------------------------------
def gpt_bigcode_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-BigCode / StarCoder decoder (learned positions, MQA).

    Raises:
        ValueError: an unsupported setting (cross-attention, activation) or a missing key.
    """
    arch = "gpt_bigcode"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("add_cross_attention", False, False),))
    act = hf_cfg.get("activation_function", "gelu_pytorch_tanh")
    acts = {"gelu_pytorch_tanh": "gelu_new", "gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu"}
    if act not in acts:
        raise ValueError(f"{arch} activation_function={act!r} is not supported ({sorted(acts)})")
    d_model, n_heads = _need(hf_cfg, "n_embd", arch), _need(hf_cfg, "n_head", arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "n_layer", arch), d_model=d_model, n_heads=n_heads,
        n_kv_heads=1 if hf_cfg.get("multi_query", True) else n_heads,
        d_mlp=hf_cfg.get("n_inner") or 4 * d_model, activation=acts[act], d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "n_positions", arch), normalization="pre", positional="learned",
        norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5),
        attn_scale=None if hf_cfg.get("scale_attn_weights", True) else 1.0, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gpt_bigcode_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-BigCode one: MQA's ``c_attn`` rows are ``[q | k | v]`` already, MHA's are
    grouped per head and reordered.

    Raises:
        ValueError: a tensor is absent or ``c_attn``'s shape disagrees with the config (both named).
    """
    src = _Source(hf_sd, ("transformer.",), "GPT-BigCode")
    H, K, D, M = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    out = {"W_E.weight": src("wte.weight"), "W_pos.weight": src("wpe.weight"),
           "ln_final.weight": src("ln_f.weight"), "ln_final.bias": src("ln_f.bias")}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        w = _shaped(src, h + "attn.c_attn.weight", ((H + 2 * K) * D, M))
        bias = _shaped(src, h + "attn.c_attn.bias", ((H + 2 * K) * D,))
        if K == H:
            w, bias = _per_head_qkv(w, H, D), _per_head_qkv(bias, H, D)
        out[b + "attn.W_qkv.weight"], out[b + "attn.W_qkv.bias"] = w, bias
        for ours, theirs in (("attn.W_O", "attn.c_proj"), ("mlp.W_in", "mlp.c_fc"), ("mlp.W_out", "mlp.c_proj"),
                             ("ln1", "ln_1"), ("ln2", "ln_2")):
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    out.update(_lm_head(hf_sd, src, cfg, "GPT-BigCode"))
    return out


# --- Falcon -----------------------------------------------------------------------------------------------
def falcon_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Falcon decoder: MQA (7B) or grouped K/V (``new_decoder_architecture``).

    Raises:
        ValueError: ALiBi with more than 8 heads, a non-parallel new decoder architecture, an activation other
            than gelu/relu, or a missing key.
    """
    arch = "falcon"
    act = hf_cfg.get("activation", "gelu")
    if act not in ("gelu", "relu"):
        raise ValueError(f"{arch} activation={act!r} is not supported (gelu, relu)")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    _decoder_checks(hf_cfg, arch, rotary_head_dim=d_model // n_heads)
    new_arch = bool(hf_cfg.get("new_decoder_architecture", False))
    parallel = bool(hf_cfg.get("parallel_attn", True))
    multi_query = bool(hf_cfg.get("multi_query", True))  # read by the old architecture only
    if new_arch:
        if not parallel:
            raise ValueError(f"{arch} new_decoder_architecture=True with parallel_attn=False is not supported")
        n_kv = hf_cfg.get("num_kv_heads") or n_heads
        n_ln = hf_cfg.get("num_ln_in_parallel_attn") or 2
        block = "two_norms" if n_ln == 2 else "one_norm"
    else:
        n_kv = 1 if multi_query else n_heads
        block = "one_norm" if parallel else "none"
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("bias", False))
    slopes = _falcon_alibi_slopes(n_heads, d_model // n_heads) if hf_cfg.get("alibi", False) else None
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv,
        d_mlp=hf_cfg.get("ffn_hidden_size") or 4 * d_model, activation=act,
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=hf_cfg.get("max_position_embeddings") or 2048,
        normalization="pre", norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5),
        positional="none" if slopes else "rotary", alibi_slopes=slopes,  # ALiBi layers do not rotate
        rotary_base=theta, rope_scaling=None if slopes else scaling, parallel_block=block, attn_bias=bias, out_bias=bias,
        mlp_bias=bias, unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def _falcon_alibi_slopes(n_heads: int, d_head: int) -> list[float]:
    """Falcon's ALiBi slopes as transformers applies them: divided by ``sqrt(d_head)`` (its bias is added after the
    scores are scaled, and scaled itself).

    transformers rounds each slope and each ``slope * key_position`` to bfloat16 before adding it. For up to 8
    heads every slope is a power of two, so the products are exact up to key position 255; for more heads the
    rounded slopes and products differ from exact ALiBi by up to 0.4 %, which interp does not reproduce: refused.

    Raises:
        ValueError: more than 8 heads with ``alibi=True``.
    """
    if n_heads > 8:
        raise ValueError(f"falcon alibi=True with num_attention_heads={n_heads} is not supported: transformers rounds "
                         "the slopes (not powers of two beyond 8 heads) and their products with key positions to "
                         "bfloat16, which interp does not reproduce")
    return [s / math.sqrt(d_head) for s in alibi_slopes(n_heads)]


def falcon_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Falcon one; the fused QKV is reordered into ``[q | k | v]``.

    Raises:
        ValueError: a tensor is absent or the fused QKV's shape disagrees with the config (both named).
    """
    src = _Source(hf_sd, ("transformer.",), "Falcon")
    H, K, D, M = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    G = H // K
    out = {"W_E.weight": src("word_embeddings.weight"), "ln_final.weight": src("ln_f.weight"),
           "ln_final.bias": src("ln_f.bias")}
    # Per-group rows [q_1 .. q_G, k, v] coincide with per-head [q, k, v] for G = 1 and with [q | k | v] for K = 1.
    grouped = K not in (1, H)

    def qkv(t: torch.Tensor) -> torch.Tensor:
        rest = t.shape[1:]
        if grouped:  # per K/V group [q_1 .. q_G, k, v]
            g = t.reshape(K, G + 2, D, *rest)  # [K, G + 2, D, ..]
            return torch.cat([g[:, :G].reshape(H * D, *rest), g[:, G].reshape(K * D, *rest),
                              g[:, G + 1].reshape(K * D, *rest)])  # [(H + 2K) D, ..]
        if K == H:
            return _per_head_qkv(t, H, D)
        return t  # MQA: [q | k | v] already

    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        out[b + "attn.W_qkv.weight"] = qkv(_shaped(src, h + "self_attention.query_key_value.weight",
                                                   ((H + 2 * K) * D, M)))
        out[b + "attn.W_O.weight"] = src(h + "self_attention.dense.weight")
        out[b + "mlp.W_in.weight"] = src(h + "mlp.dense_h_to_4h.weight")
        out[b + "mlp.W_out.weight"] = src(h + "mlp.dense_4h_to_h.weight")
        if cfg.attn_bias:
            out[b + "attn.W_qkv.bias"] = qkv(src(h + "self_attention.query_key_value.bias"))
            out[b + "attn.W_O.bias"] = src(h + "self_attention.dense.bias")
            out[b + "mlp.W_in.bias"] = src(h + "mlp.dense_h_to_4h.bias")
            out[b + "mlp.W_out.bias"] = src(h + "mlp.dense_4h_to_h.bias")
        if cfg.parallel_block == "two_norms":
            norms = (("ln1", "ln_attn"), ("ln2", "ln_mlp"))
        elif cfg.parallel_block == "one_norm":
            norms = (("ln1", "input_layernorm"),)
        else:
            norms = (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"))
        for ours, theirs in norms:
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    out.update(_lm_head(hf_sd, src, cfg, "Falcon"))
    return out


# --- Phi-1 / Phi-2 ----------------------------------------------------------------------------------------
def phi_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Phi-1 / Phi-2 decoder (parallel block with one LayerNorm, partial rotary).

    Raises:
        ValueError: ``qk_layernorm``, an unsupported activation or a missing key.
    """
    arch = "phi"
    _refuse(arch, hf_cfg, (("qk_layernorm", False, False),))
    act = hf_cfg.get("hidden_act", "gelu_new")
    acts = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
    if act not in acts:
        raise ValueError(f"{arch} hidden_act={act!r} is not supported ({sorted(acts)})")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = d_model // n_heads
    _decoder_checks(hf_cfg, arch, rotary_head_dim=d_head)
    rope = hf_cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", hf_cfg.get("partial_rotary_factor", 0.5))
    theta, scaling = _rope(hf_cfg, arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=acts[act], d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="pre",
        norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rotary_dim=int(d_head * partial), rope_scaling=scaling, parallel_block="one_norm", unembed=True,
        # Phi's lm_head has a bias, which tied embeddings keep (only the weight is W_E's): interp's tied W_U has
        # no bias, so the unembedding is always a separate W_U holding the tied weight and the bias.
        tie_embeddings=False, pad_token_id=hf_cfg.get("pad_token_id"),
    )


def phi_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Phi-1 / Phi-2 one (its unembedding has a bias).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "Phi")
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("final_layernorm.weight"),
           "ln_final.bias": src("final_layernorm.bias")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                [src(h + f"self_attn.{n}_proj.{kind}") for n in ("q", "k", "v")], dim=0)  # [(H+2K)*D(, M)]
            for ours, theirs in (("attn.W_O", "self_attn.dense"), ("ln1", "input_layernorm"),
                                 ("mlp.W_in", "mlp.fc1"), ("mlp.W_out", "mlp.fc2")):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    if "lm_head.weight" not in hf_sd and "lm_head.bias" in hf_sd:
        # A tied checkpoint stores the head's bias but not its weight, which is the embedding.
        # A view, not a copy: reads still reach hf_sd (a folder reader records what the converter used).
        hf_sd = ChainMap({"lm_head.weight": out["W_E.weight"]}, hf_sd)  # type: ignore[arg-type]
    if "lm_head.bias" not in hf_sd:
        raise ValueError("Phi state dict has no 'lm_head.bias' (pass a PhiForCausalLM model, not the bare PhiModel)")
    out.update(_lm_head(hf_sd, src, cfg, "Phi", bias="lm_head.bias"))
    return out


# --- Starcoder 2 ------------------------------------------------------------------------------------------
def starcoder2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Starcoder 2 decoder: pre-LayerNorm, biased projections (``use_bias``), a
    tanh-GELU MLP, grouped K/V, RoPE and one sliding window on every layer.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> cfg = starcoder2_config({"model_type": "starcoder2", "hidden_size": 64, "num_attention_heads": 4,
        ...                          "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96,
        ...                          "vocab_size": 50, "max_position_embeddings": 64, "sliding_window": 8})
        >>> cfg.sliding_window, cfg.activation, cfg.n_kv_heads
        ([8, 8], 'gelu_new', 2)
    """
    arch = "starcoder2"
    _decoder_checks(hf_cfg, arch)
    act = hf_cfg.get("hidden_act", "gelu_pytorch_tanh")
    acts = {"gelu_pytorch_tanh": "gelu_new", "gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu"}
    if act not in acts:
        raise ValueError(f"{arch} hidden_act={act!r} is not supported ({sorted(acts)})")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("use_bias", True))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads, n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=acts[act],
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="pre", norm_eps=hf_cfg.get("norm_epsilon", 1e-5), positional="rotary", rotary_base=theta,
        rope_scaling=scaling, sliding_window=sliding_windows(hf_cfg, arch), attn_bias=bias, out_bias=bias,
        mlp_bias=bias, unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def starcoder2_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Starcoder 2 one (separate q/k/v/o, ``mlp.c_fc`` / ``mlp.c_proj``).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "Starcoder 2")
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight"),
           "ln_final.bias": src("norm.bias")}
    kinds = ("weight", "bias") if cfg.mlp_bias else ("weight",)
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        for kind in ("weight", "bias"):
            out[b + f"ln1.{kind}"] = src(h + f"input_layernorm.{kind}")
            out[b + f"ln2.{kind}"] = src(h + f"post_attention_layernorm.{kind}")
        for kind in kinds:
            out[b + f"mlp.W_in.{kind}"] = src(h + f"mlp.c_fc.{kind}")
            out[b + f"mlp.W_out.{kind}"] = src(h + f"mlp.c_proj.{kind}")
    out.update(_lm_head(hf_sd, src, cfg, "Starcoder 2"))
    return out


# --- OLMo 1 -----------------------------------------------------------------------------------------------
def olmo_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an OLMo (1) decoder: Llama with non-parametric LayerNorms (eps 1e-5, which
    transformers hard-codes), optionally biased attention.

    The LayerNorms have no weights in the checkpoint; the state dict gives ours weight 1 and bias 0, which
    computes the same numbers with no new norm kind.

    Raises:
        ValueError: ``clip_qkv`` (not implemented), an activation other than silu, or a missing key.

    Example:
        >>> cfg = olmo_config({"model_type": "olmo", "hidden_size": 64, "num_attention_heads": 4,
        ...                    "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                    "max_position_embeddings": 64, "attention_bias": True})
        >>> cfg.normalization, cfg.norm_eps, cfg.attn_bias, cfg.out_bias
        ('pre', 1e-05, True, True)
    """
    arch = "olmo"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("clip_qkv", None, None),))
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads, n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=_gated_activation(hf_cfg, arch),
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="pre", norm_eps=1e-5, positional="rotary", rotary_base=theta, rope_scaling=scaling,
        attn_bias=bias, out_bias=bias, mlp_bias=False, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def olmo_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF OLMo (1) one; every LayerNorm gets weight 1 and bias 0 (OLMo's have none).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "OLMo")
    embed = src("embed_tokens.weight")
    one, zero = torch.ones(cfg.d_model, dtype=embed.dtype), torch.zeros(cfg.d_model, dtype=embed.dtype)
    out = {"W_E.weight": embed, "ln_final.weight": one, "ln_final.bias": zero}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        for ln in ("ln1", "ln2"):
            out[b + f"{ln}.weight"], out[b + f"{ln}.bias"] = one.clone(), zero.clone()
        out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, "OLMo"))
    return out


# --- Arcee ------------------------------------------------------------------------------------------------
def arcee_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an Arcee (AFM) decoder: Llama with an ungated MLP (``up_proj`` / ``down_proj``)
    whose activation is squared ReLU by default.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> cfg = arcee_config({"model_type": "arcee", "hidden_size": 64, "num_attention_heads": 4,
        ...                     "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                     "max_position_embeddings": 64})
        >>> cfg.activation, cfg.normalization
        ('relu2', 'rms')
    """
    arch = "arcee"
    _decoder_checks(hf_cfg, arch)
    act = hf_cfg.get("hidden_act", "relu2")
    acts = {"relu2": "relu2", "relu": "relu", "silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_new",
            "gelu_new": "gelu_new"}
    if act not in acts:
        raise ValueError(f"{arch} hidden_act={act!r} is not supported ({sorted(acts)})")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads, n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=acts[act],
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="rms", norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rope_scaling=scaling, attn_bias=bias, out_bias=bias, mlp_bias=bool(hf_cfg.get("mlp_bias", False)),
        unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def arcee_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Arcee one (Llama keys; the MLP has no ``gate_proj``).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "Arcee")
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}
    kinds = ("weight", "bias") if cfg.mlp_bias else ("weight",)
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
        out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
        for kind in kinds:
            out[b + f"mlp.W_in.{kind}"] = src(h + f"mlp.up_proj.{kind}")
            out[b + f"mlp.W_out.{kind}"] = src(h + f"mlp.down_proj.{kind}")
    out.update(_lm_head(hf_sd, src, cfg, "Arcee"))
    return out


# --- Hunyuan (dense) --------------------------------------------------------------------------------------
def hunyuan_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Hunyuan v1 dense decoder: Llama with per-head QK-norm applied after RoPE
    (``qk_norm="head_after_rotary"``); its "dynamic" RoPE with a fixed ``alpha`` is plain RoPE with the base
    ``rope_theta * alpha ** (d_head / (d_head - 2))``, as transformers computes it.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> cfg = hunyuan_config({"model_type": "hunyuan_v1_dense", "hidden_size": 64, "num_attention_heads": 4,
        ...                       "head_dim": 16, "num_hidden_layers": 2, "intermediate_size": 96,
        ...                       "vocab_size": 50, "max_position_embeddings": 64,
        ...                       "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "alpha": 2.0}})
        >>> cfg.qk_norm, round(cfg.rotary_base, 1), cfg.rope_scaling
        ('head_after_rotary', 22081.8, None)
    """
    arch = "hunyuan_v1_dense"
    _decoder_checks(hf_cfg, arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = hf_cfg.get("head_dim") or d_model // n_heads
    rope = hf_cfg.get("rope_parameters") or {}
    if rope.get("rope_type") == "dynamic" and rope.get("alpha"):
        theta, _ = _rope(hf_cfg, arch, {"rope_type": "default", "rope_theta": rope.get("rope_theta", 10000.0)})
        alpha = rope["alpha"]
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
            raise ValueError(f"{arch} rope_parameters['alpha']={alpha!r} must be a number > 0")
        theta, scaling = theta * alpha ** (d_head / (d_head - 2)), None
    else:
        theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=_gated_activation(hf_cfg, arch), d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        qk_norm="head_after_rotary", attn_bias=bias, out_bias=bias, mlp_bias=False, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def hunyuan_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Hunyuan v1 dense one (Llama keys plus ``query_layernorm`` / ``key_layernorm``).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "Hunyuan")
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        out[b + "attn.q_norm.weight"] = src(h + "self_attn.query_layernorm.weight")
        out[b + "attn.k_norm.weight"] = src(h + "self_attn.key_layernorm.weight")
        out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
        out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
        out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, "Hunyuan"))
    return out


# --- SmolLM3, EXAONE 4: layers without positions (NoPE) -----------------------------------------------------
def _typed_windows(hf_cfg: Mapping[str, Any], arch: str, default_types: list[str],
                   use: bool = True) -> tuple[list[str], list[int | None] | None]:
    """``(layer_types, windows)``: the config's ``layer_types`` (else ``default_types``, what the config class
    derives) and each layer's window (``sliding_window`` on the sliding layers when ``use``).

    Raises:
        ValueError: a ``layer_types`` of the wrong length or with a type other than sliding / full attention.
    """
    n_layers = _need(hf_cfg, "num_hidden_layers", arch)
    types = hf_cfg.get("layer_types") or default_types
    if len(types) != n_layers:
        raise ValueError(f"{arch} layer_types has {len(types)} entries, num_hidden_layers={n_layers}")
    for i, kind in enumerate(types):
        if kind not in ("sliding_attention", "full_attention"):
            raise ValueError(f"{arch} layer_types[{i}]={kind!r} is not supported "
                             "(only 'sliding_attention' and 'full_attention')")
    window = hf_cfg.get("sliding_window")
    windows = [window if use and window and kind == "sliding_attention" else None for kind in types]
    return list(types), windows if any(w is not None for w in windows) else None


def smollm3_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a SmolLM3 decoder: Llama whose layers flagged 0 in ``no_rope_layers`` (by default
    every ``no_rope_layer_interval``-th) attend without positions (``nope_layers``); with ``use_sliding_window``
    the sliding layers of ``layer_types`` are windowed.

    Raises:
        ValueError: an unsupported activation, RoPE kind or layer type, a ``no_rope_layers`` of the wrong length,
            or a missing key.

    Example:
        >>> cfg = smollm3_config({"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4,
        ...                       "num_hidden_layers": 4, "intermediate_size": 96, "vocab_size": 50,
        ...                       "max_position_embeddings": 64})
        >>> cfg.nope_layers, cfg.sliding_window
        ([3], None)
    """
    arch = "smollm3"
    _decoder_checks(hf_cfg, arch)
    n_layers = _need(hf_cfg, "num_hidden_layers", arch)
    interval = hf_cfg.get("no_rope_layer_interval", 4)
    has_rope = hf_cfg.get("no_rope_layers")
    if has_rope is None:
        has_rope = [int((i + 1) % interval != 0) for i in range(n_layers)]
    if len(has_rope) != n_layers or any(flag not in (0, 1) for flag in has_rope):
        raise ValueError(f"{arch} no_rope_layers={has_rope!r} must hold one 0 / 1 flag per layer "
                         f"(num_hidden_layers={n_layers})")
    use = bool(hf_cfg.get("use_sliding_window", False))
    window = hf_cfg.get("sliding_window")
    default = ["sliding_attention" if use and window is not None and not rope else "full_attention"
               for rope in has_rope]
    _, windows = _typed_windows(hf_cfg, arch, default, use)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=hf_cfg.get("head_dim") or d_model // n_heads,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=_gated_activation(hf_cfg, arch), d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        nope_layers=[i for i, rope in enumerate(has_rope) if not rope] or None, sliding_window=windows,
        attn_bias=bias, out_bias=bias, mlp_bias=bool(hf_cfg.get("mlp_bias", False)), unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def exaone4_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an EXAONE 4 decoder: OLMo 2's output-only norms with per-head QK-norm, sliding
    layers (``layer_types``, else all but every ``sliding_window_pattern``-th) and, when any layer slides, no
    positions on the global layers (``nope_layers``).

    Raises:
        ValueError: an unsupported activation, RoPE kind or layer type, or a missing key.

    Example:
        >>> cfg = exaone4_config({"model_type": "exaone4", "hidden_size": 64, "num_attention_heads": 4,
        ...                       "num_hidden_layers": 4, "intermediate_size": 96, "vocab_size": 50,
        ...                       "max_position_embeddings": 64, "sliding_window": 8, "sliding_window_pattern": 2})
        >>> cfg.sliding_window, cfg.nope_layers
        ([8, None, 8, None], [1, 3])
    """
    arch = "exaone4"
    _decoder_checks(hf_cfg, arch)
    n_layers = _need(hf_cfg, "num_hidden_layers", arch)
    window = hf_cfg.get("sliding_window")
    pattern = hf_cfg.get("sliding_window_pattern", 4)
    if window is None:
        default = ["full_attention"] * n_layers
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        default = ["sliding_attention" if (i + 1) % pattern != 0 else "full_attention" for i in range(n_layers)]
    elif not hf_cfg.get("layer_types"):
        raise ValueError(f"{arch} sliding_window_pattern={pattern!r} without layer_types is not supported "
                         "(only a positive int)")
    else:
        default = []
    types, windows = _typed_windows(hf_cfg, arch, default)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    theta, scaling = _rope(hf_cfg, arch)
    # transformers rotates every layer when sliding_window is None, else only the sliding ones.
    nope = [] if window is None else [i for i, kind in enumerate(types) if kind != "sliding_attention"]
    return ModelConfig(
        n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=hf_cfg.get("head_dim") or d_model // n_heads,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=_gated_activation(hf_cfg, arch), d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        nope_layers=nope or None, sliding_window=windows, qk_norm="head", sublayer_norm="output",
        norm_weight_float32=True, attn_bias=False, out_bias=False, mlp_bias=False, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


# --- Granite ----------------------------------------------------------------------------------------------
def _granite_multiplier(hf_cfg: Mapping[str, Any], key: str, arch: str = "granite", default: float = 1.0) -> float:
    """A scalar multiplier of the config, checked to be a finite number > 0."""
    value = hf_cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ValueError(f"{arch} {key}={value!r} must be a finite number > 0")
    return float(value)


def granite_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Granite (3.x) decoder: Llama with four scalars. ``embedding_multiplier`` is
    ``embed_scale`` and ``attention_multiplier`` the score scale (``attn_scale``); ``residual_multiplier`` and
    ``logits_scaling`` are folded into the weights by :func:`granite_state_dict_for` (each sublayer's output
    projection times the multiplier, the unembedding divided by the scaling), so the unembedding is always a
    separate ``W_U`` (a tied one holds the embedding divided by ``logits_scaling``).

    Raises:
        ValueError: a multiplier that is not a finite number > 0, an activation other than silu, or a missing key.

    Example:
        >>> cfg = granite_config({"model_type": "granite", "hidden_size": 64, "num_attention_heads": 4,
        ...                       "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                       "max_position_embeddings": 64, "embedding_multiplier": 12.0,
        ...                       "attention_multiplier": 0.0078125, "tie_word_embeddings": True})
        >>> cfg.embed_scale, cfg.attn_scale, cfg.tie_embeddings
        (12.0, 0.0078125, False)
    """
    from .hf import llama_config

    cfg = llama_config(hf_cfg)
    return dataclasses.replace(cfg, embed_scale=_granite_multiplier(hf_cfg, "embedding_multiplier"),
                               attn_scale=_granite_multiplier(hf_cfg, "attention_multiplier"), tie_embeddings=False)


def granite_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]:
    """The state-dict function of a Granite config: Llama's, with ``residual_multiplier`` folded into every
    ``W_O`` and ``W_out`` (weights and biases) and ``W_U = lm_head / logits_scaling`` (the embedding when tied
    and the checkpoint has no ``lm_head.weight``).

    Raises:
        ValueError: ``residual_multiplier`` or ``logits_scaling`` not a finite number > 0.
    """
    residual = _granite_multiplier(hf_cfg, "residual_multiplier")
    logits = _granite_multiplier(hf_cfg, "logits_scaling")
    tied = bool(hf_cfg.get("tie_word_embeddings", False))

    def convert(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
        if "lm_head.weight" not in hf_sd and tied:
            hf_sd = ChainMap({"lm_head.weight": _Source(hf_sd, ("model.",), "granite")("embed_tokens.weight")},
                             hf_sd)  # type: ignore[arg-type]
        out = llama_state_dict(hf_sd, cfg, arch="granite")
        for key in out:
            if ".attn.W_O." in key or ".mlp.W_out." in key:
                out[key] = out[key] * residual  # the block adds residual_multiplier x each sublayer's output
        out["W_U.weight"] = out["W_U.weight"] / logits
        return out

    return convert


# --- GLM-4 ------------------------------------------------------------------------------------------------
def glm4_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GLM-4 (0414) decoder: sandwich norms, fused ``gate_up_proj``, biased q/k/v, and
    partial rotary (``partial_rotary_factor``, 0.5 by default) on interleaved pairs, which
    :func:`glm4_state_dict` turns into our half-split layout by permuting the query and key rows. GLM
    (``model_type="glm"``, GLM-4-9B) is the same without the norms after each sublayer.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> cfg = glm4_config({"model_type": "glm4", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        ...                    "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                    "max_position_embeddings": 64,
        ...                    "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
        ...                                        "partial_rotary_factor": 0.5}})
        >>> cfg.rotary_dim, cfg.sublayer_norm, cfg.attn_bias, cfg.out_bias
        (8, 'sandwich', True, False)
    """
    arch = hf_cfg.get("model_type", "glm4")
    _decoder_checks(hf_cfg, arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = hf_cfg.get("head_dim") or d_model // n_heads
    rope = hf_cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", hf_cfg.get("partial_rotary_factor", 0.5))
    theta, scaling = _rope(hf_cfg, arch)
    if scaling is not None:
        raise ValueError(f"{arch} rope_type={scaling['rope_type']!r} is not supported (only 'default': GLM-4 "
                         "rotates part of each head)")
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=_gated_activation(hf_cfg, arch), d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rotary_dim=int(d_head * partial), sublayer_norm="sandwich" if arch == "glm4" else "input",
        attn_bias=bool(hf_cfg.get("attention_bias", True)), out_bias=False, mlp_bias=False, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def _leading_pairs_to_halves(w: torch.Tensor, heads: int, width: int, rope: int) -> torch.Tensor:
    """Rows ``[heads * width, ..]`` whose first ``rope`` rows per head hold interleaved rotary pairs
    ``(x0, x1), (x2, x3), ..`` -> the half-split layout ``(x0, x2, ..), (x1, x3, ..)`` our RoPE rotates.
    Applied to queries and keys alike, it permutes both sides of every dot product the same way: the scores
    are unchanged."""
    perm = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2), torch.arange(rope, width)])  # [width]
    return w.reshape(heads, width, *w.shape[1:])[:, perm].reshape(w.shape)  # [heads, width, ..] -> [heads * width, ..]


def glm4_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GLM-4 one: sandwich norms, ``gate_up_proj`` split into ``[gate | up]``, and the
    rotary rows of each query and key head reordered from interleaved pairs to halves.

    Raises:
        ValueError: a tensor is absent or a fused one's shape disagrees with the config (both named).
    """
    src = _Source(hf_sd, ("model.",), "GLM-4")
    H, K, D, M, F, R = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model, cfg.d_mlp, cfg.rotary_dim
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        for kind in ("weight", "bias") if cfg.attn_bias else ("weight",):
            q, k, v = out[b + f"attn.W_qkv.{kind}"].split([H * D, K * D, K * D], dim=0)
            out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                [_leading_pairs_to_halves(q, H, D, R), _leading_pairs_to_halves(k, K, D, R), v])  # [(H+2K)*D(, M)]
        norms = (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"))
        if cfg.sublayer_norm == "sandwich":  # GLM-4-0414; GLM normalises the sublayers' inputs only
            norms += (("ln1_post", "post_self_attn_layernorm"), ("ln2_post", "post_mlp_layernorm"))
        for ours, theirs in norms:
            out[b + f"{ours}.weight"] = src(h + f"{theirs}.weight")
        gate, up = _shaped(src, h + "mlp.gate_up_proj.weight", (2 * F, M)).split([F, F], dim=0)  # [F, M] each
        out[b + "mlp.W_gate.weight"], out[b + "mlp.W_in.weight"] = gate, up
        out[b + "mlp.W_out.weight"] = src(h + "mlp.down_proj.weight")
    out.update(_lm_head(hf_sd, src, cfg, "GLM-4"))
    return out


# --- StableLM ---------------------------------------------------------------------------------------------
def stablelm_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a StableLM (2) decoder: pre-LayerNorm, partial rotary (``partial_rotary_factor``,
    0.25 by default), optional q/k/v biases (``use_qkv_bias``) and parallel block with one norm
    (``use_parallel_residual``).

    Raises:
        ValueError: ``qk_layernorm`` (per-head LayerNorms, not implemented), an unsupported activation or RoPE
            kind, or a missing key.

    Example:
        >>> cfg = stablelm_config({"model_type": "stablelm", "hidden_size": 64, "num_attention_heads": 4,
        ...                        "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                        "max_position_embeddings": 64, "use_qkv_bias": True,
        ...                        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
        ...                                            "partial_rotary_factor": 0.25}})
        >>> cfg.rotary_dim, cfg.attn_bias, cfg.out_bias, cfg.parallel_block
        (4, True, False, 'none')
    """
    arch = "stablelm"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("qk_layernorm", False, False),))
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = d_model // n_heads  # StableLM's attention ignores head_dim; only its RoPE init would read one
    if hf_cfg.get("head_dim") not in (None, d_head):
        raise ValueError(f"{arch} head_dim={hf_cfg['head_dim']!r} is not supported (StableLM's attention uses "
                         f"hidden_size / num_attention_heads = {d_head})")
    rope = hf_cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", hf_cfg.get("partial_rotary_factor", 0.25))
    theta, scaling = _rope(hf_cfg, arch)
    if scaling is not None:
        raise ValueError(f"{arch} rope_type={scaling['rope_type']!r} is not supported (only 'default': StableLM "
                         "rotates part of each head)")
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=_gated_activation(hf_cfg, arch), d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="pre",
        norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rotary_dim=int(d_head * partial),
        parallel_block="one_norm" if hf_cfg.get("use_parallel_residual", False) else "none",
        attn_bias=bool(hf_cfg.get("use_qkv_bias", False)), out_bias=False, mlp_bias=False, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def stablelm_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF StableLM one (Llama keys, LayerNorms with biases).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "StableLM")
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight"),
           "ln_final.bias": src("norm.bias")}
    norms = (("ln1", "input_layernorm"),) if cfg.parallel_block != "none" else (
        ("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"))
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        for ours, theirs in norms:
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
        out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, "StableLM"))
    return out


# --- ERNIE 4.5 (dense) ------------------------------------------------------------------------------------
def ernie4_5_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an ERNIE 4.5 dense decoder: Llama with ``use_bias`` on every projection and RoPE
    on interleaved pairs of the whole head (reordered to halves by :func:`ernie4_5_state_dict`), rotated in
    float32 (``rotary_float32``).

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> cfg = ernie4_5_config({"model_type": "ernie4_5", "hidden_size": 64, "num_attention_heads": 4,
        ...                        "head_dim": 16, "num_hidden_layers": 2, "intermediate_size": 96,
        ...                        "vocab_size": 50, "max_position_embeddings": 64, "use_bias": True})
        >>> cfg.rotary_dim, cfg.attn_bias, cfg.out_bias, cfg.mlp_bias, cfg.tie_embeddings
        (16, True, True, True, True)
    """
    arch = "ernie4_5"
    _decoder_checks(hf_cfg, arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("use_bias", False))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads, n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=_gated_activation(hf_cfg, arch),
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="rms", norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rope_scaling=scaling, rotary_float32=True, attn_bias=bias, out_bias=bias, mlp_bias=bias, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def ernie4_5_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF ERNIE 4.5 one: Llama's keys, query and key rows reordered from interleaved
    pairs to halves (the same scores).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    out = llama_state_dict(hf_sd, cfg, arch="ernie4_5")
    for i in range(cfg.n_layers):
        for kind in ("weight", "bias") if cfg.attn_bias else ("weight",):
            key = f"blocks.{i}.attn.W_qkv.{kind}"
            q, k, v = out[key].split([H * D, K * D, K * D], dim=0)
            out[key] = torch.cat([_leading_pairs_to_halves(q, H, D, D), _leading_pairs_to_halves(k, K, D, D), v])
    return out


# --- Cohere (Command-R) -----------------------------------------------------------------------------------
def cohere_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Cohere (Command-R) decoder: parallel block with one LayerNorm without bias
    (stored with bias 0), RoPE on interleaved pairs rotated in float32 (rows reordered to halves), and logits
    times ``logit_scale``, folded into an untied ``W_U`` by :func:`cohere_state_dict_for`. Cohere 2 adds
    sliding layers (``layer_types``, else all but every 4th); only they rotate, the others have no positions.

    Raises:
        ValueError: ``use_qk_norm`` (per-head LayerNorms, not implemented), ``logit_scale`` not a finite number
            > 0, an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> cfg = cohere_config({"model_type": "cohere", "hidden_size": 64, "num_attention_heads": 4,
        ...                      "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                      "max_position_embeddings": 64})
        >>> cfg.parallel_block, cfg.normalization, cfg.tie_embeddings
        ('one_norm', 'pre', False)
    """
    arch = hf_cfg.get("model_type", "cohere")
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("use_qk_norm", False, False),) if arch == "cohere" else ())
    _granite_multiplier(hf_cfg, "logit_scale", arch, 0.0625)
    windows, nope = None, None
    if arch == "cohere2":  # sliding layers rotate; the others (all of them without a window) have no positions
        n_layers = _need(hf_cfg, "num_hidden_layers", arch)
        default = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n_layers)]
        _, windows = _typed_windows(hf_cfg, arch, default)
        nope = [i for i in range(n_layers) if windows is None or windows[i] is None] or None
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads, n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=_gated_activation(hf_cfg, arch),
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="pre", norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rope_scaling=scaling, rotary_float32=True, sliding_window=windows, nope_layers=nope,
        parallel_block="one_norm", attn_bias=bias, out_bias=bias, mlp_bias=False, unembed=True,
        tie_embeddings=False, pad_token_id=hf_cfg.get("pad_token_id"),
    )


def cohere_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]:
    """The state-dict function of a Cohere config: Llama's keys, LayerNorm biases 0, query and key rows
    reordered from interleaved pairs to halves, ``W_U = lm_head * logit_scale`` (the embedding when tied).

    Raises:
        ValueError: ``logit_scale`` not a finite number > 0.
    """
    scale = _granite_multiplier(hf_cfg, "logit_scale", "cohere", 0.0625)
    tied = bool(hf_cfg.get("tie_word_embeddings", True))

    def convert(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
        src = _Source(hf_sd, ("model.",), "Cohere")
        H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        embed = src("embed_tokens.weight")
        zero = torch.zeros(cfg.d_model, dtype=embed.dtype)
        if "lm_head.weight" not in hf_sd and not tied:
            raise ValueError("Cohere state dict has no 'lm_head.weight' and tie_word_embeddings is False "
                             "(pass a *ForCausalLM model, not the bare *Model)")
        head = hf_sd["lm_head.weight"] if "lm_head.weight" in hf_sd else embed
        out = {"W_E.weight": embed, "ln_final.weight": src("norm.weight"), "ln_final.bias": zero,
               "W_U.weight": head * scale, "W_U.bias": torch.zeros(cfg.d_vocab, dtype=embed.dtype)}
        for i in range(cfg.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            out.update(_llama_attention(src, h, b, cfg))
            for kind in ("weight", "bias") if cfg.attn_bias else ("weight",):
                q, k, v = out[b + f"attn.W_qkv.{kind}"].split([H * D, K * D, K * D], dim=0)
                out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                    [_leading_pairs_to_halves(q, H, D, D), _leading_pairs_to_halves(k, K, D, D), v])
            out[b + "ln1.weight"], out[b + "ln1.bias"] = src(h + "input_layernorm.weight"), zero.clone()
            out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
        return out

    return convert


# --- GPT-J ------------------------------------------------------------------------------------------------
def gptj_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-J decoder: parallel block with one LayerNorm, RoPE on interleaved pairs of
    the first ``rotary_dim`` dims of each head (rows reordered to halves by :func:`gptj_state_dict`), biased MLP
    and a biased unembedding (so ``W_U`` is always separate, as Phi's).

    Raises:
        ValueError: ``rotary_dim=None`` (transformers' GPT-J then rotates by the whole model width), an
            unsupported activation, or a missing key.

    Example:
        >>> cfg = gptj_config({"model_type": "gptj", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 50,
        ...                    "n_positions": 64, "rotary_dim": 8})
        >>> cfg.rotary_dim, cfg.parallel_block, cfg.d_mlp, cfg.activation
        (8, 'one_norm', 256, 'gelu_new')
    """
    arch = "gptj"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("add_cross_attention", False, False),))
    act = hf_cfg.get("activation_function", "gelu_new")
    acts = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
    if act not in acts:
        raise ValueError(f"{arch} activation_function={act!r} is not supported ({sorted(acts)})")
    d_model, n_heads = _need(hf_cfg, "n_embd", arch), _need(hf_cfg, "n_head", arch)
    rotary_dim = hf_cfg.get("rotary_dim")
    if rotary_dim is None:
        raise ValueError(f"{arch} rotary_dim=None is not supported (give the rotated dims of each head)")
    return ModelConfig(
        n_layers=_need(hf_cfg, "n_layer", arch), d_model=d_model, n_heads=n_heads,
        d_mlp=hf_cfg.get("n_inner") or 4 * d_model, activation=acts[act], d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "n_positions", arch), normalization="pre", norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5),
        positional="rotary", rotary_base=10000.0, rotary_dim=rotary_dim, parallel_block="one_norm",
        attn_bias=False, out_bias=False, mlp_bias=True, unembed=True, tie_embeddings=False,
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gptj_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-J one: the query and key rows reordered from interleaved pairs to halves.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("transformer.",), "GPT-J")
    H, D, R = cfg.n_heads, cfg.d_head, cfg.rotary_dim
    out = {"W_E.weight": src("wte.weight"), "ln_final.weight": src("ln_f.weight"), "ln_final.bias": src("ln_f.bias")}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        q, k = (_leading_pairs_to_halves(src(h + f"attn.{n}_proj.weight"), H, D, R) for n in ("q", "k"))
        out[b + "attn.W_qkv.weight"] = torch.cat([q, k, src(h + "attn.v_proj.weight")])  # [3 H D, M]
        out[b + "attn.W_O.weight"] = src(h + "attn.out_proj.weight")
        for ours, theirs in (("ln1", "ln_1"), ("mlp.W_in", "mlp.fc_in"), ("mlp.W_out", "mlp.fc_out")):
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    if "lm_head.weight" not in hf_sd and "lm_head.bias" in hf_sd:
        hf_sd = ChainMap({"lm_head.weight": out["W_E.weight"]}, hf_sd)  # type: ignore[arg-type]  # tied: the head's weight is the embedding
    if "lm_head.bias" not in hf_sd:
        raise ValueError("GPT-J state dict has no 'lm_head.bias' (pass a GPTJForCausalLM model, not GPTJModel)")
    out.update(_lm_head(hf_sd, src, cfg, "GPT-J", bias="lm_head.bias"))
    return out


# --- OPT --------------------------------------------------------------------------------------------------
def opt_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an OPT decoder (pre-LayerNorm variants: OPT-125m, 1.3b and up): learned positions
    whose table starts 2 rows in (the converter drops the offset rows), ReLU MLP, biases (``enable_bias``).

    Raises:
        ValueError: ``word_embed_proj_dim`` other than ``hidden_size`` (``project_in`` / ``project_out``, OPT-350m),
            ``do_layer_norm_before=False``, ``_remove_final_layer_norm``, an unsupported activation, or a missing key.

    Example:
        >>> cfg = opt_config({"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "ffn_dim": 96,
        ...                   "num_hidden_layers": 2, "vocab_size": 50, "max_position_embeddings": 64,
        ...                   "word_embed_proj_dim": 64})
        >>> cfg.positional, cfg.activation, cfg.tie_embeddings
        ('learned', 'relu', True)
    """
    arch = "opt"
    _decoder_checks(hf_cfg, arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    _refuse(arch, hf_cfg, (("word_embed_proj_dim", d_model, d_model), ("do_layer_norm_before", True, True),
                           ("_remove_final_layer_norm", False, False)))
    act = hf_cfg.get("activation_function", "relu")
    acts = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_new", "silu": "silu"}
    if act not in acts:
        raise ValueError(f"{arch} activation_function={act!r} is not supported ({sorted(acts)})")
    bias = bool(hf_cfg.get("enable_bias", True))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_mlp=_need(hf_cfg, "ffn_dim", arch), activation=acts[act], d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="pre", norm_eps=1e-5,
        positional="learned", attn_bias=bias, out_bias=bias, mlp_bias=bias, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def opt_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]:
    """The state-dict function of an OPT config: positions from row 2 of ``embed_positions`` (OPT's offset);
    LayerNorms without weights (``layer_norm_elementwise_affine=False``) get weight 1 and bias 0.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    affine = bool(hf_cfg.get("layer_norm_elementwise_affine", True))

    def convert(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
        src = _Source(hf_sd, ("model.decoder.", "decoder."), "OPT")
        embed = src("embed_tokens.weight")
        one, zero = torch.ones(cfg.d_model, dtype=embed.dtype), torch.zeros(cfg.d_model, dtype=embed.dtype)

        def norm(ours: str, theirs: str) -> dict[str, torch.Tensor]:
            if not affine:
                return {f"{ours}.weight": one.clone(), f"{ours}.bias": zero.clone()}
            return {f"{ours}.{kind}": src(f"{theirs}.{kind}") for kind in ("weight", "bias")}

        out = {"W_E.weight": embed, "W_pos.weight": src("embed_positions.weight")[2:2 + cfg.n_ctx],
               **norm("ln_final", "final_layer_norm")}
        kinds = ("weight", "bias") if cfg.attn_bias else ("weight",)
        for i in range(cfg.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            for kind in kinds:
                out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                    [src(h + f"self_attn.{n}_proj.{kind}") for n in ("q", "k", "v")])  # [3 H D(, M)]
                out[b + f"attn.W_O.{kind}"] = src(h + f"self_attn.out_proj.{kind}")
                out[b + f"mlp.W_in.{kind}"] = src(h + f"fc1.{kind}")
                out[b + f"mlp.W_out.{kind}"] = src(h + f"fc2.{kind}")
            out.update(norm(b + "ln1", h + "self_attn_layer_norm"))
            out.update(norm(b + "ln2", h + "final_layer_norm"))
        out.update(_lm_head(hf_sd, src, cfg, "OPT"))
        return out

    return convert


CONVERTERS_DENSE = {
    "gemma": (gemma_config, gemma_state_dict),
    "gemma2": (gemma_config, gemma_state_dict),
    "gemma3_text": (gemma_config, gemma_state_dict),
    "olmo": (olmo_config, olmo_state_dict),
    "olmo2": (olmo2_config, olmo2_state_dict),
    "olmo3": (olmo2_config, olmo2_state_dict),
    "starcoder2": (starcoder2_config, starcoder2_state_dict),
    "arcee": (arcee_config, arcee_state_dict),
    "hunyuan_v1_dense": (hunyuan_config, hunyuan_state_dict),
    "smollm3": (smollm3_config, functools.partial(llama_state_dict, arch="smollm3")),
    "exaone4": (exaone4_config, olmo2_state_dict),
    "glm": (glm4_config, glm4_state_dict),
    "glm4": (glm4_config, glm4_state_dict),
    "stablelm": (stablelm_config, stablelm_state_dict),
    "ernie4_5": (ernie4_5_config, ernie4_5_state_dict),
    "gptj": (gptj_config, gptj_state_dict),
    "opt": (opt_config, opt_state_dict_for({})),
    "cohere": (cohere_config, cohere_state_dict_for({})),
    "cohere2": (cohere_config, cohere_state_dict_for({})),
    "granite": (granite_config, granite_state_dict_for({})),
    "phi3": (phi3_config, phi3_state_dict),
    "gpt_neox": (gpt_neox_config, gpt_neox_state_dict),
    "gpt_bigcode": (gpt_bigcode_config, gpt_bigcode_state_dict),
    "falcon": (falcon_config, falcon_state_dict),
    "phi": (phi_config, phi_state_dict),
}


#: The families whose state-dict function depends on config scalars folded into the weights: the dispatch
#: (:func:`interp.zoo.hf.converter`) builds it from the config (the entries above hold the defaults' version).
STATE_DICT_FOR_CONFIG = {"gpt2": gpt2_state_dict_for, "granite": granite_state_dict_for, "cohere": cohere_state_dict_for,
                         "cohere2": cohere_state_dict_for, "opt": opt_state_dict_for}
