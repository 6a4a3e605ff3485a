"""Hunyuan v1 dense: Llama with per-head QK-norm after RoPE (``qk_norm="head_after_rotary"``) and NTK-alpha
RoPE folded into the base.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need, llama_sizes
from ._family import CompatConfig, Family, fixed
from ._gguf import LLAMA_BLOCK, LLAMA_GLOBAL, GGUFSpec, HFConfig, Meta, llama_like, refuse_keys
from ._positions import _rope
from ._tensors import (
    _dense_weights,
    _llama_ends,
    _llama_layer,
    _lm_head,
    _Source,
)


def hunyuan_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Hunyuan v1 dense decoder: Llama with per-head QK-norm applied after RoPE
    (``qk_norm="head_after_rotary"``); its "dynamic" RoPE with a fixed ``alpha`` is plain RoPE with the base
    ``rope_theta * alpha ** (d_head / (d_head - 2))``, as transformers computes it.

    Raises:
        ValueError: an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> from interp.families.hunyuan import hunyuan_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = hunyuan_config(tiny_hf_config("hunyuan_v1_dense", head_dim=16,
        ...     rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "alpha": 2.0}))
        >>> cfg.qk_norm, round(cfg.rotary_base, 1), cfg.rope_scaling
        ('head_after_rotary', 22081.8, None)
    """
    arch = "hunyuan_v1_dense"
    _decoder_checks(hf_cfg, arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = hf_cfg.get("head_dim") or d_model // n_heads
    rope = hf_cfg.get("rope_parameters") or {}
    if rope.get("rope_type") == "dynamic" and rope.get("alpha"):
        theta, _ = _rope(hf_cfg, arch, {"rope_type": "default", "rope_theta": rope.get("rope_theta", 10000.0)})
        alpha = rope["alpha"]
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
            raise ValueError(f"{arch} rope_parameters['alpha']={alpha!r} must be a number > 0")
        theta, scaling = theta * alpha ** (d_head / (d_head - 2)), None
    else:
        theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch, d_head=d_head), activation=activation, normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        qk_norm="head_after_rotary", attn_bias=bias, out_bias=bias, mlp_bias=False
    )


def hunyuan_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Hunyuan v1 dense one (Llama keys plus ``query_layernorm`` / ``key_layernorm``).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "Hunyuan")
    out = _llama_ends(src)
    for i in range(cfg.n_layers):
        h, b, layer = _llama_layer(src, cfg, i)
        out.update(layer)
        out[b + "attn.q_norm.weight"] = src(h + "self_attn.query_layernorm.weight")
        out[b + "attn.k_norm.weight"] = src(h + "self_attn.key_layernorm.weight")
        out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, "Hunyuan"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> Hunyuan v1 dense's HF config: Llama's keys. The converter folds the NTK ``alpha`` into
    ``rope.freq_base`` (``rope_theta * alpha ** (d / (d - 2))``, as transformers computes it) and writes no
    scaling, so the base is plain RoPE's; HunyuanVL's XD-RoPE (``rope.scaling.alpha``, ``rope.dimension_sections``)
    is refused by name."""
    refuse_keys(m, {"rope.scaling.alpha": "XD-RoPE alpha (HunyuanVL)", "rope.dimension_sections": "XD-RoPE "
                    "sections (HunyuanVL)"})
    return llama_like("hunyuan_v1_dense")(m, names)


#: llama.cpp's ``hunyuan-dense``: Llama's names plus ``attn_q_norm`` / ``attn_k_norm`` (HF's ``query_layernorm``
#: / ``key_layernorm``, applied after RoPE); RoPE rotate-half as HF (not permuted).
GGUF = {"hunyuan-dense": GGUFSpec(_gguf_config, LLAMA_GLOBAL, "model.layers.{}.", {
    **LLAMA_BLOCK, "attn_q_norm": "self_attn.query_layernorm", "attn_k_norm": "self_attn.key_layernorm"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "hunyuan_v1_dense": CompatConfig("hunyuan_v1_dense", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                                              num_key_value_heads=1, head_dim=16, attention_bias=True,
                                                              rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0,
                                                                               "alpha": 3.0, "factor": 1.0})),
}


FAMILY = Family("hunyuan_v1_dense", ("hunyuan_v1_dense",), hunyuan_config, fixed(hunyuan_state_dict), gguf=GGUF,
                tests=TESTS)
