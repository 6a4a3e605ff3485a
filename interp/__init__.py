"""interp: a mechanistic-interpretability toolkit for multi-head attention.

Example:
    >>> import interp, torch
    >>> model = interp.Transformer(interp.ModelConfig(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=64))
    >>> logits, trace = model.run_with_cache(torch.randint(0, 100, (1, 16)), names_filter="*hook_pattern")
    >>> trace.patterns().shape
    torch.Size([2, 1, 4, 16, 16])
"""

from .analysis import HeadReport, classify_heads
from .attention import Attention, AttnMask, LatentAttention
from .config import ModelConfig
from .hooks import HookPoint
from .kv_cache import KVCache
from .model import Transformer
from .trace import MeanReducer, Reducer, Trace, record
from .zoo import list_models, load

__version__ = "0.1.0"

__all__ = [
    "Attention", "AttnMask", "HeadReport", "classify_heads", "HookPoint", "KVCache", "LatentAttention", "MeanReducer", "ModelConfig",
    "Reducer", "Trace", "Transformer", "list_models", "load", "record", "__version__",
]
