"""TransformerLens adapter: run a TransformerLens 4.x ``TransformerBridge`` and get an interp :class:`Trace`.

Hook names in interp follow TransformerLens, so the bridge's cache maps over one to one; the adapter adds
what the bridge does not record by default, the per-head residual writes ``hook_result`` [B, T, H, M],
computed from ``hook_z`` and the bridge's ``W_O``. Every analyzer that reads a Trace then works on any model
TransformerLens supports.

Example:
    >>> from interp.zoo.tl import trace_transformer_lens
    >>> from transformer_lens.model_bridge import TransformerBridge
    >>> bridge = TransformerBridge.boot_transformers("gpt2", device="cpu")       # needs hub access  # doctest: +SKIP
    >>> trace = trace_transformer_lens(bridge, bridge.to_tokens("The cat sat on the mat."))  # doctest: +SKIP
    >>> trace.pattern(0).shape                                                   # [B, H, T, S]  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..hooks import resolve_names
from ..trace import Trace

if TYPE_CHECKING:
    from ..model import Transformer

_TL_EXTRA = "pip install interp[tl]"
DEFAULT_HOOKS = ("hook_pattern", "hook_z", "hook_result")
_ATTN_RX = re.compile(r"^blocks\.(\d+)\.attn\.(hook_\w+)$")


def _require_bridge(bridge: Any) -> None:
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as e:
        raise ImportError(f"the TransformerLens adapter needs transformer-lens 4.x: {_TL_EXTRA}") from e
    if not isinstance(bridge, TransformerBridge):
        raise TypeError(f"expected a transformer_lens TransformerBridge, got {type(bridge).__name__} "
                        "(HookedTransformer is gone in TransformerLens 4.x; use TransformerBridge.boot_transformers)")


def trace_transformer_lens(
    bridge: Any,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    hooks: Sequence[str] = DEFAULT_HOOKS,
    layers: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    **forward_kwargs: Any,
) -> Trace:
    """Run ``bridge`` on ``tokens`` and return the attention hooks as an interp :class:`Trace`.

    Args:
        bridge: a ``transformer_lens.model_bridge.TransformerBridge`` (from ``boot_transformers``).
        tokens: ``[B, T]`` (or ``[T]``) token ids, special tokens included (``bridge.to_tokens(text)``).
        attention_mask: ``[B, T]``, 1 for real tokens and 0 for padding.
        hooks: attention hook suffixes to record in every layer: any of the bridge's ``blocks.{l}.attn``
            hooks (``hook_pattern`` [B, H, T, S], ``hook_z`` [B, T, H, D], ``hook_attn_scores``, ``hook_q``...)
            plus ``hook_result`` [B, T, H, M], which is computed from ``hook_z`` and ``W_O`` when the bridge
            does not record it itself (``set_use_attn_result``).
        layers: only these layers (default all).
        dtype: cast stored tensors.
        **forward_kwargs: passed to the bridge's forward (``token_type_ids`` for BERT, ...).

    Returns:
        A :class:`Trace` with keys ``blocks.{l}.attn.{hook}``, ``tokens`` and meta (``model``, ``n_layers``,
        ``n_heads``, ``str_tokens`` when the bridge has a tokenizer, ``source="transformer_lens"``).

    Raises:
        ImportError: transformer-lens is not installed (``pip install interp[tl]``).
        TypeError: ``bridge`` is not a TransformerBridge, or ``tokens`` is not an integer tensor.
        ValueError: an unknown hook name or a layer out of range.

    Example:
        >>> from interp.zoo.tl import trace_transformer_lens
        >>> trace = trace_transformer_lens(bridge, ids, attention_mask=mask)  # doctest: +SKIP
        >>> trace.head_out(3).shape     # [B, T, H, d_model]  # doctest: +SKIP
    """
    _require_bridge(bridge)
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer tensor of ids, got {type(tokens).__name__}"
                        f"{'' if not isinstance(tokens, torch.Tensor) else ' of dtype ' + str(tokens.dtype)}")
    if tokens.dim() == 1:
        tokens = tokens[None]
    n_layers, n_heads = int(bridge.cfg.n_layers), int(bridge.cfg.n_heads)
    layers = list(range(n_layers)) if layers is None else list(layers)
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range for a model with {n_layers} layers")
    hooks = list(hooks)
    want = {f"blocks.{layer}.attn.{h}" for layer in layers for h in hooks}
    # hook_result is derived from hook_z unless the bridge records it itself.
    fetch = set(want) | {f"blocks.{layer}.attn.hook_z" for layer in layers if "hook_result" in hooks}
    if not getattr(bridge.cfg, "use_attn_result", False):
        fetch = {n for n in fetch if not n.endswith("hook_result")}  # gated off in the bridge: never cached
    known = [n for n in bridge.hook_dict if _ATTN_RX.match(n)]
    missing = sorted(n for n in fetch if n not in bridge.hook_dict and not n.endswith("hook_result"))
    if missing:
        resolve_names(missing[0], known)  # raises ValueError naming close hook names
    if attention_mask is not None:
        forward_kwargs["attention_mask"] = attention_mask
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, names_filter=lambda name: name in fetch, **forward_kwargs)
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(want, key=_order):
        if name in cache:
            t = cache[name]
        elif name.endswith("hook_result"):
            matched = _ATTN_RX.match(name)
            if matched is None:
                raise ValueError(f"{name!r} is no attention hook name (blocks.<layer>.attn.hook_result)")
            layer = int(matched.group(1))
            t = head_writes_from_z(cache[f"blocks.{layer}.attn.hook_z"], bridge.blocks[layer].attn.W_O)
        else:
            raise ValueError(f"the bridge did not record {name!r}")
        t = t.detach()
        tensors[name] = t if dtype is None else t.to(dtype)
    meta: dict[str, Any] = {"model": str(getattr(bridge.cfg, "model_name", "transformer_lens")),
                            "n_layers": n_layers, "n_heads": n_heads, "source": "transformer_lens"}
    if hasattr(getattr(bridge, "tokenizer", None), "convert_ids_to_tokens"):
        meta["str_tokens"] = [bridge.tokenizer.convert_ids_to_tokens(row.tolist()) for row in tokens]
    return Trace(tensors, meta, tokens)


def _order(name: str) -> tuple[int, str]:
    m = _ATTN_RX.match(name)
    return (int(m.group(1)), m.group(2)) if m else (-1, name)


def head_writes_from_z(z: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """Per-head residual writes from mixed values and the output projection split by head.

    Args:
        z: ``[B, T, H, D]``.
        W_O: ``[H, D, M]`` (TransformerLens layout; interp's ``attn.W_O_heads``).

    Returns:
        ``[B, T, H, M]``; summed over heads (plus ``b_O``) it is the attention output.

    Raises:
        ValueError: the head axes do not agree.
    """
    if z.dim() != 4 or W_O.dim() != 3 or z.shape[2:] != W_O.shape[:2]:
        raise ValueError(f"z {tuple(z.shape)} and W_O {tuple(W_O.shape)} must be [B, T, H, D] and [H, D, M]")
    return torch.einsum("bthd,hdm->bthm", z, W_O.to(z.dtype))  # [B, T, H, M]



def from_transformer_lens(bridge: Any) -> Transformer:
    """The reverse direction: an interp :class:`~interp.Transformer` with the weights of a bridge's HF model.

    Works when the bridge wraps a model of a family interp converts (:data:`interp.zoo.hf.FAMILIES`; it converts
    ``bridge.original_model`` with :func:`interp.zoo.hf.from_hf`); then the analyzers that need a runnable model
    (head gates, pruning) work on it too. The bridge's tokenizer comes along.

    Args:
        bridge: a ``TransformerBridge`` booted without weight processing (the default of ``boot_transformers``).

    Returns:
        The converted model (eval mode).

    Raises:
        ImportError: transformer-lens is not installed (``pip install interp[tl]``).
        TypeError: ``bridge`` is not a TransformerBridge.
        ValueError: the wrapped architecture has no interp converter (the supported ones are listed).

    Example:
        >>> from interp.zoo.tl import from_transformer_lens
        >>> model = from_transformer_lens(TransformerBridge.boot_transformers("gpt2"))   # with hub access  # doctest: +SKIP
    """
    _require_bridge(bridge)
    from .hf import convert
    from .tokenizer import as_tokenizer as _wrap_tokenizer

    hf_model = bridge.original_model
    # The bridge wraps each HF submodule, which inserts "._original_component" into the state-dict keys.
    sd = {k.replace("._original_component", ""): v for k, v in hf_model.state_dict().items()}
    name = str(getattr(bridge.cfg, "model_name", "") or hf_model.config.model_type)
    model = convert(hf_model.config.to_dict(), sd, name=name, allow_unused=True)  # the bridge's own views
    model.tokenizer = _wrap_tokenizer(getattr(bridge, "tokenizer", None))
    return model
