"""Llama 4 (text): chunked local attention on the rotary layers beside NoPE global layers
(``attention_chunk``, ``nope_layers``), RMSNorm without weights on the rotated queries and keys
(``qk_norm="head_after_rotary"`` with unit weights), temperature tuning of the NoPE layers' queries
(``nope_temperature``), RoPE on interleaved pairs (rows reordered to the half-split layout), and mixture-of-experts
layers interleaved with dense ones: top-k sigmoid router whose weights scale each expert's input
(``expert_input_weighting``), plus a shared expert.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ..precision import Precision
from ._base import StateDict, _decoder_checks, _need, _refuse, llama_sizes
from ._family import TEST_WINDOW, CompatConfig, Family, fixed
from ._gguf import (
    GATED_MLP,
    LLAMA_BLOCK,
    LLAMA_GLOBAL,
    GGUFError,
    GGUFSpec,
    HFConfig,
    Meta,
    gguf_sizes,
    rope_parameters,
    rotary_dim,
)
from ._positions import _check_layer_types, _rope, _rope_context
from ._tensors import _dense_weights, _expert_count_check, _leading_pairs_to_halves, _lm_head, _Source


def llama4_text_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Llama 4 text decoder (``Llama4ForCausalLM``) from its HF config dict.

    ``no_rope_layers`` (1: the layer rotates) gives ``nope_layers``; ``layer_types`` (else the rotary layers
    chunked when ``attention_chunk_size`` is set) gives ``attention_chunk``; ``use_qk_norm`` the weightless norm of
    the rotated heads; ``attn_temperature_tuning`` ``nope_temperature = [attn_scale, floor_scale]``; ``moe_layers``
    (else every ``interleave_moe_layer_step``-th layer) the expert layers, the others dense MLPs of width
    ``intermediate_size_mlp``.

    Raises:
        ValueError: an activation other than silu, a layer type other than chunked or full attention (or a
            chunked one without ``attention_chunk_size``), list lengths that disagree with ``num_hidden_layers``,
            or a missing key.

    Example:
        >>> from interp.families.llama4 import llama4_text_config
        >>> cfg = llama4_text_config({"model_type": "llama4_text", "hidden_size": 64, "num_attention_heads": 4,
        ...                           "num_hidden_layers": 4, "intermediate_size": 32, "intermediate_size_mlp": 96,
        ...                           "vocab_size": 50, "max_position_embeddings": 64, "num_local_experts": 4,
        ...                           "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
        ...                           "attention_chunk_size": 16})
        >>> cfg.nope_layers, cfg.attention_chunk, cfg.dense_mlp_layers, cfg.nope_temperature
        ([3], [16, 16, 16, None], [0, 2], [0.1, 8192.0])
    """
    arch = "llama4_text"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("hidden_act", "silu", "silu"),))
    sizes = llama_sizes(hf_cfg, arch)
    L = sizes["n_layers"]
    rotates = hf_cfg.get("no_rope_layers") or [int((i + 1) % (hf_cfg.get("no_rope_layer_interval") or 4) != 0)
                                                for i in range(L)]
    if len(rotates) != L or any(r not in (0, 1) for r in rotates):
        raise ValueError(f"{arch} no_rope_layers={rotates!r} must hold one 0 / 1 flag per layer "
                         f"(num_hidden_layers={L})")
    nope = [i for i, r in enumerate(rotates) if not r]
    chunk_size = hf_cfg.get("attention_chunk_size")
    types = hf_cfg.get("layer_types") or ["chunked_attention" if r and chunk_size is not None else "full_attention"
                                          for r in rotates]
    _check_layer_types(types, L, arch, ("chunked_attention", "full_attention"))
    for i, kind in enumerate(types):
        if kind == "chunked_attention" and chunk_size is None:
            raise ValueError(f"{arch} layer_types[{i}]='chunked_attention' needs attention_chunk_size, got None")
    chunks = [chunk_size if kind == "chunked_attention" else None for kind in types]
    step = hf_cfg.get("interleave_moe_layer_step", 1)
    moe = hf_cfg.get("moe_layers")
    moe = list(range(step - 1, L, step)) if moe is None else list(moe)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    temperature = ([float(hf_cfg.get("attn_scale", 0.1)), float(hf_cfg.get("floor_scale", 8192))]
                   if hf_cfg.get("attn_temperature_tuning", True) and nope else None)
    cfg = ModelConfig(
        **{**sizes, "d_mlp": _need(hf_cfg, "intermediate_size_mlp", arch)}, activation="swiglu", normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        attn_bias=bias, out_bias=bias, mlp_bias=False, nope_layers=nope or None, attention_chunk=chunks,
        nope_temperature=temperature, qk_norm="head_after_rotary" if hf_cfg.get("use_qk_norm", True) else "none",
        precision=Precision.named("cohere"),  # transformers rotates Llama 4's queries and keys in float32
    )
    cfg = dataclasses.replace(cfg, n_ctx=_rope_context(cfg.n_ctx, scaling))
    if not moe:
        return cfg
    d_expert = _need(hf_cfg, "intermediate_size", arch)
    return dataclasses.replace(
        cfg, n_experts=_need(hf_cfg, "num_local_experts", arch),
        n_experts_per_token=_need(hf_cfg, "num_experts_per_tok", arch), d_expert=d_expert, router_score="sigmoid",
        expert_input_weighting=True, d_shared_expert=d_expert,
        dense_mlp_layers=[i for i in range(L) if i not in moe] or None,
    )


