"""Qwen2: Llama's config mapping and weights, with Qwen2's values (always-biased q/k/v, windows above
``max_window_layers`` when ``use_sliding_window``; both read from the tables of :mod:`._positions` and
:mod:`.llama` by ``model_type``).
"""

from __future__ import annotations

import dataclasses

from . import llama
from ._family import TEST_WINDOW, CompatConfig
from ._gguf import llama_spec

#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "qwen2": CompatConfig("qwen2", dict(hidden_size=72, intermediate_size=96, num_attention_heads=9, num_key_value_heads=3,
                                        use_sliding_window=True, sliding_window=TEST_WINDOW, max_window_layers=1)),
}


FAMILY = dataclasses.replace(llama.FAMILY, name="qwen2", model_types=("qwen2",), gguf={"qwen2": llama_spec("qwen2")},
                             title="Qwen", tests=TESTS)
