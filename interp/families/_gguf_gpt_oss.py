"""gpt-oss GGUF files (``general.architecture = "gpt-oss"``) as llama.cpp's ``convert_hf_to_gguf.py`` writes
them, mapped onto the Hugging Face config and tensor names that :mod:`interp.families.gpt_oss` converts.

What the converter writes, and how it maps back:

* metadata ``gpt-oss.*``: the shared sizes (``embedding_length``, ``attention.head_count`` / ``head_count_kv`` /
  ``key_length``, ``block_count``, ``context_length``, ``attention.layer_norm_rms_epsilon``, ``rope.freq_base``),
  ``expert_count`` / ``expert_used_count`` / ``expert_feed_forward_length``, ``attention.sliding_window`` and YaRN
  (``rope.scaling.type = "yarn"``, ``rope.scaling.factor``, ``rope.scaling.original_context_length``). llama.cpp
  fixes the rest for the architecture: layers alternate sliding (even) and full (odd), the clamped SwiGLU has
  alpha 1.702 and limit 7.0, YaRN's betas are 32 and 1; the HF config here says the same (with
  ``truncate: false``, as the release's ``rope_scaling``).
* tensors: ``blk.N.attn_{q,k,v,output}.{weight,bias}``, ``blk.N.attn_sinks.weight`` (HF ``self_attn.sinks``),
  ``blk.N.attn_norm`` / ``post_attention_norm``, the router ``blk.N.ffn_gate_inp.{weight,bias}``, and the
  experts split out of HF's interleaved ``gate_up_proj``: ``ffn_gate_exps`` / ``ffn_up_exps`` ``[E, F, M]`` and
  ``ffn_down_exps`` ``[E, M, F]`` (torch order; MXFP4 as the release, or any type ``gguf`` dequantises), each with
  its ``.bias``. Gate and up come back as ``mlp.experts.gate_proj`` / ``up_proj`` ``[E, M, F]``, which
  :func:`interp.families.gpt_oss.gpt_oss_state_dict` reads in place of ``gate_up_proj``.

Refused by name with the value: a RoPE scaling other than YaRN, an expert or router tensor whose shape the metadata
contradicts, and a tensor no gpt-oss model has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ._gguf import GGUFError, GGUFSpec, gguf_sizes
from ._gguf_experts import _Meta, _want

__all__ = ["ARCH", "hf_config", "hf_tensors"]

ARCH = "gpt-oss"

_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
          "post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.router"}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}


def hf_config(meta: Mapping[str, Any], tensor_names: set[str], *, source: str = "GGUF") -> dict[str, Any]:
    """The HF ``gpt_oss`` config dict of a gpt-oss GGUF file.

    Args:
        meta: the file's metadata.
        tensor_names: its tensor names (``output.weight`` absent means tied embeddings).
        source: named in errors.

    Returns:
        a ``config.json``-style dict for :func:`interp.families.gpt_oss.gpt_oss_config`.

    Raises:
        GGUFError: a missing or malformed key, a RoPE scaling other than YaRN, or a top-k above the expert count
            (each named with its value).

    Example:
        >>> from interp.families._gguf_gpt_oss import hf_config
        >>> meta = {"general.architecture": "gpt-oss", "gpt-oss.block_count": 2, "gpt-oss.context_length": 64,
        ...         "gpt-oss.embedding_length": 64, "gpt-oss.feed_forward_length": 32, "gpt-oss.vocab_size": 50,
        ...         "gpt-oss.attention.head_count": 4, "gpt-oss.attention.key_length": 16,
        ...         "gpt-oss.expert_count": 4, "gpt-oss.expert_used_count": 2, "gpt-oss.attention.sliding_window": 8,
        ...         "gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 4.0,
        ...         "gpt-oss.rope.scaling.original_context_length": 16}
        >>> cfg = hf_config(meta, {"output.weight"})
        >>> cfg["model_type"], cfg["layer_types"], cfg["rope_parameters"]["rope_type"]
        ('gpt_oss', ['sliding_attention', 'full_attention'], 'yarn')
    """
    m = _Meta(meta, ARCH, source)
    base = gguf_sizes(m, set(tensor_names))
    E, k = m.routing()
    L = base["num_hidden_layers"]
    kind = m.get("rope.scaling.type", "yarn")
    if kind != "yarn":
        raise m.fail(f"RoPE scaling {kind!r} ({m.key('rope.scaling.type')}) is not supported; gpt-oss uses 'yarn'")
    rope = {"rope_type": "yarn", "rope_theta": m.number("rope.freq_base", 150000.0),
            "factor": m.need("rope.scaling.factor"), "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
            "original_max_position_embeddings": m.count("rope.scaling.original_context_length", 4096)}
    return {
        **base, "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
        "intermediate_size": m.count("expert_feed_forward_length", base["intermediate_size"]),
        "num_local_experts": E, "num_experts_per_tok": k,
        "sliding_window": m.count("attention.sliding_window", 128),
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)],
        "rms_norm_eps": m.need("attention.layer_norm_rms_epsilon", 1e-5), "rope_parameters": rope,
        "attention_bias": True, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    }


def hf_tensors(name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any], *,
               source: str = "GGUF") -> dict[str, torch.Tensor]:
    """The HF tensor one gpt-oss GGUF tensor becomes.

    Args:
        name: the GGUF tensor name (``blk.1.ffn_up_exps.weight``).
        w: its values in torch order (GGUF dims reversed), real or on the meta device.
        hf_cfg: :func:`hf_config` output.
        source: named in errors.

    Returns:
        ``{hf_name: tensor}``; experts transposed to HF's ``[E, in, out]``.

    Raises:
        GGUFError: a tensor no gpt-oss model has, or an expert / router tensor whose shape the metadata
            contradicts (tensor, shape and metadata named).

    Example:
        >>> import torch
        >>> from interp.families._gguf_gpt_oss import hf_tensors
        >>> cfg = {"num_local_experts": 4, "intermediate_size": 6, "hidden_size": 8}
        >>> {k: tuple(v.shape) for k, v in hf_tensors("blk.0.ffn_up_exps.weight", torch.zeros(4, 6, 8), cfg).items()}
        {'model.layers.0.mlp.experts.up_proj': (4, 8, 6)}
    """
    if name in _GLOBAL:
        return {_GLOBAL[name]: w}
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit() or parts[3] not in ("weight", "bias"):
        raise GGUFError(f"{source}: tensor {name!r} has no place in a 'gpt-oss' decoder")
    layer, kind, suffix = parts[1:]
    h = f"model.layers.{layer}."
    E, F, M = hf_cfg["num_local_experts"], hf_cfg["intermediate_size"], hf_cfg["hidden_size"]
    sizes = f"metadata expert_count = {E}, embedding_length = {M} and expert_feed_forward_length = {F}"
    if kind == "attn_sinks" and suffix == "weight":
        return {h + "self_attn.sinks": w}
    if kind == "ffn_gate_inp":
        _want(w, name, (E, M) if suffix == "weight" else (E,), sizes, source)
    if kind in _EXPERTS:
        out_width, in_width = (M, F) if kind == "ffn_down_exps" else (F, M)
        part = _EXPERTS[kind]
        if suffix == "bias":
            _want(w, name, (E, out_width), sizes, source)
            return {h + f"mlp.experts.{part}_bias": w}
        _want(w, name, (E, out_width, in_width), sizes, source)
        return {h + f"mlp.experts.{part}": w.transpose(1, 2)}  # [E, out, in] -> HF's [E, in, out]
    if kind in _BLOCK:
        return {h + f"{_BLOCK[kind]}.{suffix}": w}
    raise GGUFError(f"{source}: tensor {name!r} has no place in a 'gpt-oss' decoder")


#: ``gpt-oss``: every tensor named by :func:`hf_tensors`.
GPT_OSS = GGUFSpec(lambda m, names: hf_config(m.meta, names, source=m.source), special=hf_tensors, experts=True)
