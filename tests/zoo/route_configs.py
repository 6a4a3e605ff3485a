"""Random tiny transformers models of the families of issue 34 (and hybrids), for the attention-level route's
tests and benchmark: every parameter re-drawn (norm weights around 1, everything else N(0, 0.2)), float32,
nothing downloaded."""

from __future__ import annotations

from typing import Any

import torch

from interp.zoo.compat import _seed_init

V = 97
_BASE = dict(vocab_size=V, num_hidden_layers=2, hidden_size=40, intermediate_size=48, num_attention_heads=5,
             num_key_value_heads=1, head_dim=8, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
             pad_token_id=0)
_MOE = dict(num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)

#: The 28 families issue 34 lists (each model_type -> the config overrides of its tiny model).
ISSUE_FAMILIES: dict[str, dict[str, Any]] = {
    "gpt_oss": dict(_MOE, num_key_value_heads=1, sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
    "olmo": {},
    "olmo3": dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
    "smollm3": dict(no_rope_layers=[1, 0]),
    "gptj": dict(n_embd=40, n_head=5, n_layer=2, rotary_dim=4, n_positions=64, n_inner=48),
    "gpt_neo": dict(num_layers=2, num_heads=5, attention_types=[[["global", "local"], 1]], window_size=4),
    "opt": dict(ffn_dim=48, word_embed_proj_dim=40, enable_bias=True),
    "bloom": dict(n_layer=2, n_head=5),
    "mpt": dict(d_model=40, n_heads=5, n_layers=2, max_seq_len=64),  # transformers ignores expansion_ratio
    "stablelm": dict(partial_rotary_factor=0.5, use_qkv_bias=True, qk_layernorm=True, num_key_value_heads=5),
    "starcoder2": dict(sliding_window=4, use_bias=True),
    "cohere": dict(use_qk_norm=True),
    "cohere2": dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
    "granite": dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.0),
    "granitemoe": dict(_MOE, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3,
                       logits_scaling=2.0),
    "glm4": dict(partial_rotary_factor=0.5),
    "llama4_text": dict(_MOE, intermediate_size_mlp=48, interleave_moe_layer_step=2, attention_chunk_size=4,
                        no_rope_layers=[1, 0]),
    "phimoe": dict(_MOE, sliding_window=None),
    "nemotron": dict(partial_rotary_factor=0.5),
    "exaone4": dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
    "glm": dict(partial_rotary_factor=0.5),
    "glm4_moe": dict(_MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, partial_rotary_factor=0.5),
    "seed_oss": dict(attention_bias=True),
    "hunyuan_v1_dense": dict(use_qk_norm=True),
    "ernie4_5": {},
    "apertus": {},
    "arcee": {},
    "ministral": dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
}

#: Hybrids whose non-attention layers (convolutions, state-space mixers) the route passes through untouched.
HYBRIDS: dict[str, dict[str, Any]] = {
    "lfm2": dict(layer_types=["conv", "full_attention", "conv"], num_hidden_layers=3, block_ff_dim=48,
                 block_auto_adjust_ff_dim=False, conv_L_cache=3),
}


def tiny_hf(model_type: str, attn_implementation: str = "sdpa", **overrides: Any) -> Any:
    """The random tiny ``*ForCausalLM`` of ``model_type`` (every parameter re-drawn, seeded)."""
    import transformers

    kw = {**_BASE, **ISSUE_FAMILIES.get(model_type, HYBRIDS.get(model_type, {})), **overrides}
    cfg = transformers.AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation)
    return _seed_init(model).float()
