"""GLM-4-MoE (GLM-4.5 / 4.6): Llama attention with q/k/v biases, optional per-head QK-norm and rotate-half RoPE
on the first ``partial_rotary_factor`` of each head, over DeepSeek-V3's routing (sigmoid scores, a choice-only
bias, expert groups scored by their top two, a shared expert) after ``first_k_dense_replace`` dense layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..config import ModelConfig
from ..precision import Precision
from ._base import _need, _positive, _refuse
from ._family import CompatConfig, Family, named
from .llama import llama_config, llama_state_dict


def glm4_moe_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GLM-4-MoE decoder from its HF config dict.

    Attention as :func:`llama_config` with q/k/v biases where ``attention_bias`` (never on ``o_proj``), per-head
    RMSNorm of queries and keys before RoPE where ``use_qk_norm``, and RoPE on the first ``partial_rotary_factor``
    (0.5 by default) of each head. Layers from ``first_k_dense_replace`` on are mixtures of ``n_routed_experts``
    SwiGLU experts of width ``moe_intermediate_size`` routed as DeepSeek-V3 routes (``n_group`` / ``topk_group``,
    ``norm_topk_prob``, ``routed_scaling_factor``), plus ``n_shared_experts`` shared ones as one MLP.

    Raises:
        ValueError: an activation other than silu, a ``partial_rotary_factor`` outside (0, 1], scaled RoPE
            (only ``default`` with a partial rotary), ``n_routed_experts`` not divisible by ``n_group``, or a
            missing key.

    Example:
        >>> from interp.families.glm4_moe import glm4_moe_config
        >>> cfg = glm4_moe_config({"model_type": "glm4_moe", "hidden_size": 64, "num_attention_heads": 4,
        ...                        "num_hidden_layers": 2, "intermediate_size": 96, "moe_intermediate_size": 16,
        ...                        "vocab_size": 50, "max_position_embeddings": 64, "n_routed_experts": 8,
        ...                        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
        ...                        "use_qk_norm": True})
        >>> cfg.rotary_dim, cfg.qk_norm, cfg.router_score, cfg.router_groups, cfg.dense_mlp_layers
        (8, 'head', 'sigmoid', 2, [0])
    """
    arch = "glm4_moe"
    _refuse(arch, hf_cfg, (("hidden_act", "silu", "silu"),))  # experts, shared and dense MLPs: checked with silu
    base = llama_config(hf_cfg, biases=("attention_bias", False))
    rope = hf_cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", hf_cfg.get("partial_rotary_factor", 0.5))
    if _positive(partial, "partial_rotary_factor", arch, hf_cfg) > 1:
        raise ValueError(f"{arch} partial_rotary_factor={partial!r} must be in (0, 1]")
    if base.rope_scaling is not None:
        raise ValueError(f"{arch} rope_type={base.rope_scaling['rope_type']!r} is not supported (only 'default': "
                         "GLM-4-MoE rotates part of each head)")
    # config.json names it n_routed_experts; transformers' attribute_map also accepts num_local_experts.
    E = _need(hf_cfg, "n_routed_experts" if hf_cfg.get("n_routed_experts") is not None else "num_local_experts", arch)
    groups = hf_cfg.get("n_group") or 1
    if E % groups:
        raise ValueError(f"{arch} n_routed_experts={E!r} is not divisible by n_group={groups!r}")
    d_expert = _need(hf_cfg, "moe_intermediate_size", arch)
    first_dense = hf_cfg.get("first_k_dense_replace", 1)
    first_dense = 1 if first_dense is None else first_dense
    return dataclasses.replace(
        base, rotary_dim=int(base.d_head * partial), qk_norm="head" if hf_cfg.get("use_qk_norm") else "none",
        n_experts=E, n_experts_per_token=_need(hf_cfg, "num_experts_per_tok", arch), d_expert=d_expert,
        router_score="sigmoid", router_choice_bias=True, router_groups=groups,
        router_topk_groups=hf_cfg.get("topk_group") or groups, router_group_score="top2_sum",
        router_renormalize=bool(hf_cfg.get("norm_topk_prob", True)),
        routed_scaling=float(hf_cfg.get("routed_scaling_factor", 1.0)),
        d_shared_expert=(hf_cfg.get("n_shared_experts") or 0) * d_expert,
        dense_mlp_layers=list(range(min(first_dense, base.n_layers))) or None,
        precision=Precision.named("deepseek_v3"),  # transformers keeps the gate (weight, choice bias) in float32
    )


TESTS = {
    "glm4_moe": CompatConfig("glm4_moe", dict(hidden_size=80, intermediate_size=96, moe_intermediate_size=24,
                                              num_attention_heads=5, num_key_value_heads=1, head_dim=16,
                                              attention_bias=True, use_qk_norm=True, n_routed_experts=8,
                                              num_experts_per_tok=3, n_shared_experts=1, n_group=4, topk_group=2,
                                              routed_scaling_factor=1.5, first_k_dense_replace=1,
                                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                               "partial_rotary_factor": 0.5})),
}

FAMILY = Family("glm4_moe", ("glm4_moe",), glm4_moe_config, named(llama_state_dict), tests=TESTS)
