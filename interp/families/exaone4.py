"""EXAONE 4: OLMo 2's weights and output-only norms with per-head QK-norm; sliding layers rotate, global ones
have no positions (``nope_layers``) when any layer slides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import ModelConfig
from ..precision import Precision
from ._base import GATED_ACTIVATIONS, _activation, _decoder_checks, _need, llama_sizes
from ._family import TEST_WINDOW, CompatConfig, Family, fixed
from ._gguf import (
    GATED_MLP,
    LLAMA_ATTN,
    LLAMA_GLOBAL,
    QK_NORM,
    GGUFSpec,
    HFConfig,
    Meta,
    declared_windows,
    gguf_sizes,
    refuse_keys,
    rope_parameters,
    rotary_dim,
)
from ._positions import _rope, _typed_windows
from .olmo2 import olmo2_state_dict


def exaone4_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an EXAONE 4 decoder: OLMo 2's output-only norms with per-head QK-norm, sliding
    layers (``layer_types``, else all but every ``sliding_window_pattern``-th) and, when any layer slides, no
    positions on the global layers (``nope_layers``).

    Raises:
        ValueError: an unsupported activation, RoPE kind or layer type, or a missing key.

    Example:
        >>> from interp.families.exaone4 import exaone4_config
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
    theta, scaling = _rope(hf_cfg, arch)
    # transformers rotates every layer when sliding_window is None, else only the sliding ones.
    nope = [] if window is None else [i for i, kind in enumerate(types) if kind != "sliding_attention"]
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch), activation=activation, normalization="rms", norm_eps=hf_cfg.get("rms_norm_eps",
        1e-5), positional="rotary", rotary_base=theta, rope_scaling=scaling, nope_layers=nope or None,
        sliding_window=windows, qk_norm="head", sublayer_norm="output", precision=Precision.named("gemma"), attn_bias=False,
        out_bias=False, mlp_bias=False
    )


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> EXAONE 4's HF config: the shared sizes, RMSNorm epsilon and RoPE, and the sliding layers
    the file declares (``attention.sliding_window`` with ``sliding_window_pattern``, one boolean per layer as
    the converter writes it from ``layer_types``); with a window, the global layers have no positions, as in
    transformers. Multi-token-prediction layers (EXAONE 4.5's ``nextn_predict_layers``) are refused by name."""
    refuse_keys(m, {"nextn_predict_layers": "multi-token-prediction layers"})
    rope = rope_parameters(m, names, 10000.0)
    cfg = gguf_sizes(m, names)
    rotary_dim(m, cfg["head_dim"])
    window, types = declared_windows(m, cfg["num_hidden_layers"])
    return {**cfg, "model_type": "exaone4", "hidden_act": "silu", "rope_parameters": rope,
            "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon", 1e-5), "sliding_window": window,
            "layer_types": types}


#: llama.cpp's ``exaone4``: OLMo 2's tensors (no pre-norms; ``post_attention_norm`` / ``post_ffw_norm`` after each
#: sublayer; per-head QK-norm), RoPE rotate-half as HF (not permuted).
GGUF = {"exaone4": GGUFSpec(_gguf_config, LLAMA_GLOBAL, "model.layers.{}.", {
    **LLAMA_ATTN, **QK_NORM, **GATED_MLP, "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "exaone4": CompatConfig("exaone4", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                            sliding_window=TEST_WINDOW, sliding_window_pattern=2)),
}


FAMILY = Family("exaone4", ("exaone4",), exaone4_config, fixed(olmo2_state_dict), gguf=GGUF, tests=TESTS)
