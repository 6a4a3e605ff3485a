"""Arcee: Llama with an ungated squared-ReLU MLP (``activation="relu2"``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..config import Activation, ModelConfig
from ._base import StateDict, llama_sizes
from ._family import CompatConfig, Family, fixed
from ._gguf import LLAMA_ATTN, LLAMA_GLOBAL, llama_spec
from ._positions import rotary_basics
from ._tensors import (
    _llama_attention,
    _lm_head,
    _Source,
)

#: The ``hidden_act`` values this family's transformers code accepts, as our activations.
_ACTIVATIONS: dict[str, Activation] = {"relu2": "relu2", "relu": "relu", "silu": "silu", "gelu": "gelu",
                                       "gelu_pytorch_tanh": "gelu_new", "gelu_new": "gelu_new"}


def arcee_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an Arcee (AFM) decoder: Llama with an ungated MLP (``up_proj`` / ``down_proj``)
    whose activation is squared ReLU by default.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> from interp.families.arcee import arcee_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = arcee_config(tiny_hf_config("arcee"))
        >>> cfg.activation, cfg.normalization
        ('relu2', 'rms')
    """
    arch = "arcee"
    activation, theta, scaling = rotary_basics(hf_cfg, arch, "relu2", _ACTIVATIONS)
    bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        **llama_sizes(hf_cfg, arch), activation=activation, normalization="rms", norm_eps=hf_cfg.get("rms_norm_eps",
        1e-5), positional="rotary", rotary_base=theta, rope_scaling=scaling, attn_bias=bias, out_bias=bias,
        mlp_bias=bool(hf_cfg.get("mlp_bias", False))
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


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
#: llama.cpp's ``arcee`` (AFM): Llama's names and Q/K permutation, an ungated ``ffn_up`` / ``ffn_down`` MLP whose
#: activation llama.cpp fixes to squared ReLU.
GGUF = {"arcee": dataclasses.replace(
    llama_spec("arcee", permuted=True, hidden_act="relu2"), global_names=LLAMA_GLOBAL,
    block={**LLAMA_ATTN, "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
           "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "arcee": CompatConfig("arcee", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                        attention_bias=True, mlp_bias=True,
                                        rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                                         "original_max_position_embeddings": 16})),
}


FAMILY = Family("arcee", ("arcee",), arcee_config, fixed(arcee_state_dict), gguf=GGUF, tests=TESTS)