def llama4_text_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF ``Llama4ForCausalLM`` one: the rotary layers' q/k rows reordered from interleaved
    pairs to the half-split layout (every score unchanged), unit QK-norm weights on those layers, the experts'
    ``[E, M, 2F]`` / ``[E, F, M]`` tensors transposed to ours.

    Raises:
        ValueError: a tensor the conversion needs is absent, or the experts disagree with the config (named).
    """
    arch = "llama4_text"
    src = _Source(hf_sd, ("model.", "language_model.model."), arch)
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        rotates = i not in (cfg.nope_layers or ())
        for kind in ("weight", "bias") if cfg.attn_bias else ("weight",):
            q, k, v = (src(h + f"self_attn.{n}_proj.{kind}") for n in "qkv")
            if rotates:  # interleaved rotary pairs -> half-split rows, queries and keys alike
                q, k = _leading_pairs_to_halves(q, H, D, D), _leading_pairs_to_halves(k, K, D, D)
            out[b + f"attn.W_qkv.{kind}"] = torch.cat([q, k, v], dim=0)  # [(H + 2K) * D(, M)]
        out[b + "attn.W_O.weight"] = src(h + "self_attn.o_proj.weight")
        if cfg.out_bias:
            out[b + "attn.W_O.bias"] = src(h + "self_attn.o_proj.bias")
        if cfg.qk_norm != "none" and rotates:  # transformers' norm has no weight: ours holds ones
            ones = torch.ones(D, dtype=out["ln_final.weight"].dtype)  # a norm's dtype (GGUF keep_quantized: no tag)
            out[b + "attn.q_norm.weight"], out[b + "attn.k_norm.weight"] = ones, ones.clone()
        out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
        out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
        ff = h + "feed_forward."
        if not cfg.is_moe_layer(i):
            out.update(_dense_weights(src, ff, b + "mlp.", cfg))
            continue
        E, F_ = cfg.n_experts, cfg.d_expert
        router = src(ff + "router.weight")  # [E, M]
        _expert_count_check(arch, src.prefix + ff + "router.weight", router, 0, E, "n_experts")
        down = src(ff + "experts.down_proj")  # [E, F, M]
        if src.has(ff + "experts.gate_proj"):  # a GGUF file (llama.cpp splits gate_up_proj): [E, M, F] each
            gate, up = src(ff + "experts.gate_proj"), src(ff + "experts.up_proj")
            for name, part in (("gate_proj", gate), ("up_proj", up)):
                _expert_count_check(arch, src.prefix + ff + f"experts.{name}", part, 2, F_, "d_expert")
        else:
            gate_up = src(ff + "experts.gate_up_proj")  # [E, M, 2F]: gate columns, then up
            _expert_count_check(arch, src.prefix + ff + "experts.gate_up_proj", gate_up, 2, 2 * F_, "2 x d_expert")
            gate, up = gate_up[..., :F_], gate_up[..., F_:]  # [E, M, F] each
        _expert_count_check(arch, src.prefix + ff + "experts.down_proj", down, 1, F_, "d_expert")
        out[b + "mlp.W_router"] = router
        out[b + "mlp.W_gate"] = gate.transpose(1, 2)  # [E, F, M]
        out[b + "mlp.W_in"] = up.transpose(1, 2)  # [E, F, M]
        out[b + "mlp.W_out"] = down.transpose(1, 2)  # [E, M, F]
        out.update(_dense_weights(src, ff + "shared_expert.", b + "mlp.shared.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, arch))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
#: What llama.cpp's ``llama4`` fixes rather than reads (``llama_load_hparams`` / the ``llama4`` graph): chunks of
#: 8192 tokens on 3 layers of every 4, the 4th global and without RoPE, and the NoPE layers' temperature tuning
#: with scale 0.1 and floor 8192 (the HF defaults and Scout's / Maverick's configs).
GGUF_CHUNK, GGUF_PERIOD, GGUF_TEMPERATURE = 8192, 4, (0.1, 8192)
#: llama.cpp skips the weightless QK-norm for the 128-expert model (Maverick, ``use_qk_norm: false``) only.
GGUF_NO_QK_NORM_EXPERTS = 128


def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> ``Llama4TextConfig``'s dict, as llama.cpp reads a ``llama4`` file: the shared sizes with
    ``feed_forward_length`` the dense MLPs' width (``intermediate_size_mlp``) and ``expert_feed_forward_length``
    the experts' (and the shared expert's); ``expert_count`` / ``expert_used_count``; the MoE layers every
    ``interleave_moe_layer_step``-th; chunked attention, NoPE layers, temperature tuning and QK-norm as llama.cpp
    fixes them (:data:`GGUF_CHUNK`, :data:`GGUF_PERIOD`, :data:`GGUF_TEMPERATURE`, :data:`GGUF_NO_QK_NORM_EXPERTS`).

    Refused by name: ``attention.sliding_window`` other than 8192 (llama.cpp reads 0 as "no chunks, RoPE on
    all but the last layer", MobileLLM's reading, which is not reproduced), a partial ``rope.dimension_count``,
    and llama3 RoPE scaling (the ``rope_freqs`` factor tensor, as for every architecture).
    """
    rope = rope_parameters(m, names, 500000.0)
    cfg = gguf_sizes(m, names)
    rotary_dim(m, cfg["head_dim"])
    window = m.get("attention.sliding_window")
    if window is not None and window != GGUF_CHUNK:
        raise m.fail(f"{m.key('attention.sliding_window')} = {window!r} is not supported: llama.cpp's 'llama4' "
                     f"attends in chunks of {GGUF_CHUNK} (the key absent), and reads 0 as no chunks")
    L = cfg["num_hidden_layers"]
    E = m.count("expert_count", 0, low=0)
    step = m.count("interleave_moe_layer_step")  # llama.cpp requires it
    moe = {}
    if E:
        moe = {"num_local_experts": E, "num_experts_per_tok": m.count("expert_used_count"),
               "intermediate_size": m.count("expert_feed_forward_length"), "interleave_moe_layer_step": step}
        if moe["num_experts_per_tok"] > E:
            raise m.fail(f"{m.key('expert_used_count')} = {moe['num_experts_per_tok']} is more than "
                         f"{m.key('expert_count')} = {E}")
    rotates = [int((i + 1) % GGUF_PERIOD != 0) for i in range(L)]
    return {**cfg, "model_type": "llama4_text", "hidden_act": "silu", "rope_parameters": rope,
            "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon", 1e-5),
            "intermediate_size_mlp": cfg["intermediate_size"], **moe, "moe_layers": None if E else [],
            "no_rope_layers": rotates, "attention_chunk_size": GGUF_CHUNK,
            "layer_types": ["chunked_attention" if r else "full_attention" for r in rotates],
            "attn_temperature_tuning": True, "attn_scale": GGUF_TEMPERATURE[0], "floor_scale": GGUF_TEMPERATURE[1],
            "use_qk_norm": E != GGUF_NO_QK_NORM_EXPERTS, "attention_bias": "blk.0.attn_q.bias" in names}


