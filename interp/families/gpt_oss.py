"""gpt-oss (OpenAI's open-weight mixture of experts) from its Hugging Face config and state dict, including the
MXFP4 expert weights of the safetensors release.

What the family needs of the core, each a config value:

* learned per-head attention sinks (``attn_sinks``: ``self_attn.sinks`` -> ``attn.sinks``);
* alternating banded (``sliding_attention``, window ``sliding_window``) and full layers (``layer_types``);
* YaRN RoPE as configured (``rope_parameters`` / ``rope_scaling``), rotating halves as Llama;
* biased q/k/v/o projections (``attention_bias``);
* RMSNorm that multiplies by its weight in float32 before rounding (the ``"gemma"`` precision policy: ``GptOssRMSNorm``
  computes ``weight * x`` on the float32 normalised input);
* the router ``top-k of (x W^T + b)`` then a softmax over the k chosen, which is ``router_score="softmax"`` with
  ``router_renormalize`` and ``router_logit_bias`` (see :mod:`interp.moe`);
* experts with biases (``expert_bias``) and the clamped SwiGLU (``activation="swiglu_clamped"``,
  ``swiglu_alpha`` / ``swiglu_limit``).

Weight layouts (transformers 5): ``mlp.experts.gate_up_proj`` ``[E, M, 2F]`` (stored transposed, gate and up
interleaved along the last axis: gate = columns 0, 2, 4 ..., up = 1, 3, 5 ...), ``gate_up_proj_bias`` ``[E, 2F]``
(interleaved the same way), ``down_proj`` ``[E, F, M]``, ``down_proj_bias`` ``[E, M]``; ``mlp.router.weight``
``[E, M]`` and ``mlp.router.bias`` ``[E]``. A GGUF file keeps gate and up apart; the GGUF reader below
(:func:`gguf_hf_tensors`) names them ``mlp.experts.gate_proj`` / ``up_proj`` ``[E, M, F]`` (and ``*_bias`` ``[E, F]``), which this
converter takes in place of ``gate_up_proj``.

The release stores the two expert projections in MXFP4 instead (``quantization_config.quant_method ==
"mxfp4"``): ``gate_up_proj_blocks`` ``[E, 2F, M/32, 16]`` uint8 (two 4-bit E2M1 codes a byte, low nibble first)
and ``gate_up_proj_scales`` ``[E, 2F, M/32]`` uint8 (a power-of-two exponent per 32 values, biased by 127);
``down_proj_blocks`` ``[E, M, F/32, 16]`` / ``down_proj_scales`` ``[E, M, F/32]``. :func:`mxfp4_dequantize`
decodes them exactly as transformers' ``convert_moe_packed_tensors`` does (every MXFP4 value is exact in
float32).

GGUF files (``general.architecture = "gpt-oss"``), as llama.cpp's ``convert_hf_to_gguf.py`` writes them, are
mapped onto the Hugging Face config and tensor names converted above.

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
  :func:`gpt_oss_state_dict` reads in place of ``gate_up_proj``.

Refused by name with the value: a RoPE scaling other than YaRN, an expert or router tensor whose shape the metadata
contradicts, and a tensor no gpt-oss model has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ..precision import Precision
from ._base import StateDict, _decoder_checks, _need
from ._family import TEST_WINDOW, CompatConfig, Family, fixed
from ._gguf import GGUFError, GGUFSpec, gguf_sizes
from ._gguf_experts import _Meta, _want
from ._positions import _check_layer_types, _rope
from ._tensors import _llama_ends, _llama_layer, _Source

__all__ = ["FP4_VALUES", "gguf_hf_config", "gguf_hf_tensors", "gpt_oss_config", "gpt_oss_state_dict",
           "mxfp4_dequantize"]

ARCH = "gpt_oss"

#: The 16 values of an E2M1 (FP4) code, by code (bit 3 is the sign), as the OCP MX format defines them.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

#: transformers' GptOssConfig defaults for the keys a config.json may leave out.
_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}


def gpt_oss_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a gpt-oss model from its HF config dict (``config.json`` / ``config.to_dict()``).

    Args:
        hf_cfg: the HF config; absent keys take ``GptOssConfig``'s defaults (window 128, YaRN with factor 32 on
            base 150000, layers alternating sliding and full from layer 0, ``swiglu_alpha`` 1.702,
            ``swiglu_limit`` 7.0, biased attention).

    Returns:
        the config: attention sinks, per-layer windows, YaRN RoPE, an MoE with router bias, expert biases and
        the clamped SwiGLU.

    Raises:
        ValueError: a missing size, a ``layer_types`` entry other than sliding / full attention or of the wrong
            length, an unsupported RoPE kind, a ``quantization_config`` other than MXFP4, or an invalid value
            (each named with its value).

    Example:
        >>> from interp.families.gpt_oss import gpt_oss_config
        >>> cfg = gpt_oss_config({"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64,
        ...                       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        ...                       "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
        ...                       "vocab_size": 50, "max_position_embeddings": 256, "sliding_window": 8})
        >>> cfg.sliding_window, cfg.attn_sinks, cfg.activation, cfg.rope_scaling["rope_type"]
        ([8, None], True, 'swiglu_clamped', 'yarn')
    """
    _decoder_checks(hf_cfg, ARCH)
    quant = hf_cfg.get("quantization_config")
    if quant and quant.get("quant_method") != "mxfp4":
        raise ValueError(f"{ARCH} quantization_config quant_method={quant.get('quant_method')!r} is not supported "
                         "(only 'mxfp4', the release's expert format)")
    n_layers = _need(hf_cfg, "num_hidden_layers", ARCH)
    d_model, n_heads = _need(hf_cfg, "hidden_size", ARCH), _need(hf_cfg, "num_attention_heads", ARCH)
    window = hf_cfg.get("sliding_window", 128)
    types = hf_cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                          for i in range(n_layers)]
    _check_layer_types(types, n_layers, ARCH)
    windows = [window if kind == "sliding_attention" and window else None for kind in types]
    params = hf_cfg.get("rope_parameters") or {}
    if not params.get("rope_type") and not hf_cfg.get("rope_scaling"):
        params = {**_DEFAULT_ROPE, **params}  # GptOssConfig's own default: YaRN
    theta, scaling = _rope(hf_cfg, ARCH, params, default_theta=150000.0)
    bias = bool(hf_cfg.get("attention_bias", True))
    d_expert = _need(hf_cfg, "intermediate_size", ARCH)
    head_dim = hf_cfg.get("head_dim", 64)
    return ModelConfig(
        n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=head_dim or d_model // n_heads,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, attn_sinks=True,
        d_vocab=_need(hf_cfg, "vocab_size", ARCH), n_ctx=_need(hf_cfg, "max_position_embeddings", ARCH),
        normalization="rms", norm_eps=hf_cfg.get("rms_norm_eps", 1e-5), precision=Precision.named("gemma"),
        positional="rotary", rotary_base=theta,
        rope_scaling=scaling, sliding_window=windows if any(w is not None for w in windows) else None,
        attn_bias=bias, out_bias=bias, mlp_bias=False, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
        activation="swiglu_clamped", swiglu_alpha=float(hf_cfg.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(hf_cfg.get("swiglu_limit", 7.0)), d_mlp=d_expert, d_expert=d_expert,
        n_experts=_need(hf_cfg, "num_local_experts", ARCH), n_experts_per_token=_need(hf_cfg, "num_experts_per_tok", ARCH),
        router_score="softmax", router_renormalize=True, router_logit_bias=True, expert_bias=True,
    )


def mxfp4_dequantize(blocks: torch.Tensor, scales: torch.Tensor, *, name: str = "blocks") -> torch.Tensor:
    """Decode MXFP4 weights to float32: ``blocks`` ``[..., G, 16]`` uint8 and ``scales`` ``[..., G]`` uint8 ->
    ``[..., G * 32]``.

    Byte ``j`` of a block holds value ``2j`` in its low nibble and ``2j + 1`` in its high one (E2M1 codes,
    :data:`FP4_VALUES`); a block's 32 values are multiplied by ``2 ** (scale - 127)``. This is transformers'
    ``convert_moe_packed_tensors`` without its final transpose.

    Args:
        blocks: the packed codes.
        scales: the biased exponents, one per block.
        name: the tensor named in errors.

    Returns:
        float32 values (exact: every MXFP4 value is a float32).

    Raises:
        ValueError: blocks that are not uint8 ``[..., G, 16]`` or scales whose shape is not the blocks' without
            the last axis, named with both shapes.

    Example:
        >>> import torch
        >>> from interp.families.gpt_oss import mxfp4_dequantize
        >>> blocks = torch.tensor([[[0x21] + [0] * 15]], dtype=torch.uint8)  # codes 1 (0.5) then 2 (1.0)
        >>> mxfp4_dequantize(blocks, torch.tensor([[128]], dtype=torch.uint8))[0, :3].tolist()  # times 2 ** 1
        [1.0, 2.0, 0.0]
    """
    if blocks.dtype != torch.uint8 or blocks.dim() < 2 or blocks.shape[-1] != 16:
        raise ValueError(f"{name}: MXFP4 blocks must be uint8 [..., groups, 16], got {blocks.dtype} "
                         f"{list(blocks.shape)}")
    if tuple(scales.shape) != tuple(blocks.shape[:-1]):
        raise ValueError(f"{name}: MXFP4 scales have shape {list(scales.shape)}, the blocks "
                         f"{list(blocks.shape)} need {list(blocks.shape[:-1])}")
    out_shape = (*blocks.shape[:-2], blocks.shape[-2] * 32)
    if blocks.is_meta:  # the shape check of a folder before anything is read
        return torch.empty(out_shape, dtype=torch.float32, device="meta")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()  # [..., G, 16, 2]: low nibble first
    values = lut[codes].flatten(-2)  # [..., G, 32]
    exponents = scales.to(torch.int32) - 127  # [..., G]
    return torch.ldexp(values, exponents[..., None]).reshape(out_shape)  # [..., G*32]


def _experts(src: _Source, mlp: str, name: str, rows: int, cols: int, E: int) -> torch.Tensor:
    """Expert projection ``name`` as transformers holds it (``[E, cols, rows]``: gate_up ``[E, M, 2F]``, down
    ``[E, F, M]``), from the plain tensor or from its MXFP4 blocks and scales."""
    key = mlp + f"experts.{name}"
    if src.has(key + "_blocks"):
        blocks, scales = src(key + "_blocks"), src(key + "_scales")
        if tuple(blocks.shape[:2]) != (E, rows) or blocks.shape[2] * 32 != cols:
            raise ValueError(f"{ARCH} tensor {src.prefix + key}_blocks has shape {list(blocks.shape)}, the config "
                             f"implies [{E}, {rows}, {cols // 32}, 16] ({cols} values a row in blocks of 32)")
        return mxfp4_dequantize(blocks, scales, name=src.prefix + key + "_blocks").transpose(1, 2)  # [E, cols, rows]
    w = src(key)
    if tuple(w.shape) != (E, cols, rows):
        raise ValueError(f"{ARCH} tensor {src.prefix + key!r} has shape {list(w.shape)}, the config implies "
                         f"{[E, cols, rows]}")
    return w


def gpt_oss_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF gpt-oss one (``GptOssForCausalLM`` keys; experts plain or MXFP4).

    Args:
        hf_sd: the HF state dict.
        cfg: from :func:`gpt_oss_config`.

    Returns:
        interp's tensors by name (experts de-interleaved and transposed to ``[E, F, M]`` / ``[E, M, F]``).

    Raises:
        ValueError: a tensor the conversion needs is absent, or an expert tensor's shape disagrees with the
            config (named with both shapes).
    """
    src = _Source(hf_sd, ("model.",), ARCH)
    E, M = cfg.n_experts, cfg.d_model
    F_ = cfg.d_expert if cfg.d_expert is not None else cfg.d_mlp  # set for every MoE config
    out = _llama_ends(src)
    for i in range(cfg.n_layers):
        h, b, layer = _llama_layer(src, cfg, i)
        out.update(layer)
        out[b + "attn.sinks"] = src(h + "self_attn.sinks")
        mlp = h + "mlp."
        out[b + "mlp.W_router"] = src(mlp + "router.weight")
        out[b + "mlp.b_router"] = src(mlp + "router.bias")
        if src.has(mlp + "experts.gate_proj"):  # a GGUF file (gguf_hf_tensors): gate and up apart
            out[b + "mlp.W_gate"] = _experts(src, mlp, "gate_proj", F_, M, E).transpose(1, 2)  # [E, F, M]
            out[b + "mlp.W_in"] = _experts(src, mlp, "up_proj", F_, M, E).transpose(1, 2)  # [E, F, M]
            out[b + "mlp.b_gate"] = src(mlp + "experts.gate_proj_bias")  # [E, F]
            out[b + "mlp.b_in"] = src(mlp + "experts.up_proj_bias")  # [E, F]
        else:
            gate_up = _experts(src, mlp, "gate_up_proj", 2 * F_, M, E)  # [E, M, 2F], gate and up interleaved
            out[b + "mlp.W_gate"] = gate_up[:, :, 0::2].transpose(1, 2)  # [E, F, M]
            out[b + "mlp.W_in"] = gate_up[:, :, 1::2].transpose(1, 2)  # [E, F, M]
            gate_up_bias = src(mlp + "experts.gate_up_proj_bias")  # [E, 2F]
            out[b + "mlp.b_gate"], out[b + "mlp.b_in"] = gate_up_bias[:, 0::2], gate_up_bias[:, 1::2]
        out[b + "mlp.W_out"] = _experts(src, mlp, "down_proj", M, F_, E).transpose(1, 2)  # [E, F, M] -> [E, M, F]
        out[b + "mlp.b_out"] = src(mlp + "experts.down_proj_bias")  # [E, M]
    if not cfg.tie_embeddings:
        if "lm_head.weight" not in hf_sd:
            raise ValueError(f"{ARCH} state dict has no 'lm_head.weight' and tie_word_embeddings is False "
                             "(pass a GptOssForCausalLM model, not the bare GptOssModel)")
        out["W_U.weight"] = hf_sd["lm_head.weight"]
        out["W_U.bias"] = torch.zeros(cfg.d_vocab, dtype=hf_sd["lm_head.weight"].dtype)
    return out


# --- GGUF files (see the module docstring) ------------------------------------------------------------
GGUF_ARCH = "gpt-oss"

_GGUF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
_GGUF_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
               "post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.router"}
_GGUF_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}


def gguf_hf_config(meta: Mapping[str, Any], tensor_names: set[str], *, source: str = "GGUF") -> dict[str, Any]:
    """The HF ``gpt_oss`` config dict of a gpt-oss GGUF file.

    Args:
        meta: the file's metadata.
        tensor_names: its tensor names (``output.weight`` absent means tied embeddings).
        source: named in errors.

    Returns:
        a ``config.json``-style dict for :func:`gpt_oss_config`.

    Raises:
        GGUFError: a missing or malformed key, a RoPE scaling other than YaRN, or a top-k above the expert count
            (each named with its value).

    Example:
        >>> from interp.families.gpt_oss import gguf_hf_config
        >>> meta = {"general.architecture": "gpt-oss", "gpt-oss.block_count": 2, "gpt-oss.context_length": 64,
        ...         "gpt-oss.embedding_length": 64, "gpt-oss.feed_forward_length": 32, "gpt-oss.vocab_size": 50,
        ...         "gpt-oss.attention.head_count": 4, "gpt-oss.attention.key_length": 16,
        ...         "gpt-oss.expert_count": 4, "gpt-oss.expert_used_count": 2, "gpt-oss.attention.sliding_window": 8,
        ...         "gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 4.0,
        ...         "gpt-oss.rope.scaling.original_context_length": 16}
        >>> cfg = gguf_hf_config(meta, {"output.weight"})
        >>> cfg["model_type"], cfg["layer_types"], cfg["rope_parameters"]["rope_type"]
        ('gpt_oss', ['sliding_attention', 'full_attention'], 'yarn')
    """
    m = _Meta(meta, GGUF_ARCH, source)
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


def gguf_hf_tensors(name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any], *,
                    source: str = "GGUF") -> dict[str, torch.Tensor]:
    """The HF tensor one gpt-oss GGUF tensor becomes.

    Args:
        name: the GGUF tensor name (``blk.1.ffn_up_exps.weight``).
        w: its values in torch order (GGUF dims reversed), real or on the meta device.
        hf_cfg: :func:`gguf_hf_config` output.
        source: named in errors.

    Returns:
        ``{hf_name: tensor}``; experts transposed to HF's ``[E, in, out]``.

    Raises:
        GGUFError: a tensor no gpt-oss model has, or an expert / router tensor whose shape the metadata
            contradicts (tensor, shape and metadata named).

    Example:
        >>> import torch
        >>> from interp.families.gpt_oss import gguf_hf_tensors
        >>> cfg = {"num_local_experts": 4, "intermediate_size": 6, "hidden_size": 8}
        >>> {k: tuple(v.shape) for k, v in gguf_hf_tensors("blk.0.ffn_up_exps.weight", torch.zeros(4, 6, 8), cfg).items()}
        {'model.layers.0.mlp.experts.up_proj': (4, 8, 6)}
    """
    if name in _GGUF_GLOBAL:
        return {_GGUF_GLOBAL[name]: w}
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
    if kind in _GGUF_EXPERTS:
        out_width, in_width = (M, F) if kind == "ffn_down_exps" else (F, M)
        part = _GGUF_EXPERTS[kind]
        if suffix == "bias":
            _want(w, name, (E, out_width), sizes, source)
            return {h + f"mlp.experts.{part}_bias": w}
        _want(w, name, (E, out_width, in_width), sizes, source)
        return {h + f"mlp.experts.{part}": w.transpose(1, 2)}  # [E, out, in] -> HF's [E, in, out]
    if kind in _GGUF_BLOCK:
        return {h + f"{_GGUF_BLOCK[kind]}.{suffix}": w}
    raise GGUFError(f"{source}: tensor {name!r} has no place in a 'gpt-oss' decoder")


#: ``gpt-oss``: every tensor named by :func:`gguf_hf_tensors`.
GPT_OSS = GGUFSpec(lambda m, names: gguf_hf_config(m.meta, names, source=m.source), special=gguf_hf_tensors,
                   experts=True)


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "gpt_oss": CompatConfig("gpt_oss", dict(hidden_size=72, intermediate_size=32, num_attention_heads=9, num_key_value_heads=3,
                                            head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=TEST_WINDOW,
                                            layer_types=["sliding_attention", "full_attention"], swiglu_limit=1.5,
                                            rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                             "original_max_position_embeddings": 16})),
}


FAMILY = Family("gpt_oss", ("gpt_oss",), gpt_oss_config, fixed(gpt_oss_state_dict), title="gpt-oss",
                gguf={"gpt-oss": GPT_OSS}, tests=TESTS)
