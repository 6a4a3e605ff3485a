"""The streaming engine: reducers fed batch by batch, ``stream`` over a dataset and ``record`` into a Trace.

``record(model, tokens, names_filter=...)`` runs the model with saving hooks and returns ``(output, Trace)``.
Memory controls: a names filter, a subset of layers, a storage dtype, a device to offload to, and reducers
that fold statistics batch by batch (or query-chunk by query-chunk) instead of storing tensors.
``stream(model, batches, reducers)`` runs a whole dataset through reducers; it and ``record`` share the one
function that wires reducers to hook points.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .data.batches import Batch, check_length, iter_batches
from .hooks import HookPoint, NamesFilter, QueryChunkHook, resolve_names
from .placement import is_split
from .progress import bar as progress_bar
from .progress import enabled as progress_enabled
from .progress import listening as progress_listening
from .trace import Trace

if TYPE_CHECKING:
    from .model import Transformer


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

    ``reads_query_chunks``: the reducer folds score / pattern rows chunk by chunk (it places them by
    ``q_start``), so :func:`stream` may compute a long sequence's attention a chunk of queries at a time
    (:func:`auto_query_chunk`) and no ``[B, H, T, T]`` pattern ever exists (memory linear in T). False by default: a reducer written
    for whole patterns keeps getting them.

    ``reads_cut_rows``: the reducer also folds a causal chunk's rows cut after the chunk's last query's key,
    ``[B, H, c, n]`` with ``n = q_start + c`` keys in a pass without a cache (the keys cut are exactly the
    ones no query of the chunk may see: zero weights, masked scores), so it must take the key count from the
    tensor, never assume ``S = T``. When every hook on a score / pattern point is such a reducer, attention
    hands its rows over as computed (:class:`~interp.hooks.QueryChunkHook` ``cut_rows``): no padded
    ``[B, H, c, S]`` copy per chunk and layer (on average half of it zeros). False by default.
    """

    names: NamesFilter = None
    reads_query_chunks: bool = False
    reads_cut_rows: bool = False

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


#: The most queries per chunk of :func:`stream`'s automatic query chunking (a chunk's QK^T stays one efficient
#: matrix product).
AUTO_QUERY_CHUNK = 512
#: Fewer queries per chunk when a chunk's float32 rows ``[B, H, rows, S]`` would pass this many bytes: a chunk is
#: read several times (softmax, the hooks, every reducer), and on a CPU each read of a chunk that stays in the
#: caches costs a fraction of one from memory (SmolLM2 at 4,096 tokens, 1 thread: a pass takes 1.7x one SDPA
#: forward in chunks of 512 queries, 1.1x in chunks of 32). On a GPU the budget is wide: there each chunk costs
#: kernel launches, and memory bandwidth is plentiful.
AUTO_CHUNK_BYTES = {"cpu": 4 * 2**20, "other": 512 * 2**20}
#: ... but never fewer queries than this (each chunk also costs Python and dispatch time per layer).
AUTO_MIN_QUERY_CHUNK = 16
#: ... and no more chunks per layer than this, as long as a chunk's rows stay under :data:`AUTO_CHUNK_CAP_BYTES`:
#: each chunk costs a fixed share of Python and small tensor ops in the attention and in every reducer, which
#: the byte budget alone multiplies by the square of the length (SmolLM2 at 8,192 tokens, 1 thread: 512 chunks of
#: 16 queries a layer made the text pass ~1.25x what 128 chunks of 64 take on its first 3 layers, 57.7 s against
#: 54.6 s over all 30 in one noisy run each; at 4,096 tokens ~28-32 queries stay best).
AUTO_MAX_CHUNKS = 128
#: The most bytes of a chunk's float32 rows that :data:`AUTO_MAX_CHUNKS` may ask for: a fixed ceiling, so the
#: memory of a pass stays linear in T at any length (past ~11k tokens on SmolLM2 the chunks are again more).
AUTO_CHUNK_CAP_BYTES = {"cpu": 32 * 2**20, "other": 512 * 2**20}


