"""Trace: what a run recorded, keyed by hook name; and the one streaming API, reducers fed batch by batch.

``record(model, tokens, names_filter=...)`` runs the model with saving hooks and returns ``(output, Trace)``.
Memory controls: a names filter, a subset of layers, a storage dtype, a device to offload to, and reducers
that fold statistics batch by batch (or query-chunk by query-chunk) instead of storing tensors.
``stream(model, batches, reducers)`` runs a whole dataset through reducers; it and ``record`` share the one
function that wires reducers to hook points.
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
from .data.batches import Batch, check_length, iter_batches
from .hooks import HookPoint, NamesFilter, QueryChunkHook, resolve_names

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
    """Folds the tensors of some hook points into a statistic, batch by batch, with a mergeable state.

    Subclasses set ``names`` (a names filter) and implement :meth:`update`; they keep everything they
    accumulate in ``self.state``, a dict of plain tensors of sums and counts (never means), so that two
    reducers that saw different data combine by adding states (:meth:`merge`: order-independent, what a
    distributed all-reduce does) and :meth:`result` is computed from the state alone.

    The streaming runner (:func:`stream`, and :func:`record` for one batch) calls, per batch:
    :meth:`begin_batch` with the :class:`~interp.data.Batch` (tokens, mask, annotations: prepare targets
    here), :meth:`update` for every tensor of a selected hook point, and :meth:`end_batch` after the forward
    pass (fold per-batch temporaries into the state here).

    With query chunking (:meth:`Transformer.set_query_chunk`) score and pattern hooks fire once per chunk;
    ``q_start`` is the chunk's first query position (0 otherwise).
    """

    names: NamesFilter = None

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}

    def begin_batch(self, batch: Batch) -> None:
        """Called before the forward pass over ``batch`` (default: nothing to prepare)."""

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def end_batch(self) -> None:
        """Called after the forward pass over the current batch (default: nothing to fold)."""

    def result(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    # --- mergeable state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """A copy of the state: sums and counts as plain tensors."""
        return {k: v.detach().clone() for k, v in self.state.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the state (for example with an all-reduced one).

        Raises:
            TypeError: a value is not a tensor.
        """
        bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise TypeError(f"state values must be tensors; not for keys {bad}")
        self.state = {k: v.detach().clone() for k, v in state.items()}

    def merge(self, other: Reducer) -> Reducer:
        """Add ``other``'s state into this one (keys missing on one side count as zero); returns ``self``.

        Raises:
            TypeError: ``other`` is a different reducer type.
            ValueError: a shared key has different shapes.
        """
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        for k, v in other.state.items():
            if k in self.state and self.state[k].shape != v.shape:
                raise ValueError(f"merge: state {k!r} has shape {tuple(self.state[k].shape)} here and "
                                 f"{tuple(v.shape)} in the other reducer")
            self.state[k] = self.state[k] + v.to(self.state[k]) if k in self.state else v.detach().clone()
        return self

    def _add(self, key: str, value: torch.Tensor) -> None:
        """Accumulate ``value`` into ``state[key]`` (created on first use)."""
        self.state[key] = self.state[key] + value if key in self.state else value.clone()


class MeanReducer(Reducer):
    """Running mean over the batch axis (axis 0) of each selected hook, over every batch it sees.

    Query-chunked patterns are summed chunk by chunk (state ``"{name}@{q_start}"``) and stitched in
    :meth:`result`; ``"{name}#n"`` counts the rows.

    Example:
        >>> r = MeanReducer("blocks.*.attn.hook_pattern")
        >>> stream(model, tokens, [r])
        >>> r.result()["blocks.0.attn.hook_pattern"].shape   # [H, T, S]
    """

    def __init__(self, names: NamesFilter) -> None:
        super().__init__()
        self.names = names

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        t = tensor.detach().float()
        key = f"{name}@{q_start}"
        if key in self.state and self.state[key].shape != t.shape[1:]:
            raise ValueError(f"MeanReducer: {name} changed shape from {tuple(self.state[key].shape)} "
                             f"to {tuple(t.shape[1:])}; pad batches to one length")
        self._add(key, t.sum(0, dtype=torch.float64))  # float64 sums: merging shards in any order agrees
        if q_start == 0:
            self._add(f"{name}#n", torch.tensor(float(t.shape[0]), dtype=torch.float64))

    def result(self) -> dict[str, torch.Tensor]:
        out = {}
        for count in (k for k in self.state if k.endswith("#n")):
            name = count[:-2]
            chunks = sorted((int(k.rsplit("@", 1)[1]), v) for k, v in self.state.items()
                            if k.rsplit("@", 1)[0] == name and "@" in k)
            parts = [v for _, v in chunks]
            # Chunks split the query axis, which is axis 1 once the batch axis is summed away.
            total = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
            out[name] = (total / self.state[count]).float()
        return out


