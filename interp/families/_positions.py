"""Positions of a HF config, shared by the families: RoPE parameters and scaling, per-layer sliding windows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..config import Activation
from ._base import _activation, _decoder_checks, _need, _positive, _where

#: How each family's transformers classes decide which layers slide, read from their config and modelling code:
#: ``"every"`` (one window for all layers: Mistral, Mixtral, Phi-3; Qwen3-MoE when ``use_sliding_window``),
#: ``"above_max_window_layers"`` (Qwen2 / Qwen3: ``layer_types``, else layers from ``max_window_layers`` on, when
#: ``use_sliding_window``), ``"even_below_max_window_layers"`` (Qwen2-MoE: ``layer_types``, else the even layers
#: below ``max_window_layers``), ``"alternate"`` (Gemma 2: ``layer_types``, else the even layers) and
#: ``"pattern"`` (Gemma 3: ``layer_types``, else all but every ``sliding_window_pattern``-th), ``"layer_types"``
#: (Ministral: ``layer_types``, else every layer) and ``"every_fourth_full"`` (OLMo 3: ``layer_types``, else all
#: but every 4th layer). Starcoder 2 slides every layer. Any other family's
#: attention never slides in transformers' eager / SDPA paths (Llama, OLMoE, DeepSeek), whatever its config says.
WINDOW_RULES: dict[str, str] = {
    "mistral": "every", "mixtral": "every", "phi3": "every", "qwen3_moe": "every",
    "qwen2": "above_max_window_layers",
    "qwen2_moe": "even_below_max_window_layers", "gemma2": "alternate", "gemma3_text": "pattern",
    "ministral": "layer_types", "olmo3": "every_fourth_full", "starcoder2": "every",
}


#: The families whose config class keeps ``sliding_window`` only when ``use_sliding_window`` (default False).
_USE_SLIDING_WINDOW = ("qwen2", "qwen2_moe", "qwen3_moe")


def _check_layer_types(types: Any, n_layers: int, arch: str,
                       kinds: tuple[str, ...] = ("sliding_attention", "full_attention")) -> None:
    """Refuse a ``layer_types`` that is not one entry of ``kinds`` per layer.

    Raises:
        ValueError: naming the length or the entry, with the value.
    """
    if len(types) != n_layers:
        raise ValueError(f"{arch} layer_types has {len(types)} entries, num_hidden_layers={n_layers}")
    for i, kind in enumerate(types):
        if kind not in kinds:
            raise ValueError(f"{arch} layer_types[{i}]={kind!r} is not supported "
                             f"(only {' and '.join(repr(k) for k in kinds)})")


def sliding_windows(hf_cfg: Mapping[str, Any], arch: str, *, rule: str | None = None,
                    gated: bool | None = None) -> list[int | None] | None:
    """Each layer's sliding window from a HF config, by the rule of family ``arch`` (:data:`WINDOW_RULES`);
    ``None`` when no layer slides.

    Args:
        hf_cfg: the HF config dict.
        arch: its ``model_type`` (named in errors; picks the rule unless ``rule`` is given).
        rule: the window rule (a value of :data:`WINDOW_RULES`), for a family file that declares its own.
        gated: windows exist only when ``use_sliding_window`` is set (default: ``arch`` in ``_USE_SLIDING_WINDOW``).

    Returns:
        One window (or None) per layer, or None.

    Raises:
        ValueError: a layer type other than sliding or full attention (named with its layer), or a
            ``layer_types`` whose length is not ``num_hidden_layers``.

    Example:
        >>> from interp.families._positions import sliding_windows
        >>> cfg = {"num_hidden_layers": 3, "sliding_window": 4, "use_sliding_window": True, "max_window_layers": 1}
        >>> sliding_windows(cfg, "qwen2"), sliding_windows(cfg, "qwen3_moe"), sliding_windows(cfg, "llama")
        ([None, 4, 4], [4, 4, 4], None)
    """
    rule = rule or WINDOW_RULES.get(arch)
    if rule is None:
        return None
    # Every key the family's rule reads is read, whatever the branch (the config-key audit records reads).
    window = hf_cfg.get("sliding_window")
    gated = arch in _USE_SLIDING_WINDOW if gated is None else gated
    use = hf_cfg.get("use_sliding_window", False) if gated else True
    max_layers = hf_cfg.get("max_window_layers", 28) if "max_window_layers" in rule else None
    types = hf_cfg.get("layer_types")
    if not window or not use:  # Qwen2-MoE's config stores 0 for "no window"
        return None
    n_layers = _need(hf_cfg, "num_hidden_layers", arch)
    if types:
        _check_layer_types(types, n_layers, arch)
        if rule == "every" and "full_attention" in types:
            # transformers' class ignores layer_types and slides every layer: such a checkpoint was made for
            # another class (Ministral), so neither reading is safe.
            raise ValueError(f"{arch} layer_types={types!r} with full-attention layers is not supported: "
                             f"transformers' {arch} ignores layer_types and slides every layer")
    if types and rule != "every":
        slides = [kind == "sliding_attention" for kind in types]
    elif rule in ("every", "layer_types"):
        slides = [True] * n_layers
    elif rule == "every_fourth_full":
        slides = [(i + 1) % 4 != 0 for i in range(n_layers)]
    elif max_layers is None and "max_window_layers" in rule:
        raise ValueError(f"{arch} max_window_layers=None must be an integer (the layer where windows start / stop)")
    elif rule == "above_max_window_layers":
        slides = [i >= int(max_layers or 0) for i in range(n_layers)]
    elif rule == "even_below_max_window_layers":
        slides = [i % 2 == 0 and i < int(max_layers or 0) for i in range(n_layers)]
    elif rule == "alternate":
        slides = [i % 2 == 0 for i in range(n_layers)]
    else:  # pattern
        pattern = hf_cfg.get("sliding_window_pattern") or 6
        slides = [(i + 1) % pattern != 0 for i in range(n_layers)]
    windows = [window if s else None for s in slides]
    return windows if any(w is not None for w in windows) else None


def _typed_windows(hf_cfg: Mapping[str, Any], arch: str, default_types: list[str],
                   use: bool = True) -> tuple[list[str], list[int | None] | None]:
    """``(layer_types, windows)``: the config's ``layer_types`` (else ``default_types``, what the config class
    derives) and each layer's window (``sliding_window`` on the sliding layers when ``use``).

    Raises:
        ValueError: a ``layer_types`` of the wrong length or with a type other than sliding / full attention.
    """
    n_layers = _need(hf_cfg, "num_hidden_layers", arch)
    types = hf_cfg.get("layer_types") or default_types
    _check_layer_types(types, n_layers, arch)
    window = hf_cfg.get("sliding_window")
    windows = [window if use and window and kind == "sliding_attention" else None for kind in types]
    return list(types), windows if any(w is not None for w in windows) else None


_ROPE_KINDS_HF = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


#: The families whose attention rotates ``partial_rotary_factor`` of each head (the others rotate whole heads).
_PARTIAL_ROTARY = ("gpt_neox", "phi", "phi3")


def _rope(hf_cfg: Mapping[str, Any], arch: str, params: Mapping[str, Any] | None = None, *,
          default_theta: float = 10000.0) -> tuple[float, dict | None]:
    """``(rope_theta, rope_scaling)`` of a HF config: transformers 5's ``rope_parameters`` or 4.x's
    ``rope_theta`` + ``rope_scaling``, resolved into :class:`ModelConfig`'s explicit ``rope_scaling`` dict
    (defaults filled in as transformers fills them). ``params`` overrides the dict read (per-layer-type RoPE);
    ``default_theta`` is the base when the config gives none (GPT-NeoX's legacy ``rotary_emb_base``).

    Raises:
        ValueError: a RoPE kind interp does not implement, named with the supported ones; a ``rope_theta``, a
            factor or an original context that is missing, zero, negative or not finite; llama3's
            ``high_freq_factor`` below its ``low_freq_factor``. Each message names the key, its value, the
            ``model_type`` and the config file when known.

    Example:
        >>> _rope({"rope_scaling": {"rope_type": "linear", "factor": 2}, "max_position_embeddings": 64}, "llama")
        (10000.0, {'rope_type': 'linear', 'factor': 2.0})
        >>> _rope({"rope_scaling": {"rope_type": "linear", "factor": 0}, "max_position_embeddings": 64}, "llama")
        Traceback (most recent call last):
        ...
        ValueError: model_type='llama': rope_scaling['factor']=0 must be a finite number > 0
    """
    rope = dict(params if params is not None else (hf_cfg.get("rope_parameters") or {}))
    field = "rope_parameters"
    legacy = hf_cfg.get("rope_scaling") or {}
    if not rope.get("rope_type") and legacy:
        rope = {**legacy, **rope}
        field = "rope_scaling"
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in _ROPE_KINDS_HF:
        raise ValueError(f"{arch} rope_type={kind!r} is not supported; supported: {list(_ROPE_KINDS_HF)}"
                         f"{_where(hf_cfg)}")

    def need(key: str, *, integer: bool = False, zero: bool = False) -> float:
        if rope.get(key) is None:
            raise ValueError(f"model_type={arch!r}: {field} of rope_type {kind!r} has no {key!r} (got keys "
                             f"{sorted(rope)}){_where(hf_cfg)}")
        return _positive(rope[key], f"{field}[{key!r}]", arch, hf_cfg, integer=integer, zero=zero)

    def optional(key: str, *, integer: bool = False) -> float | None:
        return None if rope.get(key) is None else need(key, integer=integer)

    partial = rope.get("partial_rotary_factor", 1.0)
    if kind != "default" and partial != 1.0 and arch not in _PARTIAL_ROTARY:
        # transformers' scaled-RoPE init rotates head_dim x partial_rotary_factor dims, but this family's attention
        # rotates whole heads (its default RoPE ignores the factor).
        raise ValueError(f"model_type={arch!r}: {field}['partial_rotary_factor']={partial!r} with rope_type "
                         f"{kind!r} is not supported (this family rotates whole heads){_where(hf_cfg)}")
    theta_key = f"{field}['rope_theta']" if rope.get("rope_theta") is not None else "rope_theta"
    theta = _positive(rope.get("rope_theta", hf_cfg.get("rope_theta", default_theta)), theta_key, arch, hf_cfg)
    if kind == "default":
        return theta, None
    max_pos = _need(hf_cfg, "max_position_embeddings", arch)
    orig_key = "original_max_position_embeddings"
    if rope.get(orig_key) is not None:
        orig: float | None = need(orig_key, integer=True)
    elif hf_cfg.get(orig_key) is not None:
        orig = _positive(hf_cfg[orig_key], orig_key, arch, hf_cfg, integer=True)
    else:
        orig = None
    scaling: dict[str, Any] = {"rope_type": kind}
    if kind == "linear":
        scaling["factor"] = need("factor")
    elif kind == "dynamic":
        # transformers grows the base past max_position_embeddings itself (the original context of dynamic NTK).
        scaling.update(factor=need("factor"), original_max_position_embeddings=max_pos)
    elif kind == "llama3":
        low, high = need("low_freq_factor"), need("high_freq_factor")
        if high < low:  # equal (Llama 4 Scout): no blended band
            raise ValueError(f"model_type={arch!r}: {field} high_freq_factor={rope['high_freq_factor']!r} must be "
                             f"at least low_freq_factor={rope['low_freq_factor']!r}{_where(hf_cfg)}")
        scaling.update(factor=need("factor"), low_freq_factor=low, high_freq_factor=high,
                       original_max_position_embeddings=int(need(orig_key, integer=True)))
    elif kind == "yarn":
        orig = orig or max_pos
        factor = optional("factor") or max_pos / orig
        scaling.update(factor=float(factor), original_max_position_embeddings=int(orig))
        for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
            if rope.get(key) is not None:
                scaling[key] = need(key, zero=key.startswith("mscale"))  # mscale_all_dim 0: no extra scaling
        if rope.get("truncate") is not None:
            scaling["truncate"] = rope["truncate"]
    else:  # longrope
        orig = orig or max_pos
        for key in ("short_factor", "long_factor"):
            values = rope.get(key)
            if not isinstance(values, (list, tuple)) or not values:
                raise ValueError(f"model_type={arch!r}: {field}[{key!r}]={values!r} must be a non-empty list of "
                                 f"numbers{_where(hf_cfg)}")
            for i, v in enumerate(values):
                _positive(v, f"{field}[{key!r}][{i}]", arch, hf_cfg)
            scaling[key] = [float(v) for v in values]
        scaling.update(original_max_position_embeddings=int(orig), factor=float(optional("factor") or max_pos / orig))
        if rope.get("attention_factor") is not None:
            scaling["attention_factor"] = need("attention_factor")
    return theta, scaling


def rotary_basics(hf_cfg: Mapping[str, Any], arch: str, act_default: str,
                  activations: Mapping[str, Activation]) -> tuple[Activation, float, dict | None]:
    """What a rotary decoder's config mapping reads first: :func:`_decoder_checks`, the ``hidden_act``
    (``act_default`` when absent, through the family's ``activations``) and RoPE (:func:`_rope`).

    Returns:
        ``(activation, rotary base, rope_scaling)``.

    Raises:
        ValueError: what the checks, the activation table or :func:`_rope` refuse (each named).

    Example:
        >>> from interp.families._base import GATED_ACTIVATIONS
        >>> from interp.families._positions import rotary_basics
        >>> rotary_basics({"rope_theta": 500.0}, "toy", "silu", GATED_ACTIVATIONS)
        ('swiglu', 500.0, None)
    """
    _decoder_checks(hf_cfg, arch)
    activation = _activation(hf_cfg, "hidden_act", act_default, arch, activations)
    theta, scaling = _rope(hf_cfg, arch)
    return activation, theta, scaling


def _partial_factor(hf_cfg: Mapping[str, Any], default: float, legacy: str = "partial_rotary_factor") -> float:
    """The share of each head that rotates: ``rope_parameters["partial_rotary_factor"]`` (transformers 5), else the
    top-level ``legacy`` key (4.x: ``partial_rotary_factor``, GPT-NeoX's ``rotary_pct``), else ``default``.

    Example:
        >>> from interp.families._positions import _partial_factor
        >>> _partial_factor({"rotary_pct": 0.25}, 1.0, legacy="rotary_pct")
        0.25
    """
    rope = hf_cfg.get("rope_parameters") or {}
    return rope.get("partial_rotary_factor", hf_cfg.get(legacy, default))


def _unscaled_rope(hf_cfg: Mapping[str, Any], arch: str, family: str) -> float:
    """The RoPE base of a family whose transformers code rotates part of each head with no scaling.

    Raises:
        ValueError: a RoPE scaling kind (named), or what :func:`_rope` refuses.
    """
    theta, scaling = _rope(hf_cfg, arch)
    if scaling is not None:
        raise ValueError(f"{arch} rope_type={scaling['rope_type']!r} is not supported (only 'default': {family} "
                         "rotates part of each head)")
    return theta


def _rope_context(n_ctx: int, scaling: dict | None) -> int:
    """Dynamic NTK exists to run past ``max_position_embeddings``: allow ``factor`` times that."""
    if scaling is not None and scaling["rope_type"] == "dynamic":
        return int(n_ctx * scaling["factor"])
    return n_ctx


def _per_type_rope(hf_cfg: Mapping[str, Any], arch: str,
                   windows: list[int | None] | None) -> tuple[float, dict | None, float | None]:
    """``(rotary_base, rope_scaling, local_rotary_base)`` of a config whose ``rope_parameters`` may hold one dict
    per layer type (Gemma 3, OLMo 3): the full-attention layers' RoPE, and the sliding layers' plain base.

    Raises:
        ValueError: scaled RoPE on the sliding layers, or sliding-layer RoPE that differs while no layer slides.
    """
    rope = hf_cfg.get("rope_parameters") or {}
    if "full_attention" not in rope:
        theta, scaling = _rope(hf_cfg, arch)
        return theta, scaling, None
    theta, scaling = _rope(hf_cfg, arch, rope["full_attention"])
    local_theta, local_scaling = _rope(hf_cfg, arch, rope.get("sliding_attention") or {"rope_type": "default"})
    if local_scaling is not None:
        raise ValueError(f"{arch} sliding_attention rope_type={local_scaling['rope_type']!r} is not supported "
                         "(local layers rotate with plain RoPE)")
    if windows is None:
        types = hf_cfg.get("layer_types") or []
        if "sliding_attention" in types and local_theta != theta:
            raise ValueError(f"{arch} layer_types has sliding layers but sliding_window=None, and their "
                             f"rope_theta={local_theta!r} differs from the full layers' {theta!r}: not supported")
        return theta, scaling, None
    return theta, scaling, local_theta


def _yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention-temperature factor ``0.1 * mscale * ln(factor) + 1`` (1 without stretching)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
