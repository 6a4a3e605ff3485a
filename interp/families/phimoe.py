"""Phi-MoE (Phi-3.5-MoE): pre-LayerNorm with biases, biased attention where ``attention_bias``, a sliding window on
every layer when ``sliding_window`` is set, and 16 SwiGLU experts routed by the sparsemixer
(``router_score="sparsemixer"``: two experts, each weighed by its softmax over the logits near it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import StateDict, _decoder_checks, _need, _positive, _refuse, llama_sizes
from ._family import TEST_WINDOW, CompatConfig, Family
from ._positions import _rope, sliding_windows
from ._tensors import Renamed, _llama_attention, _lm_head, _moe_weights, _Source

#: transformers 5's router name -> the one :func:`._tensors._moe_weights` reads (the published checkpoints'
#: ``block_sparse_moe.gate`` / ``experts.{e}.w1/w2/w3`` it reads as they are).
_RENAMES = ((re.compile(r"\.mlp\.router\.weight$"), ".mlp.gate.weight"),)


def _longrope_as_transformers(hf_cfg: Mapping[str, Any], arch: str) -> dict[str, Any] | None:
    """Phi-MoE's LongRoPE as transformers computes it, in our ``rope_scaling`` vocabulary (``None``: no LongRoPE).

    transformers' Phi-MoE rotary recomputes its frequencies without the sequence length, so it always rotates with
    the *short* factors, and scales cos / sin by ``short_mscale`` up to ``original_max_position_embeddings`` and
    by ``long_mscale`` past it. That is our LongRoPE with the short factors on both sides and ``attention_factor``
    the one mscale, when the two are equal (Phi-3.5-MoE's are).

    Raises:
        ValueError: ``short_mscale`` and ``long_mscale`` that differ, or either missing (quoting both).
    """
    rope = dict(hf_cfg.get("rope_parameters") or {})
    if not rope.get("rope_type") and hf_cfg.get("rope_scaling"):
        rope = {**hf_cfg["rope_scaling"], **rope}
    if (rope.get("rope_type") or rope.get("type")) != "longrope":
        return None
    short, long = rope.pop("short_mscale", None), rope.pop("long_mscale", None)
    if short is None or short != long:
        raise ValueError(f"{arch} short_mscale={short!r} with long_mscale={long!r} is not supported (only two equal "
                         "numbers: transformers switches the scale, not the factors, past the original context)")
    rope["rope_type"] = "longrope"
    rope.setdefault("rope_theta", hf_cfg.get("rope_theta", 10000.0))
    return {**rope, "long_factor": rope.get("short_factor"), "attention_factor": short}


def phimoe_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Phi-MoE decoder from its HF config dict.

    LayerNorms (weight and bias, eps ``rms_norm_eps``), rotate-half RoPE, q/k/v/o biases and an ``lm_head`` bias
    where the config says, and every MLP a mixture of ``num_local_experts`` experts of width
    ``intermediate_size`` under the sparsemixer with ``router_jitter_noise`` as its threshold (the input jitter
    is training-only).

    Raises:
        ValueError: ``num_experts_per_tok`` other than 2 (the sparsemixer always picks two), an activation other
            than silu, a RoPE kind other than ``default`` or ``longrope`` (LongRoPE as transformers runs it, see
            :func:`_longrope_as_transformers`), a negative jitter, a tied unembedding with a bias
            (``tie_word_embeddings`` with ``lm_head_bias``), or a missing key.

    Example:
        >>> from interp.families.phimoe import phimoe_config
        >>> cfg = phimoe_config({"model_type": "phimoe", "hidden_size": 64, "num_attention_heads": 4,
        ...                      "num_hidden_layers": 2, "intermediate_size": 32, "vocab_size": 50,
        ...                      "max_position_embeddings": 64, "num_local_experts": 4, "num_experts_per_tok": 2})
        >>> cfg.router_score, cfg.sparsemixer_eps, cfg.normalization, cfg.sliding_window
        ('sparsemixer', 0.01, 'pre', None)
    """
    arch = "phimoe"
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, (("hidden_act", "silu", "silu"), ("num_experts_per_tok", 2, 2)))
    theta, scaling = _rope(hf_cfg, arch, _longrope_as_transformers(hf_cfg, arch))
    if scaling is not None and scaling["rope_type"] != "longrope":
        raise ValueError(f"{arch} rope_type={scaling['rope_type']!r} is not supported (only 'default' and "
                         "'longrope')")
    if hf_cfg.get("tie_word_embeddings") and hf_cfg.get("lm_head_bias"):
        raise ValueError(f"{arch} tie_word_embeddings=True with lm_head_bias=True is not supported (a tied "
                         "unembedding has no bias here)")
    jitter = hf_cfg.get("router_jitter_noise", 0.01)
    jitter = 0.0 if jitter == 0 else _positive(jitter, "router_jitter_noise", arch, hf_cfg)
    bias = bool(hf_cfg.get("attention_bias", False))
    sizes = llama_sizes(hf_cfg, arch)
    return ModelConfig(
        **sizes, activation="swiglu", normalization="pre", norm_eps=hf_cfg.get("rms_norm_eps", 1e-5),
        positional="rotary", rotary_base=theta, rope_scaling=scaling, attn_bias=bias, out_bias=bias, mlp_bias=False,
        sliding_window=sliding_windows(hf_cfg, arch, rule="every", gated=False),
        n_experts=_need(hf_cfg, "num_local_experts", arch), n_experts_per_token=2, d_expert=sizes["d_mlp"],
        router_score="sparsemixer", sparsemixer_eps=jitter,
    )


def phimoe_state_dict(hf_sd: StateDict, cfg: ModelConfig, *, lm_head_bias: bool = False) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Phi-MoE one (transformers 5's names or the published checkpoints').

    Args:
        hf_sd: the HF state dict.
        cfg: from :func:`phimoe_config`.
        lm_head_bias: the unembedding has a bias (``lm_head_bias``).

    Raises:
        ValueError: a tensor the conversion needs is absent, or the experts disagree with the config (named).
    """
    hf_sd = Renamed(hf_sd, _RENAMES)
    src = _Source(hf_sd, ("model.",), "phimoe")
    out = {"W_E.weight": src("embed_tokens.weight")}
    for kind in ("weight", "bias"):
        out[f"ln_final.{kind}"] = src(f"norm.{kind}")
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        for kind in ("weight", "bias"):
            out[b + f"ln1.{kind}"] = src(h + f"input_layernorm.{kind}")
            out[b + f"ln2.{kind}"] = src(h + f"post_attention_layernorm.{kind}")
        out.update(_moe_weights(src, h, b + "mlp.", cfg, i))
    out.update(_lm_head(hf_sd, src, cfg, "phimoe", bias="lm_head.bias" if lm_head_bias else None))
    return out


TESTS = {
    # router_jitter_noise 0.3: the sparsemixer's softmaxes take in more than the chosen logit on most tokens
    "phimoe": CompatConfig("phimoe", dict(hidden_size=72, intermediate_size=32, num_attention_heads=9,
                                          num_key_value_heads=3, num_local_experts=8, num_experts_per_tok=2,
                                          router_jitter_noise=0.3, sliding_window=TEST_WINDOW, attention_bias=True,
                                          lm_head_bias=True)),
}

FAMILY = Family("phimoe", ("phimoe",), phimoe_config,
                lambda hf_cfg: lambda sd, cfg: phimoe_state_dict(sd, cfg, lm_head_bias=bool(hf_cfg.get("lm_head_bias"))),
                tests=TESTS)
