"""OLMo (1): Llama with non-parametric LayerNorms, stored as weight 1 and bias 0; ``clip_qkv`` is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, _refuse, llama_sizes
from ._family import CompatConfig, Family, fixed
from ._gguf import GATED_MLP, LLAMA_ATTN, HFConfig, Meta, llama_spec, llama_unpermute
from ._positions import _rope
from ._tensors import (
    _dense_weights,
    _llama_attention,
    _lm_head,
    _Source,
)


def olmo_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an OLMo (1) decoder: Llama with non-parametric LayerNorms (eps 1e-5, which
    transformers hard-codes), optionally biased attention.

    The LayerNorms have no weights in the checkpoint; the state dict gives ours weight 1 and bias 0, which
    computes the same numbers with no new norm kind.

    Raises:
        ValueError: ``clip_qkv`` (not implemented), an activation other than silu, or a missing key.

    Example:
        >>> from interp.families.olmo import olmo_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = olmo_config(tiny_hf_config("olmo", attention_bias=True))
        >>> cfg.normalization, cfg.norm_eps, cfg.attn_bias, cfg.out_bias
        ('pre', 1e-05, True, True)
    """
    arch = "olmo"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("clip_qkv", None, None),))
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        **llama_sizes(hf_cfg, arch), activation=activation, normalization="pre", norm_eps=1e-5, positional="rotary",
        rotary_base=theta, rope_scaling=scaling, attn_bias=bias, out_bias=bias, mlp_bias=False
    )


def olmo_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF OLMo (1) one; every LayerNorm gets weight 1 and bias 0 (OLMo's have none).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "OLMo")
    embed = src("embed_tokens.weight")
    one, zero = torch.ones(cfg.d_model, dtype=embed.dtype), torch.zeros(cfg.d_model, dtype=embed.dtype)
    out = {"W_E.weight": embed, "ln_final.weight": one, "ln_final.bias": zero}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        for ln in ("ln1", "ln2"):
            out[b + f"{ln}.weight"], out[b + f"{ln}.bias"] = one.clone(), zero.clone()
        out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, "OLMo"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
_LLAMA_GGUF = llama_spec("olmo", permuted=True)


def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> OLMo's HF config (Llama's keys; ``attention.clamp_kqv``, HF's ``clip_qkv``, is refused)."""
    if m.has("attention.clamp_kqv"):
        raise m.fail(f"metadata {m.key('attention.clamp_kqv')!r} = {m.get('attention.clamp_kqv')!r} (clip_qkv) is not "
                     f"supported")
    return _LLAMA_GGUF.config(m, names)


def _gguf_unpermute(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
    """Llama's Q/K unpermutation, of the weights only: OLMo's converter permutes ``q_proj`` / ``k_proj`` weights and
    leaves their biases as they are."""
    return llama_unpermute(kind, hf_name, w, hf_cfg) if hf_name.endswith(".weight") else w


#: llama.cpp's ``olmo``: Llama's names and Q/K permutation (weights only); no norm tensors (OLMo's LayerNorms have
#: no weights).
GGUF = {"olmo": dataclasses.replace(_LLAMA_GGUF, config=_gguf_config, transform=_gguf_unpermute,
                                    block={**LLAMA_ATTN, **GATED_MLP},
                                    global_names={"token_embd": "model.embed_tokens", "output": "lm_head"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "olmo": CompatConfig("olmo", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=5,
                                      attention_bias=True)),
}


FAMILY = Family("olmo", ("olmo",), olmo_config, fixed(olmo_state_dict), gguf=GGUF, tests=TESTS)
