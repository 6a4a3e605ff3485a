"""GPT-2: ``Conv1D`` weights stored ``[in, out]`` (transposed), tanh GELU, tied unembedding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GPT_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need
from ._family import Family
from ._gguf import GPT2_BLOCK, GPT2_GLOBAL, GGUFSpec, HFConfig, Meta, fixed_heads_sizes, gpt2_keys, transposed
from ._mapping import Rule, both, map_tensors, transpose


def gpt2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-2 decoder from its HF config dict.

    ``scale_attn_by_inverse_layer_idx`` (layer i's scores divided by i + 1) is folded into that layer's query
    rows by :func:`gpt2_state_dict_for`; ``reorder_and_upcast_attn`` computes the same scores in float32 (scaled
    before the product instead of after: the same numbers up to rounding).

    Raises:
        ValueError: unsupported settings (``scale_attn_weights=False``, cross-attention, an unknown activation)
            or a missing key.
    """
    arch = "GPT-2"
    _decoder_checks(hf_cfg, "gpt2")
    for key, bad in (("scale_attn_weights", False), ("add_cross_attention", True)):
        if hf_cfg.get(key, not bad) == bad:
            raise ValueError(f"GPT-2 {key}={bad} is not supported by the converter")
    activation = _activation(hf_cfg, "activation_function", "gelu_new", "GPT-2", {**GPT_ACTIVATIONS, "silu": "silu"})
    d_model = _need(hf_cfg, "n_embd", arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "n_layer", arch), d_model=d_model, n_heads=_need(hf_cfg, "n_head", arch),
        d_mlp=hf_cfg.get("n_inner") or 4 * d_model, activation=activation, d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "n_positions", arch), normalization="pre", positional="learned", causal=True,
        norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5), unembed=True,
        tie_embeddings=hf_cfg.get("tie_word_embeddings", True), pad_token_id=hf_cfg.get("pad_token_id"),
    )


#: GPT-2's tensors: ``Conv1D`` weights are ``[in, out]`` (transposed to ``nn.Linear``'s ``[out, in]``); ``c_attn``'s
#: columns are ``[q | k | v]``, each split by head in order: our ``W_qkv`` row order once transposed.
TABLE: tuple[Rule, ...] = (
    Rule("W_E", "wte"), Rule("W_pos", "wpe"), Rule("ln_final", "ln_f", kinds=both),
    *(Rule(f"blocks.{{i}}.{ours}", f"h.{{i}}.{theirs}", kinds=both, transform=transpose)
      for ours, theirs in (("attn.W_qkv", "attn.c_attn"), ("attn.W_O", "attn.c_proj"), ("mlp.W_in", "mlp.c_fc"),
                           ("mlp.W_out", "mlp.c_proj"))),
    Rule("blocks.{i}.ln1", "h.{i}.ln_1", kinds=both), Rule("blocks.{i}.ln2", "h.{i}.ln_2", kinds=both),
)


def gpt2_state_dict(hf_sd: StateDict, cfg: ModelConfig, *, inverse_layer_scale: bool = False
                    ) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-2 one (``GPT2LMHeadModel`` or ``GPT2Model`` keys): :data:`TABLE`, plus an
    untied unembedding when the config unties it.

    ``inverse_layer_scale`` (``scale_attn_by_inverse_layer_idx``): layer i's query rows (weight and bias) are
    divided by i + 1, which divides its scores by i + 1 as transformers does.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    out, _ = map_tensors(TABLE, hf_sd, cfg, prefixes=("transformer.",), arch="GPT-2")
    if inverse_layer_scale:
        q_rows = cfg.n_heads * cfg.d_head  # the first rows of W_qkv are the queries
        for i in range(1, cfg.n_layers):
            for kind in ("weight", "bias"):
                w = out[f"blocks.{i}.attn.W_qkv.{kind}"].clone()
                w[:q_rows] /= i + 1
                out[f"blocks.{i}.attn.W_qkv.{kind}"] = w
    if not cfg.tie_embeddings:
        # An untied GPT-2 without lm_head keeps wte's values (read again: the table consumed it as W_E).
        out["W_U.weight"] = hf_sd["lm_head.weight"] if "lm_head.weight" in hf_sd else out["W_E.weight"]
        out["W_U.bias"] = torch.zeros(cfg.d_vocab)  # an untied W_U has a bias in interp; lm_head has none
    return out


def gpt2_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]:
    """The state-dict function of a GPT-2 config: :func:`gpt2_state_dict` with ``scale_attn_by_inverse_layer_idx``.

    Example:
        >>> from interp.families.gpt2 import gpt2_state_dict_for
        >>> gpt2_state_dict_for({"scale_attn_by_inverse_layer_idx": True}).keywords
        {'inverse_layer_scale': True}
    """
    return functools.partial(gpt2_state_dict,
                             inverse_layer_scale=bool(hf_cfg.get("scale_attn_by_inverse_layer_idx", False)))


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> GPT-2's HF config (multi-head attention, learned positions, tanh GELU)."""
    sizes = fixed_heads_sizes(m, names, "GPT-2")
    return {"model_type": "gpt2", **gpt2_keys(m, sizes), "activation_function": "gelu_new"}


#: llama.cpp's ``gpt2``: GPT-2's names; the converter transposed the ``Conv1D`` weights to ``[out, in]``
#: (transposed back here, for the HF mapping).
GGUF = {"gpt2": GGUFSpec(_gguf_config, GPT2_GLOBAL, "transformer.h.{}.", GPT2_BLOCK,
                         transposed(("attn_qkv", "attn_output", "ffn_up", "ffn_down")))}


FAMILY = Family("gpt2", ("gpt2",), gpt2_config, gpt2_state_dict_for, title="GPT-2", headline=True, gguf=GGUF)
