"""GPT-BigCode / StarCoder: GPT-2 with ``nn.Linear`` weights and multi-query attention (one K/V head).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GPT_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need, _refuse
from ._family import CompatConfig, Family, fixed
from ._gguf import GPT2_BLOCK, GPT2_GLOBAL, GGUFSpec, HFConfig, Meta, fixed_heads_sizes, gpt2_keys
from ._tensors import (
    _lm_head,
    _per_head_qkv,
    _shaped,
    _Source,
)


def gpt_bigcode_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-BigCode / StarCoder decoder (learned positions, MQA).

    Raises:
        ValueError: an unsupported setting (cross-attention, activation) or a missing key.
    """
    arch = "gpt_bigcode"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("add_cross_attention", False, False),))
    activation = _activation(hf_cfg, "activation_function", "gelu_pytorch_tanh", arch, GPT_ACTIVATIONS)
    d_model, n_heads = _need(hf_cfg, "n_embd", arch), _need(hf_cfg, "n_head", arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "n_layer", arch), d_model=d_model, n_heads=n_heads,
        n_kv_heads=1 if hf_cfg.get("multi_query", True) else n_heads,
        d_mlp=hf_cfg.get("n_inner") or 4 * d_model, activation=activation, d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "n_positions", arch), normalization="pre", positional="learned",
        norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5),
        attn_scale=None if hf_cfg.get("scale_attn_weights", True) else 1.0, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gpt_bigcode_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-BigCode one: MQA's ``c_attn`` rows are ``[q | k | v]`` already, MHA's are
    grouped per head and reordered.

    Raises:
        ValueError: a tensor is absent or ``c_attn``'s shape disagrees with the config (both named).
    """
    src = _Source(hf_sd, ("transformer.",), "GPT-BigCode")
    H, K, D, M = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    out = {"W_E.weight": src("wte.weight"), "W_pos.weight": src("wpe.weight"),
           "ln_final.weight": src("ln_f.weight"), "ln_final.bias": src("ln_f.bias")}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        w = _shaped(src, h + "attn.c_attn.weight", ((H + 2 * K) * D, M))
        bias = _shaped(src, h + "attn.c_attn.bias", ((H + 2 * K) * D,))
        if K == H:
            w, bias = _per_head_qkv(w, H, D), _per_head_qkv(bias, H, D)
        out[b + "attn.W_qkv.weight"], out[b + "attn.W_qkv.bias"] = w, bias
        for ours, theirs in (("attn.W_O", "attn.c_proj"), ("mlp.W_in", "mlp.c_fc"), ("mlp.W_out", "mlp.c_proj"),
                             ("ln1", "ln_1"), ("ln2", "ln_2")):
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    out.update(_lm_head(hf_sd, src, cfg, "GPT-BigCode"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> GPT-BigCode's HF config: llama.cpp's ``starcoder`` is multi-query only."""
    cfg = fixed_heads_sizes(m, names, "llama.cpp's starcoder", kv_heads=1)
    return {"model_type": "gpt_bigcode", **gpt2_keys(m, cfg), "multi_query": True,
            "activation_function": "gelu_pytorch_tanh"}


#: llama.cpp's ``starcoder``: MQA, learned positions, GPT-2 names.
GGUF = {"starcoder": GGUFSpec(_gguf_config, GPT2_GLOBAL, "transformer.h.{}.", GPT2_BLOCK)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "gpt_bigcode": CompatConfig("gpt_bigcode", dict(n_embd=80, n_inner=96, n_head=5, n_layer=2, n_positions=64,
                                                    multi_query=True)),
    "gpt_bigcode_mha": CompatConfig("gpt_bigcode", dict(n_embd=80, n_inner=96, n_head=5, n_layer=2, n_positions=64,
                                                        multi_query=False)),
}


FAMILY = Family("gpt_bigcode", ("gpt_bigcode",), gpt_bigcode_config, fixed(gpt_bigcode_state_dict),
                gguf=GGUF, tests=TESTS)
