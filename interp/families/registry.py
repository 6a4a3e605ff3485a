"""The one family registry: HF ``model_type`` and GGUF ``general.architecture`` -> :class:`Family`.

Every family file's ``FAMILY`` is listed once in :data:`_MODULES`; the lookups and the help text are derived
from that list, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import (
    arcee,
    bert,
    bloom,
    cohere,
    deepseek,
    ernie4_5,
    exaone4,
    falcon,
    gemma,
    glm4,
    glm4_moe,
    gpt2,
    gpt_bigcode,
    gpt_neo,
    gpt_neox,
    gpt_oss,
    gptj,
    granite,
    granitemoe,
    hunyuan,
    llama,
    llama4,
    moe,
    mpt,
    nemotron,
    olmo,
    olmo2,
    opt,
    phi,
    phi3,
    phimoe,
    qwen2,
    qwen3,
    smollm3,
    stablelm,
    starcoder2,
)
from ._family import CompatConfig, ConfigFn, Family, StateDictFn

# The help text lists the headline families in this order.
_MODULES = (bert, gpt2, llama, qwen2, qwen3, gemma, phi, moe, deepseek, phi3, gpt_neox, gpt_bigcode, falcon, olmo, olmo2,
            starcoder2, arcee, hunyuan, smollm3, exaone4, granite, glm4, stablelm, ernie4_5, cohere, gptj, opt,
            gpt_oss, bloom, mpt, gpt_neo,
            nemotron, granitemoe, glm4_moe, phimoe, llama4)


#: Every family, in help-text order.
FAMILIES: tuple[Family, ...] = tuple(m.FAMILY for m in _MODULES)


def _index(key: str, values: Any) -> dict[str, Family]:
    out: dict[str, Family] = {}
    for fam in FAMILIES:
        for v in values(fam):
            if v in out:
                raise RuntimeError(f"{key} {v!r} is claimed by two families: {out[v].name} and {fam.name}")
            out[v] = fam
    return out


#: HF ``model_type`` -> its family.
BY_MODEL_TYPE: dict[str, Family] = _index("model_type", lambda f: f.model_types)
#: llama.cpp ``general.architecture`` -> its family.
BY_GGUF_ARCH: dict[str, Family] = _index("GGUF architecture", lambda f: f.gguf_archs)


def _compat_configs() -> dict[str, CompatConfig]:
    out: dict[str, CompatConfig] = {}
    for fam in FAMILIES:
        for row, test in fam.tests.items():
            if row in out:
                raise RuntimeError(f"test config {row!r} is declared twice (again by {fam.name})")
            out[row] = test
    return out


#: Every family's random tiny test configs (:attr:`Family.tests`), by row name, in family order; two families that
#: name the same row are refused.
COMPAT_CONFIGS: dict[str, CompatConfig] = _compat_configs()


#: The families in short, for help texts (:func:`family_for` lists every ``model_type`` when it refuses one).
HEADLINE = ", ".join(f.title for f in FAMILIES if f.headline) + " and other families"


def family_for(model_type: Any) -> Family:
    """The family that converts HF ``model_type``.

    Raises:
        ValueError: an unsupported ``model_type`` (the supported ones are listed).

    Example:
        >>> from interp.families.registry import family_for
        >>> family_for("mistral").name
        'llama'
    """
    if model_type not in BY_MODEL_TYPE:
        raise ValueError(f"model_type={model_type!r} is not supported; supported: {sorted(BY_MODEL_TYPE)}")
    return BY_MODEL_TYPE[model_type]


def converter(hf_cfg: Mapping[str, Any]) -> tuple[ConfigFn, StateDictFn]:
    """``(config function, state-dict function)`` for a HF config dict, looked up by its ``model_type``.

    Raises:
        ValueError: an unsupported ``model_type`` (the supported ones are listed).

    Example:
        >>> from interp.families.registry import converter
        >>> make_cfg, make_sd = converter({"model_type": "qwen2_moe"})
        >>> make_cfg.__name__, make_sd.keywords
        ('moe_config', {'arch': 'qwen2_moe'})
    """
    return family_for(hf_cfg.get("model_type")).converter(hf_cfg)
