"""Phi-1 / Phi-2: parallel block with one LayerNorm, partial rotary, biased unembedding.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GPT_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need, _refuse
from ._family import CompatConfig, Family, fixed
from ._gguf import TOKEN_IDS, GGUFSpec, HFConfig, Meta, gguf_sizes, no_window, one_head_width, partial_rope
from ._positions import _partial_factor, _rope
from ._tensors import (
    _lm_head,
    _Source,
)


def phi_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Phi-1 / Phi-2 decoder (parallel block with one LayerNorm, partial rotary).

    Raises:
        ValueError: ``qk_layernorm``, an unsupported activation or a missing key.
    """
    arch = "phi"
    _refuse(arch, hf_cfg, (("qk_layernorm", False, False),))
    activation = _activation(hf_cfg, "hidden_act", "gelu_new", arch, GPT_ACTIVATIONS)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = d_model // n_heads
    _decoder_checks(hf_cfg, arch, rotary_head_dim=d_head)
    partial = _partial_factor(hf_cfg, 0.5)
    theta, scaling = _rope(hf_cfg, arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
        activation=activation, d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="pre",
        norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rotary_dim=int(d_head * partial), rope_scaling=scaling, parallel_block="one_norm", unembed=True,
        # Phi's lm_head has a bias, which tied embeddings keep (only the weight is W_E's): interp's tied W_U has
        # no bias, so the unembedding is always a separate W_U holding the tied weight and the bias.
        tie_embeddings=False, pad_token_id=hf_cfg.get("pad_token_id"),
    )


def phi_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Phi-1 / Phi-2 one (its unembedding has a bias).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "Phi")
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("final_layernorm.weight"),
           "ln_final.bias": src("final_layernorm.bias")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                [src(h + f"self_attn.{n}_proj.{kind}") for n in ("q", "k", "v")], dim=0)  # [(H+2K)*D(, M)]
            for ours, theirs in (("attn.W_O", "self_attn.dense"), ("ln1", "input_layernorm"),
                                 ("mlp.W_in", "mlp.fc1"), ("mlp.W_out", "mlp.fc2")):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    if "lm_head.weight" not in hf_sd and "lm_head.bias" in hf_sd:
        # A tied checkpoint stores the head's bias but not its weight, which is the embedding.
        # A view, not a copy: reads still reach hf_sd (a folder reader records what the converter used).
        hf_sd = ChainMap({"lm_head.weight": out["W_E.weight"]}, hf_sd)  # type: ignore[arg-type]
    if "lm_head.bias" not in hf_sd:
        raise ValueError("Phi state dict has no 'lm_head.bias' (pass a PhiForCausalLM model, not the bare PhiModel)")
    out.update(_lm_head(hf_sd, src, cfg, "Phi", bias="lm_head.bias"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> Phi (1 / 1.5 / 2)'s HF config: partial rotary, one LayerNorm for the parallel block."""
    sizes = gguf_sizes(m, names)
    one_head_width(m, sizes, "Phi")
    no_window(m)
    return {"model_type": "phi", **{k: sizes[k] for k in (
                "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "intermediate_size",
                "vocab_size", "max_position_embeddings", "tie_word_embeddings", *TOKEN_IDS)},
            "rope_parameters": partial_rope(m, names, sizes["head_dim"]), "hidden_act": "gelu_new",
            "layer_norm_eps": m.number("attention.layer_norm_epsilon", 1e-5)}


#: llama.cpp's ``phi2`` (Phi-1, 1.5, 2 as transformers writes them: separate q / k / v); rotate-half RoPE as HF.
GGUF = {"phi2": GGUFSpec(_gguf_config, {
    "token_embd": "model.embed_tokens", "output_norm": "model.final_layernorm", "output": "lm_head"},
    "model.layers.{}.", {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.dense", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "phi": CompatConfig("phi", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.5})),
}


FAMILY = Family("phi", ("phi",), phi_config, fixed(phi_state_dict), title="Phi", headline=True, gguf=GGUF, tests=TESTS)
