"""Tiny GGUF files written from random transformers models the way llama.cpp's ``convert_hf_to_gguf.py`` writes
them, for the GGUF loader's tests (no download, nothing of interp's loader used).

Per architecture, as the converter does: the metadata keys its ``set_gguf_parameters`` writes (Falcon's fixed
2048 context and ``tensor_data_layout = "jploski"``, StarCoder's ``4 * n_embd`` MLP and single K/V head, Phi-3's
``sliding_window = 0`` for none, Gemma 2's soft-caps, ...), tensor names from the ``gguf`` package's own tensor
map (the table the converter uses), and the converter's tensor changes: Llama's Q/K row permutation, Gemma's
norm weights stored as ``1 + w``, Falcon's fused QKV reordered from per-K/V-group ``[q_1 .. q_G, k, v]`` to
``[q | k | v]``; tied unembeddings are not written.

Weights are stored as F32, F16 and Q8_0 in turn (or all in one type), and the HF model's own parameters are
replaced by what the file dequantises to, so the HF model is an exact reference for the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
import transformers

from interp.zoo.compat import _seed_init

V = 97  # vocabulary
WINDOW = 8  # sliding windows, shorter than the test sequences
SEQ = 40

# name: (GGUF general.architecture, HF model_type, HF config keywords)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("llama", "llama", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                     num_key_value_heads=1,
                                     rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0})),
    "qwen2": ("qwen2", "qwen2", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9,
                                     num_key_value_heads=3)),
    "qwen3": ("qwen3", "qwen3", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                     num_key_value_heads=1, head_dim=24)),
    "gemma": ("gemma", "gemma", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                     num_key_value_heads=1, head_dim=16)),
    "gemma2": ("gemma2", "gemma2", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                                        sliding_window=WINDOW, attn_logit_softcapping=3.0,
                                        final_logit_softcapping=4.0)),
    "gemma3": ("gemma3", "gemma3_text", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                             num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                                             num_hidden_layers=6, sliding_window=WINDOW, final_logit_softcapping=4.0,
                                             rope_parameters={
                                                 "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                    "rope_theta": 1000.0},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "phi3": ("phi3", "phi3", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                  sliding_window=WINDOW)),
    "starcoder": ("starcoder", "gpt_bigcode", dict(n_embd=80, n_head=5, n_layer=2, n_positions=64, multi_query=True)),
    "falcon": ("falcon", "falcon", dict(hidden_size=80, num_attention_heads=5, multi_query=True, parallel_attn=True,
                                        bias=False)),
    "falcon_new_arch": ("falcon", "falcon", dict(hidden_size=72, num_attention_heads=9, num_kv_heads=3,
                                                 new_decoder_architecture=True, bias=False)),
    # llama.cpp writes no RoPE base for gptneox / phi2 / stablelm: their files rotate with base 10000.
    "gpt2": ("gpt2", "gpt2", dict(n_embd=80, n_head=5, n_layer=2, n_positions=64)),
    "gptneox": ("gptneox", "gpt_neox", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 0.5})),
    "gptneox_sequential": ("gptneox", "gpt_neox", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                                       use_parallel_residual=False)),
    "phi2": ("phi2", "phi", dict(hidden_size=80, intermediate_size=320, num_attention_heads=5,
                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                  "partial_rotary_factor": 0.4})),
    "olmo": ("olmo", "olmo", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                  attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "olmo2": ("olmo2", "olmo2", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                     num_key_value_heads=1)),
    "stablelm": ("stablelm", "stablelm", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                              num_key_value_heads=1, use_qkv_bias=True)),
    "stablelm_parallel": ("stablelm", "stablelm", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                                       num_key_value_heads=5, use_parallel_residual=True)),
    "starcoder2": ("starcoder2", "starcoder2", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                                    num_key_value_heads=1, sliding_window=None)),
    "bloom": ("bloom", "bloom", dict(hidden_size=96, n_head=6, n_layer=2)),  # 6 heads: ALiBi's interleaved slopes
    "smollm3": ("smollm3", "smollm3", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                           num_key_value_heads=1, num_hidden_layers=4)),  # layer 3 has no RoPE
    "ernie4_5": ("ernie4_5", "ernie4_5", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9,
                                              num_key_value_heads=3, head_dim=8, use_bias=True)),
    "mpt": ("mpt", "mpt", dict(d_model=72, n_heads=6, n_layers=2, max_seq_len=64)),  # ALiBi, 6 heads
    "command_r": ("command-r", "cohere", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                              num_key_value_heads=1, logit_scale=0.5, attention_bias=True)),
    "arcee": ("arcee", "arcee", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                     attention_bias=True)),
    "seed_oss": ("seed_oss", "seed_oss", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                              num_key_value_heads=1, head_dim=24, attention_bias=True,
                                              attention_out_bias=True, mlp_bias=True)),
    "granite": ("granite", "granite", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                           num_key_value_heads=1, attention_bias=True, embedding_multiplier=3.0,
                                           attention_multiplier=0.3, residual_multiplier=0.6, logits_scaling=2.5)),
    # llama.cpp fixes Cohere 2's pattern (3 sliding layers of 4, the 4th global without RoPE): 4 layers
    "cohere2": ("cohere2", "cohere2", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                           num_key_value_heads=1, num_hidden_layers=4, logit_scale=0.5,
                                           sliding_window=WINDOW, tie_word_embeddings=True)),
    "exaone4": ("exaone4", "exaone4", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                           num_key_value_heads=1, num_hidden_layers=3, sliding_window=WINDOW,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "exaone4_global": ("exaone4", "exaone4", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                                  num_key_value_heads=1, sliding_window=None,  # RoPE everywhere
                                                  layer_types=["full_attention"] * 2)),
    "glm4": ("glm4", "glm4", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                  head_dim=16, attention_bias=True,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                   "partial_rotary_factor": 0.5})),
    # the converter's HunYuan checks: dynamic RoPE only with base 10000 and a 32k or 256k context
    "hunyuan_dense": ("hunyuan-dense", "hunyuan_v1_dense", dict(
        hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1, head_dim=16,
        attention_bias=True, max_position_embeddings=32 * 1024, tie_word_embeddings=True,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0})),
    # llama.cpp's fixed chunks (8192) and NoPE step (4): layers 0-2 chunked with RoPE, layer 3 global NoPE;
    # experts on the odd layers (interleave_moe_layer_step 2)
    "llama4": ("llama4", "llama4_text", dict(hidden_size=80, intermediate_size=24, intermediate_size_mlp=96,
                                             num_attention_heads=5, num_key_value_heads=1, head_dim=16,
                                             num_hidden_layers=4, num_local_experts=8, num_experts_per_tok=2,
                                             interleave_moe_layer_step=2, attention_chunk_size=8192,
                                             no_rope_layers=[1, 1, 1, 0], use_qk_norm=True, attention_bias=True,
                                             rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
}
_COMMON = dict(num_hidden_layers=2, max_position_embeddings=64, vocab_size=V, bos_token_id=0, eos_token_id=0,
               pad_token_id=0, tie_word_embeddings=False)
_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text", "gpt_bigcode", "falcon", "gpt2", "cohere", "bloom", "mpt")
# Llama 4's converter splits HF's fused experts: gate_up_proj [E, M, 2F] -> gate and up [E, F, M]; down_proj
# [E, F, M] -> [E, M, F] (torch order).
_LLAMA4_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
# llama.cpp's converters that permute the Q/K rows (LlamaModel.permute) and whether they permute the biases too.
_PERMUTED = {"llama": True, "granite": True, "arcee": True, "smollm3": True, "olmo": False}
# GPT-2's Conv1D weights, stored transposed by the converter.
_CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")


def hf_model(name: str, **overrides: Any):
    """The random tiny HF model of :data:`FAMILIES` ``[name]`` (seeded, float32, eager attention)."""
    _, model_type, kw = FAMILIES[name]
    common = dict(_COMMON)
    if model_type in _TIED_BY_DEFAULT:
        common.pop("tie_word_embeddings")
    if model_type in ("gpt_bigcode", "gpt2", "bloom", "mpt"):
        common = {k: v for k, v in common.items() if k not in ("num_hidden_layers", "max_position_embeddings")}
    cfg = transformers.AutoConfig.for_model(model_type, **{**common, **kw, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return _seed_init(transformers.AutoModelForCausalLM.from_config(cfg))


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (rotary pairs interleaved per head)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _jploski(w: np.ndarray, n_head: int, n_kv: int, head_dim: int) -> np.ndarray:
    """llama.cpp's Falcon QKV reorder: per-K/V-group [q_1 .. q_G, k, v] rows to [q | k | v]."""
    qkv = w.reshape(n_kv, n_head // n_kv + 2, head_dim, w.shape[-1])
    q = qkv[:, :-2].reshape(n_head * head_dim, -1)
    k = qkv[:, [-2]].reshape(n_kv * head_dim, -1)
    v = qkv[:, [-1]].reshape(n_kv * head_dim, -1)
    return np.concatenate([q, k, v]).reshape(w.shape)


def text_model_keys(w: gguf.GGUFWriter, c: Any) -> None:
    """The keys llama.cpp's ``TextModel.set_gguf_parameters`` writes for every decoder: sizes and head counts."""
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)


