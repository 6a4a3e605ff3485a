"""DeepSeek-V2 / V3: multi-head latent attention, routed and shared experts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ..precision import Precision
from ._base import _MLP_BIAS_KEY, StateDict, _decoder_checks, _need
from ._family import CompatConfig, Family
from ._gguf_experts import DEEPSEEK2
from ._positions import _rope, _yarn_mscale
from ._tensors import (
    _deinterleave,
    _mlp_weights,
    _shape_check,
    _Source,
)


def deepseek_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a DeepSeek-V2 / V3 decoder (MLA attention, routed + shared experts).

    MLA: ``q_lora_rank`` (None: direct query projection), ``kv_lora_rank``, ``qk_nope_head_dim`` (our
    ``d_head``), ``qk_rope_head_dim``, ``v_head_dim``. Experts: V2 softmax scores, ``topk_method`` ``greedy`` or
    ``group_limited_greedy`` (group score = its best expert); V3 sigmoid scores with
    ``e_score_correction_bias`` for the choice, groups scored by their two best experts, ``norm_topk_prob``;
    both ``routed_scaling_factor``, ``n_shared_experts`` and dense first ``first_k_dense_replace`` layers.
    DeepSeek-V3's multi-token-prediction layers (``num_nextn_predict_layers``) are not part of the causal-LM
    forward pass (transformers drops them too): their weights, if present, are ignored.

    Raises:
        ValueError: a setting this converter does not reproduce (named with its value), or a missing key.

    Example:
        >>> from interp.families.deepseek import deepseek_config
        >>> from transformers import DeepseekV3Config
        >>> deepseek_config(DeepseekV3Config().to_dict()).kind
        'mla'
    """
    mtype = str(hf_cfg.get("model_type"))
    arch = mtype
    _decoder_checks(hf_cfg, mtype)
    act = hf_cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{mtype} hidden_act={act!r} is not supported (only 'silu')")
    if hf_cfg.get("attention_bias"):
        raise ValueError(f"{mtype} attention_bias=True is not supported (DeepSeek's projections have no bias)")
    freq = hf_cfg.get("moe_layer_freq", 1)
    if freq != 1:
        raise ValueError(f"{mtype} moe_layer_freq={freq} is not supported (only 1: every layer after the dense ones)")
    v3 = mtype == "deepseek_v3"
    scoring = hf_cfg.get("scoring_func", "sigmoid" if v3 else "softmax")
    if scoring != ("sigmoid" if v3 else "softmax"):
        raise ValueError(f"{mtype} scoring_func={scoring!r} is not supported (transformers' {mtype} uses "
                         f"{'sigmoid' if v3 else 'softmax'})")
    method = hf_cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
    allowed = ("noaux_tc",) if v3 else ("greedy", "group_limited_greedy")
    if method not in allowed:
        raise ValueError(f"{mtype} topk_method={method!r} is not supported ({allowed})")
    if not v3 and hf_cfg.get("norm_topk_prob"):
        raise ValueError("deepseek_v2 norm_topk_prob=True is not supported (transformers' DeepSeek-V2 router "
                         "never renormalises)")
    L = _need(hf_cfg, "num_hidden_layers", arch)
    n_heads = _need(hf_cfg, "num_attention_heads", arch)
    nope, rope = _need(hf_cfg, "qk_nope_head_dim", arch), _need(hf_cfg, "qk_rope_head_dim", arch)
    # transformers' eager MLA repeats the keys num_attention_heads / num_key_value_heads times: only equal counts
    # run there. (Its head_dim is always set to qk_rope_head_dim by the config class, whatever config.json says.)
    eps = hf_cfg.get("rms_norm_eps", 1e-6)
    eps = 1e-6 if eps is None else eps
    # transformers' q_a_layernorm / kv_a_layernorm keep RMSNorm's default eps whatever the config says (a GGUF file
    # stores 1e-6 as a float32: 9.99999997e-07).
    if not math.isclose(eps, 1e-6, rel_tol=1e-6):
        raise ValueError(f"{mtype} rms_norm_eps={eps!r} is not supported: transformers' {mtype} normalises the MLA "
                         "latents with eps 1e-6 and the blocks with rms_norm_eps, and interp's model has one eps "
                         "(only 1e-6)")
    kv_heads = hf_cfg.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != n_heads:
        raise ValueError(f"{mtype} num_key_value_heads={kv_heads!r} is not supported (MLA needs "
                         f"num_attention_heads={n_heads})")
    grouped = v3 or method == "group_limited_greedy"
    groups = (hf_cfg.get("n_group") or 1) if grouped else 1
    first_dense = hf_cfg.get("first_k_dense_replace", 0) or 0
    E = _need(hf_cfg, "n_routed_experts", arch)
    d_expert = _need(hf_cfg, "moe_intermediate_size", arch)
    theta, scaling = _rope(hf_cfg, mtype)
    attn_scale = None
    if scaling is not None and scaling["rope_type"] == "yarn" and scaling.get("mscale_all_dim"):
        # DeepSeek's YaRN also rescales the softmax by mscale(factor, mscale_all_dim)**2.
        m = _yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])
        attn_scale = (nope + rope) ** -0.5 * m * m
    return ModelConfig(
        n_layers=L, d_model=_need(hf_cfg, "hidden_size", arch), n_heads=n_heads, attention="latent",
        d_head=nope, rope_dim=rope, v_head_dim=_need(hf_cfg, "v_head_dim", arch),
        kv_latent_dim=_need(hf_cfg, "kv_lora_rank", arch), q_latent_dim=hf_cfg.get("q_lora_rank"),
        positional="rotary", rotary_base=theta, rope_scaling=scaling, attn_scale=attn_scale,
        normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation="swiglu", d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), attn_bias=False, out_bias=False,
        # DeepSeek-V2's dense and shared-expert MLPs read mlp_bias; V3's hard-code none (the routed experts never).
        mlp_bias=mtype in _MLP_BIAS_KEY and bool(hf_cfg.get("mlp_bias", False)),
        unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)),
        pad_token_id=hf_cfg.get("pad_token_id"),
        n_experts=E, n_experts_per_token=_need(hf_cfg, "num_experts_per_tok", arch), d_expert=d_expert,
        router_score="sigmoid" if v3 else "softmax", router_renormalize=v3 and bool(hf_cfg.get("norm_topk_prob")),
        router_groups=groups, router_topk_groups=(hf_cfg.get("topk_group") or groups) if grouped else 1,
        router_group_score="top2_sum" if v3 else "max", router_choice_bias=v3,
        routed_scaling=float(hf_cfg.get("routed_scaling_factor", 1.0)),
        d_shared_expert=(hf_cfg.get("n_shared_experts") or 0) * d_expert,
        dense_mlp_layers=list(range(min(first_dense, L))) or None,
        precision=Precision.named("deepseek_v3" if v3 else "deepseek_v2"),  # float32 gate (V2: float32 rotary)
    )


