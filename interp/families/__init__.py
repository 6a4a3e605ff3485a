"""The family layer: one file per model family, one registry, one strict weight-mapping driver.

A family file (``interp/families/<family>.py``) holds everything interp knows about one family of models:

* its config mapping, ``<family>_config(hf_cfg) -> ModelConfig``, written as a diff over its parent family where
  one exists (``qwen2.py`` is ``llama.py`` with other values; ``granite_config`` is ``llama_config`` plus four
  scalars), refusing by name every setting it does not reproduce;
* its weight mapping, HF state dict -> ours, as a state-dict function (``fixed`` / ``named`` wrap it into the
  factory the registry stores) or a declarative tensor table run by :func:`map_tensors`;
* the llama.cpp architectures whose GGUF files hold its weights, each with its metadata and tensor-name mapping
  (``gguf``: architecture -> :class:`~._gguf.GGUFSpec`, which :mod:`interp.zoo.gguf` looks up by
  ``general.architecture``);
* its random tiny test configs (``TESTS``: row -> :class:`~._family.CompatConfig`), which :mod:`interp.zoo.compat`
  runs and prints as the compatibility table of docs/models.md;
* and a ``FAMILY = Family(...)`` record tying these together (:class:`Family`).

Shared helpers live once: :mod:`._base` (required keys, refused settings, decoder checks), :mod:`._positions`
(RoPE and sliding windows), :mod:`._tensors` (tensor readers, fused-projection splits, rotary-row reorders,
the Llama attention / MLP / expert blocks) and :mod:`._mapping` (the declarative tables' driver).

Adding a family: write ``interp/families/<family>.py`` ending in ``FAMILY = Family(...)``, add the module to
``registry._MODULES`` (its random tiny test configs go in the same file, ``tests=TESTS``, and
:mod:`interp.zoo.compat` reads them through the registry). Nothing else names families:
:func:`interp.zoo.hf.converter`, ``CONVERTERS`` and the help text ``FAMILIES`` are derived from the registry.
A family that needs a new mechanism adds a :class:`~interp.ModelConfig` field and its code in the core.

The layer imports the core only (never :mod:`interp.zoo`); :mod:`interp.zoo.hf` and :mod:`interp.zoo.gguf` are
drivers that look families up here.

Example:
    >>> from interp.families import family_for, tiny_hf_config
    >>> fam = family_for("qwen2")
    >>> fam.name, fam.config(tiny_hf_config("qwen2")).attn_bias
    ('qwen2', True)
"""

from __future__ import annotations

from ._base import tiny_hf_config
from ._family import Family, fixed, named
from .registry import BY_GGUF_ARCH, BY_MODEL_TYPE, FAMILIES, HEADLINE, converter, family_for

__all__ = ["BY_GGUF_ARCH", "BY_MODEL_TYPE", "FAMILIES", "HEADLINE", "Family", "converter", "family_for", "fixed",
           "named", "tiny_hf_config"]
