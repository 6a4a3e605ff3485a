"""Falcon: parallel block with one shared LayerNorm (7B: MQA) or two (``new_decoder_architecture``: grouped K/V,
fused QKV ordered per K/V group as ``[q_1 .. q_G, k, v]``); ``alibi=True`` up to 8 heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig, ParallelBlock, alibi_slopes
from ._base import StateDict, _decoder_checks, _need
from ._family import CompatConfig, Family, fixed
from ._gguf import TOKEN_IDS, GGUFSpec, HFConfig, Meta, gguf_sizes, no_window, one_head_width, rope_parameters, rotary_dim
from ._positions import _rope
from ._tensors import (
    _lm_head,
    _per_head_qkv,
    _shaped,
    _Source,
)


def falcon_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Falcon decoder: MQA (7B) or grouped K/V (``new_decoder_architecture``).

    ``alibi=True`` (up to 8 heads) replaces RoPE with ALiBi (``alibi_slopes``, divided by ``sqrt(d_head)`` as
    transformers does).

    Raises:
        ValueError: ALiBi with more than 8 heads, a non-parallel new decoder architecture, an activation other
            than gelu/relu, or a missing key.
    """
    arch = "falcon"
    act = hf_cfg.get("activation", "gelu")
    if act not in ("gelu", "relu"):
        raise ValueError(f"{arch} activation={act!r} is not supported (gelu, relu)")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    _decoder_checks(hf_cfg, arch, rotary_head_dim=d_model // n_heads)
    new_arch = bool(hf_cfg.get("new_decoder_architecture", False))
    parallel = bool(hf_cfg.get("parallel_attn", True))
    multi_query = bool(hf_cfg.get("multi_query", True))  # read by the old architecture only
    if new_arch:
        if not parallel:
            raise ValueError(f"{arch} new_decoder_architecture=True with parallel_attn=False is not supported")
        n_kv = hf_cfg.get("num_kv_heads") or n_heads
        n_ln = hf_cfg.get("num_ln_in_parallel_attn") or 2
        block: ParallelBlock = "two_norms" if n_ln == 2 else "one_norm"
    else:
        n_kv = 1 if multi_query else n_heads
        block = "one_norm" if parallel else "none"
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("bias", False))
    slopes = _falcon_alibi_slopes(n_heads, d_model // n_heads) if hf_cfg.get("alibi", False) else None
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv,
        d_mlp=hf_cfg.get("ffn_hidden_size") or 4 * d_model, activation=act,
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=hf_cfg.get("max_position_embeddings") or 2048,
        normalization="pre", norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5),
        positional="none" if slopes else "rotary", alibi_slopes=slopes,  # ALiBi layers do not rotate
        rotary_base=theta, rope_scaling=None if slopes else scaling, parallel_block=block, attn_bias=bias,
        out_bias=bias,
        mlp_bias=bias, unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def _falcon_alibi_slopes(n_heads: int, d_head: int) -> list[float]:
    """Falcon's ALiBi slopes as transformers applies them: divided by ``sqrt(d_head)`` (its bias is added after the
    scores are scaled, and scaled itself).

    transformers rounds each slope and each ``slope * key_position`` to bfloat16 before adding it. For up to 8
    heads every slope is a power of two, so the products are exact up to key position 255; for more heads the
    rounded slopes and products differ from exact ALiBi by up to 0.4 %, which interp does not reproduce: refused.

    Raises:
        ValueError: more than 8 heads with ``alibi=True``.
    """
    if n_heads > 8:
        raise ValueError(f"falcon alibi=True with num_attention_heads={n_heads} is not supported: transformers rounds "
                         "the slopes (not powers of two beyond 8 heads) and their products with key positions to "
                         "bfloat16, which interp does not reproduce")
    return [s / math.sqrt(d_head) for s in alibi_slopes(n_heads)]


