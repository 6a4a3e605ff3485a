"""OLMo 2 / OLMo 3: norms on the sublayers' outputs only (``sublayer_norm="output"``), QK-norm over all heads,
float32 norm weights and rotary (the ``"olmo2"`` precision policy); OLMo 3 adds sliding layers with
their own RoPE base.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ..precision import Precision
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, _refuse, llama_sizes
from ._family import Family, fixed
from ._mapping import LLAMA_ATTENTION, SWIGLU_MLP, Rule, map_tensors
from ._positions import _per_type_rope, sliding_windows
from ._tensors import (
    _lm_head,
    _Source,
)


def olmo2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an OLMo 2 or OLMo 3 decoder: norms after each sublayer only, QK-norm over all
    heads; OLMo 3 adds sliding-window layers (``layer_types``) with their own RoPE base.

    Raises:
        ValueError: an unsupported setting (activation, RoPE kind) or a missing key.

    Example:
        >>> from interp.families.olmo2 import olmo2_config
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
    windows = sliding_windows(hf_cfg, arch)
    theta, scaling, local_base = _per_type_rope(hf_cfg, arch, windows)
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch), sliding_window=windows, local_rotary_base=local_base, activation=activation,
        normalization="rms", norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=theta,
        rope_scaling=scaling, qk_norm="full", sublayer_norm="output", precision=Precision.named("olmo2"),
        attn_bias=False, out_bias=False, mlp_bias=False
    )


#: OLMo 2 / 3's tensors: Llama's attention and MLP, QK-norm over all heads, norms after each sublayer only.
TABLE: tuple[Rule, ...] = (
    Rule("W_E", "embed_tokens"), Rule("ln_final", "norm"), *LLAMA_ATTENTION, *SWIGLU_MLP,
    Rule("blocks.{i}.attn.q_norm", "layers.{i}.self_attn.q_norm"),
    Rule("blocks.{i}.attn.k_norm", "layers.{i}.self_attn.k_norm"),
    Rule("blocks.{i}.ln1_post", "layers.{i}.post_attention_layernorm"),
    Rule("blocks.{i}.ln2_post", "layers.{i}.post_feedforward_layernorm"),
)


def olmo2_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF OLMo 2 / 3 (or EXAONE 4) one: :data:`TABLE` and the unembedding.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    out, _ = map_tensors(TABLE, hf_sd, cfg, prefixes=("model.",), arch="OLMo 2/3")
    out.update(_lm_head(hf_sd, _Source(hf_sd, ("model.",), "OLMo 2/3"), cfg, "OLMo 2/3"))
    return out


FAMILY = Family("olmo2", ("olmo2", "olmo3"), olmo2_config, fixed(olmo2_state_dict))
