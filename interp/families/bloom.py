"""BLOOM: a config function, a state-dict function and its family record (neither imports ``transformers``).

What BLOOM needs of the core: ALiBi (``alibi_slopes``, BLOOM's ``_get_alibi_slopes``, which are
:func:`interp.config.alibi_slopes` with ``max_bias=8``), a LayerNorm right after the embeddings (``embed_norm``),
pre-LayerNorm blocks, tanh-GELU MLP (``bloom_gelu_forward`` is ``gelu_new``), no positions otherwise, tied
unembedding. Its fused ``query_key_value`` rows are grouped per head (``[q_h, k_h, v_h]`` for each head h) and
reordered into our ``[q | k | v]``.

BLOOM adds ``slope * key_position`` to the scores, interp ``slope * (key - query)``: the two differ by a constant
per query row, which softmax ignores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig, alibi_slopes
from ._base import StateDict, _decoder_checks, _need, _refuse
from ._family import CompatConfig, Family, fixed
from ._gguf import TOKEN_IDS, GGUFSpec, HFConfig, Meta, fixed_heads_sizes, per_head_rows
from ._tensors import _lm_head, _per_head_qkv, _shaped, _Source

#: BLOOM has no position table: ALiBi extrapolates. The longest sequence a converted model accepts (the
#: training length of the published checkpoints) unless the config gives ``seq_length``.
BLOOM_N_CTX = 2048


def bloom_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a BLOOM decoder from its HF config dict.

    Args:
        hf_cfg: the HF config as a dict (``model_type`` ``"bloom"``).

    Returns:
        A config with ALiBi slopes for ``n_head`` heads and the embedding LayerNorm.

    Raises:
        ValueError: ``apply_residual_connection_post_layernorm=True`` (the residual would be the normalised
            input), bidirectional attention, or a missing key.

    Example:
        >>> from interp.families.bloom import bloom_config
        >>> cfg = bloom_config({"model_type": "bloom", "hidden_size": 48, "n_head": 6, "n_layer": 2,
        ...                     "vocab_size": 50})
        >>> cfg.embed_norm, cfg.positional, cfg.alibi_slopes[4:]
        (True, 'none', [0.5, 0.125])
    """
    arch = "bloom"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("apply_residual_connection_post_layernorm", False, False),))
    d_model = hf_cfg.get("hidden_size") or _need(hf_cfg, "n_embed", arch)
    n_heads = _need(hf_cfg, "n_head", arch)
    if d_model % n_heads:
        raise ValueError(f"{arch} hidden_size={d_model} is not divisible by n_head={n_heads}")
    # pretraining_tp / slow_but_exact only split the output projection's matmul into slices: the same sum.
    return ModelConfig(
        n_layers=_need(hf_cfg, "n_layer", arch), d_model=d_model, n_heads=n_heads, d_mlp=4 * d_model,
        activation="gelu_new", d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=hf_cfg.get("seq_length") or BLOOM_N_CTX, normalization="pre", embed_norm=True,
        norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5), positional="none", alibi_slopes=alibi_slopes(n_heads),
        attn_bias=True, out_bias=True, mlp_bias=True, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def bloom_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF BLOOM one (``BloomForCausalLM`` or ``BloomModel`` keys).

    Args:
        hf_sd: the HF state dict.
        cfg: the config :func:`bloom_config` made.

    Returns:
        Our tensors by name; the fused QKV's per-head row groups reordered.

    Raises:
        ValueError: a tensor is absent or the fused QKV's shape disagrees with the config (both named).

    Example:
        >>> from interp.families.bloom import bloom_config, bloom_state_dict
        >>> import transformers
        >>> hf = transformers.BloomForCausalLM(transformers.BloomConfig(hidden_size=48, n_head=6, n_layer=1,
        ...                                                             vocab_size=50))
        >>> sd = bloom_state_dict(hf.state_dict(), bloom_config(hf.config.to_dict()))
        >>> sd["blocks.0.attn.W_qkv.weight"].shape
        torch.Size([144, 48])
    """
    src = _Source(hf_sd, ("transformer.",), "BLOOM")
    H, D, M = cfg.n_heads, cfg.d_head, cfg.d_model
    out = {"W_E.weight": src("word_embeddings.weight")}
    for ours, theirs in (("embed_ln", "word_embeddings_layernorm"), ("ln_final", "ln_f")):
        for kind in ("weight", "bias"):
            out[f"{ours}.{kind}"] = src(f"{theirs}.{kind}")
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        out[b + "attn.W_qkv.weight"] = _per_head_qkv(
            _shaped(src, h + "self_attention.query_key_value.weight", (3 * H * D, M)), H, D)
        out[b + "attn.W_qkv.bias"] = _per_head_qkv(
            _shaped(src, h + "self_attention.query_key_value.bias", (3 * H * D,)), H, D)
        for ours, theirs in (("attn.W_O", "self_attention.dense"), ("ln1", "input_layernorm"),
                             ("ln2", "post_attention_layernorm"), ("mlp.W_in", "mlp.dense_h_to_4h"),
                             ("mlp.W_out", "mlp.dense_4h_to_h")):
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    out.update(_lm_head(hf_sd, src, cfg, "BLOOM"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> BLOOM's HF config (ALiBi: ``context_length`` is only the longest sequence accepted)."""
    sizes = fixed_heads_sizes(m, names, "BLOOM")
    return {"model_type": "bloom", "hidden_size": sizes["hidden_size"], "n_head": sizes["num_attention_heads"],
            "n_layer": sizes["num_hidden_layers"], "vocab_size": sizes["vocab_size"],
            "seq_length": sizes["max_position_embeddings"],
            "layer_norm_epsilon": m.number("attention.layer_norm_epsilon", 1e-5),
            "tie_word_embeddings": sizes["tie_word_embeddings"], **{k: sizes[k] for k in TOKEN_IDS}}


#: llama.cpp's ``bloom``: the fused QKV reordered from per-head groups to ``[q | k | v]`` (regrouped here); the
#: converter writes the tied unembedding out as ``output``.
GGUF = {"bloom": GGUFSpec(_gguf_config, {
    "token_embd": "transformer.word_embeddings", "token_embd_norm": "transformer.word_embeddings_layernorm",
    "output_norm": "transformer.ln_f", "output": "lm_head"}, "transformer.h.{}.", {
        "attn_norm": "input_layernorm", "attn_qkv": "self_attention.query_key_value",
        "attn_output": "self_attention.dense", "ffn_norm": "post_attention_layernorm",
        "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"}, per_head_rows)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    # ALiBi with 6 heads (not a power of two: the interleaved extra slopes) and with 12
    "bloom": CompatConfig("bloom", dict(hidden_size=96, n_head=6, n_layer=2)),
    "bloom_12_heads": CompatConfig("bloom", dict(hidden_size=96, n_head=12, n_layer=2)),
}


FAMILY = Family("bloom", ("bloom",), bloom_config, fixed(bloom_state_dict), title="BLOOM", gguf=GGUF, tests=TESTS)
