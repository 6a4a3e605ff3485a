"""Config helpers every family shares: required keys, refused settings, checks every decoder needs.

Each is written once here; a family file imports them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ..config import Activation

StateDict = Mapping[str, torch.Tensor]


def _need(hf_cfg: Mapping[str, Any], key: str, arch: str) -> Any:
    if key not in hf_cfg or hf_cfg[key] is None:
        raise ValueError(f"{arch} config has no {key!r}; got keys {sorted(hf_cfg)}")
    return hf_cfg[key]


def _refuse(arch: str, hf_cfg: Mapping[str, Any], settings: tuple[tuple[str, Any, Any], ...]) -> None:
    """Raise naming the first setting whose value is not the one the converter reproduces."""
    for key, default, supported in settings:
        value = hf_cfg.get(key)
        value = default if value is None else value
        if value != supported:
            raise ValueError(f"{arch} {key}={value!r} is not supported by the converter (only {supported!r})")


def _decoder_checks(hf_cfg: Mapping[str, Any], arch: str, *, rotary_head_dim: int | None = None) -> None:
    """Settings every decoder's transformers mask and RoPE code reads that interp does not reproduce.

    ``is_causal: false`` turns transformers' causal mask bidirectional (``masking_utils``); a family whose
    attention splits heads as ``hidden_size / num_attention_heads`` but whose RoPE reads ``head_dim``
    (``rotary_head_dim`` given: the width the attention uses) would rotate a different width.

    Raises:
        ValueError: naming the key and its value.
    """
    if hf_cfg.get("is_causal", True) is False:
        raise ValueError(f"{arch} is_causal=False (bidirectional attention) is not supported; interp's {arch} is "
                         "causal")
    if rotary_head_dim is None:
        return
    head_dim = hf_cfg.get("head_dim")
    if head_dim is not None and head_dim != rotary_head_dim:
        raise ValueError(f"{arch} head_dim={head_dim!r} is not supported: transformers' {arch} attention uses "
                         f"{rotary_head_dim} per head while its RoPE would read head_dim")


def _where(hf_cfg: Mapping[str, Any]) -> str:
    """`` (in <folder>/config.json)`` when the config knows the folder or hub id it came from, else ``""``."""
    origin = hf_cfg.get("_name_or_path") or hf_cfg.get("name_or_path")
    return f" (in {origin}/config.json)" if origin else ""


def _positive(value: Any, what: str, arch: str, hf_cfg: Mapping[str, Any], *, integer: bool = False,
              zero: bool = False) -> float:
    """``value`` as a float after checking it is a finite number > 0 (an int > 0 when ``integer``; >= 0 when
    ``zero``).

    Raises:
        ValueError: naming ``what`` (the key), the value, the ``model_type`` and the file when known.
    """
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= 0 if zero else value > 0))
    if ok and integer and value != int(value):
        ok = False
    if not ok:
        need = "an integer >= 1" if integer else f"a finite number {'>=' if zero else '>'} 0"
        raise ValueError(f"model_type={arch!r}: {what}={value!r} must be {need}{_where(hf_cfg)}")
    return float(value)


#: The families whose dense MLP reads ``mlp_bias`` (the others hard-code no bias).
_MLP_BIAS_KEY = ("llama", "deepseek_v2", "seed_oss", "granite")


#: GPT-style ``activation_function`` / ``hidden_act`` values, as our activations (``gelu_pytorch_tanh`` and
#: ``gelu_new`` are both the tanh approximation).
GPT_ACTIVATIONS: dict[str, Activation] = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu",
                                          "relu": "relu"}
#: A Llama-style MLP's ``hidden_act`` on its gate -> the gated activation (SiLU: SwiGLU; GELU: GeGLU; ``gelu_new`` and
#: ``gelu_pytorch_tanh`` are both the tanh approximation).
GATED_ACTIVATIONS: dict[str, Activation] = {"silu": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh",
                                            "gelu_new": "geglu_tanh"}


def _activation(hf_cfg: Mapping[str, Any], key: str, default: str, arch: str,
                table: Mapping[str, Activation]) -> Activation:
    """Our activation for the config's ``key`` (``default`` when absent), through the family's ``table``.

    Raises:
        ValueError: a value the table does not hold, named with the supported ones.

    Example:
        >>> _activation({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act", "gelu", "phi", GPT_ACTIVATIONS)
        'gelu_new'
    """
    act = hf_cfg.get(key, default)
    if act not in table:
        raise ValueError(f"{arch} {key}={act!r} is not supported ({sorted(table)})")
    return table[act]


#: The sizes of :func:`tiny_hf_config`: a model small enough for a docstring example.
TINY_SIZES: dict[str, int] = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                              "intermediate_size": 96, "vocab_size": 50, "max_position_embeddings": 64}


def tiny_hf_config(model_type: str, **overrides: Any) -> dict[str, Any]:
    """A tiny HF config dict in Llama's key names (64 wide, 4 heads, 2 layers, 96-wide MLP, 50 tokens, 64
    positions) for ``model_type``, with ``overrides`` on top: the family docstrings' examples build from it.

    Args:
        model_type: the HF ``model_type``.
        overrides: keys to add or change.

    Returns:
        The ``config.json``-style dict.

    Example:
        >>> from interp.families import family_for, tiny_hf_config
        >>> family_for("qwen2").config(tiny_hf_config("qwen2")).n_layers
        2
    """
    return {"model_type": model_type, **TINY_SIZES, **overrides}


def llama_sizes(hf_cfg: Mapping[str, Any], arch: str, *, d_head: int | None = None,
                tie_default: bool = False) -> dict[str, Any]:
    """The size fields of a config that names them as Llama does (``hidden_size``, ``num_attention_heads``,
    ``num_key_value_heads``, ``head_dim``, ``intermediate_size``, ...), as :class:`ModelConfig` keywords.

    Args:
        hf_cfg: the HF config dict.
        arch: its ``model_type``, named in errors.
        d_head: the head width when the family derives it otherwise (default ``head_dim``, else
            ``hidden_size / num_attention_heads``).
        tie_default: the family's ``tie_word_embeddings`` default.

    Returns:
        ``n_layers``, ``d_model``, ``n_heads``, ``d_head``, ``n_kv_heads``, ``d_mlp``, ``d_vocab``, ``n_ctx``,
        ``unembed``, ``tie_embeddings`` and ``pad_token_id``.

    Raises:
        ValueError: a required key is missing (named, with the keys the config has).

    Example:
        >>> from interp.families._base import llama_sizes
        >>> llama_sizes({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 96,
        ...              "vocab_size": 50, "max_position_embeddings": 32}, "toy")["d_head"]
        16
    """
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    return dict(n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
                d_head=d_head or hf_cfg.get("head_dim") or d_model // n_heads,
                n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch),
                d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=_need(hf_cfg, "max_position_embeddings", arch),
                unembed=True, tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", tie_default)),
                pad_token_id=hf_cfg.get("pad_token_id"))
