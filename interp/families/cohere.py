"""Cohere (Command-R): parallel block with one bias-free LayerNorm (bias 0), interleaved RoPE reordered to
halves, ``logit_scale`` folded into an untied ``W_U``; ``use_qk_norm`` refused. Cohere 2: sliding layers rotate,
global ones have no positions (``nope_layers``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ..precision import Precision
from ._base import GATED_ACTIVATIONS, StateDict, _activation, _decoder_checks, _need, _refuse
from ._family import TEST_WINDOW, CompatConfig, Family
from ._gguf import (
    GATED_MLP,
    LLAMA_ATTN,
    LLAMA_GLOBAL,
    QK_NORM,
    GGUFSpec,
    HFConfig,
    Meta,
    gguf_sizes,
    llama_like,
    pattern_windows,
    rope_parameters,
    rotary_dim,
)
from ._positions import _rope, _typed_windows
from ._tensors import (
    _dense_weights,
    _llama_attention,
    _qk_pairs_to_halves,
    _Source,
)
from .granite import _granite_multiplier


def cohere_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Cohere (Command-R) decoder: parallel block with one LayerNorm without bias
    (stored with bias 0), RoPE on interleaved pairs rotated in float32 (rows reordered to halves), and logits
    times ``logit_scale``, folded into an untied ``W_U`` by :func:`cohere_state_dict_for`. Cohere 2 adds
    sliding layers (``layer_types``, else all but every 4th); only they rotate, the others have no positions.

    Raises:
        ValueError: ``use_qk_norm`` (per-head LayerNorms, not implemented), ``logit_scale`` not a finite number
            > 0, an unsupported activation or RoPE kind, or a missing key.

    Example:
        >>> from interp.families.cohere import cohere_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = cohere_config(tiny_hf_config("cohere"))
        >>> cfg.parallel_block, cfg.normalization, cfg.tie_embeddings
        ('one_norm', 'pre', False)
    """
    arch = hf_cfg.get("model_type", "cohere")
    _decoder_checks(hf_cfg, arch)
    _refuse(arch, hf_cfg, ((("use_qk_norm", False, False),) if arch == "cohere"
                                                               else ()))
    _granite_multiplier(hf_cfg, "logit_scale", arch, 0.0625)
    windows, nope = None, None
    if arch == "cohere2":  # sliding layers rotate; the others (all of them without a window) have no positions
        n_layers = _need(hf_cfg, "num_hidden_layers", arch)
        default = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n_layers)]
        _, windows = _typed_windows(hf_cfg, arch, default)
        nope = [i for i in range(n_layers) if windows is None or windows[i] is None] or None
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    theta, scaling = _rope(hf_cfg, arch)
    bias = bool(hf_cfg.get("attention_bias", False))
    activation = _activation(hf_cfg, "hidden_act", "silu", arch, GATED_ACTIVATIONS)
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads, n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=activation,
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="pre", norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), positional="rotary", rotary_base=theta,
        rope_scaling=scaling, precision=Precision.named("cohere"), sliding_window=windows, nope_layers=nope,
        parallel_block="one_norm", attn_bias=bias, out_bias=bias, mlp_bias=False, unembed=True,
        tie_embeddings=False, pad_token_id=hf_cfg.get("pad_token_id"),
    )


