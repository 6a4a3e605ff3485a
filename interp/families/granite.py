"""Granite: Llama with ``embedding_multiplier`` (``embed_scale``), ``attention_multiplier`` (``attn_scale``) and
``residual_multiplier`` / ``logits_scaling`` folded into the output projections and the unembedding.
"""

from __future__ import annotations

import dataclasses
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import StateDict
from ._family import CompatConfig, Family
from ._gguf import HFConfig, Meta, llama_spec
from ._tensors import (
    _Source,
)
from .llama import ATTENTION_BIASES, llama_config, llama_state_dict


def _granite_multiplier(hf_cfg: Mapping[str, Any], key: str, arch: str = "granite", default: float = 1.0) -> float:
    """A scalar multiplier of the config, checked to be a finite number > 0."""
    value = hf_cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ValueError(f"{arch} {key}={value!r} must be a finite number > 0")
    return float(value)


def granite_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Granite (3.x) decoder: Llama with four scalars. ``embedding_multiplier`` is
    ``embed_scale`` and ``attention_multiplier`` the score scale (``attn_scale``); ``residual_multiplier`` and
    ``logits_scaling`` are folded into the weights by :func:`granite_state_dict_for` (each sublayer's output
    projection times the multiplier, the unembedding divided by the scaling), so the unembedding is always a
    separate ``W_U`` (a tied one holds the embedding divided by ``logits_scaling``).

    Raises:
        ValueError: a multiplier that is not a finite number > 0, an activation other than silu, or a missing key.

    Example:
        >>> from interp.families.granite import granite_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = granite_config(tiny_hf_config("granite", embedding_multiplier=12.0, attention_multiplier=0.0078125,
        ...     tie_word_embeddings=True))
        >>> cfg.embed_scale, cfg.attn_scale, cfg.tie_embeddings
        (12.0, 0.0078125, False)
    """
    arch = str(hf_cfg.get("model_type", "granite"))  # granitemoe comes through here too: errors name it
    cfg = llama_config(hf_cfg, biases=ATTENTION_BIASES["granite"])
    return dataclasses.replace(cfg, embed_scale=_granite_multiplier(hf_cfg, "embedding_multiplier", arch),
                               attn_scale=_granite_multiplier(hf_cfg, "attention_multiplier", arch),
                               tie_embeddings=False)


def granite_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]:
    """The state-dict function of a Granite config: Llama's, with ``residual_multiplier`` folded into every
    ``W_O`` and ``W_out`` (weights and biases) and ``W_U = lm_head / logits_scaling`` (the embedding when tied
    and the checkpoint has no ``lm_head.weight``).

    Raises:
        ValueError: ``residual_multiplier`` or ``logits_scaling`` not a finite number > 0.
    """
    arch = str(hf_cfg.get("model_type", "granite"))
    residual = _granite_multiplier(hf_cfg, "residual_multiplier", arch)
    logits = _granite_multiplier(hf_cfg, "logits_scaling", arch)
    tied = bool(hf_cfg.get("tie_word_embeddings", False))

    def convert(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
        if "lm_head.weight" not in hf_sd and tied:
            hf_sd = ChainMap({"lm_head.weight": _Source(hf_sd, ("model.",), arch)("embed_tokens.weight")},
                             hf_sd)  # type: ignore[arg-type]
        out = llama_state_dict(hf_sd, cfg, arch=arch)
        for key in out:
            # a dense MLP's W_out.weight / .bias, or the experts' stacked W_out [E, M, F] (Granite-MoE)
            if ".attn.W_O." in key or ".mlp.W_out." in key or key.endswith(".mlp.W_out"):
                out[key] = out[key] * residual  # the block adds residual_multiplier x each sublayer's output
        out["W_U.weight"] = out["W_U.weight"] / logits
        return out

    return convert


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
_LLAMA_GGUF = llama_spec("granite", permuted=True)


def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> Granite's HF config: Llama's, with the four scalars (``attention.scale``, ``embedding_scale``,
    ``residual_scale``, ``logit_scale``); a missing ``attention.scale`` is ``1 / sqrt(head_dim)``, as llama.cpp
    reads it."""
    cfg = _LLAMA_GGUF.config(m, names)
    return {**cfg, "attention_multiplier": m.number("attention.scale", cfg["head_dim"] ** -0.5),
            "embedding_multiplier": m.number("embedding_scale", 1.0),
            "residual_multiplier": m.number("residual_scale", 1.0), "logits_scaling": m.number("logit_scale", 1.0)}


#: llama.cpp's ``granite``: Llama's names and Q/K permutation, plus four scalars in the metadata.
GGUF = {"granite": dataclasses.replace(_LLAMA_GGUF, config=_gguf_config)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "granite": CompatConfig("granite", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9, num_key_value_heads=3,
                                            embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.5,
                                            logits_scaling=4.0, tie_word_embeddings=True, attention_bias=True)),
}


FAMILY = Family("granite", ("granite",), granite_config, granite_state_dict_for, gguf=GGUF, tests=TESTS)
