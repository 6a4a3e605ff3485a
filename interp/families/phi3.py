"""Phi-3: Llama with fused ``qkv_proj`` and ``gate_up_proj``, optional sliding window and LongRoPE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import StateDict, _decoder_checks, _need, _refuse
from ._family import Family, fixed
from ._positions import _rope, sliding_windows
from ._tensors import (
    _lm_head,
    _shaped,
    _Source,
)


def phi3_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Phi-3 decoder (fused projections, optional sliding window and LongRoPE).

    Raises:
        ValueError: an unsupported setting (activation, RoPE kind) or a missing key.
    """
    arch = "phi3"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("hidden_act", "silu", "silu"),))
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
        activation="swiglu", d_vocab=_need(hf_cfg, "vocab_size", arch),
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


FAMILY = Family("phi3", ("phi3",), phi3_config, fixed(phi3_state_dict), gguf_archs=("phi3",))
