"""Gemma 1 / 2 / 3 text decoders: RMSNorm ``x * (1 + w)`` (stored as ``1 + w``; its weight multiplies in float32,
the ``"gemma"`` precision policy), embeddings times ``sqrt(d_model)``, gated tanh-GELU MLP, tied unembedding. Gemma 2 adds
sandwich norms, ``query_pre_attn_scalar``, soft-caps and alternating sliding layers; Gemma 3 adds QK-norm and a
separate RoPE base for its local layers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import Activation, ModelConfig
from ..precision import Precision
from ._base import StateDict, _decoder_checks, _need, _refuse, llama_sizes
from ._family import TEST_WINDOW, CompatConfig, Family, fixed
from ._gguf import (
    GATED_MLP,
    LLAMA_ATTN,
    LLAMA_BLOCK,
    LLAMA_GLOBAL,
    QK_NORM,
    GGUFSpec,
    HFConfig,
    Meta,
    gguf_sizes,
    no_window,
    pattern_windows,
    rope_parameters,
    rotary_dim,
)
from ._positions import _rope, sliding_windows
from ._tensors import (
    _dense_weights,
    _llama_attention,
    _lm_head,
    _Source,
)


def gemma_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Gemma, Gemma 2 or Gemma 3 text decoder from its HF config dict.

    Raises:
        ValueError: an unsupported setting (activation, bidirectional attention, RoPE kind on the local layers),
            or a missing key.

    Example:
        >>> from interp.families.gemma import gemma_config
        >>> from interp.families import tiny_hf_config
        >>> cfg = gemma_config(tiny_hf_config("gemma2", head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
        ...     attn_logit_softcapping=50.0, final_logit_softcapping=30.0, layer_types=["sliding_attention",
        ...     "full_attention"]))
        >>> cfg.sliding_window, cfg.attn_softcap, cfg.sublayer_norm
        ([8, None], 50.0, 'sandwich')
    """
    mtype = hf_cfg.get("model_type", "gemma")
    arch = mtype
    _decoder_checks(hf_cfg, arch)
    act = hf_cfg.get("hidden_activation") or hf_cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if mtype == "gemma" and act == "gelu":
        act = "gelu_pytorch_tanh"  # transformers reads Gemma 1's legacy "gelu" as the tanh approximation
    acts: dict[str, Activation] = {"gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu": "geglu"}
    if act not in acts:
        raise ValueError(f"{arch} hidden_activation={act!r} is not supported ({sorted(acts)})")
    _refuse(arch, hf_cfg, (("use_bidirectional_attention", False, False),))
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    d_head = hf_cfg.get("head_dim") or d_model // n_heads
    rope = hf_cfg.get("rope_parameters") or {}
    local_base = None
    if mtype == "gemma3_text" and "full_attention" in rope:
        theta, scaling = _rope(hf_cfg, arch, rope["full_attention"])
        local_theta, local_scaling = _rope(hf_cfg, arch, rope.get("sliding_attention") or {"rope_type": "default"})
        if local_scaling is not None:
            raise ValueError(f"{arch} sliding_attention rope_type={local_scaling['rope_type']!r} is not supported "
                             "(local layers rotate with plain RoPE)")
        local_base = local_theta
    else:
        theta, scaling = _rope(hf_cfg, arch)
    windows = sliding_windows(hf_cfg, arch) if mtype != "gemma" else None
    if local_base is not None and windows is None:
        local_base = None
    later = mtype != "gemma"
    scalar = hf_cfg.get("query_pre_attn_scalar") if later else None
    attn_bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
        **llama_sizes(hf_cfg, arch, d_head=d_head, tie_default=True), activation=acts[act], normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=theta, rope_scaling=scaling,
        local_rotary_base=local_base, sliding_window=windows, attn_scale=None if scalar is None else float(scalar) **
        -0.5, attn_softcap=hf_cfg.get("attn_logit_softcapping") if mtype == "gemma2" else None,
        final_softcap=hf_cfg.get("final_logit_softcapping") if later else None, qk_norm="head" if mtype == "gemma3_text"
        else "none", sublayer_norm="sandwich" if later else "input", embed_scale=d_model ** 0.5,
        precision=Precision.named("gemma"), attn_bias=attn_bias, out_bias=attn_bias, mlp_bias=False
    )


