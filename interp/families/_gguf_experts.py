"""Mixture-of-experts GGUF files: Mixtral (llama.cpp's ``llama`` with experts), DeepSeek-V2/V3 (``deepseek2``),
Qwen2-MoE / Qwen3-MoE (``qwen2moe`` / ``qwen3moe``) and OLMoE (``olmoe``).

:mod:`interp.zoo.gguf` reads the container and finds the architecture's spec through the family registry; the
specs here (:data:`QWEN_OLMOE` for the ``mixtral`` family, :data:`DEEPSEEK2` for ``deepseek``, :func:`with_experts`
for ``llama``'s Mixtral files) map what is particular to expert files onto a Hugging Face config and state dict,
which the MoE and MLA converters turn into an :class:`interp.Transformer` exactly as they do a HF model (one
conversion).

What llama.cpp's converter (``convert_hf_to_gguf.py``) does, and how it is undone:

* The experts of a layer are merged into 3-D tensors ``blk.N.ffn_{gate,up,down}_exps.weight`` (``[E, F, M]``
  for gate and up, ``[E, M, F]`` for down, in torch order; GGUF lists the dims reversed). They are split back
  into per-expert HF tensors (views, no copy); the router is ``ffn_gate_inp``.
* Mixtral is written as ``llama`` with ``llama.expert_count`` / ``expert_used_count``; its Q/K rows carry
  llama's rotary permutation (undone by :func:`interp.zoo.gguf.unpermute_rotary`). llama.cpp routes it with a
  softmax and renormalises the chosen weights, as transformers' Mixtral does.
* DeepSeek (``deepseek2``): MLA tensors ``attn_q_a`` / ``attn_q_a_norm`` / ``attn_q_b`` (or ``attn_q`` when
  ``q_lora_rank`` is 0), ``attn_kv_a_mqa``, ``attn_kv_a_norm`` and either ``attn_kv_b`` or, from newer
  converters, its two halves ``attn_k_b`` (``[H, C, D_nope]``, transposed for the absorbed decode) and
  ``attn_v_b`` (``[H, D_v, C]``), which are joined back into HF's ``kv_b_proj``. The rotary rows keep
  DeepSeek's own interleaved-pair layout (llama.cpp rotates ``deepseek2`` in that convention), so no
  permutation is undone here: the HF converter de-interleaves them as it does for a HF checkpoint.
  Routing: ``expert_gating_func`` softmax (DeepSeek-V2; absent means softmax, as llama.cpp reads old files)
  or sigmoid with the correction bias ``exp_probs_b`` (DeepSeek-V3); ``expert_group_count`` /
  ``expert_group_used_count``, ``expert_weights_norm``, ``expert_weights_scale``, shared experts
  ``ffn_*_shexp`` (``expert_shared_count`` of them), dense first layers (``leading_dense_block_count``).
  Newer files write ``attention.key_length`` / ``value_length`` for the MQA view of the latent
  (``kv_lora_rank + rope``, ``kv_lora_rank``) and the per-head sizes as ``key_length_mla`` /
  ``value_length_mla``; older files write the per-head sizes in ``key_length`` / ``value_length``. Both are read.
* Qwen-MoE and OLMoE: llama-style attention that llama.cpp rotates rotate-half like HF (nothing to unpermute);
  Qwen2-MoE's shared expert ``ffn_*_shexp`` and its gate ``ffn_gate_inp_shexp``. A layer without a router
  tensor would be one of Qwen-MoE's dense ``mlp_only_layers`` (llama.cpp itself writes experts in every
  layer). llama.cpp renormalises the chosen weights for Qwen3-MoE only (``expert_weights_norm`` overrides).
* Files written before llama.cpp knew expert groups have no ``expert_group_count``: they route without groups,
  as llama.cpp did for them.
* YaRN: llama.cpp keeps ``factor``, ``original_context_length``, ``beta_fast`` / ``beta_slow`` and
  ``yarn_log_multiplier = 0.1 * mscale_all_dim``; DeepSeek's separate ``mscale`` is not written. llama.cpp's
  ``deepseek2`` then leaves the rotary magnitude at 1 and multiplies the softmax scale by
  ``(1 + yarn_log_multiplier * ln(factor))**2``: that is transformers' DeepSeek with
  ``mscale == mscale_all_dim`` (as the published DeepSeek-V2/V3 configs have it), which is what is built.

Refused by name with the value: other gating functions, sigmoid gating without ``exp_probs_b`` (or softmax with
it), renormalised softmax routing in ``deepseek2`` (transformers' DeepSeek-V2 never renormalises), YaRN
``ext_factor`` / ``attn_factor``, multi-token-prediction layers, expert counts, expert widths or MLA ranks that
the tensors contradict (tensor and both shapes named), and a ``q_lora_rank`` the tensors contradict.
DeepSeek's group-limited routing follows the HF model the file was converted from (V2: a group's score is its
best expert; V3: the sum of its two best).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ._gguf import GGUFError, GGUFSpec, HFConfig, Meta, llama_like, shown

# The HF model_type each architecture of Qwen-MoE / OLMoE came from.
MODEL_TYPES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "olmoe": "olmoe"}
HF_TYPES = ("mixtral", "deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE values
_EXPERT_PARTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_SHARED_PARTS = {"ffn_gate_shexp": "gate_proj", "ffn_up_shexp": "up_proj", "ffn_down_shexp": "down_proj"}
_MLA_NAMES = {
    "attn_q": "q_proj", "attn_q_a": "q_a_proj", "attn_q_a_norm": "q_a_layernorm", "attn_q_b": "q_b_proj",
    "attn_kv_a_mqa": "kv_a_proj_with_mqa", "attn_kv_a_norm": "kv_a_layernorm", "attn_kv_b": "kv_b_proj",
    "attn_k_b": "k_b_proj", "attn_v_b": "v_b_proj", "attn_output": "o_proj",
}
_ATTENTION = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
              "attn_q_norm": "q_norm", "attn_k_norm": "k_norm"}  # Qwen-MoE / OLMoE: llama attention, unpermuted
_COMMON = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def is_expert_config(hf_cfg: Mapping[str, Any]) -> bool:
    """Whether an HF config dict (from :func:`hf_config`) is one whose tensors :func:`hf_tensors` names.

    Example:
        >>> from interp.families._gguf_experts import is_expert_config
        >>> is_expert_config({"model_type": "deepseek_v3"}), is_expert_config({"model_type": "llama"})
        (True, False)
    """
    return hf_cfg.get("model_type") in HF_TYPES


# --- metadata ---------------------------------------------------------------------------------------------
class _Meta(Meta):
    """:class:`interp.families._gguf.Meta` plus the routing keys (each refused by name when malformed)."""

    def need(self, key: str, default: float | None = None) -> float:
        """A positive finite number that must be there (or have a default)."""
        value = self.number(key, default)
        if value is None:
            raise self.fail(f"metadata has no {self.key(key)!r}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.meta.get(self.key(key), default)
        if not isinstance(value, (bool, np.bool_)):
            raise self.fail(f"metadata {self.key(key)!r} = {shown(value)} must be a boolean")
        return bool(value)

    def gating(self) -> str | None:
        value = self.meta.get(self.key("expert_gating_func"))
        if value is None:
            return None
        if value not in GATING:
            raise self.fail(f"metadata {self.key('expert_gating_func')!r} = {shown(value)} is not supported; "
                            f"supported: {GATING}")
        return GATING[value]

    def routing(self) -> tuple[int, int]:
        """``(expert_count, expert_used_count)``, the top-k checked against the count."""
        E = self.count("expert_count", low=2)
        k = self.count("expert_used_count")
        if k > E:
            raise self.fail(f"metadata {self.key('expert_used_count')!r} = {k} (the router's top-k) is larger "
                            f"than {self.key('expert_count')!r} = {E}")
        return E, k


def llama_experts_config(base: Mapping[str, Any], meta: Mapping[str, Any], tensor_names: set[str], *,
                         source: str = "GGUF") -> dict[str, Any]:
    """The HF ``MixtralConfig`` dict of a ``llama`` GGUF file with experts, from its dense llama dict.

    Args:
        base: :func:`interp.zoo.gguf.hf_config_from_gguf`'s llama dict of the same file (attention, norms, RoPE).
        meta: the file's metadata.
        tensor_names: the file's tensor names.
        source: named in errors.

    Returns:
        ``base`` with ``model_type="mixtral"``, ``num_local_experts`` and ``num_experts_per_tok``.

    Raises:
        GGUFError: a top-k larger than the expert count, or routing settings llama.cpp's ``llama`` does not
            have (shared experts, dense leading layers, sigmoid gating, unnormalised weights), each named.

    Example:
        >>> from interp.families._gguf_experts import llama_experts_config
        >>> meta = {"general.architecture": "llama", "llama.expert_count": 8, "llama.expert_used_count": 2}
        >>> cfg = llama_experts_config({"model_type": "llama", "num_hidden_layers": 2}, meta, set())
        >>> cfg["model_type"], cfg["num_local_experts"], cfg["num_experts_per_tok"]
        ('mixtral', 8, 2)
    """
    m = _Meta(meta, "llama", source)
    E, k = m.routing()
    for key, allowed in (("expert_shared_count", (0,)), ("leading_dense_block_count", (0,)),
                         ("expert_gating_func", (1,)), ("expert_weights_norm", (True,)),
                         ("expert_weights_scale", (1.0,)), ("expert_group_count", (1,))):
        if m.has(key) and meta[m.key(key)] not in allowed:
            raise GGUFError(f"{source}: metadata {m.key(key)!r} = {meta[m.key(key)]!r} is not supported for "
                            f"llama with experts (Mixtral routing: softmax, top-k renormalised, no shared or "
                            f"dense layers)")
    if m.has("expert_feed_forward_length") and meta[m.key("expert_feed_forward_length")] != base["intermediate_size"]:
        raise GGUFError(f"{source}: metadata {m.key('expert_feed_forward_length')!r} = "
                        f"{meta[m.key('expert_feed_forward_length')]!r} differs from {m.key('feed_forward_length')!r}"
                        f" = {base['intermediate_size']} (Mixtral's experts have the feed-forward width)")
    return {**base, "model_type": "mixtral", "num_local_experts": E, "num_experts_per_tok": k,
            "sliding_window": None, "router_jitter_noise": 0.0}


def deepseek2_config(meta: Mapping[str, Any], tensor_names: set[str], *, source: str = "GGUF") -> dict[str, Any]:
    """The HF ``DeepseekV2Config`` / ``DeepseekV3Config`` dict a ``deepseek2`` GGUF file's metadata describes.

    Sigmoid gating (with ``exp_probs_b``) is DeepSeek-V3, softmax gating DeepSeek-V2 (group-limited when
    ``expert_group_count > 1``).

    Args:
        meta: the file's metadata.
        tensor_names: the file's tensor names (``attn_q_a`` / ``attn_q``, ``exp_probs_b``, ``output``).
        source: named in errors.

    Returns:
        A ``config.json``-style dict for :func:`interp.zoo.hf.deepseek_config`.

    Raises:
        GGUFError: a missing or malformed key, or a setting this loader does not reproduce (named with its value).

    Example:
        >>> from interp.families._gguf_experts import deepseek2_config
        >>> meta = {"general.architecture": "deepseek2", "deepseek2.block_count": 2, "deepseek2.context_length": 64,
        ...         "deepseek2.embedding_length": 32, "deepseek2.feed_forward_length": 48,
        ...         "deepseek2.attention.head_count": 4, "deepseek2.vocab_size": 50,
        ...         "deepseek2.rope.dimension_count": 4, "deepseek2.attention.kv_lora_rank": 16,
        ...         "deepseek2.attention.key_length": 20, "deepseek2.attention.value_length": 16,
        ...         "deepseek2.attention.key_length_mla": 12, "deepseek2.attention.value_length_mla": 6,
        ...         "deepseek2.expert_count": 8, "deepseek2.expert_used_count": 2,
        ...         "deepseek2.expert_feed_forward_length": 24, "deepseek2.leading_dense_block_count": 1}
        >>> cfg = deepseek2_config(meta, {"blk.0.attn_q.weight"})
        >>> cfg["model_type"], cfg["q_lora_rank"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        ('deepseek_v2', None, 8, 6)
    """
    m = _Meta(meta, "deepseek2", source)
    L = m.count("block_count")
    H = m.count("attention.head_count")
    R = m.count("rope.dimension_count")
    C = m.count("attention.kv_lora_rank")
    if m.has("attention.key_length_mla"):  # newer converters: key/value_length describe the latent's MQA view
        qk, v = m.count("attention.key_length_mla"), m.count("attention.value_length_mla")
        for key, want in (("attention.key_length", C + R), ("attention.value_length", C)):
            if m.has(key) and meta[m.key(key)] != want:
                raise GGUFError(f"{source}: metadata {m.key(key)!r} = {meta[m.key(key)]!r}, but with "
                                f"{m.key('attention.kv_lora_rank')!r} = {C} and {m.key('rope.dimension_count')!r} "
                                f"= {R} the latent's MQA view needs {want}")
    else:
        qk, v = m.count("attention.key_length"), m.count("attention.value_length")
    if qk <= R:
        raise GGUFError(f"{source}: the per-head key length {qk} must exceed {m.key('rope.dimension_count')!r} = "
                        f"{R} (key = no-rotary part + rotary part)")
    q_rank = m.count("attention.q_lora_rank", 0, low=0) or None
    has_a, has_q = "blk.0.attn_q_a.weight" in tensor_names, "blk.0.attn_q.weight" in tensor_names
    if q_rank is not None and not has_a and has_q:
        raise GGUFError(f"{source}: metadata {m.key('attention.q_lora_rank')!r} = {q_rank}, but the file has a "
                        f"direct query projection 'blk.0.attn_q.weight' and no 'blk.0.attn_q_a.weight'")
    if q_rank is None and has_a:
        raise GGUFError(f"{source}: the file has a low-rank query 'blk.0.attn_q_a.weight', but metadata has no "
                        f"{m.key('attention.q_lora_rank')!r} (or it is 0)")
    E, k = m.routing()
    gating = m.gating() or "softmax"  # llama.cpp reads files without the key (old DeepSeek-V2) as softmax
    v3 = gating == "sigmoid"
    has_bias = any(n.endswith(".exp_probs_b.bias") for n in tensor_names)
    if v3 and not has_bias:
        raise GGUFError(f"{source}: metadata {m.key('expert_gating_func')!r} = 2 (sigmoid, DeepSeek-V3) needs the "
                        f"router correction bias 'blk.N.exp_probs_b.bias', which the file lacks")
    if not v3 and has_bias:
        raise GGUFError(f"{source}: the file has router correction biases 'blk.N.exp_probs_b.bias' with softmax "
                        f"gating; only DeepSeek-V3's sigmoid gating (expert_gating_func = 2) uses them")
    norm = m.flag("expert_weights_norm")
    if norm and not v3:
        raise GGUFError(f"{source}: metadata {m.key('expert_weights_norm')!r} = True with softmax gating is not "
                        f"supported (DeepSeek-V2 never renormalises the chosen weights)")
    groups = m.count("expert_group_count", 1)
    used_groups = m.count("expert_group_used_count", groups)
    if E % groups or used_groups > groups:
        raise GGUFError(f"{source}: metadata {m.key('expert_group_count')!r} = {groups} and "
                        f"{m.key('expert_group_used_count')!r} = {used_groups} do not split "
                        f"{m.key('expert_count')!r} = {E} experts into equal groups a token may use")
    d_expert = m.count("expert_feed_forward_length")
    n_shared = m.count("expert_shared_count", 0, low=0)
    if m.has("expert_shared_feed_forward_length") and meta[m.key("expert_shared_feed_forward_length")] != n_shared * d_expert:
        raise GGUFError(f"{source}: metadata {m.key('expert_shared_feed_forward_length')!r} = "
                        f"{meta[m.key('expert_shared_feed_forward_length')]!r} differs from expert_shared_count x "
                        f"expert_feed_forward_length = {n_shared} x {d_expert}")
    if m.count("nextn_predict_layers", 0, low=0):
        raise GGUFError(f"{source}: metadata {m.key('nextn_predict_layers')!r} = {meta[m.key('nextn_predict_layers')]}"
                        f": multi-token-prediction layers are not supported")
    theta = m.number("rope.freq_base", 10000.0)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    scaling = meta.get(m.key("rope.scaling.type"), "none")
    if scaling not in ("none", None):
        if scaling != "yarn":
            raise GGUFError(f"{source}: metadata {m.key('rope.scaling.type')!r} = {scaling!r} is not supported for "
                            f"deepseek2 (only 'yarn' or none)")
        for key in ("rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor"):
            if m.has(key):
                raise GGUFError(f"{source}: metadata {m.key(key)!r} = {meta[m.key(key)]!r} is not supported "
                                f"(transformers' DeepSeek YaRN has no such setting)")
        log_mul = meta.get(m.key("rope.scaling.yarn_log_multiplier"), 0.0)
        if isinstance(log_mul, bool) or not isinstance(log_mul, (int, float)) or not 0 <= log_mul < 10:
            raise GGUFError(f"{source}: metadata {m.key('rope.scaling.yarn_log_multiplier')!r} = {log_mul!r} must be "
                            f"a number in [0, 10)")
        mscale = log_mul / 0.1
        rope.update(rope_type="yarn", factor=m.need("rope.scaling.factor"),
                    original_max_position_embeddings=m.count("rope.scaling.original_context_length"),
                    beta_fast=m.number("rope.scaling.yarn_beta_fast", 32.0),
                    beta_slow=m.number("rope.scaling.yarn_beta_slow", 1.0),
                    # the rotary magnitude stays 1 (llama.cpp's deepseek2); the softmax takes mscale_all_dim
                    mscale=mscale, mscale_all_dim=mscale, attention_factor=1.0)
    if "rope_freqs.weight" in tensor_names:
        raise GGUFError(f"{source}: tensor 'rope_freqs.weight' (per-frequency RoPE factors) is not supported")
    vocab = meta.get(m.key("vocab_size")) or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise GGUFError(f"{source}: metadata has neither {m.key('vocab_size')} nor tokenizer.ggml.tokens")
    vocab = m.count("vocab_size", vocab)
    for which in ("padding", "bos", "eos"):
        key = f"tokenizer.ggml.{which}_token_id"
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab):
            raise m.fail(f"metadata {key!r} = {shown(value)} is outside the vocabulary of {vocab} tokens")
    return {
        "model_type": "deepseek_v3" if v3 else "deepseek_v2", "hidden_act": "silu",
        "hidden_size": m.count("embedding_length"), "num_hidden_layers": L, "num_attention_heads": H,
        "num_key_value_heads": H, "intermediate_size": m.count("feed_forward_length"),
        "vocab_size": vocab, "max_position_embeddings": m.count("context_length"),
        "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon", 1e-6), "rope_parameters": rope,
        "rope_interleave": True, "q_lora_rank": q_rank, "kv_lora_rank": C, "qk_rope_head_dim": R,
        "qk_nope_head_dim": qk - R, "v_head_dim": v, "n_routed_experts": E, "num_experts_per_tok": k,
        "moe_intermediate_size": d_expert, "n_shared_experts": n_shared,
        "first_k_dense_replace": m.count("leading_dense_block_count", 0, low=0),
        "routed_scaling_factor": m.number("expert_weights_scale", 1.0),
        "norm_topk_prob": norm, "scoring_func": gating,
        "topk_method": "noaux_tc" if v3 else ("group_limited_greedy" if groups > 1 else "greedy"),
        "n_group": groups, "topk_group": used_groups,
        "tie_word_embeddings": "output.weight" not in tensor_names, "attention_bias": False,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"), "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }


def qwen_olmoe_config(meta: Mapping[str, Any], tensor_names: set[str], *, source: str = "GGUF") -> dict[str, Any]:
    """The HF config dict of a ``qwen2moe``, ``qwen3moe`` or ``olmoe`` GGUF file.

    Layers without a router (``blk.N.ffn_gate_inp``) are Qwen-MoE's dense ``mlp_only_layers``. The chosen
    weights are renormalised as llama.cpp does per architecture unless ``expert_weights_norm`` says otherwise
    (Qwen2-MoE and OLMoE: no; Qwen3-MoE: yes).

    Raises:
        GGUFError: a missing or malformed key, what the dense table refuses (RoPE scaling other than linear, a
            sliding window, partial rotary), sigmoid gating, an OLMoE expert width other than its feed-forward
            width, or dense layers in OLMoE (each named with its value).

    Example:
        >>> from interp.families._gguf_experts import qwen_olmoe_config
        >>> meta = {"general.architecture": "olmoe", "olmoe.block_count": 1, "olmoe.context_length": 64,
        ...         "olmoe.embedding_length": 32, "olmoe.feed_forward_length": 24, "olmoe.attention.head_count": 4,
        ...         "olmoe.vocab_size": 50, "olmoe.expert_count": 8, "olmoe.expert_used_count": 2}
        >>> cfg = qwen_olmoe_config(meta, {"blk.0.ffn_gate_inp.weight"})
        >>> cfg["model_type"], cfg["num_experts"], cfg["norm_topk_prob"]
        ('olmoe', 8, False)
    """
    arch = str(meta.get("general.architecture"))
    mtype = MODEL_TYPES[arch]
    m = _Meta(meta, arch, source)
    # Attention, norms and RoPE as the dense Qwen / Llama files of the architectures table.
    base = llama_like(str(mtype))(m, set(tensor_names))
    if m.gating() not in (None, "softmax"):
        raise m.fail(f"metadata {m.key('expert_gating_func')!r} = {meta[m.key('expert_gating_func')]!r} is not "
                     f"supported for {arch!r} (only softmax)")
    E, k = m.routing()
    d_ff = base["intermediate_size"]
    d_expert = m.count("expert_feed_forward_length", d_ff)
    L = base["num_hidden_layers"]
    dense = [i for i in range(L) if f"blk.{i}.ffn_gate_inp.weight" not in tensor_names]
    if mtype == "olmoe" and (d_expert != d_ff or dense):
        raise m.fail(f"OLMoE's experts have the feed-forward width in every layer; this file has "
                     f"expert_feed_forward_length = {d_expert}, feed_forward_length = {d_ff}, dense layers {dense[:8]}")
    cfg = {**base, "num_experts": E, "num_experts_per_tok": k, "moe_intermediate_size": d_expert,
           "norm_topk_prob": m.flag("expert_weights_norm", mtype == "qwen3_moe"),
           "qkv_bias": base["attention_bias"], "clip_qkv": None}
    if mtype != "olmoe":
        cfg.update(mlp_only_layers=dense, decoder_sparse_step=1)
    if mtype == "qwen2_moe":
        cfg["shared_expert_intermediate_size"] = m.count("expert_shared_feed_forward_length", 0, low=0)
    return cfg


# --- tensors ----------------------------------------------------------------------------------------------
def _want(w: torch.Tensor, name: str, shape: tuple[int, ...], why: str, source: str) -> None:
    if tuple(w.shape) != shape:
        raise GGUFError(f"{source}: tensor {name!r} has shape {list(w.shape)} (GGUF lists "
                        f"{list(reversed(w.shape))}), but {why} need {list(shape)}")


def hf_tensors(name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any], *,
               source: str = "GGUF") -> dict[str, torch.Tensor] | None:
    """The HF tensors an expert-file tensor becomes, or None for a tensor the dense mapping handles.

    Args:
        name: the GGUF tensor name (``blk.3.ffn_up_exps.weight``).
        w: its values in torch order (GGUF dims reversed), real or on the meta device.
        hf_cfg: the HF config dict of the file (:func:`llama_experts_config` / :func:`deepseek2_config`).
        source: named in errors.

    Returns:
        ``{hf_name: tensor}``: merged experts split into per-expert views; DeepSeek's ``attn_k_b`` /
        ``attn_v_b`` under the names ``self_attn.k_b_proj`` / ``v_b_proj`` (joined by :func:`join_split_tensors`).

    Raises:
        GGUFError: a shape the config contradicts (expert count, expert width, MLA ranks): the tensor, its shape
            and the metadata that implies another are named.

    Example:
        >>> import torch
        >>> from interp.families._gguf_experts import hf_tensors
        >>> cfg = {"model_type": "mixtral", "num_local_experts": 4, "intermediate_size": 6, "hidden_size": 8}
        >>> sorted(hf_tensors("blk.0.ffn_up_exps.weight", torch.zeros(4, 6, 8), cfg))[0]
        'model.layers.0.mlp.experts.0.up_proj.weight'
    """
    parts = name.split(".")
    if hf_cfg["model_type"] != "mixtral" and name in _GLOBAL:  # Mixtral: the llama table names these
        return {_GLOBAL[name]: w}
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    layer, kind, suffix = parts[1], parts[2], parts[3]
    h = f"model.layers.{layer}."
    mtype = hf_cfg["model_type"]
    deepseek = mtype.startswith("deepseek")
    E = hf_cfg.get("n_routed_experts") or hf_cfg.get("num_local_experts") or hf_cfg["num_experts"]
    M = hf_cfg["hidden_size"]
    F = hf_cfg["intermediate_size"] if mtype in ("mixtral", "olmoe") else hf_cfg["moe_intermediate_size"]
    count_key = "llama.expert_count" if mtype == "mixtral" else "expert_count"
    if kind == "ffn_gate_inp" and suffix == "weight":
        _want(w, name, (E, M), f"metadata {count_key} = {E} and embedding_length = {M}", source)
        return {h + "mlp.gate.weight": w}
    if kind in _EXPERT_PARTS and suffix == "weight":
        if w.dim() != 3:
            raise GGUFError(f"{source}: tensor {name!r} has shape {list(w.shape)}; merged experts are 3-D "
                            f"[experts, rows, cols]")
        shape = (E, M, F) if kind == "ffn_down_exps" else (E, F, M)
        _want(w, name, shape, f"metadata {count_key} = {E}, embedding_length = {M} and expert width {F}", source)
        part = _EXPERT_PARTS[kind]
        return {h + f"mlp.experts.{e}.{part}.weight": w[e] for e in range(E)}  # [rows, cols] views
    if mtype == "mixtral":
        return None  # attention and norms: the llama mapping (Q/K unpermuted there)
    if not deepseek:
        return _qwen_olmoe_tensor(h, kind, suffix, w, name, hf_cfg, source)
    if kind == "exp_probs_b" and suffix == "bias":
        _want(w, name, (E,), f"metadata expert_count = {E}", source)
        return {h + "mlp.gate.e_score_correction_bias": w}
    if kind in _SHARED_PARTS and suffix == "weight":
        Fs = hf_cfg["n_shared_experts"] * F
        shared_shape = (M, Fs) if kind == "ffn_down_shexp" else (Fs, M)
        _want(w, name, shared_shape, f"metadata expert_shared_count x expert_feed_forward_length = {Fs}", source)
        return {h + f"mlp.shared_experts.{_SHARED_PARTS[kind]}.weight": w}
    if kind in _MLA_NAMES:
        _check_mla(name, kind, w, hf_cfg, source)
        return {h + f"self_attn.{_MLA_NAMES[kind]}.{suffix}": w}
    if kind in _COMMON:
        return {h + f"{_COMMON[kind]}.{suffix}": w}
    return None


def _qwen_olmoe_tensor(h: str, kind: str, suffix: str, w: torch.Tensor, name: str, hf_cfg: Mapping[str, Any],
                       source: str) -> dict[str, torch.Tensor] | None:
    if kind in _ATTENTION:  # rotate-half RoPE in llama.cpp too (NEOX): nothing to unpermute
        return {h + f"self_attn.{_ATTENTION[kind]}.{suffix}": w}
    if kind in _COMMON:
        return {h + f"{_COMMON[kind]}.{suffix}": w}
    Fs = hf_cfg.get("shared_expert_intermediate_size") or 0
    if kind in _SHARED_PARTS and suffix == "weight" and Fs:
        M = hf_cfg["hidden_size"]
        _want(w, name, (M, Fs) if kind == "ffn_down_shexp" else (Fs, M),
              f"metadata expert_shared_feed_forward_length = {Fs}", source)
        return {h + f"mlp.shared_expert.{_SHARED_PARTS[kind]}.weight": w}
    if kind == "ffn_gate_inp_shexp" and suffix == "weight" and Fs:
        M = hf_cfg["hidden_size"]
        if w.numel() != M:
            raise GGUFError(f"{source}: tensor {name!r} has shape {list(w.shape)}; the shared expert's gate needs "
                            f"{M} values (embedding_length)")
        return {h + "mlp.shared_expert_gate.weight": w.reshape(1, M)}  # stored [M] or [1, M]
    return None


def _check_mla(name: str, kind: str, w: torch.Tensor, hf_cfg: Mapping[str, Any], source: str) -> None:
    H, M, C, R = (hf_cfg[k] for k in ("num_attention_heads", "hidden_size", "kv_lora_rank", "qk_rope_head_dim"))
    D, Dv, Cq = hf_cfg["qk_nope_head_dim"], hf_cfg["v_head_dim"], hf_cfg["q_lora_rank"]
    heads = f"head_count {H} x key_length_mla {D + R}"
    shapes = {
        "attn_q": ((H * (D + R), M), f"{heads}, embedding_length {M}"),
        "attn_q_a": ((Cq, M), f"q_lora_rank {Cq}, embedding_length {M}"),
        "attn_q_a_norm": ((Cq,), f"q_lora_rank {Cq}"),
        "attn_q_b": ((H * (D + R), Cq), f"{heads}, q_lora_rank {Cq}"),
        "attn_kv_a_mqa": ((C + R, M), f"kv_lora_rank {C} + rope dimension {R}, embedding_length {M}"),
        "attn_kv_a_norm": ((C,), f"kv_lora_rank {C}"),
        "attn_kv_b": ((H * (D + Dv), C), f"head_count {H} x (key {D} + value {Dv}) without rope, kv_lora_rank {C}"),
        "attn_k_b": ((H, C, D), f"head_count {H}, kv_lora_rank {C}, key_length_mla {D + R} - rope {R}"),
        "attn_v_b": ((H, Dv, C), f"head_count {H}, value_length_mla {Dv}, kv_lora_rank {C}"),
        "attn_output": ((M, H * Dv), f"embedding_length {M}, head_count {H} x value_length_mla {Dv}"),
    }
    if kind in ("attn_q_a", "attn_q_a_norm", "attn_q_b") and Cq is None:
        raise GGUFError(f"{source}: tensor {name!r} is a low-rank query part, but metadata q_lora_rank is 0")
    shape, why = shapes[kind]
    if name.endswith(".weight"):
        _want(w, name, shape, f"the metadata's {why}", source)


def join_split_tensors(hf_sd: dict[str, torch.Tensor]) -> dict[str, str]:
    """Join DeepSeek's split ``k_b_proj`` ``[H, C, D]`` and ``v_b_proj`` ``[H, Dv, C]`` into HF's ``kv_b_proj``
    ``[H * (D + Dv), C]`` in place.

    Returns:
        ``{split name: joined name}`` for the tensors joined (so a reader can tell they were used).

    Raises:
        GGUFError: one half without the other.

    Example:
        >>> import torch
        >>> from interp.families._gguf_experts import join_split_tensors
        >>> sd = {"model.layers.0.self_attn.k_b_proj.weight": torch.zeros(2, 5, 3),
        ...       "model.layers.0.self_attn.v_b_proj.weight": torch.zeros(2, 4, 5)}
        >>> _ = join_split_tensors(sd); sd["model.layers.0.self_attn.kv_b_proj.weight"].shape
        torch.Size([14, 5])
    """
    aliases = {}
    for k_name in [n for n in hf_sd if n.endswith("self_attn.k_b_proj.weight")]:
        v_name = k_name.replace("k_b_proj", "v_b_proj")
        joined = k_name.replace("k_b_proj", "kv_b_proj")
        if v_name not in hf_sd:
            raise GGUFError(f"{k_name!r} has no {v_name!r}: llama.cpp's split kv_b needs both halves")
        k_b, v_b = hf_sd.pop(k_name), hf_sd.pop(v_name)  # [H, C, D], [H, Dv, C]
        C = k_b.shape[1]
        kv = torch.cat([k_b.transpose(1, 2), v_b], dim=1)  # [H, D + Dv, C]
        hf_sd[joined] = kv.reshape(-1, C)  # [H * (D + Dv), C]: per head, key rows then value rows
        aliases[k_name] = aliases[v_name] = joined
    for v_name in [n for n in hf_sd if n.endswith("self_attn.v_b_proj.weight")]:
        raise GGUFError(f"{v_name!r} has no {v_name.replace('v_b_proj', 'k_b_proj')!r}: llama.cpp's split kv_b "
                        f"needs both halves")
    return aliases


def _with_source(fn: Any) -> Any:
    """A ``(metadata, names, *, source)`` config function as a :class:`GGUFSpec` config (``(Meta, names)``)."""
    return lambda m, names: fn(m.meta, names, source=m.source)


def _expert_tensors(name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any], *,
                    source: str = "GGUF") -> dict[str, torch.Tensor] | None:
    """:func:`hf_tensors` for a config with experts; None (the tables' tensors) for a dense one."""
    return hf_tensors(name, w, hf_cfg, source=source) if is_expert_config(hf_cfg) else None


def with_experts(spec: GGUFSpec) -> GGUFSpec:
    """A dense Llama-layout spec whose files may also carry merged experts (``llama``: Mixtral, an
    ``expert_count`` in the metadata and ``ffn_*_exps`` in place of the MLPs).

    Example:
        >>> from interp.families._gguf import llama_spec
        >>> from interp.families._gguf_experts import with_experts
        >>> meta = {"general.architecture": "llama", "llama.block_count": 1, "llama.context_length": 64,
        ...         "llama.embedding_length": 32, "llama.feed_forward_length": 24, "llama.attention.head_count": 4,
        ...         "llama.vocab_size": 50, "llama.expert_count": 4, "llama.expert_used_count": 2}
        >>> with_experts(llama_spec("llama", permuted=True)).hf_config(meta, set())["model_type"]
        'mixtral'
    """
    dense = spec.config

    def config(m: Meta, names: set[str]) -> HFConfig:
        cfg = dense(m, names)
        return llama_experts_config(cfg, m.meta, names, source=m.source) if m.get("expert_count", 0) else cfg

    return GGUFSpec(config, spec.global_names, spec.block_prefix, spec.block, spec.transform, _expert_tensors,
                    experts=True)


#: ``deepseek2`` (DeepSeek-V2 / V3): MLA attention and experts, every tensor named by :func:`hf_tensors`.
DEEPSEEK2 = GGUFSpec(_with_source(deepseek2_config), special=hf_tensors, experts=True)
#: ``qwen2moe`` / ``qwen3moe`` / ``olmoe``: Llama attention and experts, every tensor named by :func:`hf_tensors`.
QWEN_OLMOE = GGUFSpec(_with_source(qwen_olmoe_config), special=hf_tensors, experts=True)


__all__ = ["DEEPSEEK2", "HF_TYPES", "MODEL_TYPES", "QWEN_OLMOE", "deepseek2_config", "hf_tensors",
           "is_expert_config", "join_split_tensors", "llama_experts_config", "qwen_olmoe_config", "with_experts"]
