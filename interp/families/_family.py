"""What a model family is: the record each ``interp/families/<family>.py`` file declares as ``FAMILY``."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from ..config import ModelConfig
from ._base import StateDict
from ._gguf import GGUFSpec

#: An HF config dict -> our :class:`ModelConfig`.
ConfigFn = Callable[[Mapping[str, Any]], ModelConfig]
#: An HF state dict and our config -> our state dict.
StateDictFn = Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]
#: An HF config dict -> the state-dict function for it (config scalars folded into the weights, the errors' name).
StateDictFactory = Callable[[Mapping[str, Any]], StateDictFn]


#: The sliding window of the test configs: shorter than :mod:`interp.zoo.compat`'s 40-token sequences, so a
#: window changes the logits.
TEST_WINDOW = 8


class CompatConfig(NamedTuple):
    """One random tiny test config of a family (:mod:`interp.zoo.compat` builds the transformers model from it,
    with a 97-token vocabulary and two layers unless the config says otherwise).

    Attributes:
        model_type: the HF ``model_type``.
        config: the config keywords (sizes and the features the row exercises).
        table_only: a row of the compatibility table only, not of the family conversion tests
            (``tests/zoo/test_zoo_families.py``; mixtures of experts and MLA are tested in their own files).
    """

    model_type: str
    config: Mapping[str, Any]
    table_only: bool = False


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: the HF ``model_type`` values it converts, its config mapping and weight mapping.

    Attributes:
        name: the family's name (its file's name in :mod:`interp.families`).
        model_types: the HF ``model_type`` values this family converts (each in exactly one family).
        config: HF config dict -> :class:`ModelConfig` (raises ``ValueError`` naming a refused setting).
        state_dict_for: HF config dict -> state-dict function (see :func:`fixed` and :func:`named`).
        gguf: llama.cpp's ``general.architecture`` values whose files hold this family's weights, each with how
            its metadata and tensors map onto this family's HF config and state dict (:class:`~._gguf.GGUFSpec`).
        title: the family's name in help texts (``"GPT-2"``), when ``headline``.
        headline: named in the help texts' short list (:data:`interp.zoo.hf.FAMILIES`).
        tests: the family's random tiny test configs (row name -> :class:`CompatConfig`), which
            :mod:`interp.zoo.compat` runs and prints as the compatibility table of docs/models.md.
    """

    name: str
    model_types: tuple[str, ...]
    config: ConfigFn
    state_dict_for: StateDictFactory
    gguf: Mapping[str, GGUFSpec] = dataclasses.field(default_factory=dict)
    title: str = ""
    headline: bool = False
    tests: Mapping[str, CompatConfig] = dataclasses.field(default_factory=dict)

    @property
    def gguf_archs(self) -> tuple[str, ...]:
        """The llama.cpp architectures this family reads (the keys of :attr:`gguf`)."""
        return tuple(self.gguf)

    def converter(self, hf_cfg: Mapping[str, Any]) -> tuple[ConfigFn, StateDictFn]:
        """``(config function, state-dict function)`` for ``hf_cfg`` (one of this family's model types)."""
        return self.config, self.state_dict_for(hf_cfg)


def fixed(fn: StateDictFn) -> StateDictFactory:
    """A state-dict factory that returns ``fn`` whatever the config (most families).

    Example:
        >>> from interp.families._family import fixed
        >>> def sd(hf_sd, cfg): return {}
        >>> fixed(sd)({"model_type": "x"}) is sd
        True
    """
    return lambda hf_cfg: fn


def named(fn: Callable[..., dict[str, torch.Tensor]]) -> StateDictFactory:
    """A state-dict factory for a function shared by several model types: ``fn`` with ``arch`` set to the config's
    ``model_type``, so its errors name the real one.

    Example:
        >>> from interp.families._family import named
        >>> def sd(hf_sd, cfg, *, arch): return {}
        >>> named(sd)({"model_type": "mistral"}).keywords
        {'arch': 'mistral'}
    """
    return lambda hf_cfg: functools.partial(fn, arch=hf_cfg.get("model_type"))
