"""BERT encoders (``BertModel``; the ``bert.`` part of ``BertFor*``): post-LN, separate q/k/v stacked into
``W_qkv``; task heads dropped (``unembed=False``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import StateDict, _need
from ._family import Family, fixed
from ._tensors import (
    _Source,
)


def bert_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a BERT encoder from its HF config dict (``config.json`` / ``config.to_dict()``).

    Raises:
        ValueError: a setting this converter does not reproduce (relative position embeddings, an
            activation other than gelu/relu/gelu_new) or a missing key.

    Example:
        >>> from interp.families.bert import bert_config
        >>> import json, os; from interp.zoo.minilm import minilm_path
        >>> bert_config(json.load(open(os.path.join(minilm_path(), "config.json")))).normalization
        'post'
    """
    arch = "BERT"
    for key in ("is_decoder", "add_cross_attention"):  # a decoder BERT is causal; cross-attention needs an encoder
        if hf_cfg.get(key):
            raise ValueError(f"BERT {key}={hf_cfg[key]!r} is not supported (only False: an encoder)")
    pos = hf_cfg.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"BERT position_embedding_type={pos!r} is not supported (only 'absolute')")
    act = hf_cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "relu", "gelu_new"):
        raise ValueError(f"BERT hidden_act={act!r} is not supported (gelu, relu, gelu_new)")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=d_model // n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=act,
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=hf_cfg.get("max_position_embeddings", 512),
        n_token_types=hf_cfg.get("type_vocab_size", 2), normalization="post", embed_norm=True,
        positional="learned", causal=False, unembed=False, norm_eps=hf_cfg.get("layer_norm_eps", 1e-12),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def bert_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF BERT one (keys with or without the ``bert.`` prefix).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("bert.",), "BERT")
    out = {
        "W_E.weight": src("embeddings.word_embeddings.weight"),
        "W_pos.weight": src("embeddings.position_embeddings.weight"),
        "embed_ln.weight": src("embeddings.LayerNorm.weight"),
        "embed_ln.bias": src("embeddings.LayerNorm.bias"),
    }
    if cfg.n_token_types:
        out["W_tt.weight"] = src("embeddings.token_type_embeddings.weight")
    for i in range(cfg.n_layers):
        h, b = f"encoder.layer.{i}.", f"blocks.{i}."
        # HF keeps Q, K, V apart, each [H*D, M] with head h in rows h*D:(h+1)*D: stacked they are our W_qkv.
        for kind in ("weight", "bias"):
            out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                [src(h + f"attention.self.{n}.{kind}") for n in ("query", "key", "value")], dim=0)  # [3*H*D(, M)]
            out[b + f"attn.W_O.{kind}"] = src(h + f"attention.output.dense.{kind}")
            out[b + f"ln1.{kind}"] = src(h + f"attention.output.LayerNorm.{kind}")
            out[b + f"mlp.W_in.{kind}"] = src(h + f"intermediate.dense.{kind}")
            out[b + f"mlp.W_out.{kind}"] = src(h + f"output.dense.{kind}")
            out[b + f"ln2.{kind}"] = src(h + f"output.LayerNorm.{kind}")
    return out


FAMILY = Family("bert", ("bert",), bert_config, fixed(bert_state_dict), title="BERT", headline=True)
