"""GPT-NeoX / Pythia: parallel attention and MLP with two LayerNorms, partial rotary, a fused QKV whose rows
are grouped per head (``[q_h, k_h, v_h]``), reordered into our ``[q | k | v]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import Activation, ModelConfig
from ._base import StateDict, _activation, _decoder_checks, _need
from ._family import CompatConfig, Family, fixed
from ._gguf import (
    TOKEN_IDS,
    GGUFSpec,
    HFConfig,
    Meta,
    fixed_heads_sizes,
    partial_rope,
    per_head_rows,
)
from ._mapping import Rule, biased_if, both, map_tensors, per_head_qkv
from ._positions import _partial_factor, _rope
from ._tensors import (
    _lm_head,
    _Source,
)

#: The ``hidden_act`` values this family's transformers code accepts, as our activations.
_ACTIVATIONS: dict[str, Activation] = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_fast": "gelu_new",
                                        "gelu_pytorch_tanh": "gelu_new", "relu": "relu"}


def gpt_neox_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-NeoX / Pythia decoder (parallel block, partial rotary).

    Raises:
        ValueError: an unsupported setting (activation, RoPE kind) or a missing key.
    """
    arch = "gpt_neox"
    activation = _activation(hf_cfg, "hidden_act", "gelu", arch, _ACTIVATIONS)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = d_model // n_heads
    _decoder_checks(hf_cfg, arch, rotary_head_dim=d_head)
    pct = _partial_factor(hf_cfg, 1.0, legacy="rotary_pct")
    legacy_base = hf_cfg.get("rotary_emb_base")
    theta, scaling = _rope(hf_cfg, arch, default_theta=legacy_base or 10000.0)
    bias = bool(hf_cfg.get("attention_bias", True))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=activation,
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="pre", norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rotary_dim=int(d_head * pct), rope_scaling=scaling,
        parallel_block="two_norms" if hf_cfg.get("use_parallel_residual", True) else "none",
        attn_bias=bias, out_bias=bias, mlp_bias=True, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def _qkv_shape(cfg: ModelConfig, kind: str) -> tuple[int, ...]:
    rows = 3 * cfg.n_heads * cfg.d_head
    return (rows, cfg.d_model) if kind == "weight" else (rows,)


#: GPT-NeoX's tensors: a fused QKV grouped per head (reordered to ``[q | k | v]``), biased projections, two norms.
TABLE: tuple[Rule, ...] = (
    Rule("W_E", "embed_in"), Rule("ln_final", "final_layer_norm", kinds=both),
    Rule("blocks.{i}.attn.W_qkv", "layers.{i}.attention.query_key_value", transform=per_head_qkv, shape=_qkv_shape,
         kinds=biased_if("attn_bias")),
    Rule("blocks.{i}.attn.W_O", "layers.{i}.attention.dense",
         kinds=biased_if("attn_bias")),
    *(Rule(f"blocks.{{i}}.{ours}", f"layers.{{i}}.{theirs}", kinds=both)
      for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"),
                           ("mlp.W_in", "mlp.dense_h_to_4h"), ("mlp.W_out", "mlp.dense_4h_to_h"))),
)


def gpt_neox_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-NeoX one (:data:`TABLE` and the unembedding).

    Raises:
        ValueError: a tensor is absent or the fused QKV's shape disagrees with the config (both named).
    """
    out, _ = map_tensors(TABLE, hf_sd, cfg, prefixes=("gpt_neox.",), arch="GPT-NeoX")
    key = "embed_out.weight" if "embed_out.weight" in hf_sd else "lm_head.weight"
    out.update(_lm_head(hf_sd, _Source(hf_sd, ("gpt_neox.",), "GPT-NeoX"), cfg, "GPT-NeoX", key))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> GPT-NeoX's HF config (partial rotary from ``rope.dimension_count``, ``use_parallel_residual``)."""
    sizes = fixed_heads_sizes(m, names, "GPT-NeoX")
    parallel = m.get("use_parallel_residual", True)
    return {"model_type": "gpt_neox", **{k: sizes[k] for k in (
                "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
                "max_position_embeddings", "tie_word_embeddings", *TOKEN_IDS)},
            "rope_parameters": partial_rope(m, names, sizes["head_dim"]), "hidden_act": "gelu",
            "layer_norm_eps": m.number("attention.layer_norm_epsilon", 1e-5), "use_parallel_residual": bool(parallel),
            "attention_bias": "blk.0.attn_qkv.bias" in names}


#: llama.cpp's ``gptneox`` (Pythia, GPT-NeoX): the converter reordered the fused QKV from per-head groups to
#: ``[q | k | v]``; regrouped here.
GGUF = {"gptneox": GGUFSpec(_gguf_config, {
    "token_embd": "gpt_neox.embed_in", "output_norm": "gpt_neox.final_layer_norm", "output": "embed_out"},
    "gpt_neox.layers.{}.", {
        "attn_norm": "input_layernorm", "attn_qkv": "attention.query_key_value", "attn_output": "attention.dense",
        "ffn_norm": "post_attention_layernorm", "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"},
    per_head_rows)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "gpt_neox": CompatConfig("gpt_neox", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                               "partial_rotary_factor": 0.5})),
    "gpt_neox_sequential": CompatConfig("gpt_neox", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                                         use_parallel_residual=False)),
}


FAMILY = Family("gpt_neox", ("gpt_neox",), gpt_neox_config, fixed(gpt_neox_state_dict), gguf=GGUF, tests=TESTS)
