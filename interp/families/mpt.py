"""MPT: a config function, a state-dict function and its family record (neither imports ``transformers``).

MPT as transformers runs it: ALiBi with the slopes of ``build_mpt_alibi_tensor`` (``alibi_bias_max=8``: the
same numbers as :func:`interp.config.alibi_slopes`), LayerNorms without bias (stored with bias 0), no bias on any
projection, an exact-GELU MLP of ``4 * d_model``, a fused ``Wqkv`` already in ``[q | k | v]`` order, optional
``softmax_scale`` (``attn_scale``), tied unembedding.

Every setting transformers' MPT does not apply as MosaicML's own code would (it ignores ``qk_ln``,
``alibi=False``, another ``alibi_bias_max``, ``expansion_ratio``, ``no_bias=False``, ``logit_scale``,
multi-query attention) is refused by name rather than converted one way or the other; so is ``clip_qkv``, which
interp's attention does not reproduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig, alibi_slopes
from ._base import StateDict, _decoder_checks, _need, _refuse
from ._family import CompatConfig, Family, fixed
from ._gguf import TOKEN_IDS, GGUFSpec, HFConfig, Meta, fixed_heads_sizes
from ._tensors import _lm_head, _shaped, _Source

#: attn_config settings: (key, default, the one value converted).
_ATTN_SETTINGS = (("clip_qkv", None, None), ("qk_ln", False, False), ("alibi", True, True),
                  ("alibi_bias_max", 8, 8), ("prefix_lm", False, False), ("attn_uses_sequence_id", False, False),
                  ("attn_type", "multihead_attention", "multihead_attention"))


def mpt_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an MPT decoder from its HF config dict.

    Args:
        hf_cfg: the HF config as a dict (``model_type`` ``"mpt"``); ``attn_config`` a dict or an object.

    Returns:
        A config with ALiBi slopes for ``n_heads`` heads and no biases.

    Raises:
        ValueError: a setting listed in the module docstring at a value other than the converted one (named
            with its value, e.g. ``attn_config.clip_qkv=8.0``), or a missing key.

    Example:
        >>> from interp.families.mpt import mpt_config
        >>> cfg = mpt_config({"model_type": "mpt", "d_model": 48, "n_heads": 6, "n_layers": 2, "vocab_size": 50,
        ...                   "max_seq_len": 64, "attn_config": {"softmax_scale": 0.3}})
        >>> cfg.attn_scale, cfg.attn_bias, cfg.activation, len(cfg.alibi_slopes)
        (0.3, False, 'gelu', 6)
    """
    arch = "mpt"
    _decoder_checks(hf_cfg, arch)
    attn = hf_cfg.get("attn_config") or {}
    if not isinstance(attn, Mapping):
        attn = attn.to_dict() if hasattr(attn, "to_dict") else vars(attn)
    _refuse(f"{arch} attn_config:", attn, _ATTN_SETTINGS)
    _refuse(arch, hf_cfg, (("expansion_ratio", 4, 4), ("no_bias", True, True), ("logit_scale", None, None)))
    d_model = hf_cfg.get("d_model") or _need(hf_cfg, "hidden_size", arch)
    n_heads = hf_cfg.get("n_heads") or _need(hf_cfg, "num_attention_heads", arch)
    if d_model % n_heads:
        raise ValueError(f"{arch} d_model={d_model} is not divisible by n_heads={n_heads}")
    scale = attn.get("softmax_scale")
    return ModelConfig(
        n_layers=hf_cfg.get("n_layers") or _need(hf_cfg, "num_hidden_layers", arch), d_model=d_model,
        n_heads=n_heads, d_mlp=4 * d_model, activation="gelu", d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=hf_cfg.get("max_seq_len") or _need(hf_cfg, "max_position_embeddings", arch), normalization="pre",
        norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5), positional="none", alibi_slopes=alibi_slopes(n_heads),
        attn_scale=None if scale is None else float(scale), attn_bias=False, out_bias=False, mlp_bias=False,
        unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def mpt_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF MPT one (``MptForCausalLM`` or ``MptModel`` keys); LayerNorm biases are 0.

    Args:
        hf_sd: the HF state dict.
        cfg: the config :func:`mpt_config` made.

    Returns:
        Our tensors by name.

    Raises:
        ValueError: a tensor is absent or ``Wqkv``'s shape disagrees with the config (both named).

    Example:
        >>> from interp.families.mpt import mpt_config, mpt_state_dict
        >>> import transformers
        >>> hf = transformers.MptForCausalLM(transformers.MptConfig(d_model=48, n_heads=6, n_layers=1,
        ...                                                         vocab_size=50, max_seq_len=16))
        >>> sd = mpt_state_dict(hf.state_dict(), mpt_config(hf.config.to_dict()))
        >>> float(sd["blocks.0.ln1.bias"].abs().max())
        0.0
    """
    src = _Source(hf_sd, ("transformer.",), "MPT")
    M = cfg.d_model
    embed = src("wte.weight")
    zero = torch.zeros(M, dtype=embed.dtype)
    out = {"W_E.weight": embed, "ln_final.weight": src("norm_f.weight"), "ln_final.bias": zero.clone()}
    for i in range(cfg.n_layers):
        h, b = f"blocks.{i}.", f"blocks.{i}."
        out[b + "attn.W_qkv.weight"] = _shaped(src, h + "attn.Wqkv.weight", (3 * M, M))  # [q | k | v] already
        for ours, theirs in (("attn.W_O", "attn.out_proj"), ("mlp.W_in", "ffn.up_proj"),
                             ("mlp.W_out", "ffn.down_proj")):
            out[b + f"{ours}.weight"] = src(h + f"{theirs}.weight")
        for ours, theirs in (("ln1", "norm_1"), ("ln2", "norm_2")):
            out[b + f"{ours}.weight"], out[b + f"{ours}.bias"] = src(h + f"{theirs}.weight"), zero.clone()
    out.update(_lm_head(hf_sd, src, cfg, "MPT"))
    return out


# --- GGUF (llama.cpp) ------------------------------------------------------------------------------------------
def _gguf_config(m: Meta, names: set[str]) -> HFConfig:
    """GGUF metadata -> MPT's HF config: ``max_alibi_bias`` and ``attention.clamp_kqv`` become ``attn_config``'s
    ``alibi_bias_max`` / ``clip_qkv``, which the HF mapping refuses by name unless they are MPT's defaults."""
    sizes = fixed_heads_sizes(m, names, "MPT")
    bias_max = m.get("max_alibi_bias", 8.0)
    attn = {"alibi": bool(bias_max), "alibi_bias_max": bias_max, "clip_qkv": m.get("attention.clamp_kqv")}
    return {"model_type": "mpt", "d_model": sizes["hidden_size"], "n_heads": sizes["num_attention_heads"],
            "n_layers": sizes["num_hidden_layers"], "vocab_size": sizes["vocab_size"],
            "max_seq_len": sizes["max_position_embeddings"], "expansion_ratio": sizes["intermediate_size"] / sizes["hidden_size"],
            "layer_norm_epsilon": m.number("attention.layer_norm_epsilon", 1e-5), "attn_config": attn,
            "tie_word_embeddings": sizes["tie_word_embeddings"], **{k: sizes[k] for k in TOKEN_IDS}}


#: llama.cpp's ``mpt``: the HF names, nothing changed (``Wqkv`` is already ``[q | k | v]``; no biases).
GGUF = {"mpt": GGUFSpec(_gguf_config, {
    "token_embd": "transformer.wte", "output_norm": "transformer.norm_f", "output": "lm_head"}, "transformer.blocks.{}.", {
        "attn_norm": "norm_1", "attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "ffn_norm": "norm_2",
        "ffn_up": "ffn.up_proj", "ffn_down": "ffn.down_proj"})}


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "mpt": CompatConfig("mpt", dict(d_model=72, n_heads=6, n_layers=2, max_seq_len=64)),
    "mpt_12_heads": CompatConfig("mpt", dict(d_model=96, n_heads=12, n_layers=2, max_seq_len=64,
                                             attn_config={"softmax_scale": 0.2})),
}


FAMILY = Family("mpt", ("mpt",), mpt_config, fixed(mpt_state_dict), title="MPT", gguf=GGUF, tests=TESTS)
