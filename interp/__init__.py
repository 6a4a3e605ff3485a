"""interp: a mechanistic-interpretability toolkit for multi-head attention.

Example:
    >>> import interp, torch
    >>> model = interp.Transformer(interp.ModelConfig(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=64))
    >>> logits, trace = model.run_with_cache(torch.randint(0, 100, (1, 16)), names_filter="*hook_pattern")
    >>> trace.patterns().shape
    torch.Size([2, 1, 4, 16, 16])
"""

from typing import Any

from .attention import Attention, AttnMask, LatentAttention
from .config import LayerShape, ModelConfig
from .hooks import HookPoint
from .kv_cache import KVCache
from .model import Transformer
from .trace import MeanReducer, Reducer, Trace, record, stream

__version__ = "0.1.0"

# Names from the upper layers, imported on first use: ``import interp.zoo`` (or the core alone) must not
# pull in the analysis stack, and the import-graph test checks that it does not.
_LAZY = {"HeadReport": "analysis", "classify_heads": "analysis", "list_models": "zoo", "load": "zoo"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'interp' has no attribute {name!r}")

__all__ = [
    "Attention", "AttnMask", "HeadReport", "classify_heads", "HookPoint", "KVCache", "LatentAttention", "LayerShape",
    "MeanReducer", "ModelConfig", "Reducer", "Trace", "Transformer", "list_models", "load", "record", "stream",
    "__version__",
]