def _mla_size(cfg: ModelConfig, name: str) -> int:
    """An MLA size of the config (set by :func:`deepseek_config`), refused by name when absent."""
    value = getattr(cfg, name)
    if value is None:
        raise ValueError(f"a DeepSeek state dict needs an MLA config, but {name}=None")
    return int(value)


def deepseek_state_dict(hf_sd: StateDict, cfg: ModelConfig, *, interleaved: bool = True,
                        arch: str = "deepseek_v3") -> dict[str, torch.Tensor]:
    """Our state dict from a HF DeepSeek-V2 / V3 one.

    Args:
        hf_sd: the HF state dict (``*ForCausalLM`` keys).
        cfg: from :func:`deepseek_config`.
        interleaved: the checkpoint's rotary dims come in interleaved pairs (DeepSeek-V2 always; V3 with
            ``rope_interleave``): their rows are permuted to the half-split layout (see :func:`_deinterleave`).
        arch: the HF ``model_type`` the weights come from, which the errors name.

    Raises:
        ValueError: a missing tensor, or MLA ranks / head widths / expert counts that do not match the tensors.
    """
    src = _Source(hf_sd, ("model.",), arch)
    H, D, M = cfg.n_heads, cfg.d_head, cfg.d_model
    R, C, Dv = (_mla_size(cfg, name) for name in ("rope_dim", "kv_latent_dim", "v_head_dim"))
    Cq = cfg.q_latent_dim
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}

    def rope_rows(w: torch.Tensor, heads: int, width: int) -> torch.Tensor:
        return _deinterleave(w, heads, width, R) if interleaved else w

    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        a, at = h + "self_attn.", b + "attn."
        if Cq is None:
            w = src(a + "q_proj.weight")
            _shape_check(arch, src.prefix + a + "q_proj.weight", w, (H * (D + R), M),
                         f"num_attention_heads={H} x (qk_nope_head_dim={D} + qk_rope_head_dim={R}), hidden_size={M}")
            out[at + "W_q.weight"] = rope_rows(w, H, D + R)
        else:
            w_a, w_b = src(a + "q_a_proj.weight"), src(a + "q_b_proj.weight")
            _shape_check(arch, src.prefix + a + "q_a_proj.weight", w_a, (Cq, M), f"q_lora_rank={Cq}, hidden_size={M}")
            _shape_check(arch, src.prefix + a + "q_b_proj.weight", w_b, (H * (D + R), Cq),
                         f"num_attention_heads={H} x (qk_nope_head_dim={D} + qk_rope_head_dim={R}), q_lora_rank={Cq}")
            out[at + "W_dq.weight"] = w_a
            out[at + "q_norm.weight"] = src(a + "q_a_layernorm.weight")
            out[at + "W_uq.weight"] = rope_rows(w_b, H, D + R)
        w_dkv = src(a + "kv_a_proj_with_mqa.weight")
        _shape_check(arch, src.prefix + a + "kv_a_proj_with_mqa.weight", w_dkv, (C + R, M),
                     f"kv_lora_rank={C} + qk_rope_head_dim={R}, hidden_size={M}")
        out[at + "W_dkv.weight"] = rope_rows(w_dkv, 1, C + R)
        out[at + "kv_norm.weight"] = src(a + "kv_a_layernorm.weight")
        w_ukv = src(a + "kv_b_proj.weight")
        _shape_check(arch, src.prefix + a + "kv_b_proj.weight", w_ukv, (H * (D + Dv), C),
                     f"num_attention_heads={H} x (qk_nope_head_dim={D} + v_head_dim={Dv}), kv_lora_rank={C}")
        out[at + "W_ukv.weight"] = w_ukv
        w_o = src(a + "o_proj.weight")
        _shape_check(arch, src.prefix + a + "o_proj.weight", w_o, (M, H * Dv),
                     f"hidden_size={M}, num_attention_heads={H} x v_head_dim={Dv}")
        out[at + "W_O.weight"] = w_o
        out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
        out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
        out.update(_mlp_weights(src, h, b + "mlp.", cfg, i))
    if not cfg.tie_embeddings:
        if "lm_head.weight" not in hf_sd:
            raise ValueError(f"{arch} state dict has no 'lm_head.weight' and tie_word_embeddings is False")
        out["W_U.weight"] = hf_sd["lm_head.weight"]
        out["W_U.bias"] = torch.zeros(cfg.d_vocab)  # an untied W_U has a bias in interp; lm_head has none
    return out