def auto_query_chunk(model: Any, batch_size: int, n_keys: int, most: int = AUTO_QUERY_CHUNK) -> int:
    """Queries per chunk for a pass of ``batch_size`` sequences over ``n_keys`` keys: at most ``most``, fewer
    when a chunk's float32 pattern rows would pass :data:`AUTO_CHUNK_BYTES` for the model's device, never fewer
    than :data:`AUTO_MIN_QUERY_CHUNK`, nor so few that ``n_keys`` queries take more than :data:`AUTO_MAX_CHUNKS`
    chunks while a chunk stays under :data:`AUTO_CHUNK_CAP_BYTES`.

    Args:
        model: an interp Transformer (its widest layer's head count and its device are read).
        batch_size: sequences in the pass.
        n_keys: keys each query row spans (the sequence length without a cache).
        most: the largest chunk.

    Returns:
        The chunk's query count.

    Example:
        >>> from interp.streaming import auto_query_chunk
        >>> from interp.examples import model
        >>> auto_query_chunk(model, 1, 128), auto_query_chunk(model, 64, 65536)
        (512, 16)
        >>> from interp import ModelConfig, Transformer  # SmolLM2's 9 heads at 2k, 4k, 8k and 32k tokens
        >>> smol = Transformer(ModelConfig(n_layers=1, d_model=576, n_heads=9, n_kv_heads=3, d_vocab=8, n_ctx=8))
        >>> [auto_query_chunk(smol, 1, n) for n in (2048, 4096, 8192, 32768)]  # bytes, count, count, byte ceiling
        [56, 32, 64, 28]
    """
    heads = max((getattr(b.attn, "n_heads", 0) for b in getattr(model, "blocks", ())), default=1) or 1
    # A pipeline's stage keeps other ranks' modules on the meta device: its own weights say where it runs.
    param = next((p for p in model.parameters() if not p.is_meta), None)
    where = "cpu" if param is None or param.device.type == "cpu" else "other"
    row_bytes = max(1, batch_size * heads * n_keys * 4)  # one query's float32 rows over every head of the batch
    rows = AUTO_CHUNK_BYTES[where] // row_bytes
    # Without a cache the queries are the keys: at most AUTO_MAX_CHUNKS chunks of them, within the byte ceiling.
    rows = max(rows, min(-(-n_keys // AUTO_MAX_CHUNKS), AUTO_CHUNK_CAP_BYTES[where] // row_bytes))
    return int(max(min(most, AUTO_MIN_QUERY_CHUNK), min(most, rows)))


class MeanReducer(Reducer):
    """Running mean over the batch axis (axis 0) of each selected hook, over every batch it sees.

    Query-chunked patterns are summed chunk by chunk (state ``"{name}@{q_start}"``) and stitched in
    :meth:`result`; ``"{name}#n"`` counts the rows.

    Example:
        >>> from interp import MeanReducer, stream
        >>> from interp.examples import model, tokens
        >>> r = MeanReducer("blocks.*.attn.hook_pattern")
        >>> stream(model, tokens, [r])
        >>> r.result()["blocks.0.attn.hook_pattern"].shape   # [H, T, S]
    """

    reads_query_chunks = True

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
            self._add(f"{name}#n", torch.tensor(float(t.shape[0]), dtype=torch.float64, device=t.device))

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
    return [(resolve_names(r.names, model.hook_names), QueryChunkHook(_updating(r), cut_rows=r.reads_cut_rows))
            for r in reducers]


def _updating(reducer: Reducer) -> Callable[[torch.Tensor, HookPoint, int], None]:
    """The hook function that feeds ``reducer`` what a hook point sees (and the query offset of the chunk)."""
    def update(t: torch.Tensor, hook: HookPoint, q0: int) -> None:
        reducer.update(hook.name, t, q_start=q0)
    return update


class _StopForward(Exception):
    """Raised by :func:`stream`'s last hook: no reducer reads anything the rest of the forward pass computes."""


# Hook points that fire, within a block, no later than its attention pattern (plus the embeddings).
_UP_TO_PATTERN = re.compile(r"blocks\.(\d+)\.(?:hook_resid_pre|attn\.hook_(?:q|k|v|attn_scores|pattern))|hook_(?:pos_)?embed")
# The heads' outputs, which fire once per layer after every query chunk of its pattern.
_HEAD_OUTPUT = re.compile(r"blocks\.(\d+)\.attn\.hook_z")


def _stop_point(names: Sequence[str]) -> tuple[str, bool] | None:
    """The hook after which a pass feeding only ``names`` can stop, and whether it fires per query chunk; None
    when the pass must run to the end.

    When every hook the reducers read fires no later than some layer's pattern (the usual case: analyzers
    of attention patterns), or its ``hook_z`` (the copying score reads the heads' outputs), the rest of that
    block, the later blocks and the unembedding are wasted work: for a 6-layer encoder that is the last
    block's value mixing, output projection and MLP, ~13 % of a pass; for SmolLM2 the last MLP and the
    49k-token unembedding, ~20 %.
    """
    last = (-1, 0)  # (layer, 0 = up to the pattern / 1 = hook_z)
    for n in names:
        m, z = _UP_TO_PATTERN.fullmatch(n), _HEAD_OUTPUT.fullmatch(n)
        if z is not None:
            last = max(last, (int(z.group(1)), 1))
        elif m is not None:
            last = max(last, (int(m.group(1)) if m.group(1) is not None else -1, 0))
        else:
            return None
    if last[0] < 0:
        return None
    return (f"blocks.{last[0]}.attn.hook_z", False) if last[1] else (f"blocks.{last[0]}.attn.hook_pattern", True)


def _layer_ticks(names: Sequence[str], order: Sequence[str], within: Any) -> list[tuple[list[str], QueryChunkHook]]:
    """Hooks that report ``within(fraction of the pass done)`` after the last hook the reducers read in each
    block (``order``: the model's hook names in forward order). Added only while someone listens."""
    rank = {n: i for i, n in enumerate(order)}
    last: dict[int, str] = {}
    for n in names:
        m = re.match(r"blocks\.(\d+)\.", n)
        if m is not None and rank.get(n, -1) >= rank.get(last.get(int(m.group(1)), ""), -1):
            last[int(m.group(1))] = n
    if not last:
        return []
    n_blocks = max(last) + 1  # the pass stops after the last block any reducer reads, or runs them all
    return [([n], QueryChunkHook(_ticking(within, (layer + 1) / n_blocks), cut_rows=True))  # reads no tensor
            for layer, n in sorted(last.items())]


def _ticking(within: Callable[[float], Any], fraction: float) -> Callable[[torch.Tensor, HookPoint, int], None]:
    """The hook function that reports ``within(fraction)`` (how much of the pass is done)."""
    def tick(t: torch.Tensor, hook: HookPoint, q0: int) -> None:
        within(fraction)
    return tick


_ROW_HOOKS = re.compile(r".*attn\.hook_(?:attn_scores|pattern)")


def _pass_query_chunk(model: Any, reducers: Sequence[Reducer], names: Sequence[str], query_chunk: int | str | None
                      ) -> int | None:
    """The query chunk :func:`stream` sets for its passes, or None to leave the model's own setting.

    ``"auto"``: :data:`AUTO_QUERY_CHUNK` (at most; :func:`stream` sizes each batch's chunk with
    :func:`auto_query_chunk`) when some reducer reads score / pattern rows, every such reducer
    declares :attr:`Reducer.reads_query_chunks`, and the model's attention layers are interp's own with no chunk
    of their own set (a chunk the caller set stays). An int is used as given.

    Raises:
        ValueError: ``query_chunk`` is neither ``"auto"``, None nor an int >= 1, or an int for a pass whose
            reducer reads whole patterns (it does not declare ``reads_query_chunks``).
    """
    if query_chunk is None:
        return None
    if query_chunk != "auto" and (isinstance(query_chunk, bool) or not isinstance(query_chunk, int)
                                  or query_chunk < 1):
        raise ValueError(f"stream: query_chunk={query_chunk!r} must be 'auto', None or an int >= 1")
    reading = [r for r in reducers if any(_ROW_HOOKS.fullmatch(n) for n in resolve_names(r.names, names))]
    whole = [type(r).__name__ for r in reading if not r.reads_query_chunks]
    if whole and query_chunk != "auto":
        raise ValueError(f"stream: query_chunk={query_chunk} but reducers {whole} read whole patterns "
                         f"(they do not declare reads_query_chunks)")
    if query_chunk != "auto":
        return int(query_chunk)
    attns = [getattr(b, "attn", None) for b in getattr(model, "blocks", ())]
    own = bool(attns) and all(a is not None and getattr(a, "query_chunk", 0) is None for a in attns)
    return AUTO_QUERY_CHUNK if reading and not whole and own else None


@contextlib.contextmanager
def _query_chunk(model: Any, chunk: int | None) -> Any:
    """Every attention layer of ``model`` computes ``chunk`` queries at a time inside the block; restored after."""
    if chunk is None:
        yield
        return
    attns = [b.attn for b in model.blocks]
    before = [a.query_chunk for a in attns]
    for a in attns:
        a.query_chunk = chunk
    try:
        yield
    finally:
        for a, c in zip(attns, before):
            a.query_chunk = c


def _stop_after(queries: list[int]) -> Callable[[torch.Tensor, HookPoint, int], None]:
    """The hook that ends the pass after the chunk holding the last of ``queries[0]`` queries (set per batch): the
    rows' key count cannot tell, since a chunk handed over cut ends at its own last query."""
    def stop(t: torch.Tensor, hook: HookPoint, q0: int) -> None:
        if q0 + t.shape[-2] >= queries[0]:  # the last query chunk
            raise _StopForward
    return stop


def _stop_now(t: torch.Tensor, hook: Any, q0: int) -> None:
    raise _StopForward


def stream(
    model: Transformer,
    data: Any,
    reducers: Sequence[Reducer],
    *,
    batch_size: int = 32,
    name: str = "tokens",
    progress: bool | None = False,
    desc: str = "batches",
    query_chunk: int | str | None = "auto",
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
        progress: show a tqdm bar over batches (None: in terminals and notebooks, :mod:`interp.progress`).
        desc: the bar's label.
        query_chunk: queries per chunk of the attention pattern during these passes (see
            :func:`_pass_query_chunk`): ``"auto"`` (default) chunks by :func:`auto_query_chunk` when every
            reducer reading patterns folds them chunk by chunk, an int chunks by that, None leaves the model's
            setting. The scores do not change; a sequence's pattern is never held whole, and a causal chunk
            computes only the keys its queries may see.

    Returns:
        The number of sequences processed (over all ranks).

    Raises:
        ValueError: an empty dataset, a sequence longer than the model's context, a reducer's hook name
            that matches nothing, ranks that disagree on the model or the data, or a bad ``query_chunk``.

    Example:
        >>> import torch
        >>> from interp import MeanReducer, stream
        >>> from interp.examples import model
        >>> r = MeanReducer("blocks.0.attn.hook_pattern")
        >>> stream(model, torch.randint(0, 100, (64, 16)), [r], batch_size=16)
        64
    """
    route = getattr(model, "stream_route", None)
    if route is not None:  # a pipeline's stage inside Pipeline.routed(): the pass runs over the ranks
        return int(route(data, reducers, batch_size=batch_size, name=name, progress=progress, desc=desc,
                         query_chunk=query_chunk))
    hooks = _reducer_hooks(model, reducers)
    chunk = _pass_query_chunk(model, reducers, model.hook_names, query_chunk)
    sized = query_chunk == "auto" and chunk is not None  # each batch's chunk sized by auto_query_chunk
    stop = _stop_point([n for names, _ in hooks for n in names])
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    total = (-(-data.shape[0] // batch_size) if isinstance(data, torch.Tensor) and data.dim() == 2
             else len(data) if isinstance(data, Sequence) else None)  # batches, for the progress bar
    batches: Iterable[Batch] = iter_batches(data, batch_size=batch_size, name=name)
    reported = None
    single = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    if progress_listening() and progress_enabled(progress) and single:
        # Someone draws this pass (interp.progress.listen): report it layer by layer, with the reducers.
        batches = reported = progress_bar(batches, desc=desc, progress=True, total=total, state=reducers)
        hooks += _layer_ticks([n for names, _ in hooks for n in names], model.hook_names, reported.within)
    queries = [0]  # the current batch's length: the stop hook's last query chunk
    if stop is not None:  # after the reducers' own hooks on that point, so they see its tensor first
        hooks.append(([stop[0]], QueryChunkHook(_stop_after(queries) if stop[1] else _stop_now, cut_rows=True)))
    sharded = torch.distributed.is_available() and torch.distributed.is_initialized()
    if sharded:  # the single-process path never imports interp.distributed
        from . import distributed

        sharded = distributed.data_parallel()  # not when the ranks split one model (distributed.replicated)
    if sharded:  # data parallel under torchrun: check that the ranks agree, then run this rank's batches only
        listed = list(batches)
        for b in listed:  # fail on every rank alike, not on one while the others wait in the all-reduce
            check_length(model, b.tokens.shape[1])
        distributed.check_same(model, distributed.describe_batches(listed))
        batches = own = distributed.shard(listed)
        total = len(own)
        progress = progress_enabled(progress) and distributed.rank() == 0
    if progress_enabled(progress) and reported is None:
        batches = progress_bar(batches, desc=desc, progress=True, total=total)
    n = 0
    # Hooks are shared state: hold the model's lock for the whole stream, so no other thread's pass sees them.
    with getattr(model, "lock", contextlib.nullcontext()), torch.no_grad(), model.hooks(hooks), \
            _query_chunk(model, chunk):
        for batch in batches:
            check_length(model, batch.tokens.shape[1])
            queries[0] = batch.tokens.shape[1]
            for r in reducers:
                r.begin_batch(batch)
            kwargs = {} if batch.mask is None else {"attention_mask": batch.mask.to(device)}
            if sized and chunk is not None:
                rows = auto_query_chunk(model, batch.tokens.shape[0], batch.tokens.shape[1], chunk)
                for block in model.blocks:
                    block.attn.query_chunk = rows
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


def record(
    model: Transformer,
    *args: Any,
    names_filter: NamesFilter = None,
    layers: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    reducers: Sequence[Reducer] = (),
    offload: str | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Trace]:
    """Run ``model(*args, **kwargs)`` and record hook points into a :class:`Trace`.

    Args:
        model: an interp Transformer (or anything with ``hook_names`` and ``hooks``).
        names_filter: which hook points to store (name, glob, list, predicate; ``None`` = all). ``[]``
            stores nothing (useful with reducers).
        layers: keep only hook points of these layers.
        dtype: cast stored tensors (for example ``torch.float16`` to halve memory).
        device: move stored tensors there (for example ``"cpu"`` to offload from a GPU). A model split over
            devices (:func:`interp.placement.place`) gathers its trace on the first device by default.
        reducers: :class:`Reducer` objects fed with their own hook points; their results land in
            ``trace.stats`` in the same order.
        offload: ``"cpu"`` streams every recorded tensor to CPU memory as it is produced (pinned memory and
            non-blocking copies from a GPU, so the copies overlap the rest of the pass), for traces that do not
            fit on the GPU. The trace is complete when ``record`` returns.

    Per-head writes (``*.hook_result``) are recorded as the head's z (after ``hook_z``) and a snapshot of
    its W_O (times its gate, if any) and multiplied out when read: the same numbers, without a
    ``[B, T, H, d_model]`` tensor per layer in the forward pass. Hooks on ``hook_result`` and reducers still
    receive the computed writes.

    Returns:
        ``(output, trace)``.

    Raises:
        TypeError: ``layers`` is not a list of int layer indices (``['0']`` is named).
        ValueError: an explicit hook name matches nothing, a layer is out of range, or ``offload`` is not
            ``"cpu"`` / None.
    """
    if offload not in (None, "cpu"):
        raise ValueError(f"offload={offload!r}: only 'cpu' (or None) is supported")
    if reducers and kwargs.get("start_at_layer") is not None:
        raise ValueError(f"reducers read the batch's tokens; a pass from start_at_layer={kwargs['start_at_layer']} "
                         "starts from a residual: record it without reducers")
    if device is None and is_split(model):
        device = model.embed.weight.device  # one trace on one device, whatever block each tensor came from
    names = [] if isinstance(names_filter, (list, tuple)) and not names_filter else resolve_names(
        names_filter, model.hook_names)
    if layers is not None:
        n_layers = model.cfg.n_layers
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not all(
                isinstance(layer, int) and not isinstance(layer, bool) for layer in layers):
            raise TypeError(f"layers must be a list of int layer indices (0 to {n_layers - 1}), got {layers!r}")
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
        if offload is not None and t.device.type != "cpu":
            # A pinned host buffer lets the device-to-host copy run asynchronously on the current stream.
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            t = host.copy_(t, non_blocking=True)
        chunks = store.setdefault(hook.name, [])
        if q_start == 0:
            chunks.clear()  # a new forward pass (or the first query chunk) replaces what was there
        chunks.append(t)

    fwd_hooks: list = [(names, QueryChunkHook(save))] if names else []
    fwd_hooks += _reducer_hooks(model, reducers)
    tokens = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("tokens")
    if kwargs.get("start_at_layer") is not None:
        tokens = None  # the input is a residual, not token ids
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
        if offload is not None and torch.cuda.is_available():
            torch.cuda.synchronize()  # every non-blocking copy into the pinned buffers has landed
        for r in reducers:
            r.end_batch()
        # Query-chunked attention fires score/pattern hooks once per chunk: stitch them along the query axis.
        tensors = {k: v[0] if len(v) == 1 else torch.cat(v, dim=2) for k, v in store.items()}
        for result_name, z_name in z_names.items():
            if z_name not in tensors:
                continue  # a layer outside start_at_layer .. stop_at_layer did not run
            w_o = gated_w_o(model, result_name)
            w_o = w_o.to(dtype=dtype or w_o.dtype, device=device or ("cpu" if offload else w_o.device), copy=True)
            z = tensors[z_name] if z_name in requested else tensors.pop(z_name)
            head_writes[result_name] = (z, w_o)
    return out, Trace(tensors, trace_meta(model, names), tokens, [r.result() for r in reducers],
                      head_writes=head_writes, tokenizer=getattr(model, "tokenizer", None))


def gated_w_o(model: Transformer, result_name: str) -> torch.Tensor:
    """The per-head output weights ``[H, D, M]`` behind ``result_name`` (``blocks.i.attn.hook_result``), times each
    head's gate: head h writes ``z_h @ gated_w_o[h]`` (a view of the live weights when ungated: copy to keep it)."""
    # interp's attention, or a route model's adapter of an HF attention: both have W_O_heads and gate.
    attn: Any = model.get_submodule(result_name[: -len(".hook_result")])
    w_o = attn.W_O_heads.detach()  # [H, D, M]
    if attn.gate is not None:
        w_o = w_o * attn.gate.detach().to(w_o.dtype)[:, None, None]  # gated head h writes gate_h z_h W_O[h]
    return w_o


def trace_meta(model: Transformer, names: Sequence[str]) -> dict[str, Any]:
    """A :class:`Trace`'s metadata for a recording of hook points ``names``: the model's name and shape, its hub
    ``revision`` when it has one, and ``layers_recorded`` when the names cover only some layers
    (:meth:`Trace.load` then knows it is partial)."""
    meta: dict[str, Any] = {"model": getattr(model, "name", type(model).__name__),
                            "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads}
    if getattr(model, "revision", None) is not None:  # a hub training checkpoint: which one was recorded
        meta["revision"] = model.revision
    recorded = sorted({int(m.group(1)) for n in names if (m := re.match(r"blocks\.(\d+)\.", n))})
    if recorded and recorded != list(range(model.cfg.n_layers)):
        meta["layers_recorded"] = recorded
    return meta
