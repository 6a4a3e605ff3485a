"""Granite-MoE: Granite's four scalars (:mod:`.granite`) over Mixtral-style experts whose router takes the top k
of its logits and a softmax over those k (``router_score="softmax"`` with ``router_renormalize``: the same
weights, ``exp(l_i) / sum_chosen exp(l_j)``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import StateDict, _need, _refuse
from ._family import CompatConfig, Family
from ._tensors import Renamed
from .granite import granite_config, granite_state_dict_for

#: Granite-MoE's expert tensors -> the names :func:`._tensors._moe_weights` reads (transformers 5's
#: ``router.weight`` and the published checkpoints' ``router.layer.weight`` / ``input_linear`` / ``output_linear``,
#: which transformers renames on loading the same way).
_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(a), b) for a, b in (
    (r"block_sparse_moe\.router(\.layer)?\.weight$", "block_sparse_moe.gate.weight"),
    (r"block_sparse_moe\.input_linear\.weight$", "block_sparse_moe.experts.gate_up_proj"),
    (r"block_sparse_moe\.output_linear\.weight$", "block_sparse_moe.experts.down_proj"),
))


def granitemoe_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Granite-MoE (3.x ``a400m`` / ``a800m``) decoder: :func:`granite_config` with every
    MLP a mixture of ``num_local_experts`` SwiGLU experts of width ``intermediate_size``, ``num_experts_per_tok``
    chosen per token.

    Raises:
        ValueError: a multiplier that is not a finite number > 0, an activation other than silu, a missing key.

    Example:
        >>> from interp.families.granitemoe import granitemoe_config
        >>> cfg = granitemoe_config({"model_type": "granitemoe", "hidden_size": 64, "num_attention_heads": 4,
        ...                          "num_hidden_layers": 2, "intermediate_size": 32, "vocab_size": 50,
        ...                          "max_position_embeddings": 64, "num_local_experts": 8,
        ...                          "num_experts_per_tok": 2, "embedding_multiplier": 12.0})
        >>> cfg.n_experts, cfg.n_experts_per_token, cfg.d_expert, cfg.router_renormalize, cfg.embed_scale
        (8, 2, 32, True, 12.0)
    """
    arch = "granitemoe"
    _refuse(arch, hf_cfg, (("hidden_act", "silu", "silu"),))  # the experts' activation; checked against HF
    base = granite_config(hf_cfg)
    return dataclasses.replace(base, n_experts=_need(hf_cfg, "num_local_experts", arch),
                               n_experts_per_token=_need(hf_cfg, "num_experts_per_tok", arch), router_score="softmax",
                               router_renormalize=True, d_expert=base.d_mlp)


def granitemoe_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig],
                                                                     dict[str, torch.Tensor]]:
    """Granite's state-dict function (multipliers folded into the weights) over the expert tensors renamed to
    Mixtral's.

    Raises:
        ValueError: ``residual_multiplier`` or ``logits_scaling`` not a finite number > 0.
    """
    convert = granite_state_dict_for(hf_cfg)
    return lambda hf_sd, cfg: convert(Renamed(hf_sd, _RENAMES), cfg)


TESTS = {
    "granitemoe": CompatConfig("granitemoe", dict(hidden_size=72, intermediate_size=32, num_attention_heads=9,
                                                  num_key_value_heads=3, num_local_experts=8, num_experts_per_tok=2,
                                                  embedding_multiplier=1.5, attention_multiplier=0.2,
                                                  residual_multiplier=0.5, logits_scaling=4.0,
                                                  tie_word_embeddings=True, attention_bias=True)),
}

FAMILY = Family("granitemoe", ("granitemoe",), granitemoe_config, granitemoe_state_dict_for, tests=TESTS)
