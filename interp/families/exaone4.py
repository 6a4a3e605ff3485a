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


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "exaone4": CompatConfig("exaone4", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                            sliding_window=TEST_WINDOW, sliding_window_pattern=2)),
}


FAMILY = Family("exaone4", ("exaone4",), exaone4_config, fixed(olmo2_state_dict), tests=TESTS)
