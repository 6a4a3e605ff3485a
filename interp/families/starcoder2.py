"""Starcoder 2: pre-LayerNorm, ``use_bias`` on every projection, tanh-GELU MLP, one window on every layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GPT_ACTIVATIONS, StateDict, llama_sizes
from ._family import TEST_WINDOW, CompatConfig, Family, fixed
from ._gguf import LLAMA_ATTN, LLAMA_GLOBAL, TOKEN_IDS, GGUFSpec, HFConfig, Meta, gguf_sizes, rope_parameters, rotary_dim
from ._mapping import LLAMA_ATTENTION, Rule, biased_if, both, with_head
from ._positions import rotary_basics, sliding_windows


def starcoder2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Starcoder 2 decoder: pre-LayerNorm, biased projections (``use_bias``), a
    tanh-GELU MLP, grouped K/V, RoPE and one sliding window on every layer.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> from interp.families.starcoder2 import starcoder2_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = starcoder2_config(tiny_hf_config("starcoder2", num_key_value_heads=2, sliding_window=8))
        >>> cfg.sliding_window, cfg.activation, cfg.n_kv_heads
        ([8, 8], 'gelu_new', 2)
    """
    arch = "starcoder2"
    activation, theta, scaling = rotary_basics(hf_cfg, arch, "gelu_pytorch_tanh", GPT_ACTIVATIONS)
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
    return with_head(TABLE, hf_sd, cfg, arch="Starcoder 2")


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> Starcoder 2's HF config; an ``attention.sliding_window`` slides every layer (as HF)."""
    rope = rope_parameters(m, names, 10000.0)
    sizes = gguf_sizes(m, names)
    rotary_dim(m, sizes["head_dim"])
    window = m.get("attention.sliding_window", 0)
    return {"model_type": "starcoder2", **{k: sizes[k] for k in (
                "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "intermediate_size",
                "vocab_size", "max_position_embeddings", "tie_word_embeddings", *TOKEN_IDS)},
            "rope_parameters": rope, "hidden_act": "gelu_pytorch_tanh",
            "norm_epsilon": m.number("attention.layer_norm_epsilon", 1e-5), "use_bias": "blk.0.attn_q.bias" in names,
            "sliding_window": m.count("attention.sliding_window") if window else None}


#: llama.cpp's ``starcoder2``: Llama's attention names, LayerNorms with biases, an ungated ``c_fc`` / ``c_proj``
#: MLP; RoPE rotate-half as HF (not permuted).
GGUF = {"starcoder2": GGUFSpec(_gguf_config, LLAMA_GLOBAL, "model.layers.{}.", {
    **LLAMA_ATTN, "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "starcoder2": CompatConfig("starcoder2", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9,
                                                  num_key_value_heads=3, sliding_window=TEST_WINDOW, use_bias=True)),
}


FAMILY = Family("starcoder2", ("starcoder2",), starcoder2_config, fixed(starcoder2_state_dict), gguf=GGUF, tests=TESTS)