def _reducer_hooks(model: Transformer, reducers: Sequence[Reducer]) -> list[tuple[list[str], QueryChunkHook]]:
    """The one place where reducers meet hooks: each gets its hook points, with the query offset."""
    return [(resolve_names(r.names, model.hook_names),
             QueryChunkHook(lambda t, hook, q0, r=r: r.update(hook.name, t, q_start=q0))) for r in reducers]


class _StopForward(Exception):
    """Raised by :func:`stream`'s last hook: no reducer reads anything the rest of the forward pass computes."""


# Hook points that fire, within a block, no later than its attention pattern (plus the embeddings).
_UP_TO_PATTERN = re.compile(r"blocks\.(\d+)\.(?:hook_resid_pre|attn\.hook_(?:q|k|v|attn_scores|pattern))|hook_(?:pos_)?embed")


def _stop_point(names: Sequence[str]) -> str | None:
    """The attention-pattern hook after which a pass feeding only ``names`` can stop, or None (run it all).

    When every hook the reducers read fires no later than some layer's pattern (the usual case: analyzers
    of attention patterns), the rest of that block, the later blocks and the unembedding are wasted work:
    for a 6-layer encoder that is the last block's value mixing, output projection and MLP, ~13 % of a pass.
    """
    last = -1
    for n in names:
        m = _UP_TO_PATTERN.fullmatch(n)
        if m is None:
            return None
        last = max(last, int(m.group(1)) if m.group(1) is not None else -1)
    return None if last < 0 else f"blocks.{last}.attn.hook_pattern"


def _stop_hook(t: torch.Tensor, hook: Any, q0: int) -> None:
    if q0 + t.shape[-2] >= t.shape[-1]:  # the last query chunk (without a cache, queries = keys)
        raise _StopForward