def _metadata(w: gguf.GGUFWriter, arch: str, c: Any) -> None:
    """The keys the converter's set_gguf_parameters writes for ``arch`` (``c``: the HF config)."""
    def rope_params(layer_type: str | None = None) -> dict:
        rope = dict(getattr(c, "rope_parameters", None) or {})
        return rope.get(layer_type, rope) if layer_type else rope

    if arch == "starcoder":
        w.add_context_length(c.n_positions)
        w.add_embedding_length(c.n_embd)
        w.add_feed_forward_length(4 * c.n_embd)
        w.add_block_count(c.n_layer)
        w.add_head_count(c.n_head)
        w.add_head_count_kv(1)
        w.add_layer_norm_eps(c.layer_norm_epsilon)
        return
    if arch == "gpt2":
        w.add_block_count(c.n_layer)
        w.add_context_length(c.n_ctx if hasattr(c, "n_ctx") else c.n_positions)
        w.add_embedding_length(c.n_embd)
        w.add_feed_forward_length(4 * c.n_embd)
        w.add_head_count(c.n_head)
        w.add_layer_norm_eps(c.layer_norm_epsilon)
        return
    if arch in ("gptneox", "phi2", "stablelm"):
        head_dim = c.hidden_size // c.num_attention_heads
        w.add_context_length(c.max_position_embeddings)
        w.add_embedding_length(c.hidden_size)
        w.add_block_count(c.num_hidden_layers)
        w.add_feed_forward_length(4 * c.hidden_size if arch == "phi2" else c.intermediate_size)
        w.add_rope_dimension_count(int(rope_params().get("partial_rotary_factor", 1.0) * head_dim))
        w.add_head_count(c.num_attention_heads)
        if arch != "gptneox":
            w.add_head_count_kv(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
        if arch != "phi2":
            w.add_parallel_residual(c.use_parallel_residual)
        w.add_layer_norm_eps(c.layer_norm_eps)
        return
    if arch in ("olmo", "olmo2", "starcoder2", "granite", "command-r", "arcee", "seed_oss", "smollm3", "ernie4_5"):
        # TextModel.set_gguf_parameters, then the architecture's own keys
        text_model_keys(w, c)
        w.add_rope_freq_base(rope_params()["rope_theta"])
        if getattr(c, "rms_norm_eps", None) is not None:
            w.add_layer_norm_rms_eps(c.rms_norm_eps)
        for eps in ("norm_epsilon", "layer_norm_eps"):
            if getattr(c, eps, None) is not None:
                w.add_layer_norm_eps(getattr(c, eps))
        if getattr(c, "head_dim", None) is not None and arch != "granite":  # Granite's converter drops head_dim
            w.add_key_length(c.head_dim)
            w.add_value_length(c.head_dim)
        if arch == "command-r":
            w.add_logit_scale(c.logit_scale)
            w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        if arch == "olmo":
            w.add_layer_norm_eps(1e-5)
        if arch in ("granite", "arcee", "smollm3"):  # LlamaModel's keys
            w.add_vocab_size(c.vocab_size)
            w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
        if arch == "granite":  # Granite's four scalars
            w.add_attention_scale(c.attention_multiplier)
            w.add_embedding_scale(c.embedding_multiplier)
            w.add_residual_scale(c.residual_multiplier)
            w.add_logit_scale(c.logits_scaling)
        return
    if arch in ("cohere2", "exaone4", "glm4", "hunyuan-dense", "llama4"):
        _newer_metadata(w, arch, c, rope_params())
        return
    if arch == "mpt":
        w.add_context_length(c.max_seq_len)
        w.add_embedding_length(c.d_model)
        w.add_block_count(c.n_layers)
        w.add_feed_forward_length(4 * c.d_model)
        w.add_head_count(c.n_heads)
        w.add_layer_norm_eps(1e-5)
        w.add_max_alibi_bias(c.attn_config.alibi_bias_max if c.attn_config.alibi else 0.0)
        return
    if arch == "bloom":
        w.add_context_length(getattr(c, "seq_length", None) or c.hidden_size)  # the converter's fallback
        w.add_embedding_length(c.hidden_size)
        w.add_feed_forward_length(4 * c.hidden_size)
        w.add_block_count(c.n_layer)
        w.add_head_count(c.n_head)
        w.add_head_count_kv(c.n_head)
        w.add_layer_norm_eps(c.layer_norm_epsilon)
        return
    if arch == "falcon":
        w.add_context_length(2048)  # not in config.json
        w.add_tensor_data_layout("jploski")
        w.add_embedding_length(c.hidden_size)
        w.add_feed_forward_length(4 * c.hidden_size)
        w.add_block_count(c.num_hidden_layers)
        w.add_head_count(c.num_attention_heads)
        w.add_head_count_kv(_falcon_kv(c))
        w.add_layer_norm_eps(c.layer_norm_epsilon)
        return
    text_model_keys(w, c)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = rope_params("full_attention" if arch == "gemma3" else None)
    if rope.get("rope_theta") is not None:
        w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if getattr(c, "head_dim", None) is not None and arch != "phi3":
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    if arch == "llama":
        w.add_vocab_size(c.vocab_size)
        w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
        w.add_sliding_window(c.sliding_window)
    if arch == "gemma3":
        if c.final_logit_softcapping:
            w.add_final_logit_softcapping(c.final_logit_softcapping)
        w.add_sliding_window(c.sliding_window)
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(getattr(c, "original_max_position_embeddings", None) or
                                        c.max_position_embeddings)
        partial = rope.get("partial_rotary_factor", 1.0)
        w.add_rope_dimension_count(int(partial * c.hidden_size) // c.num_attention_heads)
        w.add_sliding_window(c.sliding_window or 0)


def _newer_metadata(w: gguf.GGUFWriter, arch: str, c: Any, rope: dict) -> None:
    """The keys of the converters of Cohere 2, EXAONE 4, GLM-4, Hunyuan dense and Llama 4: ``TextModel``'s (sizes,
    RoPE base, norm epsilons, ``head_dim`` as key / value length), then each model class's own."""
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    ff = c.intermediate_size_mlp if arch == "llama4" else c.intermediate_size  # Llama4Model swaps the two
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(ff)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    if arch == "hunyuan-dense":  # HunYuanModel: the NTK alpha folded into the base, the context set to 256k
        base = rope["rope_theta"] * rope["alpha"] ** (d_head / (d_head - 2))
        w.add_rope_freq_base(base)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        w.add_rope_scaling_factor(1)
        w.add_rope_scaling_orig_ctx_len(256 * 1024)
        w.add_context_length(256 * 1024)  # overwrites the one above, as the converter does
    else:
        w.add_rope_freq_base(rope["rope_theta"])
    if getattr(c, "rms_norm_eps", None) is not None:
        w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if getattr(c, "layer_norm_eps", None) is not None:
        w.add_layer_norm_eps(c.layer_norm_eps)
    if getattr(c, "num_local_experts", None) is not None:
        w.add_expert_count(c.num_local_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
    if "head_dim" in c.to_dict():  # config.json's key (TextModel writes it whenever it is there)
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    if arch == "cohere2":  # Cohere2Model
        w.add_logit_scale(c.logit_scale)
        w.add_sliding_window(c.sliding_window)
        w.add_vocab_size(c.vocab_size)
        w.add_rope_dimension_count(int(getattr(c, "rotary_pct", 1.0) * (c.hidden_size // c.num_attention_heads)))
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    if arch == "exaone4":  # Exaone4Model: the window and one boolean per layer
        w.add_vocab_size(c.vocab_size)
        if c.sliding_window is not None:
            w.add_sliding_window(c.sliding_window)
            w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    if arch == "glm4":  # Glm4Model: the rotated share of each head
        w.add_rope_dimension_count(int(d_head * rope.get("partial_rotary_factor", 0.5)))
    if arch == "llama4":  # LlamaModel's keys, then Llama4Model's
        w.add_vocab_size(c.vocab_size)
        w.add_rope_dimension_count(d_head)
        w.add_interleave_moe_layer_step(c.interleave_moe_layer_step)
        w.add_expert_feed_forward_length(c.intermediate_size)


def _llama4_experts(part: str, a: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Llama4Model.modify_tensors on HF's fused experts: ``(HF-style name, tensor)`` pairs."""
    if part == "gate_up_proj":  # [E, M, 2F] -> [E, 2F, M] -> gate, up [E, F, M]
        gate, up = np.split(a.swapaxes(1, 2), 2, axis=1)
        return [("gate_proj", gate), ("up_proj", up)]
    return [("down_proj", a.swapaxes(1, 2))]  # [E, F, M] -> [E, M, F]


def _falcon_kv(c: Any) -> int:
    # config.json's own value: the converter reads num_kv_heads / n_head_kv, which old MQA files leave out (1)
    if c.new_decoder_architecture:
        return c.num_kv_heads
    return 1 if c.multi_query else c.num_attention_heads


def _tokenizer(w: gguf.GGUFWriter, arch: str, vocab: int) -> None:
    alphabet = list(_bytes_to_unicode().values())
    tokens = ["<|endoftext|>", *alphabet[:vocab - 1]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (vocab - 1))
    w.add_token_merges([])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)


def _bytes_to_unicode() -> dict[int, str]:
    from interp.zoo.gguf import _bytes_to_unicode as table

    return table()


_TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
          "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
          "q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
          "q5_0": gguf.GGMLQuantizationType.Q5_0, "q5_1": gguf.GGMLQuantizationType.Q5_1,
          "q2_k": gguf.GGMLQuantizationType.Q2_K, "q4_k": gguf.GGMLQuantizationType.Q4_K,
          "q5_k": gguf.GGMLQuantizationType.Q5_K, "q6_k": gguf.GGMLQuantizationType.Q6_K}
# Where each K-quant keeps its float16 super-block scales (byte offsets in a block): d, then dmin if it has one.
_K_SCALES = {"q2_k": (80, 82), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}


def block_size(kind: str) -> int:
    """Values per block of GGUF type ``kind`` (1 for float types)."""
    return 1 if kind in ("f32", "f16", "bf16") else gguf.GGML_QUANT_SIZES[_TYPES[kind]][0]


def random_k_blocks(a: np.ndarray, kind: str) -> np.ndarray:
    """Blocks of K-quant ``kind`` for a matrix shaped like ``a``: the ``gguf`` package cannot quantise to the
    K-quants, so the packed values and scales are random bytes (seeded by ``a``'s shape) and the float16 scales
    are set to ``a``'s scale, so the dequantised matrix is a finite random weight of a sensible size."""
    qtype = _TYPES[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(a.size)
    blocks = rng.integers(0, 256, (a.size // block, size), dtype=np.uint8)  # [N, Q]
    scale = float(np.abs(a).mean()) / 64
    for off in _K_SCALES[kind]:
        d = (rng.uniform(0.5, 1.5, blocks.shape[0]) * scale).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(a.shape[0], -1)  # [rows, bytes per row]


def _store(a: np.ndarray, kind: str) -> tuple[np.ndarray, Any]:
    """``(bytes or array to write, raw dtype)`` of ``a`` in GGUF type ``kind``."""
    if kind == "f32":
        return a, None
    if kind == "f16":
        return a.astype(np.float16), None
    if kind in _K_SCALES:
        return random_k_blocks(a, kind), _TYPES[kind]
    return gguf.quants.quantize(a, _TYPES[kind]), _TYPES[kind]


def _round_trip(a: np.ndarray, kind: str) -> np.ndarray:
    stored, raw = _store(a, kind)
    return np.asarray(stored, dtype=np.float32) if raw is None else gguf.quants.dequantize(stored, raw)


def write_gguf(hf, path: str | Path, arch: str, *, types: str | tuple[str, ...] = "mixed") -> Path:
    """Write ``hf`` (a transformers causal LM) to ``path`` as llama.cpp's converter would for ``arch``.

    ``types``: ``"mixed"`` (2-D weights as F32, F16 and Q8_0 in turn; 1-D in F32, as the converter keeps
    them), one of ``f32`` / ``f16`` / ``bf16`` / ``q8_0`` / ``q4_0`` / ``q4_1`` / ``q5_0`` / ``q5_1`` /
    ``q2_k`` / ``q4_k`` / ``q5_k`` / ``q6_k`` for every 2-D weight, or a tuple of them taken in turn (a weight
    whose rows are not whole blocks of its type is stored as F16). The HF model's parameters are set to the
    values the file holds, so it stays an exact reference.
    """
    path = Path(path)
    c = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    _metadata(w, arch, c)
    _tokenizer(w, arch, c.vocab_size)
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch),
                                     getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", None) or c.n_layers)
    tied = bool(getattr(c, "tie_word_embeddings", False))
    cycle = list(types) if isinstance(types, tuple) else ["f32", "f16", "q8_0"]
    n_2d = 0
    params = dict(hf.named_parameters())
    for hf_name, t in hf.state_dict().items():
        if hf_name == "lm_head.weight" and (tied or arch.startswith("gemma") or arch == "cohere2"):
            continue  # the converter skips tied (and Gemma's) lm_head; Cohere 2 has no place for one
        stem, suffix = hf_name.rsplit(".", 1)
        if arch == "llama4" and suffix in _LLAMA4_EXPERTS:  # 3-D, kept in float32
            for part, a in _llama4_experts(suffix, t.detach().numpy().astype(np.float32)):
                w.add_tensor(names.get_name(f"{stem}.{part}.weight", try_suffixes=(".weight",)),
                             np.ascontiguousarray(a))
            continue
        gguf_name = names.get_name(stem.removeprefix("transformer.") if arch == "bloom" else stem)  # as BLOOM's converter
        assert gguf_name is not None, f"gguf's tensor map has no name for {hf_name!r} ({arch})"
        a = t.detach().numpy().astype(np.float32)
        if a.ndim == 2:
            kind = cycle[n_2d % len(cycle)] if types == "mixed" or isinstance(types, tuple) else types
            conv1d = arch == "gpt2" and hf_name.endswith(_CONV1D)  # stored transposed: blocks run along its rows
            stored_rows = a.T if conv1d else a
            if stored_rows.shape[1] % block_size(kind):
                kind = "f16"
            n_2d += 1
            a = _round_trip(np.ascontiguousarray(stored_rows), kind)  # the file's values become the HF model's own
            a = a.T if conv1d else a
            with torch.no_grad():
                params[hf_name].copy_(torch.from_numpy(a))
        else:
            kind = "f32"
        if arch in _PERMUTED and (suffix == "weight" or _PERMUTED[arch]) and stem.endswith("q_proj"):
            a = permute(a, c.num_attention_heads)
        elif arch in _PERMUTED and (suffix == "weight" or _PERMUTED[arch]) and stem.endswith("k_proj"):
            a = permute(a, c.num_key_value_heads)
        elif arch == "gpt2" and hf_name.endswith(_CONV1D):
            a = a.T
        elif arch in ("gptneox", "bloom") and "query_key_value" in stem:
            H = c.num_attention_heads  # per-head [q_h, k_h, v_h] rows -> [q | k | v], as the converter
            a = a.reshape(H, 3, -1, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)
        elif arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            a = a + 1  # llama.cpp's RMSNorm has no (1 + w)
        elif arch == "falcon" and "query_key_value" in stem:
            a = _jploski(a, c.num_attention_heads, _falcon_kv(c), c.hidden_size // c.num_attention_heads)
        stored, raw = _store(np.ascontiguousarray(a), kind)
        w.add_tensor(f"{gguf_name}.{suffix}", stored, raw_dtype=raw)
        if arch == "bloom" and gguf_name == "token_embd":  # the converter writes the tied head out as a copy
            w.add_tensor("output.weight", stored, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