def falcon_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Falcon one; the fused QKV is reordered into ``[q | k | v]``.

    Raises:
        ValueError: a tensor is absent or the fused QKV's shape disagrees with the config (both named).
    """
    src = _Source(hf_sd, ("transformer.",), "Falcon")
    H, K, D, M = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    G = H // K
    out = {"W_E.weight": src("word_embeddings.weight"), "ln_final.weight": src("ln_f.weight"),
           "ln_final.bias": src("ln_f.bias")}
    # Per-group rows [q_1 .. q_G, k, v] coincide with per-head [q, k, v] for G = 1 and with [q | k | v] for K = 1.
    grouped = K not in (1, H)

    def qkv(t: torch.Tensor) -> torch.Tensor:
        rest = t.shape[1:]
        if grouped:  # per K/V group [q_1 .. q_G, k, v]
            g = t.reshape(K, G + 2, D, *rest)  # [K, G + 2, D, ..]
            return torch.cat([g[:, :G].reshape(H * D, *rest), g[:, G].reshape(K * D, *rest),
                              g[:, G + 1].reshape(K * D, *rest)])  # [(H + 2K) D, ..]
        if K == H:
            return _per_head_qkv(t, H, D)
        return t  # MQA: [q | k | v] already

    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        out[b + "attn.W_qkv.weight"] = qkv(_shaped(src, h + "self_attention.query_key_value.weight",
                                                   ((H + 2 * K) * D, M)))
        out[b + "attn.W_O.weight"] = src(h + "self_attention.dense.weight")
        out[b + "mlp.W_in.weight"] = src(h + "mlp.dense_h_to_4h.weight")
        out[b + "mlp.W_out.weight"] = src(h + "mlp.dense_4h_to_h.weight")
        if cfg.attn_bias:
            out[b + "attn.W_qkv.bias"] = qkv(src(h + "self_attention.query_key_value.bias"))
            out[b + "attn.W_O.bias"] = src(h + "self_attention.dense.bias")
            out[b + "mlp.W_in.bias"] = src(h + "mlp.dense_h_to_4h.bias")
            out[b + "mlp.W_out.bias"] = src(h + "mlp.dense_4h_to_h.bias")
        if cfg.parallel_block == "two_norms":
            norms: tuple[tuple[str, str], ...] = (("ln1", "ln_attn"), ("ln2", "ln_mlp"))
        elif cfg.parallel_block == "one_norm":
            norms = (("ln1", "input_layernorm"),)
        else:
            norms = (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"))
        for ours, theirs in norms:
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    out.update(_lm_head(hf_sd, src, cfg, "Falcon"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> Falcon's HF config (only the ``jploski`` ``[q | k | v]`` layout); a second norm per block
    (``attn_norm_2``) means the new decoder architecture with two norms (Falcon 40B / 180B)."""
    cfg = gguf_sizes(m, names)
    layout = m.get("tensor_data_layout", "jploski")
    if layout != "jploski":
        raise m.fail(f"{m.key('tensor_data_layout')} = {layout!r} is not supported (only 'jploski', the "
                     f"[q | k | v] layout llama.cpp's converter writes)")
    one_head_width(m, cfg, "Falcon")
    rotary_dim(m, cfg["head_dim"])
    no_window(m)
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    two_norms = "blk.0.attn_norm_2.weight" in names
    # HF spells the K/V grouping three ways; each below converts to the same model.
    if two_norms or K not in (1, H):
        layout_cfg = {"new_decoder_architecture": True, "num_kv_heads": K, "num_ln_in_parallel_attn": 2 if two_norms else 1}
    else:
        layout_cfg = {"new_decoder_architecture": False, "multi_query": K == 1}
    return {"model_type": "falcon", "hidden_size": cfg["hidden_size"], "num_attention_heads": H,
            "num_hidden_layers": cfg["num_hidden_layers"], "vocab_size": cfg["vocab_size"],
            "ffn_hidden_size": cfg["intermediate_size"], "max_position_embeddings": cfg["max_position_embeddings"],
            "layer_norm_epsilon": m.number("attention.layer_norm_epsilon", 1e-5),
            "rope_parameters": rope_parameters(m, names, 10000.0), "parallel_attn": True, "alibi": False,
            "bias": "blk.0.attn_qkv.bias" in names, "activation": "gelu",
            "tie_word_embeddings": cfg["tie_word_embeddings"], **layout_cfg,
            **{k: cfg[k] for k in TOKEN_IDS}}


def _gguf_regroup(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
    """``[q | k | v]`` rows (llama.cpp) back to HF Falcon's per-K/V-group ``[q_1 .. q_G, k, v]``."""
    if kind != "attn_qkv":
        return w
    H = hf_cfg["num_attention_heads"]
    K = hf_cfg.get("num_kv_heads", 1 if hf_cfg.get("multi_query") else H)
    D = hf_cfg["hidden_size"] // H
    if w.shape[0] != (H + 2 * K) * D:
        raise ValueError(f"has {w.shape[0]} rows, {H} query + 2 x {K} K/V heads of {D} need {(H + 2 * K) * D}")
    rest = w.shape[1:]
    q, k, v = w.split([H * D, K * D, K * D])
    groups = [q.reshape(K, H // K, D, *rest), k.reshape(K, 1, D, *rest), v.reshape(K, 1, D, *rest)]
    return torch.cat(groups, dim=1).reshape(w.shape)  # [K, G + 2, D, ..] -> [(H + 2K) D, ..]


def _gguf_block(hf_cfg: Mapping[str, Any]) -> dict[str, str]:
    two = hf_cfg.get("new_decoder_architecture") and hf_cfg.get("num_ln_in_parallel_attn") == 2
    # Two norms (gguf's tensor map, as llama.cpp's falcon graph reads them): attn_norm_2 feeds the attention,
    # attn_norm the MLP.
    return {"attn_norm": "ln_mlp" if two else "input_layernorm", "attn_norm_2": "ln_attn",
            "attn_qkv": "self_attention.query_key_value", "attn_output": "self_attention.dense",
            "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"}


#: llama.cpp's ``falcon``: the fused QKV reordered from HF's per-K/V-group ``[q_1 .. q_G, k, v]`` into
#: ``[q | k | v]`` (``tensor_data_layout = "jploski"``); regrouped on reading.
GGUF = {"falcon": GGUFSpec(_gguf_config, {
    "token_embd": "transformer.word_embeddings", "output_norm": "transformer.ln_f", "output": "lm_head"},
    "transformer.h.{}.", _gguf_block, _gguf_regroup)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "falcon": CompatConfig("falcon", dict(hidden_size=80, ffn_hidden_size=96, num_attention_heads=5, multi_query=True,
                                          parallel_attn=True, bias=False)),
    "falcon_new_arch": CompatConfig("falcon", dict(hidden_size=72, ffn_hidden_size=96, num_attention_heads=9, num_kv_heads=3,
                                                   new_decoder_architecture=True, bias=True)),
    "falcon_alibi": CompatConfig("falcon", dict(hidden_size=72, ffn_hidden_size=96, num_attention_heads=6, multi_query=False,
                                                parallel_attn=False, bias=True, alibi=True)),
}


FAMILY = Family("falcon", ("falcon",), falcon_config, fixed(falcon_state_dict), gguf=GGUF, tests=TESTS)