def stream(
    model: Transformer,
    data: Any,
    reducers: Sequence[Reducer],
    *,
    batch_size: int = 32,
    name: str = "tokens",
    progress: bool = False,
) -> int:
    """Run ``model`` over ``data`` batch by batch, feeding ``reducers``; nothing is stored.

    Every reducer sees every batch (:meth:`Reducer.begin_batch`, :meth:`Reducer.update` per hook tensor,
    :meth:`Reducer.end_batch`), so all statistics of one dataset come from one forward pass per batch.
    Gradients are off. Under ``torchrun`` (``torch.distributed`` initialised, several ranks) each rank runs
    the batches ``rank::world_size`` after checking that all ranks hold the same model and data, and the
    reducers' states are summed over the ranks (see :mod:`interp.distributed`).

    Args:
        model: an interp Transformer.
        data: anything :func:`~interp.data.iter_batches` accepts (a LongTensor ``[N, T]``, an iterable of
            :class:`~interp.data.Batch`, tensors, ``(tokens, mask)`` tuples or dicts).
        reducers: the reducers to feed.
        batch_size: rows per forward pass when ``data`` is one tensor.
        name: the data's name, for error messages.
        progress: show a tqdm bar over batches.

    Returns:
        The number of sequences processed (over all ranks).

    Raises:
        ValueError: an empty dataset, a sequence longer than the model's context, a reducer's hook name
            that matches nothing, or ranks that disagree on the model or the data.

    Example:
        >>> r = MeanReducer("blocks.0.attn.hook_pattern")
        >>> stream(model, torch.randint(0, 100, (64, 16)), [r], batch_size=16)
        64
    """
    hooks = _reducer_hooks(model, reducers)
    stop = _stop_point([n for names, _ in hooks for n in names])
    if stop is not None:  # after the reducers' own hooks on that point, so they see its tensor first
        hooks.append(([stop], QueryChunkHook(_stop_hook)))
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    batches = iter_batches(data, batch_size=batch_size, name=name)
    sharded = torch.distributed.is_available() and torch.distributed.is_initialized()
    if sharded:  # the single-process path never imports interp.distributed
        from . import distributed

        sharded = distributed.active()
    if sharded:  # data parallel under torchrun: check that the ranks agree, then run this rank's batches only
        batches = list(batches)
        for b in batches:  # fail on every rank alike, not on one while the others wait in the all-reduce
            check_length(model, b.tokens.shape[1])
        distributed.check_same(model, distributed.describe_batches(batches))
        batches = distributed.shard(batches)
        progress = progress and distributed.rank() == 0
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="batches")
    n = 0
    # Hooks are shared state: hold the model's lock for the whole stream, so no other thread's pass sees them.
    with getattr(model, "lock", contextlib.nullcontext()), torch.no_grad(), model.hooks(hooks):
        for batch in batches:
            check_length(model, batch.tokens.shape[1])
            for r in reducers:
                r.begin_batch(batch)
            kwargs = {} if batch.mask is None else {"attention_mask": batch.mask.to(device)}
            try:
                model(batch.tokens.to(device), **kwargs)
            except _StopForward:
                pass  # every reducer has what it reads from this batch
            for r in reducers:
                r.end_batch()
            n += len(batch)
    if sharded:  # one all-reduce of every reducer's state: each rank now holds the whole dataset's sums
        n = distributed.all_reduce_reducers(reducers, n)
    return n


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
        >>> trace.save(tmp / "run.safetensors"); Trace.load(tmp / "run.safetensors")
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

    def apply_ln_to_stack(self, stack: torch.Tensor, model: Transformer, **kwargs: Any) -> torch.Tensor:
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
            >>> trace.save(tmp / "run.safetensors"); Trace.load(tmp / "run.safetensors")
        """
        path = Path(path)
        if not path.parent.is_dir():
            raise FileNotFoundError(f"cannot save the trace to {str(path)!r}: folder {str(path.parent)!r} "
                                    "does not exist")
        if _TOKENS_KEY in self:
            raise ValueError(f"{_TOKENS_KEY!r} is reserved for the input tokens; rename that recorded tensor")
        _ = self.str_tokens  # decode before writing, so the file carries them
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
    def load(cls, path: str | Path) -> Trace:
        """Read a file written by :meth:`save`.

        Args:
            path: a ``.safetensors`` file written by :meth:`save`.

        Returns:
            The trace, with its tokens and metadata.

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not an interp trace, or its metadata is not a JSON object.

        Example:
            >>> trace = Trace.load(trace.save(tmp / "run.safetensors"))
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
    model: Transformer,
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

    def save(t: torch.Tensor, hook: HookPoint, q_start: int) -> None:
        t = t.detach()
        if dtype is not None:
            t = t.to(dtype)
        if device is not None:
            t = t.to(device)
        chunks = store.setdefault(hook.name, [])
        if q_start == 0:
            chunks.clear()  # a new forward pass (or the first query chunk) replaces what was there
        chunks.append(t)

    fwd_hooks: list = [(names, QueryChunkHook(save))] if names else []
    fwd_hooks += _reducer_hooks(model, reducers)
    tokens = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("tokens")
    if isinstance(tokens, torch.Tensor) and tokens.dim() == 1:
        tokens = tokens[None]
    head_writes = {}
    # One lock over the pass and the W_O/gate snapshot: another thread must not change gates in between.
    with getattr(model, "lock", contextlib.nullcontext()):
        if reducers and isinstance(tokens, torch.Tensor):
            batch = Batch(tokens, kwargs.get("attention_mask"))
            for r in reducers:
                r.begin_batch(batch)
        out = model.run_with_hooks(*args, fwd_hooks=fwd_hooks, **kwargs)
        for r in reducers:
            r.end_batch()
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
    return out, Trace(tensors, meta, tokens, [r.result() for r in reducers], head_writes=head_writes,
                      tokenizer=getattr(model, "tokenizer", None))