def cohere_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]:
    """The state-dict function of a Cohere config: Llama's keys, LayerNorm biases 0, query and key rows
    reordered from interleaved pairs to halves, ``W_U = lm_head * logit_scale`` (the embedding when tied).

    Raises:
        ValueError: ``logit_scale`` not a finite number > 0.
    """
    scale = _granite_multiplier(hf_cfg, "logit_scale", "cohere", 0.0625)
    tied = bool(hf_cfg.get("tie_word_embeddings", True))

    def convert(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
        src = _Source(hf_sd, ("model.",), "Cohere")
        embed = src("embed_tokens.weight")
        zero = torch.zeros(cfg.d_model, dtype=embed.dtype)
        if "lm_head.weight" not in hf_sd and not tied:
            raise ValueError("Cohere state dict has no 'lm_head.weight' and tie_word_embeddings is False "
                             "(pass a *ForCausalLM model, not the bare *Model)")
        head = hf_sd["lm_head.weight"] if "lm_head.weight" in hf_sd else embed
        out = {"W_E.weight": embed, "ln_final.weight": src("norm.weight"), "ln_final.bias": zero,
               "W_U.weight": head * scale, "W_U.bias": torch.zeros(cfg.d_vocab, dtype=embed.dtype)}
        for i in range(cfg.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            out.update(_llama_attention(src, h, b, cfg))
            _qk_pairs_to_halves(out, b, cfg, cfg.d_head)
            out[b + "ln1.weight"], out[b + "ln1.bias"] = src(h + "input_layernorm.weight"), zero.clone()
            out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
        return out

    return convert


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> Cohere's HF config: Llama's keys with the LayerNorm epsilon and ``logit_scale``; QK-norm
    (``attn_q_norm``) is refused by name, as the HF mapping refuses ``use_qk_norm``."""
    cfg = llama_like("cohere")(m, names)
    return {**cfg, "layer_norm_eps": m.number("attention.layer_norm_epsilon", 1e-5),
            "logit_scale": m.number("logit_scale", 0.0625), "use_qk_norm": "blk.0.attn_q_norm.weight" in names}


def _gguf_config_cohere2(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> Cohere 2's HF config. llama.cpp's ``cohere2`` fixes the layer pattern (3 sliding layers of
    every 4, the 4th global and without RoPE: the HF default) and needs ``attention.sliding_window``; the converter
    writes ``rope.dimension_count`` from ``rotary_pct`` (partial rotary refused, as transformers' Cohere 2 rotates
    whole heads) and drops the all-zero biases (any bias tensors left are read as ``attention_bias``)."""
    rope = rope_parameters(m, names, 10000.0)
    cfg = gguf_sizes(m, names)
    rotary_dim(m, cfg["head_dim"])
    m.count("attention.sliding_window")  # llama.cpp reads it unconditionally: a file without it is refused
    window, types = pattern_windows(m, cfg["num_hidden_layers"], 4)
    return {**cfg, "model_type": "cohere2", "hidden_act": "silu", "rope_parameters": rope,
            "layer_norm_eps": m.number("attention.layer_norm_epsilon", 1e-5),
            "logit_scale": m.number("logit_scale", 0.0625), "sliding_window": window, "layer_types": types,
            "attention_bias": "blk.0.attn_q.bias" in names}


_COHERE_GLOBAL = {k: v for k, v in LLAMA_GLOBAL.items() if k != "output"}  # the unembedding is always tied

#: llama.cpp's ``command-r`` (Command-R, Aya 23) and ``cohere2`` (Command R7B, Command A): Llama's names with one
#: LayerNorm per parallel block, RoPE on interleaved pairs as HF (not permuted; the HF mapping reorders them to
#: halves). Cohere 2 has no QK-norm tensors.
GGUF = {"command-r": GGUFSpec(_gguf_config, _COHERE_GLOBAL, "model.layers.{}.",
                              {**LLAMA_ATTN, **QK_NORM, **GATED_MLP, "attn_norm": "input_layernorm"}),
        "cohere2": GGUFSpec(_gguf_config_cohere2, _COHERE_GLOBAL, "model.layers.{}.",
                            {**LLAMA_ATTN, **GATED_MLP, "attn_norm": "input_layernorm"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "cohere": CompatConfig("cohere", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                          logit_scale=0.5, attention_bias=True)),
    "cohere2": CompatConfig("cohere2", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                            logit_scale=0.5, sliding_window=TEST_WINDOW,
                                            layer_types=["sliding_attention", "full_attention"])),
}


FAMILY = Family("cohere", ("cohere", "cohere2"), cohere_config, cohere_state_dict_for, gguf=GGUF, tests=TESTS)
