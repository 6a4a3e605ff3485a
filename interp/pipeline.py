"""A pipeline across processes: each rank holds a contiguous slice of layers and passes the residual on.

Under ``torchrun`` (``torch.distributed``: gloo on CPU, nccl on GPU) rank ``r`` of ``W`` holds the blocks
:func:`stage_bounds` gives it; rank 0 also holds the embedding, the last rank the final norm and the unembedding.
:func:`interp.zoo.checkpoint.load_checkpoint_stage` builds such a slice from a checkpoint without materialising
the other ranks' layers (they stay on the meta device). A :class:`Pipeline` then runs the model:

- rank 0 broadcasts the tokens (and padding mask) so every rank knows the batch's shape and mask;
- the batch is cut into micro-batches; each rank runs its blocks on micro-batch ``m`` as soon as the residual
  ``[b, T, d_model]`` of ``m`` arrives from the previous rank (``irecv``), and sends its output on (``isend``):
  GPipe's fill-drain schedule (:func:`gpipe_schedule`), forward only;
- the last rank sends the logits to rank 0.

The schedule is explicit (plain point-to-point ``send`` / ``recv``) rather than ``torch.distributed.pipelining``:
pipelining splits the model by tracing it into a graph (``torch.export``), which drops the Python hook points
every analysis relies on, and its stages run modules it has rewritten. Here each rank runs the model's own
:meth:`~interp.model.Transformer.forward` with ``start_at_layer`` / ``stop_at_layer`` (the residual in, the
residual out), so hooks run on the rank that owns their layer, exactly as in one process.

Recording (:meth:`Pipeline.run_with_cache`) saves the selected hook points on their owner rank, joins the
micro-batches along the batch axis, and gathers every rank's records on rank 0, which builds the
:class:`~interp.trace.Trace` and replays the records, in the order one process fires them, through the
reducers: the trace and the reducers' results on rank 0 are those of one process. The other ranks get ``None``.

A rank that dies stops the others: a send or receive from it fails (gloo sees the connection close) or times
out after ``INTERP_DIST_TIMEOUT`` seconds, and the waiting rank raises :class:`~interp.distributed.DistributedError`
naming the rank it was waiting for.

Example (``torchrun --nproc_per_node 2 script.py``)::

    from interp import distributed
    from interp.pipeline import Pipeline
    from interp.zoo.checkpoint import load_checkpoint_stage

    distributed.init_from_env()
    pipe = Pipeline(load_checkpoint_stage("model.safetensors"), micro_batches=4)
    logits, trace = pipe.run_with_cache(tokens, names_filter="*hook_pattern")   # on rank 0; None elsewhere
    distributed.shutdown()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from . import distributed
from .data.batches import Batch, check_length, iter_batches
from .hooks import HookPoint, NamesFilter, QueryChunkHook, resolve_names
from .progress import bar as progress_bar
from .streaming import _StopForward, gated_w_o, trace_meta
from .trace import Trace

if TYPE_CHECKING:
    from .model import Transformer
    from .streaming import Reducer

__all__ = ["Pipeline", "bubble_fraction", "gpipe_schedule", "stage_bounds", "stage_prefixes"]

#: A hook event on the owner rank: (hook name, query offset, tensor).
Event = tuple[str, int, torch.Tensor]


def stage_bounds(n_layers: int, world: int) -> list[tuple[int, int]]:
    """The blocks ``(first, stop)`` (``first .. stop - 1``) of each of ``world`` ranks: contiguous, as even as can be,
    the earlier ranks taking one more when ``n_layers`` does not divide (rank 0 also runs the embedding, the last
    rank the unembedding).

    Args:
        n_layers: the model's blocks.
        world: the ranks.

    Returns:
        One ``(first, stop)`` per rank.

    Raises:
        ValueError: ``world`` < 1, or more ranks than blocks (a rank would hold nothing).

    Example:
        >>> from interp.pipeline import stage_bounds
        >>> stage_bounds(6, 4)
        [(0, 2), (2, 4), (4, 5), (5, 6)]
    """
    if world < 1:
        raise ValueError(f"world={world}: a pipeline needs at least one rank")
    if world > n_layers:
        raise ValueError(f"a pipeline over {world} ranks needs at least {world} layers; the model has "
                         f"n_layers={n_layers}: use {n_layers} ranks or fewer")
    base, extra = divmod(n_layers, world)
    bounds, first = [], 0
    for r in range(world):
        stop = first + base + (1 if r < extra else 0)
        bounds.append((first, stop))
        first = stop
    return bounds


def stage_prefixes(model: Transformer, rank: int, world: int) -> list[str]:
    """The state-dict prefixes (top-level modules and ``blocks.i``) that rank ``rank`` of ``world`` holds.

    Rank 0 holds the embeddings (every top-level module but the final norm and the unembedding), the last rank
    the final norm and the unembedding, and each rank its :func:`stage_bounds` blocks. A tied unembedding is the
    embedding's weight, so the last rank then holds the embedding too.

    Args:
        model: the model (its skeleton on the meta device will do).
        rank: this rank.
        world: the ranks.

    Returns:
        Module names, e.g. ``["W_E", "blocks.0", "blocks.1"]``.

    Example:
        >>> from interp.pipeline import stage_prefixes
        >>> from interp import ModelConfig
        >>> from interp.placement import build
        >>> skeleton = build(ModelConfig(n_layers=4, d_model=8, n_heads=2, d_vocab=11, n_ctx=4), device="meta")
        >>> stage_prefixes(skeleton, 1, 2), stage_prefixes(skeleton, 0, 2)
        (['blocks.2', 'blocks.3', 'ln_final', 'W_U'], ['W_E', 'W_pos', 'blocks.0', 'blocks.1'])
    """
    first, stop = stage_bounds(model.cfg.n_layers, world)[rank]
    head = {"ln_final", "W_U"}
    tops = [name for name, m in model.named_children() if name != "blocks" and m.state_dict()]  # with weights
    out = [n for n in tops if n not in head] if rank == 0 else []
    if rank == world - 1 and rank != 0 and model.cfg.tie_embeddings and model.unembed is not None:
        out.append("W_E")  # the unembedding is the embedding's weight
    out += [f"blocks.{i}" for i in range(first, stop)]
    if rank == world - 1:
        out += [n for n in tops if n in head]
    return out


def gpipe_schedule(world: int, micro_batches: int) -> list[list[int | None]]:
    """GPipe's fill-drain schedule of a forward pass: at clock tick ``t`` rank ``r`` runs micro-batch ``t - r``.

    Args:
        world: the ranks (stages).
        micro_batches: the micro-batches.

    Returns:
        One row per tick (``micro_batches + world - 1`` of them), one entry per rank: the micro-batch it runs,
        or None (idle: the bubble).

    Example:
        >>> from interp.pipeline import gpipe_schedule
        >>> gpipe_schedule(2, 3)
        [[0, None], [1, 0], [2, 1], [None, 2]]
    """
    ticks = micro_batches + world - 1
    return [[t - r if 0 <= t - r < micro_batches else None for r in range(world)] for t in range(ticks)]


def bubble_fraction(world: int, micro_batches: int) -> float:
    """The share of rank-ticks idle in :func:`gpipe_schedule` (stages of equal cost): ``(W - 1) / (m + W - 1)``.

    Example:
        >>> from interp.pipeline import bubble_fraction
        >>> bubble_fraction(4, 8)
        0.2727272727272727
    """
    table = gpipe_schedule(world, micro_batches)
    return sum(e is None for row in table for e in row) / (len(table) * world)


class Pipeline:
    """Run a model whose layers are split over the ranks of a process group (see the module's docstring).

    Args:
        model: this rank's stage, from :func:`interp.zoo.checkpoint.load_checkpoint_stage` (a whole model works
            too: each rank then runs only its own blocks).
        micro_batches: how many pieces each batch is cut into (fewer when the batch has fewer than two rows
            per piece); more micro-batches shrink the bubble (:func:`bubble_fraction`).

    Raises:
        ValueError: ``micro_batches`` < 1, a cross-attention model, or the ranks hold different configs.
        DistributedError: a peer rank died or timed out while the ranks compared configs.

    Example:
        >>> import torch
        >>> from interp.pipeline import Pipeline
        >>> from interp.examples import model, tokens
        >>> pipe = Pipeline(model, micro_batches=2)   # not distributed: one rank runs every block
        >>> torch.equal(pipe(tokens), model(tokens))
        True
    """

    def __init__(self, model: Transformer, *, micro_batches: int = 4) -> None:
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"micro_batches={micro_batches!r} must be an int >= 1")
        if model.cfg.cross_attention:
            raise ValueError("pipeline: cfg.cross_attention=True is not supported (the context sequence would have "
                             "to reach every rank); run encoder-decoder models in one process")
        self.model = model
        self.micro_batches = micro_batches
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.first, self.stop = stage_bounds(model.cfg.n_layers, self.world)[self.rank]
        if self.world > 1:
            text = model.cfg.to_json()
            everyone = distributed._all_gather(text, "all_gather of the pipeline's configs")
            differ = [r for r, t in enumerate(everyone) if t != everyone[0]]
            if differ:
                raise ValueError(f"pipeline: the config on rank(s) {differ} differs from rank 0's; every rank must "
                                 "load its stage of the same model")
        self._device = next((p.device for p in model.parameters() if not p.is_meta), torch.device("cpu"))
        self._dtype = next((p.dtype for p in model.parameters() if not p.is_meta and p.is_floating_point()),
                           torch.float32)

    # --- point to point, failures naming the peer --------------------------------------------------------
    def _wait(self, work: Any, what: str, peer: int) -> None:
        try:
            work.wait()
        except RuntimeError as e:  # gloo / nccl report a closed connection or a timeout as RuntimeError
            raise distributed.DistributedError(
                f"rank {self.rank} of {self.world}: {what} rank {peer} failed; rank {peer} died or did not answer "
                f"within the timeout: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e

    def _receive(self, shape: tuple[int, ...], what: str) -> torch.Tensor:
        """A tensor of ``shape`` (the model's dtype) from the previous rank."""
        buf = torch.empty(shape, dtype=self._dtype, device=self._device)
        self._wait(torch.distributed.irecv(buf, src=self.rank - 1), f"receiving {what} from", self.rank - 1)
        return buf

    def _send(self, t: torch.Tensor, what: str, previous: Any = None) -> Any:
        """Send ``t`` to the next rank without waiting for it; ``previous`` (the last such send) is waited for
        first, so that at most one send per rank is in flight. Returns the send to wait for."""
        if previous is not None:
            self._send_done(previous, what)
        t = t.contiguous()
        return torch.distributed.isend(t, dst=self.rank + 1), t  # the buffer must live until the send is done

    def _send_done(self, sending: Any, what: str) -> None:
        """Wait for the last :meth:`_send`."""
        self._wait(sending[0], f"sending {what} to", self.rank + 1)

    def _from_last(self, compute: Any, what: str) -> Any:
        """``compute()`` on the last rank (the one holding the logits), its value on every rank (:meth:`_from_rank`)."""
        return self._from_rank(self.world - 1, compute, what)

    def _from_first(self, compute: Any, what: str) -> Any:
        """``compute()`` on rank 0 (the one holding the embedding and block 0), its value on every rank
        (:meth:`_from_rank`): the route of ``model.first_stage_route`` while :meth:`routed`."""
        return self._from_rank(0, compute, what)

    def _from_rank(self, src: int, compute: Any, what: str) -> Any:
        """``compute()`` on rank ``src``, its value on every rank (pickled: tensors arrive bit for bit); an error
        raised there (a bad metric) is raised on every rank with its message, instead of leaving them waiting."""
        if self.world == 1:
            return compute()
        box: list[Any] = [None]
        error: Exception | None = None
        if self.rank == src:
            try:
                box[0] = ("value", compute())
            except (ValueError, TypeError, RuntimeError) as e:
                box[0], error = ("error", (type(e).__name__, str(e))), e
        distributed._collective(f"broadcast of {what}", torch.distributed.broadcast_object_list, box, src=src)
        kind, value = box[0]
        if kind == "value":
            return value
        if error is not None:
            raise error
        name, message = value
        raise (TypeError if name == "TypeError" else ValueError)(f"on rank {src}: {message}")

    def _gather_all(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        return [obj] if self.world == 1 else distributed._all_gather(obj, f"all-gather of {what}")

    def _share_input(self, tokens: torch.Tensor | None, mask: torch.Tensor | None
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Rank 0's tokens and mask on every rank (one broadcast)."""
        if self.world == 1:
            return tokens, mask
        box: list[Any] = [None if tokens is None else tokens.cpu(), None if mask is None else mask.cpu()]
        distributed._collective("broadcast of the pipeline's tokens", torch.distributed.broadcast_object_list,
                                box, src=0)
        return box[0], box[1]

    # --- the schedule ----------------------------------------------------------------------------------
    def _run(self, tokens: torch.Tensor | None, mask: torch.Tensor | None, fwd_hooks: Sequence[Any],
             micro_start: Any = None, *, shared: bool = False, logits_to_rank0: bool = True,
             kv_cache: Any = None, stop: tuple[str, bool] | None = None, whole: bool = False
             ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        # shared: every rank already holds rank 0's batch (no broadcast); logits_to_rank0=False: the last rank
        # keeps its logits (a pass that only feeds reducers sends none); kv_cache: a cache of the whole model's
        # layers that this rank fills for its own (the batch then runs as one micro-batch: the cache's rows);
        # stop: the hook after which nothing the pass computes is read (streaming._stop_point): the rank of its
        # layer stops there and sends nothing, the later ranks do not run (no logits then); whole: one
        # micro-batch, so that hooks see the whole batch as in one process (a routed model call's, _call).
        if not shared:
            tokens, mask = self._share_input(tokens, mask)
        if tokens is None:
            raise ValueError("pipeline: rank 0 passed tokens=None; rank 0's tokens are the batch every rank runs")
        # Every rank checks the same (broadcast) input before any send: a bad batch fails on all ranks alike,
        # not on one while the others wait for its residual.
        tokens = self.model._check_tokens(tokens)  # [T] -> [1, T], ids in the vocabulary
        B, T = tokens.shape
        if T > self.model.cfg.n_ctx:
            raise ValueError(f"sequence length {T} exceeds the model's n_ctx={self.model.cfg.n_ctx}")
        if mask is not None and tuple(mask.shape) != (B, T):
            raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, expected {(B, T)}")
        # At least two rows per micro-batch (when the batch has two): on a one-row batch PyTorch's matmul takes
        # other kernels in the explicit attention path (recorded patterns), a rounding away from the batch's rows.
        pieces = 1 if kv_cache is not None or whole else max(1, min(self.micro_batches, B // 2))
        rows = torch.arange(B).tensor_split(pieces)  # the row ranges
        last = self.world - 1
        dist = torch.distributed
        if stop is not None:
            if logits_to_rank0:
                raise ValueError("pipeline: a pass that stops early has no logits to send to rank 0")
            halt = int(stop[0].split(".")[1])  # the layer of the last hook read
            if self.first > halt:
                return None, tokens, mask  # nothing this rank computes is read
            if halt < self.stop:  # this rank's layer: stop there, like streaming.stream (after the savers)
                from .streaming import _stop_after, _stop_now

                ends = _stop_after([T]) if stop[1] else _stop_now  # after the chunk holding the last query
                fwd_hooks = [*fwd_hooks, ([stop[0]], QueryChunkHook(ends, cut_rows=True))]
                last = self.rank  # no later rank runs
        kw: dict[str, Any] = {}
        if self.rank > 0:
            kw["start_at_layer"] = self.first
        if self.rank < last:
            kw["stop_at_layer"] = self.stop
        recvs = []
        if self.rank > 0:  # post every receive at once: a residual lands while this rank still computes
            for r in rows:
                buf = torch.empty(len(r), T, self.model.cfg.d_model, dtype=self._dtype, device=self._device)
                recvs.append((buf, dist.irecv(buf, src=self.rank - 1)))  # [b, T, d_model]
        sends, outs = [], []
        with torch.no_grad(), self.model.hooks(fwd_hooks):
            for m, r in enumerate(rows):
                if micro_start is not None:
                    micro_start(m)
                if self.rank == 0:
                    x = tokens[r[0]:r[-1] + 1].to(self._device)
                else:
                    buf, work = recvs[m]
                    self._wait(work, f"receiving micro-batch {m}'s residual from", self.rank - 1)
                    x = buf
                m_mask = None if mask is None else mask[r[0]:r[-1] + 1].to(self._device)
                try:
                    if kv_cache is None:
                        y = self.model(x, attention_mask=m_mask, **kw)
                    else:  # forward refuses a cache on a slice of layers (the others would not fill theirs): here
                        with self.model.lock:  # the other ranks fill them
                            y = self.model._forward(x, attention_mask=m_mask, kv_cache=kv_cache, **kw)
                except _StopForward:
                    continue  # every hook read has fired: nothing to send
                if self.rank < last:
                    y = y.contiguous()
                    sends.append((m, dist.isend(y, dst=self.rank + 1)))
                else:
                    outs.append(y)
            for m, work in sends:
                self._wait(work, f"sending micro-batch {m}'s residual to", self.rank + 1)
        logits = None
        if self.rank == last and outs:
            logits = torch.cat(outs)  # [B, T, d_vocab]
            if last != 0 and logits_to_rank0:
                self._wait(dist.isend(logits, dst=0), "sending the logits to", 0)
                logits = None
        elif self.rank == 0 and logits_to_rank0:
            shape = (B, T, self.model.cfg.d_vocab if self.model.cfg.unembed else self.model.cfg.d_model)
            logits = torch.empty(shape, dtype=self._dtype, device=self._device)
            self._wait(dist.irecv(logits, src=last), "receiving the logits from", last)
        return logits, tokens, mask

    # --- public ----------------------------------------------------------------------------------------
    def __call__(self, tokens: torch.Tensor | None, *, attention_mask: torch.Tensor | None = None,
                 fwd_hooks: Sequence[tuple[NamesFilter, Any]] = ()) -> torch.Tensor | None:
        """The logits of ``tokens`` on rank 0 (None on the other ranks), every rank running its own blocks.

        Args:
            tokens: ``[B, T]`` ids on rank 0 (the other ranks may pass None: rank 0's are broadcast).
            attention_mask: ``[B, T]`` padding mask (rank 0's counts).
            fwd_hooks: ``(names_filter, fn)`` pairs, given on every rank; each runs on the rank that owns its
                hook point (a hook of another rank's layer never fires here).

        Returns:
            Logits ``[B, T, d_vocab]`` on rank 0, None elsewhere.

        Raises:
            ValueError: rank 0 passed no tokens, ids outside the vocabulary, a sequence over ``n_ctx``, or a
                mask of another shape (raised on every rank alike, before any residual is sent).
            TypeError: tokens are not integer ids.
            DistributedError: a peer rank died or timed out; the message names it.

        Example:
            >>> Pipeline(model)(tokens).shape == model(tokens).shape
            True
        """
        return self._run(tokens, attention_mask, fwd_hooks)[0]

    def run_with_cache(self, tokens: torch.Tensor | None, *, names_filter: NamesFilter = None,
                       attention_mask: torch.Tensor | None = None, reducers: Sequence[Reducer] = ()
                       ) -> tuple[torch.Tensor | None, Trace | None]:
        """Run the pipeline and record hook points into one :class:`~interp.trace.Trace` on rank 0.

        Each rank records the hook points of its own layers, joins its micro-batches, and sends its records to
        rank 0, which builds the trace and feeds ``reducers`` the records in one process's order (one
        ``begin_batch`` / ``end_batch`` for the whole batch): both equal what
        :meth:`~interp.model.Transformer.run_with_cache` gives in one process.

        Args:
            tokens: ``[B, T]`` ids on rank 0 (broadcast to the others).
            names_filter: hook points to store (as in ``run_with_cache``; ``None`` = all, ``[]`` = none).
            attention_mask: ``[B, T]`` padding mask.
            reducers: fed on rank 0 only (their results land in ``trace.stats``); the records they read travel
                to rank 0, so their memory is the whole batch's.

        Returns:
            ``(logits, trace)`` on rank 0; ``(None, None)`` on the other ranks.

        Raises:
            ValueError: a name that matches no hook point.
            DistributedError: a peer rank died or timed out.

        Example:
            >>> from interp.pipeline import Pipeline
            >>> from interp.examples import model, tokens
            >>> logits, trace = Pipeline(model).run_with_cache(tokens, names_filter="*hook_pattern")
            >>> trace.pattern(0).shape == model.run_with_cache(tokens)[1].pattern(0).shape
            True
        """
        logits, trace = self._record(tokens, names_filter, attention_mask, reducers)
        return logits, trace

    def record_own(self, tokens: torch.Tensor | None, *, names_filter: NamesFilter = None,
                   attention_mask: torch.Tensor | None = None, logits_to_rank0: bool = True,
                   kv_cache: Any = None) -> tuple[torch.Tensor | None, Trace]:
        """Run the pipeline and keep each rank's records on that rank: a :class:`~interp.trace.Trace` of the hook
        points of this rank's layers (and the embeddings' on rank 0), each tensor the one a single process records
        for the whole batch; nothing travels but the residual.

        Args:
            tokens: ``[B, T]`` ids on rank 0 (broadcast to the others).
            names_filter: hook points to store (those of other ranks' layers are absent from this rank's trace).
            attention_mask: ``[B, T]`` padding mask.
            logits_to_rank0: send the logits to rank 0 (else the last rank keeps them).
            kv_cache: a :class:`~interp.kv_cache.KVCache` of the whole model (``model.make_cache(B)``): this rank
                fills its layers' entries (the batch then runs as one micro-batch).

        Returns:
            ``(logits, trace)``: the logits on rank 0 (on the last rank with ``logits_to_rank0=False``; None on the
            others), and this rank's trace.

        Raises:
            ValueError: a name that matches no hook point, or bad input (on every rank alike).
            DistributedError: a peer rank died or timed out.

        Example:
            >>> from interp.pipeline import Pipeline
            >>> from interp.examples import model, tokens
            >>> _, own = Pipeline(model).record_own(tokens, names_filter="blocks.1.attn.hook_result")
            >>> own["blocks.1.attn.hook_result"].shape   # one rank: every layer is its own
            torch.Size([2, 21, 4, 128])
        """
        logits, trace = self._record(tokens, names_filter, attention_mask, (), gather=False,
                                     logits_to_rank0=logits_to_rank0, kv_cache=kv_cache)
        assert trace is not None
        return logits, trace

    def _record(self, tokens: torch.Tensor | None, names_filter: NamesFilter, attention_mask: torch.Tensor | None,
                reducers: Sequence[Reducer], *, gather: bool = True, logits_to_rank0: bool = True,
                kv_cache: Any = None) -> tuple[torch.Tensor | None, Trace | None]:
        """:meth:`run_with_cache` (``gather``: every rank's records to rank 0) or :meth:`record_own` (each its own)."""
        hook_names = self.model.hook_names
        names = [] if isinstance(names_filter, (list, tuple)) and not names_filter else resolve_names(
            names_filter, hook_names)
        # hook_result -> its z, multiplied by the owner's W_O on access, as streaming.record does.
        requested = set(names)
        z_names = {n: n[: -len("hook_result")] + "hook_z" for n in names if n.endswith(".hook_result")}
        names = [n for n in names if n not in z_names] + [z for z in z_names.values() if z not in requested]
        reducer_names = [set(resolve_names(r.names, hook_names)) for r in reducers]
        wanted = set(names).union(*reducer_names)
        logits, tokens, mask, mine = self._recorded_pass(tokens, attention_mask, wanted,
                                                         logits_to_rank0=logits_to_rank0, kv_cache=kv_cache)
        if gather:
            mine = [(name, q0, t.cpu()) for name, q0, t in mine]
        fired = {name for name, _, _ in mine}
        w_os = {r: gated_w_o(self.model, r).to(device="cpu" if gather else None, copy=True)
                for r, z in z_names.items() if z in fired}
        if self.world > 1 and gather:
            gathered: list[Any] = [None] * self.world if self.rank == 0 else []
            distributed._collective("gather of the pipeline's records", torch.distributed.gather_object,
                                    (mine, w_os), gathered if self.rank == 0 else None, dst=0)
            if self.rank != 0:
                return None, None
            everything = [e for rank_events, _ in gathered for e in rank_events]  # rank order is layer order
            w_os = {k: v for _, rank_w_os in gathered for k, v in rank_w_os.items()}
        else:
            everything = mine
        batch = Batch(tokens, mask)
        for reducer, rnames in zip(reducers, reducer_names):
            reducer.begin_batch(batch)
            for name, q0, t in everything:
                if name in rnames:
                    reducer.update(name, t, q_start=q0)
            reducer.end_batch()
        store: dict[str, list[torch.Tensor]] = {}
        keep = set(names)
        for name, _, t in everything:
            if name in keep:
                store.setdefault(name, []).append(t)
        # Query-chunked attention fires score/pattern hooks once per chunk: stitch them along the query axis.
        tensors = {k: v[0] if len(v) == 1 else torch.cat(v, dim=2) for k, v in store.items()}
        head_writes = {}
        for result_name, z_name in z_names.items():
            if z_name in tensors:
                z = tensors[z_name] if z_name in requested else tensors.pop(z_name)
                head_writes[result_name] = (z, w_os[result_name])
        return logits, Trace(tensors, trace_meta(self.model, names), tokens, [r.result() for r in reducers],
                             head_writes=head_writes, tokenizer=getattr(self.model, "tokenizer", None))

    def _recorded_pass(self, tokens: torch.Tensor | None, mask: torch.Tensor | None, wanted: set[str], *,
                       shared: bool = False, logits_to_rank0: bool = True, kv_cache: Any = None,
                       stop: tuple[str, bool] | None = None
                       ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None, list[Event]]:
        """One pass that saves the hook points ``wanted`` of this rank's layers: ``(logits, tokens, mask, events)``,
        the events in the order one process fires them, each micro-batch's tensors joined along the batch axis
        (the tensors one process's pass over the whole batch gives, bit for bit)."""
        events: list[list[Event]] = []

        def save(t: torch.Tensor, hook: HookPoint, q_start: int) -> None:
            events[-1].append((hook.name, q_start, t.detach()))

        hooks = [(sorted(wanted), QueryChunkHook(save))] if wanted else []
        logits, tokens, mask = self._run(tokens, mask, hooks, micro_start=lambda m: events.append([]), shared=shared,
                                         logits_to_rank0=logits_to_rank0, kv_cache=kv_cache, stop=stop)
        # The same hook points fire in the same order for every micro-batch: join them along the batch axis.
        joined = [(name, q0, events[0][j][2] if len(events) == 1 else torch.cat([ev[j][2] for ev in events]))
                  for j, (name, q0, _) in enumerate(events[0] if events else [])]
        return logits, tokens, mask, joined

    @contextlib.contextmanager
    def routed(self) -> Iterator[None]:
        """While inside, every :func:`interp.streaming.stream` pass of this rank's stage (``self.model``) runs over
        the pipeline, each rank feeding its own reducers with its own layers' records (:meth:`feed`): an
        analysis written for one model (:func:`~interp.analysis.classify_heads`) then runs unchanged on every
        rank, and each rank's per-head results are right for the layers it holds.

        What only the first stage can compute is computed there: an analysis that reads ``model.first_stage_route``
        (the effective embeddings of :func:`interp.analysis.ov_circuit.effective_embeddings`, which run the
        embedding and block 0) calls ``route(compute, what)``, and ``compute()`` runs on rank 0 while every
        rank receives its value (pickled, bit for bit; an error there is raised on every rank). A plain model call
        an analysis makes through ``model.call_route`` (the patched decoding steps of
        :func:`interp.analysis.function_vector.function_vector_effects`) runs over the pipeline (:meth:`_call`).

        Every rank enters it and runs the same analysis (the same passes, in the same order).

        Example:
            >>> from interp.pipeline import Pipeline
            >>> from interp.examples import model, tokens
            >>> from interp.streaming import MeanReducer, stream
            >>> r = MeanReducer("blocks.1.attn.hook_pattern")
            >>> with Pipeline(model).routed():    # one rank: the pipeline is the model
            ...     stream(model, tokens, [r], batch_size=1)
            2
        """
        if getattr(self.model, "stream_route", None) is not None:
            raise RuntimeError("pipeline: this stage's passes are already routed through a pipeline")
        self.model.__dict__["stream_route"] = self.feed  # read by interp.streaming.stream
        self.model.__dict__["first_stage_route"] = self._from_first  # read by analysis.ov_circuit
        self.model.__dict__["call_route"] = self._call  # read by analysis.function_vector
        try:
            yield
        finally:
            for name in ("stream_route", "first_stage_route", "call_route"):
                self.model.__dict__.pop(name, None)

    def _call(self, tokens: torch.Tensor, fwd_hooks: Sequence[Any], *, kv_cache: Any = None,
              stop_at_layer: int | None = None, reduce: Any = None) -> Any:
        """The route of ``model.call_route`` while :meth:`routed`: ``model(tokens, kv_cache=kv_cache,
        stop_at_layer=stop_at_layer)`` with ``fwd_hooks`` over the pipeline (rank 0's tokens, as one micro-batch:
        each hook runs on the rank that owns its layer and sees the whole batch, as in one process; each rank
        fills its own layers of ``kv_cache``), and ``reduce(logits)`` computed on the last rank, its value on
        every rank (None without ``reduce``). Every rank calls it alike.

        A pass with ``stop_at_layer`` ends after block ``stop_at_layer - 1``, on the rank that holds it (the later
        ranks do not run; with ``stop_at_layer = n_layers`` the last rank unembeds what no one reads); it returns
        nothing, so ``reduce`` is refused with it (one process would reduce the residual, the pipeline the logits).

        Raises:
            ValueError: ``reduce`` with ``stop_at_layer``, ``stop_at_layer`` outside 1..n_layers, or bad input.
            DistributedError: a peer rank died or timed out.
        """
        L = self.model.cfg.n_layers
        if stop_at_layer is not None and reduce is not None:
            raise ValueError(f"pipeline: a routed call with stop_at_layer={stop_at_layer} returns no logits to reduce")
        if stop_at_layer is not None and not 1 <= stop_at_layer <= L:
            raise ValueError(f"pipeline: a routed call's stop_at_layer={stop_at_layer} must be in 1..{L}")
        # The pass ends after the block of layer stop_at_layer - 1 (a whole pass when that is the last block).
        stop = (f"blocks.{stop_at_layer - 1}.hook_resid_post", False) if stop_at_layer not in (None, L) else None
        logits, _, _ = self._run(tokens, None, fwd_hooks, logits_to_rank0=False, kv_cache=kv_cache, stop=stop,
                                 whole=True)
        if kv_cache is not None and stop is None:
            # This rank filled its own layers; the others' (on the meta device) advance with them, so that the
            # cache's length reads as one process's in the next call (cache.length refuses layers that disagree).
            filled = kv_cache.layers[self.first].length
            for layer in kv_cache.layers:
                layer.length = filled
        return None if reduce is None else self._from_last(lambda: reduce(logits), "a routed pass's result")

    @contextlib.contextmanager
    def output_head_everywhere(self) -> Iterator[None]:
        """While inside, every rank holds the final norm and the unembedding (the last rank's, broadcast to the
        others' meta modules; put back on leaving): for per-head scores that read a head's write through the
        unembedding (the copying score of induction heads) on the rank that owns the head. Costs each rank one
        ``[d_vocab, d_model]`` copy for as long as it lasts. Every rank enters it.

        Raises:
            DistributedError: a peer rank died or timed out.

        Example:
            >>> from interp.pipeline import Pipeline
            >>> from interp.examples import model
            >>> with Pipeline(model).output_head_everywhere():   # one rank: it holds them already
            ...     model.unembed.weight.is_meta
            False
        """
        swapped: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
        if self.world > 1:
            last = self.world - 1
            for module in (self.model.ln_final, self.model.unembed):
                for name, param in list(getattr(module, "_parameters", {}).items()):
                    if param is None:
                        continue
                    held = param.detach().contiguous() if self.rank == last else torch.empty(
                        param.shape, dtype=param.dtype, device=self._device)
                    distributed._collective("broadcast of the pipeline's output head", torch.distributed.broadcast,
                                            held, src=last)
                    if param.is_meta:
                        assert module is not None
                        swapped.append((module, name, param))
                        module._parameters[name] = torch.nn.Parameter(held, requires_grad=False)
        try:
            yield
        finally:
            for module, name, param in swapped:
                module._parameters[name] = param

    def feed(self, data: Any, reducers: Sequence[Reducer], *, batch_size: int = 32, name: str = "tokens",
             progress: bool | None = False, desc: str = "batches", query_chunk: int | str | None = "auto") -> int:
        """:func:`interp.streaming.stream` over the pipeline, the reducers fed on the rank that owns each hook point.

        Rank 0's batches are the ones run: it iterates ``data`` and broadcasts each :class:`~interp.data.Batch`
        (tokens, mask and annotations), so every rank's reducers see the same ``begin_batch``; the other ranks'
        ``data`` is not read. Each rank records the hook points its reducers read on its own layers, joins the
        micro-batches, and feeds its reducers in one process's order; a reducer's state is then one process's
        for the layers this rank holds (and empty for the others). Only the batch travels, no record. The
        query chunk of each batch is the one :func:`~interp.streaming.stream` would choose for the whole batch.

        Args:
            data, reducers, batch_size, name, progress, desc, query_chunk: as :func:`~interp.streaming.stream`
                (the progress bar is rank 0's).

        Returns:
            The number of sequences run (on every rank).

        Raises:
            ValueError: rank 0's data is empty or bad, or a sequence is too long (raised on every rank alike).
            DistributedError: a peer rank died or timed out.

        Example:
            >>> from interp.pipeline import Pipeline
            >>> from interp.examples import model, tokens
            >>> from interp.streaming import MeanReducer
            >>> Pipeline(model).feed(tokens, [MeanReducer("blocks.0.attn.hook_pattern")], batch_size=1)
            2
        """
        from .streaming import _pass_query_chunk, _query_chunk, _stop_point, auto_query_chunk

        hook_names = self.model.hook_names
        reducer_names = [set(resolve_names(r.names, hook_names)) for r in reducers]
        wanted = set().union(*reducer_names)
        stop = _stop_point(sorted(wanted))  # the pass ends after the last hook read, on its rank
        chunk = _pass_query_chunk(self.model, reducers, hook_names, query_chunk)
        sized = query_chunk == "auto" and chunk is not None  # each batch's chunk sized for the whole batch
        n = 0
        with _query_chunk(self.model, chunk):
            for batch in self._batches(data, batch_size, name, progress, desc):
                check_length(self.model, batch.tokens.shape[1])
                for r in reducers:
                    r.begin_batch(batch)
                if sized and chunk is not None:
                    rows = auto_query_chunk(self.model, batch.tokens.shape[0], batch.tokens.shape[1], chunk)
                    for block in self.model.blocks:
                        block.attn.query_chunk = rows
                _, _, _, events = self._recorded_pass(batch.tokens, batch.mask, wanted, shared=True,
                                                      logits_to_rank0=False, stop=stop)
                for hook, q0, t in events:
                    for r, rnames in zip(reducers, reducer_names):
                        if hook in rnames:
                            r.update(hook, t, q_start=q0)
                for r in reducers:
                    r.end_batch()
                n += len(batch)
        return n

    def _batches(self, data: Any, batch_size: int, name: str, progress: bool | None, desc: str) -> Iterator[Batch]:
        """Rank 0's batches of ``data`` on every rank (one broadcast per batch, and one for the end); an error
        while rank 0 reads its data is raised on every rank."""
        mine = None
        if self.rank == 0:
            total = (-(-data.shape[0] // batch_size) if isinstance(data, torch.Tensor) and data.dim() == 2
                     else len(data) if isinstance(data, Sequence) else None)
            mine = iter(progress_bar(iter_batches(data, batch_size=batch_size, name=name), desc=desc,
                                     progress=progress, total=total))
        if self.world == 1:
            assert mine is not None
            yield from mine
            return
        while True:
            box: list[Any] = [None]
            error: BaseException | None = None
            if mine is not None:
                try:
                    box[0] = ("batch", next(mine))
                except StopIteration:
                    box[0] = ("end", None)
                except (ValueError, TypeError) as e:  # bad data: the other ranks raise it too
                    box[0], error = ("error", f"{type(e).__name__}: {e}"), e
            distributed._collective("broadcast of the pipeline's batch", torch.distributed.broadcast_object_list,
                                    box, src=0)
            what, item = box[0]
            if what == "end":
                return
            if what == "error":
                if error is not None:
                    raise error
                raise ValueError(f"pipeline: rank 0 could not read its data: {item}")
            yield item

    def stream(self, data: Any, reducers: Sequence[Reducer], *, batch_size: int = 32) -> int:
        """Feed ``reducers`` a whole dataset through the pipeline, batch by batch, as
        :func:`interp.streaming.stream` does in one process: the reducers' states on rank 0 equal its.

        Every rank passes the same ``data`` (each iterates it for the batch count; rank 0's batches are the ones
        run). Per batch, the owner ranks' records travel to rank 0, which feeds the reducers
        (:meth:`run_with_cache` with nothing stored).

        Args:
            data: anything :func:`~interp.data.iter_batches` accepts.
            reducers: fed on rank 0 (the other ranks' stay empty).
            batch_size: rows per pass when ``data`` is one tensor.

        Returns:
            The number of sequences run.

        Raises:
            ValueError: a reducer's name matches no hook point, or a bad batch (on every rank alike).
            DistributedError: a peer rank died or timed out.

        Example:
            >>> from interp.pipeline import Pipeline
            >>> from interp.examples import model, tokens
            >>> from interp.streaming import MeanReducer
            >>> r = MeanReducer("blocks.0.attn.hook_pattern")
            >>> Pipeline(model).stream(tokens, [r], batch_size=1)
            2
        """
        n = 0
        for batch in iter_batches(data, batch_size=batch_size):
            self.run_with_cache(batch.tokens, names_filter=[], attention_mask=batch.mask, reducers=reducers)
            n += len(batch)
        return n
