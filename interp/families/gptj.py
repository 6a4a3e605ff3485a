"""GPT-J: parallel block with one LayerNorm, interleaved partial RoPE (rows reordered to halves), biased head.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import GPT_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need, _refuse
from ._family import CompatConfig, Family, fixed
from ._tensors import (
    _leading_pairs_to_halves,
    _lm_head,
    _Source,
)


def gptj_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-J decoder: parallel block with one LayerNorm, RoPE on interleaved pairs of
    the first ``rotary_dim`` dims of each head (rows reordered to halves by :func:`gptj_state_dict`), biased MLP
    and a biased unembedding (so ``W_U`` is always separate, as Phi's).

    Raises:
        ValueError: ``rotary_dim=None`` (transformers' GPT-J then rotates by the whole model width), an
            unsupported activation, or a missing key.

    Example:
        >>> from interp.families.gptj import gptj_config
        >>> cfg = gptj_config({"model_type": "gptj", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 50,
        ...                    "n_positions": 64, "rotary_dim": 8})
        >>> cfg.rotary_dim, cfg.parallel_block, cfg.d_mlp, cfg.activation
        (8, 'one_norm', 256, 'gelu_new')
    """
    arch = "gptj"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("add_cross_attention", False, False),))
    activation = _activation(hf_cfg, "activation_function", "gelu_new", arch, GPT_ACTIVATIONS)
    d_model, n_heads = _need(hf_cfg, "n_embd", arch), _need(hf_cfg, "n_head", arch)
    rotary_dim = hf_cfg.get("rotary_dim")
    if rotary_dim is None:
        raise ValueError(f"{arch} rotary_dim=None is not supported (give the rotated dims of each head)")
    return ModelConfig(
        n_layers=_need(hf_cfg, "n_layer", arch), d_model=d_model, n_heads=n_heads,
        d_mlp=hf_cfg.get("n_inner") or 4 * d_model, activation=activation, d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "n_positions", arch), normalization="pre", norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5),
        positional="rotary", rotary_base=10000.0, rotary_dim=rotary_dim, parallel_block="one_norm",
        attn_bias=False, out_bias=False, mlp_bias=True, unembed=True, tie_embeddings=False,
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gptj_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-J one: the query and key rows reordered from interleaved pairs to halves.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("transformer.",), "GPT-J")
    H, D, R = cfg.n_heads, cfg.d_head, cfg.rotary_dim or cfg.d_head
    out = {"W_E.weight": src("wte.weight"), "ln_final.weight": src("ln_f.weight"), "ln_final.bias": src("ln_f.bias")}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        q, k = (_leading_pairs_to_halves(src(h + f"attn.{n}_proj.weight"), H, D, R) for n in ("q", "k"))
        out[b + "attn.W_qkv.weight"] = torch.cat([q, k, src(h + "attn.v_proj.weight")])  # [3 H D, M]
        out[b + "attn.W_O.weight"] = src(h + "attn.out_proj.weight")
        for ours, theirs in (("ln1", "ln_1"), ("mlp.W_in", "mlp.fc_in"), ("mlp.W_out", "mlp.fc_out")):
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    if "lm_head.weight" not in hf_sd and "lm_head.bias" in hf_sd:
        hf_sd = ChainMap({"lm_head.weight": out["W_E.weight"]}, hf_sd)  # type: ignore[arg-type]  # tied: the head's weight is the embedding
    if "lm_head.bias" not in hf_sd:
        raise ValueError("GPT-J state dict has no 'lm_head.bias' (pass a GPTJForCausalLM model, not GPTJModel)")
    out.update(_lm_head(hf_sd, src, cfg, "GPT-J", bias="lm_head.bias"))
    return out


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "gptj": CompatConfig("gptj", dict(n_embd=80, n_inner=96, n_head=5, n_layer=2, n_positions=64, rotary_dim=8)),
}


FAMILY = Family("gptj", ("gptj",), gptj_config, fixed(gptj_state_dict), tests=TESTS)
