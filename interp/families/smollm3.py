"""SmolLM3: Llama with layers without positions (``nope_layers``, from ``no_rope_layers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import ModelConfig
from ._base import GATED_ACTIVATIONS, _activation, _decoder_checks, _need, llama_sizes
from ._family import TEST_WINDOW, CompatConfig, Family, named
from ._gguf import llama_spec
from ._positions import _rope, _typed_windows
from .llama import llama_state_dict


def smollm3_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a SmolLM3 decoder: Llama whose layers flagged 0 in ``no_rope_layers`` (by default
    every ``no_rope_layer_interval``-th) attend without positions (``nope_layers``); with ``use_sliding_window``
    the sliding layers of ``layer_types`` are windowed.

    Raises:
        ValueError: an unsupported activation, RoPE kind or layer type, a ``no_rope_layers`` of the wrong length,
            or a missing key.

    Example:
        >>> from interp.families.smollm3 import smollm3_config
        >>> cfg = smollm3_config({"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4,
        ...                       "num_hidden_layers": 4, "intermediate_size": 96, "vocab_size": 50,
        ...                       "max_position_embeddings": 64})
        >>> cfg.nope_layers, cfg.sliding_window
        ([3], None)
    """
    arch = "smollm3"
    _decoder_checks(hf_cfg, arch)
    n_layers = _need(hf_cfg, "num_hidden_layers", arch)
    interval = hf_cfg.get("no_rope_layer_interval", 4)
    has_rope = hf_cfg.get("no_rope_layers")
    if has_rope is None:
        has_rope = [int((i + 1) % interval != 0) for i in range(n_layers)]
    if len(has_rope) != n_layers or any(flag not in (0, 1) for flag in has_rope):
        raise ValueError(f"{arch} no_rope_layers={has_rope!r} must hold one 0 / 1 flag per layer "
                         f"(num_hidden_layers={n_layers})")
    use = bool(hf_cfg.get("use_sliding_window", False))
    window = hf_cfg.get("sliding_window")
    default = ["sliding_attention" if use and window is not None and not rope else "full_attention"
               for rope in has_rope]
    _, windows = _typed_windows(hf_cfg, arch, default, use)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch, tie_default=True), activation=activation, normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        nope_layers=[i for i, rope in enumerate(has_rope) if not rope] or None, sliding_window=windows, attn_bias=bias,
        out_bias=bias, mlp_bias=bool(hf_cfg.get("mlp_bias", False))
    )


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
#: llama.cpp's ``smollm3``: Llama's names and Q/K permutation; the file says nothing of the layers without RoPE,
#: which llama.cpp fixes to every 4th, the HF config's default (``no_rope_layer_interval`` 4).
GGUF = {"smollm3": llama_spec("smollm3", permuted=True)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "smollm3": CompatConfig("smollm3", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                            no_rope_layers=[1, 0], use_sliding_window=True,
                                            sliding_window=TEST_WINDOW, tie_word_embeddings=False)),
}


FAMILY = Family("smollm3", ("smollm3",), smollm3_config, named(llama_state_dict), gguf=GGUF, tests=TESTS)