_GGUF_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}


def _gguf_experts(name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any], *, source: str = "GGUF"
                  ) -> dict[str, torch.Tensor] | None:
    """The merged experts of a ``llama4`` file as HF names: ``ffn_gate_exps`` / ``ffn_up_exps`` ``[E, F, M]``
    (torch order; the converter split HF's ``gate_up_proj`` ``[E, M, 2F]`` and transposed each half) become
    ``experts.gate_proj`` / ``up_proj`` ``[E, M, F]``, which :func:`llama4_text_state_dict` reads in its place;
    ``ffn_down_exps`` ``[E, M, F]`` becomes ``experts.down_proj`` ``[E, F, M]``. None for every other tensor."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _GGUF_EXPERTS:
        return None
    if parts[3] != "weight" or w.dim() != 3:
        raise GGUFError(f"{source}: tensor {name!r} of shape {list(w.shape)}: llama4's experts are 3-D weights")
    return {f"model.layers.{parts[1]}.feed_forward.experts.{_GGUF_EXPERTS[parts[2]]}": w.transpose(1, 2)}


#: llama.cpp's ``llama4`` (the text model of Llama 4 Scout / Maverick): Llama's names, unpermuted (llama.cpp
#: rotates interleaved pairs, as HF's Llama 4; the HF mapping reorders them to halves), dense MLPs
#: ``ffn_{gate,up,down}``, the router ``ffn_gate_inp``, merged experts ``ffn_*_exps`` and the shared expert
#: ``ffn_*_shexp``.
GGUF = {"llama4": GGUFSpec(_gguf_config, LLAMA_GLOBAL, "model.layers.{}.", {
    **{k: v.replace("mlp.", "feed_forward.") for k, v in LLAMA_BLOCK.items()}, "ffn_gate_inp": "feed_forward.router",
    **{f"{k}_shexp": v.replace("mlp.", "feed_forward.shared_expert.") for k, v in GATED_MLP.items()}},
    special=_gguf_experts, experts=True)}


TESTS = {
    # chunks of 8 on the rotary layers 0-2, layer 3 NoPE with temperature tuning from position 3 on (floor 4)
    "llama4_text": CompatConfig("llama4_text", dict(hidden_size=80, intermediate_size=24, intermediate_size_mlp=96,
                                                    num_attention_heads=5, num_key_value_heads=1, head_dim=16,
                                                    num_hidden_layers=4, num_local_experts=8, num_experts_per_tok=2,
                                                    interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0],
                                                    attention_chunk_size=TEST_WINDOW, attn_temperature_tuning=True,
                                                    attn_scale=0.5, floor_scale=4, use_qk_norm=True,
                                                    attention_bias=True)),
}

FAMILY = Family("llama4", ("llama4_text",), llama4_text_config, fixed(llama4_text_state_dict), gguf=GGUF,
                tests=TESTS)
