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
from ._family import TEST_WINDOW, CompatConfig, Family, fixed
from ._gguf import GATED_MLP, LLAMA_ATTN, LLAMA_GLOBAL, QK_NORM, GGUFSpec, llama_like
from ._mapping import LLAMA_ATTENTION, SWIGLU_MLP, Rule, with_head
from ._positions import _per_type_rope, sliding_windows


def olmo2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an OLMo 2 or OLMo 3 decoder: norms after each sublayer only, QK-norm over all
    heads; OLMo 3 adds sliding-window layers (``layer_types``) with their own RoPE base.

    Raises:
        ValueError: an unsupported setting (activation, RoPE kind) or a missing key.

    Example:
        >>> from interp.families.olmo2 import olmo2_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = olmo2_config(tiny_hf_config("olmo3", sliding_window=8, layer_types=["sliding_attention",
        ...     "full_attention"], rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e5},
        ...     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}))
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
    return with_head(TABLE, hf_sd, cfg, arch="OLMo 2/3")


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
#: llama.cpp's ``olmo2`` (OLMo 2; OLMo 3's sliding layers are refused by name): Llama's names without the
#: pre-norms, the two post-norms and QK-norm over all heads; RoPE rotate-half as HF (not permuted).
GGUF = {"olmo2": GGUFSpec(llama_like("olmo2"), LLAMA_GLOBAL, "model.layers.{}.", {
    **LLAMA_ATTN, **QK_NORM, **GATED_MLP, "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "olmo2": CompatConfig("olmo2", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1)),
    "olmo3": CompatConfig("olmo3", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                        sliding_window=TEST_WINDOW, layer_types=["sliding_attention", "full_attention"],
                                        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                                                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
}


FAMILY = Family("olmo2", ("olmo2", "olmo3"), olmo2_config, fixed(olmo2_state_dict), gguf=GGUF, tests=TESTS)