def _deepseek_state_dict(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict]:
    mtype = str(hf_cfg.get("model_type"))
    interleaved = mtype == "deepseek_v2" or bool(hf_cfg.get("rope_interleave", True))
    return lambda sd, cfg: deepseek_state_dict(sd, cfg, interleaved=interleaved, arch=mtype)


_MLA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=4, v_head_dim=6, intermediate_size=48, moe_intermediate_size=24, n_routed_experts=8,
            num_experts_per_tok=3, first_k_dense_replace=1)


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits (table-only rows are in the compatibility table, not the family tests).
TESTS = {
    "deepseek_v2": CompatConfig("deepseek_v2", dict(**_MLA, q_lora_rank=None, n_shared_experts=2,
                                                    topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                                    routed_scaling_factor=1.5), table_only=True),
    "deepseek_v3": CompatConfig("deepseek_v3", dict(**_MLA, q_lora_rank=12, n_shared_experts=1, n_group=4, topk_group=2,
                                                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                                     "original_max_position_embeddings": 16, "mscale": 0.8,
                                                                     "mscale_all_dim": 0.707}), table_only=True),
}


FAMILY = Family("deepseek", ("deepseek_v2", "deepseek_v3"), deepseek_config, _deepseek_state_dict, title="DeepSeek",
                headline=True, gguf={"deepseek2": DEEPSEEK2}, tests=TESTS)
