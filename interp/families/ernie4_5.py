"""ERNIE 4.5 (dense): Llama with ``use_bias`` and RoPE on interleaved pairs (rows reordered to halves).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ..precision import Precision
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, llama_sizes
from ._family import Family, fixed
from ._positions import _rope
from ._tensors import (
    _leading_pairs_to_halves,
)
from .llama import llama_state_dict


def ernie4_5_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an ERNIE 4.5 dense decoder: Llama with ``use_bias`` on every projection and RoPE
    on interleaved pairs of the whole head (reordered to halves by :func:`ernie4_5_state_dict`), rotated in
    float32 (the ``"cohere"`` precision policy).

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> from interp.families.ernie4_5 import ernie4_5_config
        >>> cfg = ernie4_5_config({"model_type": "ernie4_5", "hidden_size": 64, "num_attention_heads": 4,
        ...                        "head_dim": 16, "num_hidden_layers": 2, "intermediate_size": 96,
        ...                        "vocab_size": 50, "max_position_embeddings": 64, "use_bias": True})
        >>> cfg.rotary_dim, cfg.attn_bias, cfg.out_bias, cfg.mlp_bias, cfg.tie_embeddings
        (16, True, True, True, True)
    """
    arch = "ernie4_5"
    _decoder_checks(hf_cfg, arch)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("use_bias", False))
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch, tie_default=True), activation=activation, normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        precision=Precision.named("cohere"), attn_bias=bias, out_bias=bias, mlp_bias=bias
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


FAMILY = Family("ernie4_5", ("ernie4_5",), ernie4_5_config, fixed(ernie4_5_state_dict))
