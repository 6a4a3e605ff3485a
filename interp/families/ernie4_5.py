"""ERNIE 4.5 (dense): Llama with ``use_bias`` and RoPE on interleaved pairs (rows reordered to halves).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ..precision import Precision
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, llama_sizes
from ._family import CompatConfig, Family, fixed
from ._gguf import HFConfig, Meta, llama_spec
from ._positions import _rope
from ._tensors import (
    _qk_pairs_to_halves,
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
        >>> from interp.families import tiny_hf_config
        >>> cfg = ernie4_5_config(tiny_hf_config("ernie4_5", head_dim=16, use_bias=True))
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
    out = llama_state_dict(hf_sd, cfg, arch="ernie4_5")
    for i in range(cfg.n_layers):
        _qk_pairs_to_halves(out, f"blocks.{i}.", cfg, cfg.d_head)
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
_LLAMA_GGUF = llama_spec("ernie4_5")


def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> ERNIE 4.5's HF config: Llama's keys and ``use_bias`` from the tensors."""
    return {**_LLAMA_GGUF.config(m, names), "use_bias": "blk.0.attn_q.bias" in names}


#: llama.cpp's ``ernie4_5``: Llama's names, not permuted (both rotate interleaved pairs; the HF mapping reorders
#: them to halves).
GGUF = {"ernie4_5": dataclasses.replace(_LLAMA_GGUF, config=_gguf_config)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "ernie4_5": CompatConfig("ernie4_5", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9, num_key_value_heads=3,
                                              head_dim=8, use_bias=True, tie_word_embeddings=False)),
}


FAMILY = Family("ernie4_5", ("ernie4_5",), ernie4_5_config, fixed(ernie4_5_state_dict), gguf=GGUF, tests=TESTS)
