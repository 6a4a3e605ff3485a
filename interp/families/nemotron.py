"""Nemotron: pre-LayerNorm with a ``1 + w`` scale (``NemotronLayerNorm1P``, folded into the weights), partial
rotary (``partial_rotary_factor``, 0.5 by default), an ungated squared-ReLU MLP and optional biases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..config import Activation, ModelConfig
from ._base import StateDict, _activation, _decoder_checks, _positive, llama_sizes
from ._family import CompatConfig, Family, fixed
from ._mapping import LLAMA_ATTENTION, Rule, biased_if, map_tensors
from ._positions import _rope
from ._tensors import (
    _lm_head,
    _Source,
)

#: The ``hidden_act`` values of Nemotron's ungated MLP, as our activations.
_ACTIVATIONS: dict[str, Activation] = {"relu2": "relu2", "relu": "relu", "silu": "silu", "gelu": "gelu",
                                       "gelu_pytorch_tanh": "gelu_new", "gelu_new": "gelu_new"}


def nemotron_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Nemotron (3 / Minitron) decoder: pre-LayerNorm (``norm_eps``; the ``1 + w``
    scale is folded into the weights by :func:`nemotron_state_dict`), rotate-half RoPE on the first
    ``partial_rotary_factor`` of each head, an ungated MLP (``up_proj`` / ``down_proj``, relu² by default) and
    q/k/v/o biases where ``attention_bias``, MLP biases where ``mlp_bias``.

    Raises:
        ValueError: a RoPE kind other than ``default`` (scaled RoPE on a partial rotary is not checked against
            transformers), a ``partial_rotary_factor`` outside (0, 1], an unsupported activation, or a missing key.

    Example:
        >>> from interp.families.nemotron import nemotron_config
        >>> cfg = nemotron_config({"model_type": "nemotron", "hidden_size": 64, "num_attention_heads": 4,
        ...                        "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50,
        ...                        "max_position_embeddings": 64})
        >>> cfg.activation, cfg.normalization, cfg.rotary_dim
        ('relu2', 'pre', 8)
    """
    arch = "nemotron"
    _decoder_checks(hf_cfg, arch)
    sizes = llama_sizes(hf_cfg, arch)
    rope = hf_cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", hf_cfg.get("partial_rotary_factor", 0.5))
    if _positive(partial, "partial_rotary_factor", arch, hf_cfg) > 1:
        raise ValueError(f"{arch} partial_rotary_factor={partial!r} must be in (0, 1]")
    theta, scaling = _rope(hf_cfg, arch)
    if scaling is not None:
        raise ValueError(f"{arch} rope_type={scaling['rope_type']!r} is not supported (only 'default': Nemotron "
                         "rotates part of each head)")
    bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        **sizes, activation=_activation(hf_cfg, "hidden_act", "relu2", arch, _ACTIVATIONS), normalization="pre",
        norm_eps=hf_cfg.get("norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rotary_dim=int(sizes["d_head"] * partial), attn_bias=bias, out_bias=bias,
        mlp_bias=bool(hf_cfg.get("mlp_bias", False)),
    )


def _one_plus(ts: Sequence[torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    """``NemotronLayerNorm1P`` scales by ``weight + 1``: that sum is our LayerNorm's weight (the same rounding
    as transformers', which also adds in the weight's dtype)."""
    return ts[0] + 1


def _norm(ours: str, theirs: str) -> tuple[Rule, Rule]:
    """A ``NemotronLayerNorm1P``: its weight plus one, its bias as it is."""
    return Rule(ours, theirs, transform=_one_plus), Rule(ours, theirs, kinds=("bias",))


#: Nemotron's tensors: Llama's attention names, an ungated MLP and ``1 + w`` LayerNorms with biases.
TABLE: tuple[Rule, ...] = (
    Rule("W_E", "embed_tokens"), *_norm("ln_final", "norm"), *LLAMA_ATTENTION,
    *_norm("blocks.{i}.ln1", "layers.{i}.input_layernorm"),
    *_norm("blocks.{i}.ln2", "layers.{i}.post_attention_layernorm"),
    Rule("blocks.{i}.mlp.W_in", "layers.{i}.mlp.up_proj", kinds=biased_if("mlp_bias")),
    Rule("blocks.{i}.mlp.W_out", "layers.{i}.mlp.down_proj", kinds=biased_if("mlp_bias")),
)


def nemotron_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Nemotron one (:data:`TABLE` and the unembedding).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    out, _ = map_tensors(TABLE, hf_sd, cfg, prefixes=("model.",), arch="Nemotron")
    out.update(_lm_head(hf_sd, _Source(hf_sd, ("model.",), "Nemotron"), cfg, "Nemotron"))
    return out


TESTS = {
    "nemotron": CompatConfig("nemotron", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                              num_key_value_heads=1, attention_bias=True, mlp_bias=True, norm_eps=1e-5,
                                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                               "partial_rotary_factor": 0.5})),
}

FAMILY = Family("nemotron", ("nemotron",), nemotron_config, fixed(nemotron_state_dict), tests=TESTS)
