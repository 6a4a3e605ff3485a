"""Qwen3: Llama with per-head QK-norm (RMSNorm of each query and key head before RoPE), its own bias keys and
Qwen's sliding layers (from ``max_window_layers`` on, only when ``use_sliding_window``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..config import ModelConfig
from . import llama
from ._family import TEST_WINDOW, CompatConfig
from ._gguf import llama_spec


def qwen3_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Qwen3 decoder: :func:`~interp.families.llama.llama_config` with Qwen3's values.

    Raises:
        ValueError: as :func:`~interp.families.llama.llama_config`.

    Example:
        >>> from interp.families.qwen3 import qwen3_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = qwen3_config(tiny_hf_config("qwen3", sliding_window=8, use_sliding_window=True, max_window_layers=1))
        >>> cfg.qk_norm, cfg.sliding_window
        ('head', [None, 8])
    """
    cfg = llama.llama_config(hf_cfg, biases=("attention_bias", "attention_bias"),
                             window_rule="above_max_window_layers", gated_window=True)
    return dataclasses.replace(cfg, qk_norm="head")


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "qwen3": CompatConfig("qwen3", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                        head_dim=16, use_sliding_window=True, sliding_window=TEST_WINDOW, max_window_layers=1,
                                        rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                                         "original_max_position_embeddings": 16})),
}


FAMILY = dataclasses.replace(llama.FAMILY, name="qwen3", model_types=("qwen3",), config=qwen3_config,
                             gguf={"qwen3": llama_spec("qwen3", qk_norm=True)}, headline=False, tests=TESTS)
