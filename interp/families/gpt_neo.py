"""GPT-Neo: a config function, a state-dict function and its family record (neither imports ``transformers``).

GPT-Neo is GPT-2 with three differences, each a config value: its layers alternate global and local attention
(``attention_layers``; a local layer sees the last ``window_size`` keys, which is ``sliding_window`` per layer),
its scores are not scaled (``attn_scale=1``: no ``1 / sqrt(d_head)``), and Q, K, V are separate bias-free
``nn.Linear`` projections (stacked into ``W_qkv``). Positions are learned (``wpe``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config import ModelConfig
from ._base import StateDict, _decoder_checks, _need
from ._family import TEST_WINDOW, CompatConfig, Family, fixed
from ._tensors import _lm_head, _Source

_ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu",
                "silu": "silu"}


def _attention_layers(hf_cfg: Mapping[str, Any], arch: str, n_layers: int) -> list[str]:
    """Each layer's attention kind, from ``attention_layers`` or the run-length ``attention_types``."""
    types = hf_cfg.get("attention_types") or [[["global", "local"], 12]]
    layers = hf_cfg.get("attention_layers")  # what transformers builds from attention_types
    if not layers:
        layers = [kind for kinds, repeat in types for _ in range(repeat) for kind in kinds]
    layers = list(layers)
    if len(layers) != n_layers or any(kind not in ("global", "local") for kind in layers):
        raise ValueError(f"{arch} attention_layers={layers!r} must give 'global' or 'local' for each of the "
                         f"num_layers={n_layers} layers")
    return layers


def gpt_neo_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-Neo decoder from its HF config dict.

    Args:
        hf_cfg: the HF config as a dict (``model_type`` ``"gpt_neo"``).

    Returns:
        A config with a window on the local layers and unscaled attention.

    Raises:
        ValueError: an unknown attention kind or a count that disagrees with ``num_layers``, an unsupported
            activation, or a missing key.

    Example:
        >>> from interp.families.gpt_neo import gpt_neo_config
        >>> cfg = gpt_neo_config({"model_type": "gpt_neo", "hidden_size": 48, "num_heads": 6, "num_layers": 2,
        ...                       "vocab_size": 50, "max_position_embeddings": 64, "window_size": 8,
        ...                       "attention_types": [[["global", "local"], 1]]})
        >>> cfg.sliding_window, cfg.attn_scale
        ([None, 8], 1.0)
    """
    arch = "gpt_neo"
    _decoder_checks(hf_cfg, arch)
    n_layers = _need(hf_cfg, "num_layers", arch)
    layers = _attention_layers(hf_cfg, arch, n_layers)
    window = hf_cfg.get("window_size", 256)
    act = hf_cfg.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise ValueError(f"{arch} activation_function={act!r} is not supported ({sorted(_ACTIVATIONS)})")
    d_model = _need(hf_cfg, "hidden_size", arch)
    return ModelConfig(
        n_layers=n_layers, d_model=d_model, n_heads=_need(hf_cfg, "num_heads", arch),
        d_mlp=hf_cfg.get("intermediate_size") or 4 * d_model, activation=_ACTIVATIONS[act],  # type: ignore[arg-type]
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
        normalization="pre", norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5), positional="learned",
        sliding_window=[window if kind == "local" else None for kind in layers], attn_scale=1.0,
        attn_bias=False, out_bias=True, mlp_bias=True, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gpt_neo_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-Neo one, whose separate q, k and v projections ``W_qkv`` stacks.

    Args:
        hf_sd: ``GPTNeoForCausalLM`` or ``GPTNeoModel`` weights.
        cfg: from :func:`gpt_neo_config`.

    Returns:
        Our tensors by name.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).

    Example:
        >>> from interp.families.gpt_neo import gpt_neo_config, gpt_neo_state_dict
        >>> import transformers
        >>> hf = transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(
        ...     hidden_size=48, num_heads=6, num_layers=2, vocab_size=50, max_position_embeddings=16,
        ...     attention_types=[[["global", "local"], 1]], window_size=4))
        >>> sd = gpt_neo_state_dict(hf.state_dict(), gpt_neo_config(hf.config.to_dict()))
        >>> sd["blocks.1.attn.W_qkv.weight"].shape
        torch.Size([144, 48])
    """
    src = _Source(hf_sd, ("transformer.",), "GPT-Neo")
    out = {"W_E.weight": src("wte.weight"), "W_pos.weight": src("wpe.weight"),
           "ln_final.weight": src("ln_f.weight"), "ln_final.bias": src("ln_f.bias")}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        qkv = [src(h + f"attn.attention.{n}_proj.weight") for n in ("q", "k", "v")]
        out[b + "attn.W_qkv.weight"] = torch.cat(qkv)  # [3 H D, M]
        for ours, theirs in (("attn.W_O", "attn.attention.out_proj"), ("mlp.W_in", "mlp.c_fc"),
                             ("mlp.W_out", "mlp.c_proj"), ("ln1", "ln_1"), ("ln2", "ln_2")):
            for kind in ("weight", "bias"):
                out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    out.update(_lm_head(hf_sd, src, cfg, "GPT-Neo"))
    return out


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "gpt_neo": CompatConfig("gpt_neo", dict(hidden_size=80, intermediate_size=96, num_heads=5, num_layers=2,
                                            max_position_embeddings=64, window_size=TEST_WINDOW,
                                            attention_types=[[["local", "global"], 1]])),
}


FAMILY = Family("gpt_neo", ("gpt_neo",), gpt_neo_config, fixed(gpt_neo_state_dict), title="GPT-Neo", tests=TESTS)