def gemma_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Gemma / Gemma 2 / Gemma 3 text one; every RMSNorm weight ``w`` becomes ``1 + w``.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.language_model.", "model."), "Gemma")

    def norm(key: str) -> torch.Tensor:
        return src(key) + 1  # Gemma's RMSNorm scales by (1 + w)

    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": norm("norm.weight")}
    sandwich = cfg.sublayer_norm == "sandwich"
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out.update(_llama_attention(src, h, b, cfg))
        out[b + "ln1.weight"] = norm(h + "input_layernorm.weight")
        if sandwich:
            out[b + "ln1_post.weight"] = norm(h + "post_attention_layernorm.weight")
            out[b + "ln2.weight"] = norm(h + "pre_feedforward_layernorm.weight")
            out[b + "ln2_post.weight"] = norm(h + "post_feedforward_layernorm.weight")
        else:
            out[b + "ln2.weight"] = norm(h + "post_attention_layernorm.weight")
        if cfg.qk_norm != "none":
            out[b + "attn.q_norm.weight"] = norm(h + "self_attn.q_norm.weight")
            out[b + "attn.k_norm.weight"] = norm(h + "self_attn.k_norm.weight")
        out.update(_dense_weights(src, h + "mlp.", b + "mlp.", cfg))
    out.update(_lm_head(hf_sd, src, cfg, "Gemma"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(model_type: str) -> Callable[[Meta, set[str]], HFConfig]:
    """GGUF metadata -> the HF config of ``model_type`` (llama.cpp's ``gemma`` / ``gemma2`` / ``gemma3``): Gemma 2 slides
    on even layers and Gemma 3 on five layers of six (llama.cpp's fixed patterns), Gemma 3's local layers rotate with
    base 10000; ``query_pre_attn_scalar`` is not in the file and is taken as llama.cpp does: the head dim, except
    ``d_model / n_heads`` for the 27B shapes (46 layers for Gemma 2, 62 for Gemma 3)."""
    def config(m: Meta, names: set[str]) -> HFConfig:
        cfg = gguf_sizes(m, names)
        rotary_dim(m, cfg["head_dim"])
        n_layers = cfg["num_hidden_layers"]
        cfg.update(model_type=model_type, hidden_activation="gelu_pytorch_tanh",
                   rms_norm_eps=m.number("attention.layer_norm_rms_epsilon", 1e-6),
                   attention_bias="blk.0.attn_q.bias" in names)
        if model_type == "gemma":
            no_window(m)
            return {**cfg, "rope_parameters": rope_parameters(m, names, 10000.0)}
        # llama.cpp's attention scale: 1/sqrt(head_dim), except the 27B shapes (by layer count, as llama.cpp).
        big = n_layers == (46 if model_type == "gemma2" else 62)
        cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"] if big else cfg["head_dim"]
        if model_type == "gemma2":
            window, types = pattern_windows(m, n_layers, 2)
            return {**cfg, "rope_parameters": rope_parameters(m, names, 10000.0), "sliding_window": window,
                    "layer_types": types, "attn_logit_softcapping": m.number("attn_logit_softcapping", 50.0),
                    "final_logit_softcapping": m.number("final_logit_softcapping", 30.0)}
        window, types = pattern_windows(m, n_layers, 6)
        local = {"rope_type": "default", "rope_theta": m.number("rope.freq_base_swa", 10000.0)}
        return {**cfg, "rope_parameters": {"full_attention": rope_parameters(m, names, 1_000_000.0),
                                           "sliding_attention": local},
                "sliding_window": window, "layer_types": types, "attn_logit_softcapping": None,
                "final_logit_softcapping": m.number("final_logit_softcapping", None)}
    return config


def _gguf_norm(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
    # llama.cpp's converter adds 1 to every tensor whose HF name ends in "norm.weight".
    return w - 1 if hf_name.endswith("norm.weight") else w


#: Gemma never writes ``output`` (its unembedding is the embedding).
_GLOBAL = {k: v for k, v in LLAMA_GLOBAL.items() if k != "output"}
_SANDWICH_BLOCK = {**LLAMA_ATTN, **GATED_MLP, "attn_norm": "input_layernorm",
                   "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                   "post_ffw_norm": "post_feedforward_layernorm"}
#: llama.cpp's ``gemma`` / ``gemma2`` / ``gemma3``: every RMSNorm weight is stored as ``1 + w`` (llama.cpp's
#: RMSNorm has no ``1 +``); undone here, the Gemma converter adds it back. Gemma 3 adds QK-norm.
GGUF = {"gemma": GGUFSpec(_gguf_config("gemma"), _GLOBAL, "model.layers.{}.", LLAMA_BLOCK, _gguf_norm),
        "gemma2": GGUFSpec(_gguf_config("gemma2"), _GLOBAL, "model.layers.{}.", _SANDWICH_BLOCK, _gguf_norm),
        "gemma3": GGUFSpec(_gguf_config("gemma3_text"), LLAMA_GLOBAL, "model.layers.{}.",
                           {**_SANDWICH_BLOCK, **QK_NORM}, _gguf_norm)}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "gemma": CompatConfig("gemma", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                        head_dim=16)),
    "gemma2": CompatConfig("gemma2", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5, num_key_value_heads=1,
                                          head_dim=16, sliding_window=TEST_WINDOW, query_pre_attn_scalar=12,
                                          attn_logit_softcapping=3.0, final_logit_softcapping=4.0)),
    "gemma3_text": CompatConfig("gemma3_text", dict(hidden_size=80, intermediate_size=96, num_attention_heads=5,
                                                    num_key_value_heads=1, head_dim=16, sliding_window=TEST_WINDOW,
                                                    query_pre_attn_scalar=12, final_logit_softcapping=4.0,
                                                    layer_types=["sliding_attention", "full_attention"],
                                                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                                        "rope_theta": 10000.0},
                                                                     "sliding_attention": {"rope_type": "default",
                                                                                           "rope_theta": 100.0}})),
}


FAMILY = Family("gemma", ("gemma", "gemma2", "gemma3_text"), gemma_config, fixed(gemma_state_dict),
                gguf=GGUF, title="Gemma", headline=True, tests=TESTS)
