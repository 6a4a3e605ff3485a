"""GLM / GLM-4: (GLM-4 only) sandwich norms; fused ``gate_up_proj``, partial rotary on interleaved pairs (query
and key rows reordered to halves: the same scores).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need, llama_sizes
from ._family import CompatConfig, Family, fixed
from ._gguf import (
    LLAMA_ATTN,
    LLAMA_GLOBAL,
    GGUFSpec,
    HFConfig,
    Meta,
    gguf_sizes,
    no_window,
    partial_rope,
    refuse_keys,
)
from ._positions import _partial_factor, _unscaled_rope
from ._tensors import (
    _llama_attention,
    _llama_ends,
    _lm_head,
    _qk_pairs_to_halves,
    _shaped,
    _Source,
)


def glm4_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GLM-4 (0414) decoder: sandwich norms, fused ``gate_up_proj``, biased q/k/v, and
    partial rotary (``partial_rotary_factor``, 0.5 by default) on interleaved pairs, which
    :func:`glm4_state_dict` turns into our half-split layout by permuting the query and key rows. GLM
    (``model_type="glm"``, GLM-4-9B) is the same without the norms after each sublayer.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> from interp.families.glm4 import glm4_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = glm4_config(tiny_hf_config("glm4", head_dim=16, rope_parameters={"rope_type": "default",
        ...     "rope_theta": 1e4, "partial_rotary_factor": 0.5}))
        >>> cfg.rotary_dim, cfg.sublayer_norm, cfg.attn_bias, cfg.out_bias
        (8, 'sandwich', True, False)
    """
    arch = hf_cfg.get("model_type", "glm4")
    _decoder_checks(hf_cfg, arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = hf_cfg.get("head_dim") or d_model // n_heads
    partial = _partial_factor(hf_cfg, 0.5)
    theta = _unscaled_rope(hf_cfg, arch, "GLM-4")
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch, d_head=d_head), activation=activation, normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta, rotary_dim=int(d_head *
        partial), sublayer_norm="sandwich" if arch == "glm4" else "input", attn_bias=bool(hf_cfg.get("attention_bias",
        True)), out_bias=False, mlp_bias=False
    )


def glm4_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GLM-4 one: sandwich norms, ``gate_up_proj`` split into ``[gate | up]``, and the
    rotary rows of each query and key head reordered from interleaved pairs to halves.

    Raises:
        ValueError: a tensor is absent or a fused one's shape disagrees with the config (both named).
    """
    src = _Source(hf_sd, ("model.",), "GLM-4")
    M, F = cfg.d_model, cfg.d_mlp
    out = _llama_ends(src)
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        _qk_pairs_to_halves(out, b, cfg, cfg.rotary_dim or cfg.d_head)
        norms: tuple[tuple[str, str], ...] = (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"))
        if cfg.sublayer_norm == "sandwich":  # GLM-4-0414; GLM normalises the sublayers' inputs only
            norms += (("ln1_post", "post_self_attn_layernorm"), ("ln2_post", "post_mlp_layernorm"))
        for ours, theirs in norms:
            out[b + f"{ours}.weight"] = src(h + f"{theirs}.weight")
        gate, up = _shaped(src, h + "mlp.gate_up_proj.weight", (2 * F, M)).split([F, F], dim=0)  # [F, M] each
        out[b + "mlp.W_gate.weight"], out[b + "mlp.W_in.weight"] = gate, up
        out[b + "mlp.W_out.weight"] = src(h + "mlp.down_proj.weight")
    out.update(_lm_head(hf_sd, src, cfg, "GLM-4"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> GLM-4's HF config: the shared sizes, RMSNorm epsilon, and partial rotary from
    ``rope.dimension_count`` (the converter writes ``head_dim * partial_rotary_factor``); the q/k/v biases as
    the tensors have them. Refused by name: M-RoPE sections (GLM-4V's text model, whose Q/K rows the converter
    permutes to llama.cpp's NeoX order) and multi-token-prediction layers (GLM-OCR)."""
    refuse_keys(m, {"rope.dimension_sections": "M-RoPE (GLM-4V)", "nextn_predict_layers": "multi-token-prediction "
                    "layers"})
    cfg = gguf_sizes(m, names)
    no_window(m)
    return {**cfg, "model_type": "glm4", "hidden_act": "silu", "rope_parameters": partial_rope(m, names,
            cfg["head_dim"]), "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon", 1e-5),
            "attention_bias": "blk.0.attn_q.bias" in names}


#: llama.cpp's ``glm4`` (GLM-4-0414, GLM-Z1): Llama's attention names, sandwich norms (``post_attention_norm``
#: after attention, ``post_ffw_norm`` after the MLP; ``ffn_norm`` is HF's ``post_attention_layernorm``, the MLP's
#: input norm) and HF's fused ``gate_up_proj`` kept whole as ``ffn_up``; RoPE on interleaved pairs as HF (not
#: permuted).
GGUF = {"glm4": GGUFSpec(_gguf_config, LLAMA_GLOBAL, "model.layers.{}.", {
    **LLAMA_ATTN, "attn_norm": "input_layernorm", "post_attention_norm": "post_self_attn_layernorm",
    "ffn_norm": "post_attention_layernorm", "post_ffw_norm": "post_mlp_layernorm", "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "glm": CompatConfig("glm", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9, num_key_value_heads=3,
                                    head_dim=8, attention_bias=True,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.5})),
    "glm4": CompatConfig("glm4", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                      head_dim=16, attention_bias=True,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                       "partial_rotary_factor": 0.5})),
}


FAMILY = Family("glm4", ("glm", "glm4"), glm4_config, fixed(glm4_state_dict), gguf=GGUF, tests=TESTS)
