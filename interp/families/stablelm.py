"""StableLM: pre-LayerNorm, partial rotary, optional q/k/v biases and parallel block; ``qk_layernorm`` refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need, _refuse, llama_sizes
from ._family import CompatConfig, Family, fixed
from ._gguf import LLAMA_BLOCK, LLAMA_GLOBAL, TOKEN_IDS, GGUFSpec, HFConfig, Meta, gguf_sizes, no_window, partial_rope
from ._mapping import LLAMA_ATTENTION, SWIGLU_MLP, Rule, both, with_head
from ._positions import _partial_factor, _unscaled_rope


def stablelm_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a StableLM (2) decoder: pre-LayerNorm, partial rotary (``partial_rotary_factor``,
    0.25 by default), optional q/k/v biases (``use_qkv_bias``) and parallel block with one norm
    (``use_parallel_residual``).

    Raises:
        ValueError: ``qk_layernorm`` (per-head LayerNorms, not implemented), an unsupported activation or RoPE
            kind, or a missing key.

    Example:
        >>> from interp.families.stablelm import stablelm_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = stablelm_config(tiny_hf_config("stablelm", use_qkv_bias=True,
        ...     rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}))
        >>> cfg.rotary_dim, cfg.attn_bias, cfg.out_bias, cfg.parallel_block
        (4, True, False, 'none')
    """
    arch = "stablelm"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("qk_layernorm", False, False),))
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = d_model // n_heads  # StableLM's attention ignores head_dim; only its RoPE init would read one
    if hf_cfg.get("head_dim") not in (None, d_head):
        raise ValueError(f"{arch} head_dim={hf_cfg['head_dim']!r} is not supported (StableLM's attention uses "
                         f"hidden_size / num_attention_heads = {d_head})")
    partial = _partial_factor(hf_cfg, 0.25)
    theta = _unscaled_rope(hf_cfg, arch, "StableLM")
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch, d_head=d_head), activation=activation, normalization="pre",
        norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), positional="rotary", rotary_base=theta, rotary_dim=int(d_head *
        partial), parallel_block="one_norm" if hf_cfg.get("use_parallel_residual", False) else "none",
        attn_bias=bool(hf_cfg.get("use_qkv_bias", False)), out_bias=False, mlp_bias=False
    )


#: StableLM's tensors: Llama's names with LayerNorm biases; a parallel block has one norm per layer.
TABLE: tuple[Rule, ...] = (
    Rule("W_E", "embed_tokens"), Rule("ln_final", "norm", kinds=both), *LLAMA_ATTENTION, *SWIGLU_MLP,
    Rule("blocks.{i}.ln1", "layers.{i}.input_layernorm", kinds=both),
    Rule("blocks.{i}.ln2", "layers.{i}.post_attention_layernorm", kinds=both,
         when=lambda cfg: cfg.parallel_block == "none"),
)


def stablelm_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF StableLM one (:data:`TABLE` and the unembedding).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    return with_head(TABLE, hf_sd, cfg, arch="StableLM")


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> StableLM's HF config: partial rotary; no ``ffn_norm`` means the parallel residual (as
    llama.cpp's graph decides); per-head QK LayerNorms (``attn_q_norm``) are refused by name."""
    if "blk.0.attn_q_norm.weight" in names:
        raise m.fail("tensor 'blk.0.attn_q_norm.weight': StableLM's per-head QK LayerNorm (qk_layernorm) is not "
                     "supported")
    sizes = gguf_sizes(m, names)
    no_window(m)
    return {"model_type": "stablelm", **{k: sizes[k] for k in (
                "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "intermediate_size",
                "vocab_size", "max_position_embeddings", "tie_word_embeddings", *TOKEN_IDS)},
            "rope_parameters": partial_rope(m, names, sizes["head_dim"]), "hidden_act": "silu",
            "layer_norm_eps": m.number("attention.layer_norm_epsilon", 1e-5),
            "use_parallel_residual": "blk.0.ffn_norm.weight" not in names,
            "use_qkv_bias": "blk.0.attn_q.bias" in names}


#: llama.cpp's ``stablelm``: Llama's names, LayerNorms with biases, RoPE rotate-half as HF (not permuted).
GGUF = {"stablelm": GGUFSpec(_gguf_config, LLAMA_GLOBAL, "model.layers.{}.", LLAMA_BLOCK)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "stablelm": CompatConfig("stablelm", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=5,
                                              use_qkv_bias=True, partial_rotary_factor=0.25)),
    "stablelm_parallel": CompatConfig("stablelm", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                                       num_key_value_heads=1, use_parallel_residual=True)),
}


FAMILY = Family("stablelm", ("stablelm",), stablelm_config, fixed(stablelm_state_dict), gguf=GGUF, tests=TESTS)
