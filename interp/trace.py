"""Trace: what a run recorded, keyed by hook name, plus streaming reducers for data too big to keep.

``record(model, tokens, names_filter=...)`` runs the model with saving hooks and returns ``(output, Trace)``.
Memory controls: a names filter, a subset of layers, a storage dtype, a device to offload to, and reducers
that fold statistics batch by batch (or query-chunk by query-chunk) instead of storing tensors.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from . import trace_views
from .hooks import HookPoint, NamesFilter, resolve_names

if TYPE_CHECKING:
    from .model import Transformer

_LAYER_RX = re.compile(r"^blocks\.(\d+)\.")
_TRACE_FORMAT = "interp.trace/1"
_TOKENS_KEY = "__tokens__"


def _json_object(path: Path, header: dict[str, str], key: str) -> dict[str, Any]:
    """A JSON object stored under ``key`` in a trace file's header (``{}`` when absent)."""
    try:
        value = json.loads(header.get(key, "{}"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{str(path)!r}: the trace's {key!r} header is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{str(path)!r}: the trace's {key!r} header must be a JSON object, "
                         f"got {type(value).__name__}")
    return value


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
                 tokens: torch.Tensor | None = None, stats: list[Any] | None = None, *,
                 head_writes: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
                 tokenizer: Any = None) -> None:
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict (str -> JSON value), got {type(meta).__name__}: {meta!r:.80}")
        self.tensors = dict(tensors)
        self.meta = dict(meta or {})
        self.tokens = tokens
        self.stats = list(stats or [])
        # Per-head writes kept as (z [B, T, H, D], W_O per head [H, D, M]) and multiplied out on access:
        # z is d_model / d_head times smaller than the writes, and recording stays cheap.
        self._head_writes = dict(head_writes or {})
        self._tokenizer = tokenizer

    # --- mapping interface ------------------------------------------------------------------------------
    def __getitem__(self, name: str | tuple) -> torch.Tensor:
        if isinstance(name, tuple) or name in trace_views.GLOBAL_NAMES:  # TL short names: trace["pattern", 0]
            name = trace_views.act_name(self, name if isinstance(name, tuple) else (name,))
        if name in self.tensors:
            return self.tensors[name]
        if name in self._head_writes:
            z, w_o = self._head_writes[name]
            return torch.einsum("bthd,hdm->bthm", z, w_o)  # [B, T, H, M]
        names = list(self)
        raise KeyError(f"{name!r} was not recorded; recorded: {sorted(names)[:8]}"
                       f"{' ...' if len(names) > 8 else ''}")

    def __contains__(self, name: object) -> bool:
        return name in self.tensors or name in self._head_writes

    def __iter__(self) -> Iterator[str]:
        yield from self.tensors
        yield from (n for n in self._head_writes if n not in self.tensors)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys(self) -> list[str]:
        return list(self)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((k, self[k]) for k in self)

    @property
    def layers(self) -> list[int]:
        """Layers with at least one recorded tensor."""
        return sorted({int(m.group(1)) for n in self if (m := _LAYER_RX.match(n))})

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

    # --- TransformerLens-style residual views (interp/trace_views.py) ------------------------------------
    def stack_head_results(self, layer: int | None = None, **kwargs: Any) -> Any:
        """Every head's write stacked ``[n_heads_total, B, T, M]``, labels ``"L3H5"``; see :func:`trace_views.stack_head_results`."""
        return trace_views.stack_head_results(self, layer, **kwargs)

    def decompose_resid(self, layer: int | None = None, **kwargs: Any) -> Any:
        """Embeddings, attention and MLP outputs stacked ``[C, B, T, M]``; see :func:`trace_views.decompose_resid`."""
        return trace_views.decompose_resid(self, layer, **kwargs)

    def accumulated_resid(self, layer: int | None = None, **kwargs: Any) -> Any:
        """Residual stream at each layer's input ``[C, B, T, M]``; see :func:`trace_views.accumulated_resid`."""
        return trace_views.accumulated_resid(self, layer, **kwargs)

    def apply_ln_to_stack(self, stack: torch.Tensor, model: "Transformer", **kwargs: Any) -> torch.Tensor:
        """A stack normalised by the recorded run's norm scale; see :func:`trace_views.apply_ln_to_stack`."""
        return trace_views.apply_ln_to_stack(self, stack, model, **kwargs)

    def _layers_with(self, suffix: str) -> list[int]:
        layers = [layer for layer in self.layers if f"blocks.{layer}.{suffix}" in self]
        if not layers:
            raise KeyError(f"no 'blocks.*.{suffix}' was recorded; record it with names_filter='*{suffix}'")
        return layers

    @property
    def str_tokens(self) -> list[list[str]] | None:
        """Token strings per sequence, when the model had a tokenizer (decoded on first access)."""
        if "str_tokens" not in self.meta and self._tokenizer is not None and self.tokens is not None:
            self.meta["str_tokens"] = [self._tokenizer.to_str_tokens(row.tolist()) for row in self.tokens]
        return self.meta.get("str_tokens")

    # --- persistence ------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write tensors to a safetensors file; metadata goes into its JSON header.

        Recordings that share memory (``hook_embed`` and ``blocks.0.hook_resid_pre`` are one tensor) are
        written once and restored as the same tensor.

        Args:
            path: the file to write; its folder must exist.

        Returns:
            The path written.

        Raises:
            FileNotFoundError: the folder does not exist.
            ValueError: a recorded tensor uses the reserved name ``__tokens__``, or ``meta`` is not JSON.

        Example:
            >>> trace.save("run.safetensors"); Trace.load("run.safetensors")
        """
        path = Path(path)
        if not path.parent.is_dir():
            raise FileNotFoundError(f"cannot save the trace to {str(path)!r}: folder {str(path.parent)!r} "
                                    "does not exist")
        if _TOKENS_KEY in self:
            raise ValueError(f"{_TOKENS_KEY!r} is reserved for the input tokens; rename that recorded tensor")
        self.str_tokens  # decode before writing, so the file carries them
        try:
            meta_json = json.dumps(self.meta)
        except (TypeError, ValueError) as e:
            raise ValueError(f"trace meta must be JSON (str keys; str, number, list, dict values): {e}") from e
        tensors: dict[str, torch.Tensor] = {}
        aliases: dict[str, str] = {}
        seen: dict[tuple, str] = {}  # a view's identity -> the name it was written under
        storages: set[int] = set()
        items = list(self.items())
        if self.tokens is not None:
            items.append((_TOKENS_KEY, self.tokens))
        for name, t in items:
            t = t.detach().contiguous().cpu()
            view = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
            if view in seen:
                aliases[name] = seen[view]
                continue
            if t.untyped_storage().data_ptr() in storages:
                t = t.clone()  # a different view of memory already written: safetensors needs its own copy
            seen[view] = name
            storages.add(t.untyped_storage().data_ptr())
            tensors[name] = t
        header = {"format": _TRACE_FORMAT, "meta": meta_json}
        if aliases:
            header["aliases"] = json.dumps(aliases)
        save_file(tensors, str(path), metadata=header)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a file written by :meth:`save`.

        Args:
            path: a ``.safetensors`` file written by :meth:`save`.

        Returns:
            The trace, with its tokens and metadata.

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not an interp trace, or its metadata is not a JSON object.

        Example:
            >>> trace = Trace.load("run.safetensors")
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
        meta = _json_object(path, header, "meta")
        for name, source in _json_object(path, header, "aliases").items():
            if source not in tensors:
                raise ValueError(f"{str(path)!r}: alias {name!r} points to {source!r}, which is not in the file")
            tensors[name] = tensors[source]
        tokens = tensors.pop(_TOKENS_KEY, None)
        return cls(tensors, meta, tokens)

    # --- display ----------------------------------------------------------------------------------------
    def nbytes(self) -> int:
        """Bytes held (per-head writes count as their z and W_O, which is what is stored)."""
        held = list(self.tensors.values()) + [t for pair in self._head_writes.values() for t in pair]
        return sum(t.numel() * t.element_size() for t in {id(t): t for t in held}.values())

    def __repr__(self) -> str:
        return (f"Trace(model={self.meta.get('model')!r}, tensors={len(self)}, layers={self.layers}, "
                f"MB={self.nbytes() / 2**20:.2f})")

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{tuple(v.shape)}</td><td>{str(v.dtype).replace('torch.', '')}</td></tr>"
            for k, v in self.tensors.items()
        ) + "".join(
            f"<tr><td>{html.escape(k)}</td><td>{tuple(z.shape[:3]) + (w.shape[-1],)}</td><td>{str(z.dtype).replace('torch.', '')}"
            " (z @ W_O on access)</td></tr>"
            for k, (z, w) in self._head_writes.items()
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

    Per-head writes (``*.hook_result``) are recorded as the head's z (after ``hook_z``) and a snapshot of
    its W_O (times its gate, if any) and multiplied out when read: the same numbers, without a
    ``[B, T, H, d_model]`` tensor per layer in the forward pass. Hooks on ``hook_result`` and reducers still
    receive the computed writes.

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
    # hook_result -> record its z instead (see the docstring); the writes are rebuilt from z on access.
    requested = set(names)
    results = [n for n in names if n.endswith(".hook_result")]
    z_names = {n: n[: -len("hook_result")] + "hook_z" for n in results}
    names = [n for n in names if n not in z_names] + [z for z in z_names.values() if z not in names]
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
    head_writes = {}
    # One lock over the pass and the W_O/gate snapshot: another thread must not change gates in between.
    with getattr(model, "lock", contextlib.nullcontext()):
        out = model.run_with_hooks(*args, fwd_hooks=fwd_hooks, **kwargs)
        # Query-chunked attention fires score/pattern hooks once per chunk: stitch them along the query axis.
        tensors = {k: v[0] if len(v) == 1 else torch.cat(v, dim=2) for k, v in store.items()}
        for result_name, z_name in z_names.items():
            attn = model.get_submodule(result_name[: -len(".hook_result")])
            w_o = attn.W_O_heads.detach()  # [H, D, M]
            if attn.gate is not None:
                w_o = w_o * attn.gate.detach().to(w_o.dtype)[:, None, None]  # gated head h writes gate_h z_h W_O[h]
            w_o = w_o.to(dtype=dtype or w_o.dtype, device=device or w_o.device, copy=True)
            z = tensors[z_name] if z_name in requested else tensors.pop(z_name)
            head_writes[result_name] = (z, w_o)
    meta: dict[str, Any] = {"model": getattr(model, "name", type(model).__name__),
                            "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads}
    tokens = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("tokens")
    if isinstance(tokens, torch.Tensor) and tokens.dim() == 1:
        tokens = tokens[None]
    return out, Trace(tensors, meta, tokens, [r.result() for r in reducers], head_writes=head_writes,
                      tokenizer=getattr(model, "tokenizer", None))
