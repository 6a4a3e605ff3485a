"""interp: a mechanistic-interpretability toolkit for multi-head attention.

Example:
    >>> import interp, torch
    >>> model = interp.Transformer(interp.ModelConfig(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=64))
    >>> logits, trace = model.run_with_cache(torch.randint(0, 100, (1, 16)), names_filter="*hook_pattern")
    >>> trace.patterns().shape
    torch.Size([2, 1, 4, 16, 16])
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

# One version source: pyproject.toml's ``version``, read from the installed package's metadata.
try:
    __version__ = importlib.metadata.version("interp")
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"

# The public names load on first use (PEP 562): ``import interp.cli`` stays free of torch, so the ``interp``
# command can turn a Ctrl-C during its start-up imports into one line instead of a traceback.
_EXPORTS = {
    "HeadReport": ".analysis", "classify_heads": ".analysis",
    "Attention": ".attention", "AttnMask": ".attention", "LatentAttention": ".attention",
    "LayerShape": ".config", "ModelConfig": ".config", "HookPoint": ".hooks", "KVCache": ".kv_cache", "Transformer": ".model",
    "MeanReducer": ".streaming", "Reducer": ".streaming", "Trace": ".trace", "record": ".streaming", "stream": ".streaming",
    "list_models": ".zoo", "load": ".zoo",
}

if TYPE_CHECKING:  # static tools see the eager imports
    from .analysis import HeadReport, classify_heads
    from .attention import Attention, AttnMask, LatentAttention
    from .config import LayerShape, ModelConfig
    from .hooks import HookPoint
    from .kv_cache import KVCache
    from .model import Transformer
    from .streaming import MeanReducer, Reducer, record, stream
    from .trace import Trace
    from .zoo import list_models, load


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    elif not name.startswith("__"):
        try:  # a submodule used as an attribute: interp.zoo, interp.viz ...
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'interp' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'interp' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "Attention", "AttnMask", "HeadReport", "classify_heads", "HookPoint", "KVCache", "LatentAttention", "LayerShape",
    "MeanReducer", "ModelConfig", "Reducer", "Trace", "Transformer", "list_models", "load", "record", "stream",
    "__version__",
]
