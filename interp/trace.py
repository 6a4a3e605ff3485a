"""Trace: what a run recorded, keyed by hook name, plus streaming reducers for data too big to keep.

``record(model, tokens, names_filter=...)`` runs the model with saving hooks and returns ``(output, Trace)``.
Memory controls: a names filter, a subset of layers, a storage dtype, a device to offload to, and reducers
that fold statistics batch by batch (or query-chunk by query-chunk) instead of storing tensors.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .hooks import HookPoint, NamesFilter, resolve_names

if TYPE_CHECKING:
    from .model import Transformer

_LAYER_RX = re.compile(r"^blocks\.(\d+)\.")
_TRACE_FORMAT = "interp.trace/1"


class Reducer:
    """Folds the tensors of some hook points into a statistic, batch by batch.

    Subclasses set ``names`` (a names filter) and implement :meth:`update` and :meth:`result`. With query
    chunking (:meth:`Transformer.set_query_chunk`) pattern hooks fire once per chunk; ``hook.ctx["q_start"]``
    gives the chunk's first query position.
    """

    names: NamesFilter = None

    def update(self, name: str, tensor: torch.Tensor, hook: HookPoint) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def result(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class MeanReducer(Reducer):
    """Running mean over the batch axis (axis 0) of each selected hook, over every batch it sees.

    Query-chunked patterns (``hook.ctx["q_start"]``) are summed chunk by chunk and stitched in :meth:`result`.

    Example:
        >>> r = MeanReducer("blocks.*.attn.hook_pattern")
        >>> for batch in batches: model.run_with_cache(batch, names_filter=[], reducers=[r])
        >>> r.result()["blocks.0.attn.hook_pattern"].shape   # [H, T, S]
    """

    def __init__(self, names: NamesFilter) -> None:
        self.names = names
        self._sum: dict[str, dict[int, torch.Tensor]] = {}  # name -> query offset -> summed chunk
        self._n: dict[str, int] = {}

    def update(self, name: str, tensor: torch.Tensor, hook: HookPoint) -> None:
        t = tensor.detach().float()
        q_start = hook.ctx.get("q_start", 0)
        chunks = self._sum.setdefault(name, {})
        if q_start in chunks and chunks[q_start].shape != t.shape[1:]:
            raise ValueError(f"MeanReducer: {name} changed shape from {tuple(chunks[q_start].shape)} "
                             f"to {tuple(t.shape[1:])}; pad batches to one length")
        chunks[q_start] = chunks.get(q_start, 0) + t.sum(0)
        if q_start == 0:
            self._n[name] = self._n.get(name, 0) + t.shape[0]

    def result(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, chunks in self._sum.items():
            parts = [chunks[k] for k in sorted(chunks)]
            # Chunks split the query axis, which is axis 1 once the batch axis is summed away.
            total = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
            out[name] = total / self._n[name]
        return out


class Trace:
    """Recorded activations keyed by hook name.

    Args:
        tensors: hook name -> tensor.
        meta: free metadata (``model``, ``n_layers``, ``n_heads``, ``str_tokens``...).
        tokens: the ``[B, T]`` input ids, when known.
        stats: results of reducers, by reducer index.

    Example:
        >>> _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
        >>> trace.pattern(0).shape      # [batch, n_heads, query_pos, key_pos]
        >>> trace.save("run.safetensors"); Trace.load("run.safetensors")
    """

    def __init__(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any] | None = None,
                 tokens: torch.Tensor | None = None, stats: list[Any] | None = None) -> None:
        self.tensors = dict(tensors)
        self.meta = dict(meta or {})
        self.tokens = tokens
        self.stats = list(stats or [])

    # --- mapping interface ------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{name!r} was not recorded; recorded: {sorted(self.tensors)[:8]}"
                           f"{' ...' if len(self.tensors) > 8 else ''}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def keys(self):
        return self.tensors.keys()

    def items(self):
        return self.tensors.items()

    @property
    def layers(self) -> list[int]:
        """Layers with at least one recorded tensor."""
        return sorted({int(m.group(1)) for n in self.tensors if (m := _LAYER_RX.match(n))})

    # --- per-head accessors -----------------------------------------------------------------------------
    def pattern(self, layer: int) -> torch.Tensor:
        """Attention pattern of ``layer``: ``[B, H, query_pos, key_pos]``."""
        return self[f"blocks.{layer}.attn.hook_pattern"]

    def patterns(self, layers: Sequence[int] | None = None) -> torch.Tensor:
        """Patterns stacked over layers: ``[L, B, H, query_pos, key_pos]``."""
        layers = self._layers_with("attn.hook_pattern") if layers is None else layers
        return torch.stack([self.pattern(layer) for layer in layers])

    def z(self, layer: int) -> torch.Tensor:
        """Per-head mixed values of ``layer``: ``[B, pos, H, D]``."""
        return self[f"blocks.{layer}.attn.hook_z"]

    def head_out(self, layer: int) -> torch.Tensor:
        """Per-head residual writes z_h W_O[h] of ``layer``: ``[B, pos, H, d_model]``."""
        return self[f"blocks.{layer}.attn.hook_result"]

    def head_outs(self, layers: Sequence[int] | None = None) -> torch.Tensor:
        """Per-head writes stacked over layers: ``[L, B, pos, H, d_model]``."""
        layers = self._layers_with("attn.hook_result") if layers is None else layers
        return torch.stack([self.head_out(layer) for layer in layers])

    def _layers_with(self, suffix: str) -> list[int]:
        layers = [layer for layer in self.layers if f"blocks.{layer}.{suffix}" in self.tensors]
        if not layers:
            raise KeyError(f"no 'blocks.*.{suffix}' was recorded; record it with names_filter='*{suffix}'")
        return layers

    @property
    def str_tokens(self) -> list[list[str]] | None:
        """Token strings per sequence, when the model had a tokenizer."""
        return self.meta.get("str_tokens")

    # --- persistence ------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write tensors to a safetensors file; metadata goes into its JSON header."""
        path = Path(path)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.tensors.items()}
        if self.tokens is not None:
            tensors["__tokens__"] = self.tokens.detach().contiguous().cpu()
        meta = {"format": _TRACE_FORMAT, "meta": json.dumps(self.meta)}
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a file written by :meth:`save`.

        Raises:
            ValueError: the file is not an interp trace.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no trace file at {str(path)!r}")
        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"{str(path)!r} is not a readable safetensors trace: {e}") from e
        if header.get("format") != _TRACE_FORMAT:
            raise ValueError(f"{str(path)!r} is not an interp trace (format={header.get('format')!r})")
        tokens = tensors.pop("__tokens__", None)
        return cls(tensors, json.loads(header.get("meta", "{}")), tokens)

    # --- display ----------------------------------------------------------------------------------------
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def __repr__(self) -> str:
        return (f"Trace(model={self.meta.get('model')!r}, tensors={len(self.tensors)}, layers={self.layers}, "
                f"MB={self.nbytes() / 2**20:.2f})")

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{tuple(v.shape)}</td><td>{str(v.dtype).replace('torch.', '')}</td></tr>"
            for k, v in self.tensors.items()
        )
        return (f"<b>Trace</b> of {html.escape(str(self.meta.get('model')))} ({self.nbytes() / 2**20:.2f} MB)"
                f"<table><tr><th>hook</th><th>shape</th><th>dtype</th></tr>{rows}</table>")


