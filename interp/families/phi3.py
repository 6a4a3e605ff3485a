"""Phi-3: Llama with fused ``qkv_proj`` and ``gate_up_proj``, optional sliding window and LongRoPE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need, llama_sizes
from ._family import TEST_WINDOW, CompatConfig, Family, fixed
from ._gguf import LLAMA_GLOBAL, GGUFSpec, HFConfig, Meta, gguf_sizes, one_head_width, partial_rope
from ._mapping import Rule, halves, with_head
from ._positions import _rope, sliding_windows


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
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch, d_head=d_head), activation=activation, normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta, rotary_dim=rotary_dim,
        rope_scaling=scaling, sliding_window=sliding_windows(hf_cfg, arch), attn_bias=False, out_bias=False,
        mlp_bias=False
    )


def _fused_shape(rows: str) -> Callable[[ModelConfig, str], tuple[int, ...]]:
    def shape(cfg: ModelConfig, kind: str) -> tuple[int, ...]:
        n = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head if rows == "qkv" else 2 * cfg.d_mlp
        return (n, cfg.d_model)
    return shape


#: Phi-3's tensors: ``qkv_proj`` rows are already ``[q | k | v]``; ``gate_up_proj`` rows are ``[gate | up]``.
TABLE: tuple[Rule, ...] = (
    Rule("W_E", "embed_tokens"), Rule("ln_final", "norm"),
    Rule("blocks.{i}.attn.W_qkv", "layers.{i}.self_attn.qkv_proj", shape=_fused_shape("qkv")),
    Rule("blocks.{i}.attn.W_O", "layers.{i}.self_attn.o_proj"),
    Rule("blocks.{i}.ln1", "layers.{i}.input_layernorm"),
    Rule("blocks.{i}.ln2", "layers.{i}.post_attention_layernorm"),
    Rule(("blocks.{i}.mlp.W_gate", "blocks.{i}.mlp.W_in"), "layers.{i}.mlp.gate_up_proj", transform=halves,
         shape=_fused_shape("gate_up")),
    Rule("blocks.{i}.mlp.W_out", "layers.{i}.mlp.down_proj"),
)


def phi3_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Phi-3 one (:data:`TABLE` and the unembedding).

    Raises:
        ValueError: a tensor is absent or a fused one's shape disagrees with the config (both named).
    """
    return with_head(TABLE, hf_sd, cfg, arch="Phi-3")


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> Phi-3's HF config: partial rotary allowed; a ``sliding_window`` of 0 means none."""
    cfg = gguf_sizes(m, names)
    one_head_width(m, cfg, "Phi-3")
    window = m.get("attention.sliding_window", 0)
    return {**cfg, "model_type": "phi3", "hidden_act": "silu",
            "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon", 1e-5),
            "rope_parameters": partial_rope(m, names, cfg["head_dim"]),
            "sliding_window": m.count("attention.sliding_window") if window else None}


#: llama.cpp's ``phi3``: fused ``attn_qkv`` (``[q | k | v]``) and ``ffn_up`` (``[gate | up]``) as in HF.
GGUF = {"phi3": GGUFSpec(_gguf_config, LLAMA_GLOBAL, "model.layers.{}.", {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj", "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"})}


_LONG = dict(short_factor=[1.0 + 0.05 * i for i in range(8)], long_factor=[1.5 + 0.5 * i for i in range(8)])


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits (table-only rows are in the compatibility table, not the family tests).
TESTS = {
    "phi3": CompatConfig("phi3", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=5,
                                      sliding_window=TEST_WINDOW)),
    "phi3_longrope": CompatConfig("phi3", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=5,
                                               original_max_position_embeddings=16,
                                               rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, **_LONG}), table_only=True),
}


FAMILY = Family("phi3", ("phi3",), phi3_config, fixed(phi3_state_dict), gguf=GGUF, tests=TESTS)
