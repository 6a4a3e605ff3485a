"""Qwen2: Llama's config mapping and weights, with Qwen2's values (always-biased q/k/v, windows above
``max_window_layers`` when ``use_sliding_window``; both read from the tables of :mod:`._positions` and
:mod:`.llama` by ``model_type``).
"""

from __future__ import annotations

import dataclasses

from . import llama
from ._gguf import llama_spec

FAMILY = dataclasses.replace(llama.FAMILY, name="qwen2", model_types=("qwen2",), gguf={"qwen2": llama_spec("qwen2")}, title="Qwen")
