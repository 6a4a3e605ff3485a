"""Starcoder 2: pre-LayerNorm, ``use_bias`` on every projection, tanh-GELU MLP, one window on every layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GPT_ACTIVATIONS, StateDict, _activation, _decoder_checks, llama_sizes
from ._family import Family, fixed
from ._mapping import LLAMA_ATTENTION, Rule, biased_if, both, map_tensors
from ._positions import _rope, sliding_windows
from ._tensors import (
    _lm_head,
    _Source,
)


def starcoder2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Starcoder 2 decoder: pre-LayerNorm, biased projections (``use_bias``), a
    tanh-GELU MLP, grouped K/V, RoPE and one sliding window on every layer.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> from interp.families.starcoder2 import starcoder2_config
        >>> cfg = starcoder2_config({"model_type": "starcoder2", "hidden_size": 64, "num_attention_heads": 4,
        ...                          "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96,
        ...                          "vocab_size": 50, "max_position_embeddings": 64, "sliding_window": 8})
        >>> cfg.sliding_window, cfg.activation, cfg.n_kv_heads
        ([8, 8], 'gelu_new', 2)
    """
    arch = "starcoder2"
    _decoder_checks(hf_cfg, arch)
    activation = _activation(hf_cfg, "hidden_act", "gelu_pytorch_tanh", arch, GPT_ACTIVATIONS)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("use_bias", True))
    return ModelConfig(
        **llama_sizes(hf_cfg, arch, tie_default=True), activation=activation, normalization="pre",
        norm_eps=hf_cfg.get("norm_epsilon", 1e-5), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        sliding_window=sliding_windows(hf_cfg, arch), attn_bias=bias, out_bias=bias, mlp_bias=bias
    )


#: Starcoder 2's tensors: Llama's attention names, LayerNorms with biases, an ungated ``c_fc`` / ``c_proj`` MLP.
TABLE: tuple[Rule, ...] = (
    Rule("W_E", "embed_tokens"), Rule("ln_final", "norm", kinds=both), *LLAMA_ATTENTION,
    Rule("blocks.{i}.ln1", "layers.{i}.input_layernorm", kinds=both),
    Rule("blocks.{i}.ln2", "layers.{i}.post_attention_layernorm", kinds=both),
    Rule("blocks.{i}.mlp.W_in", "layers.{i}.mlp.c_fc", kinds=biased_if("mlp_bias")),
    Rule("blocks.{i}.mlp.W_out", "layers.{i}.mlp.c_proj", kinds=biased_if("mlp_bias")),
)


def starcoder2_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Starcoder 2 one (:data:`TABLE` and the unembedding).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    out, _ = map_tensors(TABLE, hf_sd, cfg, prefixes=("model.",), arch="Starcoder 2")
    out.update(_lm_head(hf_sd, _Source(hf_sd, ("model.",), "Starcoder 2"), cfg, "Starcoder 2"))
    return out


FAMILY = Family("starcoder2", ("starcoder2",), starcoder2_config, fixed(starcoder2_state_dict))
