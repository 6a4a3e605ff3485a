"""Llama-style decoders (``LlamaForCausalLM``; also Mistral, Ministral and Seed-OSS, which differ only in
config values: Ministral's ``layer_types`` windows, Seed-OSS's separate ``attention_out_bias``): pre-RMSNorm,
rotate-half RoPE with base ``rope_theta``, SwiGLU MLP, grouped-query attention. The parent of most decoder
families here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import _MLP_BIAS_KEY, GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need
from ._family import TEST_WINDOW, CompatConfig, Family, named
from ._gguf import GATED_MLP, LLAMA_ATTN, llama_spec
from ._gguf_experts import with_experts
from ._positions import _rope, _rope_context, sliding_windows
from ._tensors import (
    _llama_ends,
    _llama_layer,
    _mlp_weights,
    _Source,
)

#: Which q/k/v and output-projection biases each family's transformers attention has: a config key it reads, or
#: a constant it hard-codes (Qwen2: q/k/v always biased, whatever ``attention_bias`` says; Mistral, Mixtral: never).
ATTENTION_BIASES: dict[str, tuple[str | bool, str | bool]] = {
    "llama": ("attention_bias", "attention_bias"),
    "qwen3_moe": ("attention_bias", "attention_bias"), "olmoe": ("attention_bias", "attention_bias"),
    "qwen2": (True, False), "qwen2_moe": ("qkv_bias", False), "mistral": (False, False), "mixtral": (False, False),
    "ministral": (False, False), "seed_oss": ("attention_bias", "attention_out_bias"),
    "granite": ("attention_bias", "attention_bias"),
}


#: transformers' defaults for keys it reads with a default (``qkv_bias`` of Qwen2-MoE is True).
_BIAS_DEFAULTS = {"qkv_bias": True}


#: A family's bias rule: ``(q/k/v, output projection)``, each a config key or a constant.
BiasRule = tuple[str | bool, str | bool]


def _biases(hf_cfg: Mapping[str, Any], arch: str, rules: BiasRule | None = None) -> tuple[bool, bool]:
    """``(attn_bias, out_bias)`` of family ``arch`` (:data:`ATTENTION_BIASES`, unless ``rules`` is given)."""
    rules = rules or ATTENTION_BIASES[arch]
    return tuple(rule if isinstance(rule, bool) else bool(hf_cfg.get(rule, _BIAS_DEFAULTS.get(rule, False)))
                 for rule in rules)  # type: ignore[return-value]


def llama_config(hf_cfg: Mapping[str, Any], *, biases: BiasRule | None = None, window_rule: str | None = None,
                 gated_window: bool | None = None) -> ModelConfig:
    """:class:`ModelConfig` of a Llama-style decoder (llama / mistral / qwen2 / ...) from its HF config dict.

    Sliding windows come per layer (:func:`sliding_windows`). A child family passes its own values: ``biases``
    (see :data:`ATTENTION_BIASES`), ``window_rule`` and ``gated_window`` (see :func:`sliding_windows`); by default
    they are looked up by ``model_type``.

    ``rotary_base`` comes from ``rope_parameters["rope_theta"]`` (transformers 5) or ``rope_theta`` (4.x), and
    RoPE scaling (``linear``, ``dynamic``, ``llama3``, ``yarn``, ``longrope``) becomes ``rope_scaling``.

    Raises:
        ValueError: another RoPE kind, an activation other than silu, an unknown layer type, or a missing key.
    """
    mtype = hf_cfg.get("model_type", "llama")
    arch = mtype  # mistral, qwen2 and the MoE families come through here too: errors name the real one
    _decoder_checks(hf_cfg, mtype)
    n_ctx = _need(hf_cfg, "max_position_embeddings", arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    attn_bias, out_bias = _biases(hf_cfg, mtype, biases)
    theta, scaling = _rope(hf_cfg, mtype)
    n_ctx = _rope_context(n_ctx, scaling)
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=_activation(hf_cfg, "hidden_act", "silu", mtype, GATED_ACTIVATIONS),
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=n_ctx, normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        causal=True, attn_bias=attn_bias, out_bias=out_bias,
        mlp_bias=mtype in _MLP_BIAS_KEY and bool(hf_cfg.get("mlp_bias", False)), unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
        sliding_window=sliding_windows(hf_cfg, mtype, rule=window_rule, gated=gated_window), qk_norm="none",
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
    out = _llama_ends(src)
    for i in range(cfg.n_layers):
        h, b, layer = _llama_layer(src, cfg, i)
        out.update(layer)
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


#: llama.cpp's ``llama`` (Llama 1/2/3, Mistral, SmolLM, TinyLlama; Mixtral when the file has experts): the
#: converter permuted ``attn_q`` / ``attn_k`` rows so that each head's rotary pairs are interleaved.
GGUF = with_experts(llama_spec("llama", permuted=True))
#: llama.cpp's ``seed_oss``: Llama's names (the second norm is ``post_attention_norm``), not permuted; ``head_dim``
#: from ``attention.key_length``.
SEED_OSS_GGUF = dataclasses.replace(llama_spec("seed_oss"), block={
    **LLAMA_ATTN, **GATED_MLP, "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"})


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "llama3": CompatConfig("llama", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                         rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 16})),
    "llama_yarn": CompatConfig("llama", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=5,
                                             rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                                              "original_max_position_embeddings": 16})),
    "mistral": CompatConfig("mistral", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9, num_key_value_heads=3,
                                            sliding_window=TEST_WINDOW)),
    "ministral": CompatConfig("ministral", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9,
                                                num_key_value_heads=3, head_dim=8, sliding_window=TEST_WINDOW,
                                                layer_types=["sliding_attention", "full_attention"])),
    "seed_oss": CompatConfig("seed_oss", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                              head_dim=16, attention_bias=True, attention_out_bias=True, mlp_bias=True)),
}


FAMILY = Family("llama", ("llama", "mistral", "ministral", "seed_oss"), llama_config, named(llama_state_dict),
                gguf={"llama": GGUF, "seed_oss": SEED_OSS_GGUF}, title="Llama", headline=True, tests=TESTS)
