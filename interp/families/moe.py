"""Llama-style mixtures of experts: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (Llama attention; experts read from
transformers 5's stacked layout or per-expert checkpoint tensors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..config import ModelConfig
from ..precision import Precision
from ._base import _need
from ._family import TEST_WINDOW, CompatConfig, Family, named
from ._gguf_experts import MODEL_TYPES, QWEN_OLMOE
from .llama import llama_config, llama_state_dict


def moe_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Mixtral, Qwen2-MoE, Qwen3-MoE or OLMoE decoder from its HF config dict.

    Attention, norms and RoPE as :func:`llama_config` (plus QK-norm: per head for Qwen3-MoE, over all heads
    for OLMoE; OLMoE's ``clip_qkv`` is refused); the MLPs become mixtures of experts (softmax router,
    top-k; Mixtral always renormalises the chosen weights, the others when ``norm_topk_prob``). Qwen2-MoE adds
    its sigmoid-gated shared expert and keeps dense MLPs on ``mlp_only_layers`` and off ``decoder_sparse_step``.
    Router jitter and the auxiliary load-balancing loss are training-only and ignored.

    Raises:
        ValueError: a setting this converter does not reproduce (named), or a missing key.

    Example:
        >>> from interp.families.moe import moe_config
        >>> from transformers import MixtralConfig
        >>> moe_config(MixtralConfig(num_local_experts=8).to_dict()).n_experts
        8
    """
    mtype = str(hf_cfg.get("model_type"))
    arch = mtype
    if hf_cfg.get("clip_qkv") is not None:
        raise ValueError(f"{mtype} clip_qkv={hf_cfg['clip_qkv']!r} is not supported (only None)")
    base = llama_config(hf_cfg)
    if base.activation != "swiglu":  # other expert activations are not checked against transformers
        raise ValueError(f"{mtype} hidden_act={hf_cfg.get('hidden_act')!r} is not supported (only 'silu' for "
                         "mixture-of-experts models)")
    L = base.n_layers
    # config.json names it num_experts (Qwen, OLMoE) or num_local_experts (Mixtral; also some to_dict() outputs).
    key = "num_local_experts" if hf_cfg.get("num_local_experts") is not None else "num_experts"
    E = _need(hf_cfg, key, arch)
    other = hf_cfg.get("num_experts" if key == "num_local_experts" else "num_local_experts")
    if other is not None and other != E:
        raise ValueError(f"{arch} config gives two expert counts that disagree: num_local_experts="
                         f"{hf_cfg.get('num_local_experts')!r} and num_experts={hf_cfg.get('num_experts')!r}")
    fields: dict[str, Any] = dict(
        n_experts=E, n_experts_per_token=_need(hf_cfg, "num_experts_per_tok", arch),
        router_score="softmax", router_renormalize=mtype == "mixtral" or bool(hf_cfg.get("norm_topk_prob")),
        d_expert=base.d_mlp if mtype in ("mixtral", "olmoe") else _need(hf_cfg, "moe_intermediate_size", arch),
    )
    if mtype == "mixtral":  # transformers' Mixtral router returns float32 mixing weights (the others round them)
        fields["precision"] = Precision.named("mixtral")
    if mtype in ("qwen2_moe", "qwen3_moe"):
        step = hf_cfg.get("decoder_sparse_step", 1) or 1
        only = set(hf_cfg.get("mlp_only_layers") or [])
        dense = [i for i in range(L) if i in only or (i + 1) % step]
        fields["dense_mlp_layers"] = dense or None
    if mtype in ("qwen3_moe", "olmoe"):
        # RMSNorm of the queries and keys before RoPE: per head (Qwen3-MoE) or over all heads at once (OLMoE).
        fields["qk_norm"] = "head" if mtype == "qwen3_moe" else "full"
    if mtype == "qwen2_moe":
        shared = hf_cfg.get("shared_expert_intermediate_size") or 0
        fields.update(d_shared_expert=shared, shared_expert_gate=bool(shared))
    return dataclasses.replace(base, **fields)


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits (table-only rows are in the compatibility table, not the family tests).
TESTS = {
    "mixtral": CompatConfig("mixtral", dict(hidden_size=72, intermediate_size=48, num_attention_heads=9, num_key_value_heads=3,
                                            num_local_experts=8, num_experts_per_tok=2, sliding_window=TEST_WINDOW), table_only=True),
    "qwen2_moe": CompatConfig("qwen2_moe", dict(hidden_size=72, intermediate_size=48, moe_intermediate_size=24,
                                                shared_expert_intermediate_size=40, num_attention_heads=9, num_key_value_heads=3,
                                                num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1]),
                              table_only=True),
    "qwen3_moe": CompatConfig("qwen3_moe", dict(hidden_size=80, intermediate_size=48, moe_intermediate_size=24, head_dim=16,
                                                num_attention_heads=5, num_key_value_heads=1, num_experts=8, num_experts_per_tok=2,
                                                norm_topk_prob=True, use_sliding_window=True, sliding_window=TEST_WINDOW), table_only=True),
    "olmoe": CompatConfig("olmoe", dict(hidden_size=80, intermediate_size=24, num_attention_heads=5, num_key_value_heads=5,
                                        num_experts=8, num_experts_per_tok=3, norm_topk_prob=False), table_only=True),
}


FAMILY = Family("mixtral", ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"), moe_config, named(llama_state_dict),
                title="Mixtral", headline=True,
                gguf=dict.fromkeys(MODEL_TYPES, QWEN_OLMOE), tests=TESTS)