def record(
    model: "Transformer",
    *args: Any,
    names_filter: NamesFilter = None,
    layers: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    reducers: Sequence[Reducer] = (),
    **kwargs: Any,
) -> tuple[torch.Tensor, Trace]:
    """Run ``model(*args, **kwargs)`` and record hook points into a :class:`Trace`.

    Args:
        model: an interp Transformer (or anything with ``hook_names`` and ``hooks``).
        names_filter: which hook points to store (name, glob, list, predicate; ``None`` = all). ``[]``
            stores nothing (useful with reducers).
        layers: keep only hook points of these layers.
        dtype: cast stored tensors (for example ``torch.float16`` to halve memory).
        device: move stored tensors there (for example ``"cpu"`` to offload from a GPU).
        reducers: :class:`Reducer` objects fed with their own hook points; their results land in
            ``trace.stats`` in the same order.

    Returns:
        ``(output, trace)``.

    Raises:
        ValueError: an explicit hook name matches nothing, or a layer is out of range.
    """
    names = [] if isinstance(names_filter, (list, tuple)) and not names_filter else resolve_names(
        names_filter, model.hook_names)
    if layers is not None:
        n_layers = model.cfg.n_layers
        bad = [layer for layer in layers if not 0 <= layer < n_layers]
        if bad:
            raise ValueError(f"layers {bad} out of range for a model with {n_layers} layers")
        keep = {f"blocks.{layer}." for layer in layers}
        names = [n for n in names if any(n.startswith(k) for k in keep)]
    store: dict[str, list[torch.Tensor]] = {}

    def save(t: torch.Tensor, hook: HookPoint) -> None:
        t = t.detach()
        if dtype is not None:
            t = t.to(dtype)
        if device is not None:
            t = t.to(device)
        chunks = store.setdefault(hook.name, [])
        if hook.ctx.get("q_start", 0) == 0:
            chunks.clear()  # a new forward pass (or the first query chunk) replaces what was there
        chunks.append(t)

    fwd_hooks: list = [(names, save)] if names else []
    for r in reducers:
        fwd_hooks.append((resolve_names(r.names, model.hook_names),
                          lambda t, hook, r=r: r.update(hook.name, t, hook)))
    out = model.run_with_hooks(*args, fwd_hooks=fwd_hooks, **kwargs)
    # Query-chunked attention fires score/pattern hooks once per chunk: stitch them along the query axis.
    tensors = {k: v[0] if len(v) == 1 else torch.cat(v, dim=2) for k, v in store.items()}
    meta: dict[str, Any] = {"model": getattr(model, "name", type(model).__name__),
                            "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads}
    tokens = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("tokens")
    if isinstance(tokens, torch.Tensor) and tokens.dim() == 1:
        tokens = tokens[None]
    tok = getattr(model, "tokenizer", None)
    if tok is not None and tokens is not None:
        meta["str_tokens"] = [tok.to_str_tokens(row.tolist()) for row in tokens]
    return out, Trace(tensors, meta, tokens, [r.result() for r in reducers])
