"""Shared pieces of the head analyzers: per-layer head counts, target masks, and the target reducer.

Every analyzer is a :class:`~interp.streaming.Reducer` fed by :func:`~interp.streaming.stream`: it prepares its
targets from each :class:`~interp.data.Batch` in ``begin_batch`` and folds the attention patterns in
``update``, so several analyzers share one forward pass and no dataset's patterns are held at once (with
``model.set_query_chunk`` not even one batch's full pattern is).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ..data import Batch
from ..streaming import Reducer

if TYPE_CHECKING:
    from ..model import Transformer

PATTERN_HOOKS = "blocks.*.attn.hook_pattern"


def state_device(model: Transformer) -> torch.device:
    """Where a reducer of ``model`` keeps its state: the device of the model's first parameter (the embedding's
    on a model split over devices), so that folding a batch never waits on a copy to the host. A pipeline's
    stage holds other ranks' modules on the meta device: its first real parameter counts."""
    param = next((p for p in model.parameters() if not p.is_meta), None)
    return param.device if param is not None else torch.device("cpu")


def zeros64(*shape: int, device: torch.device) -> torch.Tensor:
    """A float64 accumulator on ``device``; float32 on devices without float64 (Apple MPS)."""
    return torch.zeros(shape, dtype=torch.float32 if device.type == "mps" else torch.float64, device=device)


def layer_of(name: str) -> int:
    """``"blocks.3.attn.hook_pattern"`` -> 3."""
    return int(name.split(".")[1])


def head_counts(model: Transformer) -> list[int]:
    """Query heads per layer (they differ after :func:`~interp.pruning.remove_heads`)."""
    return [model.cfg.layer(layer).n_heads for layer in range(model.cfg.n_layers)]


def head_grid(model: Transformer) -> tuple[int, int]:
    """``(L, H)``: the shape of a per-head table, H the most heads of any layer (a pruned layer's missing heads
    are padding)."""
    return model.cfg.n_layers, max(head_counts(model), default=0)


def heads_of(model: Transformer) -> Iterator[tuple[int, int]]:
    """Every ``(layer, head)`` of the model, layer by layer (pruned layers have fewer heads)."""
    for layer, n in enumerate(head_counts(model)):
        for head in range(n):
            yield layer, head


def key_allowed(tokens: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                rows: slice = slice(None)) -> torch.Tensor:
    """Which keys the queries ``rows`` may attend to: ``[B, T', S]`` bool (real key, and key <= query if causal)."""
    B, T = tokens.shape
    real = query_real(tokens, mask)  # [B, S]
    q = torch.arange(T)[rows]  # [T']
    allowed = real[:, None, :].expand(B, len(q), T)  # [B, T', S]
    if causal:
        allowed = allowed & (torch.arange(T)[None, :] <= q[:, None])[None]  # [B, T', S]
    return allowed


def query_real(tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` bool: the query positions that are real tokens (not padding)."""
    return Batch(tokens, mask).real


def offset_targets(T: int, offset: int, rows: slice = slice(None)) -> torch.Tensor:
    """``[T', S]`` bool, True at ``(q, q + offset)`` for the queries ``rows`` (nothing outside the sequence)."""
    pos = torch.arange(T)
    return pos[None, :] == pos[rows][:, None] + offset  # [T', S]


#: Keys per block of :func:`first_argmax` (on a CPU 128 found an 8k-key row's argmax fastest of 64..512).
ARGMAX_BLOCK = 128


def first_argmax(rows: torch.Tensor) -> torch.Tensor:
    """``rows.argmax(-1)``, the same indices (the first one on a tie; the first NaN, as ``argmax``), found by
    block maxima: ``amax`` over blocks of :data:`ARGMAX_BLOCK` keys, the argmax of those few maxima, then the
    argmax inside the one block it names. On a CPU ``argmax`` over a long row costs ~10x ``amax``
    (SmolLM2's 64-query chunks at 8k keys: 2.6 ms against 0.23 ms); this costs ~2x (0.55 ms).

    Why the same: every key before the first maximum is smaller, so every block before its block has a
    smaller maximum, and the argmax of the block maxima is that block; inside it the first maximum is again
    the first. A row whose length is not a multiple of the block gets one more block, its last
    :data:`ARGMAX_BLOCK` keys (overlapping the one before: a maximum there is found in the earlier block first).

    Args:
        rows: ``[..., n]`` (a view sliced along its last dimension will do).

    Returns:
        ``[...]`` int64.

    Example:
        >>> import torch
        >>> from interp.analysis._stream import first_argmax
        >>> rows = torch.randint(0, 3, (4, 1000)).float()  # many ties
        >>> torch.equal(first_argmax(rows), rows.argmax(-1))
        True
    """
    n = rows.shape[-1]
    n_blocks = n // ARGMAX_BLOCK
    if n_blocks < 2 or rows.device.type != "cpu":  # a GPU's argmax reads a row as fast as its amax
        return rows.argmax(-1)
    maxima = rows[..., :n_blocks * ARGMAX_BLOCK].unflatten(-1, (n_blocks, ARGMAX_BLOCK)).amax(-1)  # [..., nb]
    if n_blocks * ARGMAX_BLOCK < n:  # the last block keys, overlapping the block before
        maxima = torch.cat([maxima, rows[..., n - ARGMAX_BLOCK:].amax(-1, keepdim=True)], -1)  # [..., nb + 1]
    block = maxima.argmax(-1, keepdim=True)  # [..., 1]: the block holding the first maximum
    start = torch.where(block < n_blocks, block * ARGMAX_BLOCK, n - ARGMAX_BLOCK)  # [..., 1]: its first key
    keys = start + torch.arange(ARGMAX_BLOCK, device=rows.device)  # [..., ARGMAX_BLOCK]
    return rows.gather(-1, keys).argmax(-1) + start.squeeze(-1)  # [...]


class RowMaxima:
    """The row maxima of one chunk of pattern rows, shared by the reducers of one hook call (see :func:`row_maxima`).

    Attributes:
        top: ``[B, H, Tc]`` each row's largest weight.
        best: ``[B, H, Tc]`` its key (the first one on a tie, as ``argmax``), found when first read.
    """

    __slots__ = ("_best", "_in_place", "_rows", "_second", "top")

    def __init__(self, rows: torch.Tensor, in_place: bool) -> None:
        self._rows = rows
        self._in_place = in_place
        # The top weight alone: on a CPU ``amax`` reads a chunk ~4x faster than ``max(-1)``, whose indices cost
        # as much as a softmax (SmolLM2 at 8,192 tokens: 0.17 s a layer and pass, ~5 s a pass). The argmax is
        # found only for a reader that asks for it (the copying score); a target's hit is tested by its weight.
        self.top = rows.amax(-1)  # [B, H, Tc]
        self._best: torch.Tensor | None = None
        self._second: torch.Tensor | None = None

    @property
    def best(self) -> torch.Tensor:
        """``[B, H, Tc]``: each row's argmax key (the first one on a tie), computed on first use."""
        if self._best is None:
            self._best = first_argmax(self._rows)  # [B, H, Tc]
        return self._best

    def runner_up(self) -> torch.Tensor:
        """``[B, H, Tc]``: each row's largest weight once its argmax key is knocked out (-inf for a one-key row).

        The knock-out is written into the rows themselves and undone (the same value put back), which saves a
        copy of the chunk (on CPU one write and one read of ``[B, H, Tc, S]`` of the ~5 a chunk costs); rows that
        take part in autograd, or inference tensors outside inference mode, are copied instead.
        """
        if self._second is None:
            rows, best = self._rows, self.best.unsqueeze(-1)  # [B, H, Tc, 1]
            if self._in_place:
                rows.scatter_(-1, best, float("-inf"))
                try:
                    self._second = rows.amax(-1)  # [B, H, Tc]
                finally:
                    rows.scatter_(-1, best, self.top.unsqueeze(-1))  # the row is as it was, bit for bit
            else:
                self._second = rows.clone().scatter_(-1, best, float("-inf")).amax(-1)  # [B, H, Tc]
        return self._second

    def is_unique_argmax(self, b: torch.Tensor, t: torch.Tensor, keys: torch.Tensor, tie_tol: float) -> torch.Tensor:
        """``[N, H]`` bool: whether key ``keys[i]`` is the unique argmax of row ``(b[i], h, t[i])`` (its weight is
        the row's top, and no other key lies within ``tie_tol`` of it), without finding any row's argmax.

        Args:
            b: ``[N]`` batch rows.
            t: ``[N]`` query rows within the chunk.
            keys: ``[N]`` keys (below the key count the maxima were taken over).
            tie_tol: how close another key's weight may come to the top for the argmax to stay unique.

        Returns:
            ``[N, H]`` bool.

        Example:
            >>> import torch
            >>> from interp.analysis._stream import row_maxima
            >>> p = torch.tensor([[[[0.1, 0.6, 0.3], [0.4, 0.4, 0.2]]]])  # [B=1, H=1, Tc=2, S=3]; row 1 ties
            >>> b, t = torch.tensor([0, 0, 0]), torch.tensor([0, 0, 1])
            >>> row_maxima(p, 3).is_unique_argmax(b, t, torch.tensor([1, 2, 0]), 1e-6).flatten().tolist()
            [True, False, False]
        """
        top = self.top[b, :, t]  # [N, H]
        at_top = self._rows[b, :, t, keys] == top  # [N, H]: the key holds the row's top weight
        if self._second is None and self._rows.device.type == "cpu" and 2 * int(at_top.sum()) < self.top.numel():
            # On a CPU, when the rows asked about are fewer than half the chunk's (a top rarely lands on a target),
            # only they are copied out, with the key knocked out instead of the argmax: the same answer (a top
            # weight at another key too is a tie either way), with no argmax to find.
            i, h = at_top.nonzero(as_tuple=True)  # [m] each: the entries and heads asked about
            rows = self._rows[b[i], h, t[i]]  # [m, n]: a copy of those rows only
            second = rows.scatter_(-1, keys[i].unsqueeze(-1), float("-inf")).amax(-1)  # [m]
            out = torch.zeros_like(at_top)
            out[i, h] = second < top[i, h] - tie_tol
            return out
        return at_top & (self.runner_up()[b, :, t] < top - tie_tol)  # [N, H]


#: The last chunk's maxima: (a weak reference to the hook's tensor, the keys read, the maxima).
_LAST_MAXIMA: list[Any] = [None]


def row_maxima(tensor: torch.Tensor, n_keys: int) -> RowMaxima:
    """Row maxima of the first ``n_keys`` keys of a pattern chunk ``[B, H, Tc, S]``, computed once per hook tensor.

    Several reducers of one pass read the same chunk (the induction scores and the copying score both want each
    row's argmax): the first call computes them, later calls with the same tensor object and key count reuse
    them. Only a weak reference to the tensor is kept, so no chunk outlives its hook call.

    Args:
        tensor: the hook's pattern chunk (float32 or wider is read as it is; half precision is upcast).
        n_keys: keys read (a causal chunk's rows are exactly zero after its last query).

    Returns:
        The :class:`RowMaxima` of ``tensor[..., :n_keys]``.

    Example:
        >>> import torch
        >>> from interp.analysis._stream import row_maxima
        >>> p = torch.tensor([[[[0.1, 0.6, 0.3], [0.5, 0.5, 0.0]]]])  # [B=1, H=1, Tc=2, S=3]
        >>> m = row_maxima(p, 3)
        >>> m.best.tolist(), m.runner_up().tolist(), row_maxima(p, 3) is m
        ([[[1, 0]]], [[[0.30000001192092896, 0.5]]], True)
    """
    last = _LAST_MAXIMA[0]
    if last is not None and last[0]() is tensor and last[1] == n_keys:
        return last[2]
    rows = tensor.detach()
    upcast = rows.dtype not in (torch.float32, torch.float64)  # a copy of its own: written into freely
    rows = (rows.float() if upcast else rows)[..., :n_keys]  # [B, H, Tc, n]
    # The hook's own tensor is written into (and restored) only outside autograd, and not as an inference tensor
    # outside inference mode (which refuses in-place writes).
    in_place = upcast or (not tensor.requires_grad and (torch.is_inference_mode_enabled() or not tensor.is_inference()))
    out = RowMaxima(rows, in_place)
    _LAST_MAXIMA[0] = (weakref.ref(tensor), n_keys, out)
    return out


class TargetReducer(Reducer):
    """Folds, per head, how much attention lands on a target set of keys and how often the argmax does.

    Subclasses define :meth:`targets` (the target keys of each category for a slice of query rows of the
    current batch, so that with query chunking no ``[T, S]`` target mask exists either). For every category
    and head the state accumulates, over the *valid* rows (a real query with at least one target key):

    - ``mass``: attention weight summed over the targets;
    - ``hits``: the row's argmax is a target, counted only when the argmax is unique (the top weight beats
      the runner-up by more than ``tie_tol``). A perfectly flat row has no argmax; without this rule
      ``torch.argmax`` would pick index 0 and a uniform head would look like a first-token head.
    - ``rows``: the number of valid rows.

    It also folds the confidence (mean max weight over real rows, Voita et al. 2019). States are
    ``[C, L, H_max]`` with ``H_max`` the widest layer; heads a pruned layer lacks stay zero.

    Precision and place: a pattern is read in float32 whatever its dtype (a bf16 pattern is upcast before any
    sum or comparison), and the sums are kept in float64 on the model's device (:func:`state_device`); nothing
    moves to the host until :meth:`result` is read.

    Cost: targets are few per row (an offset, the first token, the needle...), so a chunk's targets are kept as
    the list of their ``(row, key)`` entries and the pattern is read only there, plus the row maxima; a
    chunk's entries are built once and serve every layer (kept while they number at most
    :attr:`CACHE_ENTRIES_PER_ROW` per query row and category, so their memory stays linear in T).
    """

    names = PATTERN_HOOKS
    reads_query_chunks = True
    reads_cut_rows = True  # a causal row's targets and maxima lie at keys <= its query
    #: Target entries per query row and category below which a chunk's entries are kept for the next layers.
    CACHE_ENTRIES_PER_ROW = 8

    def __init__(self, model: Transformer, categories: list[str], *, tie_tol: float = 1e-6) -> None:
        super().__init__()
        L, H = head_grid(model)
        C = len(categories)
        self.model = model
        self.categories = list(categories)
        self.tie_tol = tie_tol
        dev = state_device(model)
        self.state = {"mass": zeros64(C, L, H, device=dev), "hits": zeros64(C, L, H, device=dev),
                      "rows": zeros64(C, L, device=dev), "max_sum": zeros64(L, H, device=dev),
                      "max_rows": zeros64(L, device=dev)}
        self._batch: Batch | None = None
        self._chunks: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def targets(self, batch: Batch, rows: slice) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        """``{category: [B, T', S] bool}`` for the query ``rows`` of ``batch``."""
        raise NotImplementedError

    def begin_batch(self, batch: Batch) -> None:
        self._batch = batch
        self._real = batch.real
        self._chunks = {}
        self._kept = 0  # target entries kept for this batch's chunks

    def _targets_for(self, q0: int, Tc: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor,
                                                                             torch.Tensor]:
        """Targets of query rows ``q0 .. q0 + Tc`` on valid rows (a real query with a target), on ``device``:
        ``(entries [N, 4] long (batch row, category, query - q0, key), valid rows per category [C], real rows)``
        (counts in the state's dtype)."""
        key = (q0, Tc, device)
        if key in self._chunks:
            return self._chunks[key]
        assert self._batch is not None
        targets = self.targets(self._batch, slice(q0, q0 + Tc))
        missing = [c for c in self.categories if c not in targets]
        if missing:
            raise ValueError(f"{type(self).__name__}: no target mask for categories {missing}")
        tgt = torch.stack([targets[c] for c in self.categories], dim=1)  # [B, C, Tc, S]
        real = self._real[:, q0:q0 + Tc]  # [B, Tc]
        tgt &= real[:, None, :, None]  # a padding query has no target
        entries = tgt.nonzero().to(device)  # [N, 4]
        acc = self.state["rows"]
        out = (entries, tgt.any(-1).sum((0, 2)).to(acc), real.sum().to(acc))
        B, C = tgt.shape[:2]
        # Keep the entries of every chunk while they are few per row (then all chunks' entries are O(T)).
        if self._kept + len(entries) <= self.CACHE_ENTRIES_PER_ROW * B * C * self._real.shape[1]:
            self._kept += len(entries)
            self._chunks[key] = out
        return out

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = layer_of(name)
        q0 = q_start
        p = tensor.detach().float()  # [B, H, Tc, S] (S = q0 + Tc when handed over cut)
        B, H, Tc, S = p.shape
        if H == 0:
            return
        st = self.state
        entries, rows, n_real = self._targets_for(q0, Tc, p.device)
        real = self._real[:, q0:q0 + Tc].to(p.device)  # [B, Tc]
        # A causal pattern is exactly 0 after the chunk's last query: the argmax, the runner-up test and every
        # target (keys <= query) lie before it, so half the work of a long sequence is skipped.
        n_keys = min(S, q0 + Tc) if self.model.cfg.causal else S
        maxima = row_maxima(tensor, n_keys)  # shared with the pass's other readers of this chunk
        top = maxima.top  # [B, H, Tc]
        # The argmax is unique when no other key lies within tie_tol of the top (RowMaxima.is_unique_argmax). The
        # runner-up is the maximum with the top's key knocked out: on CPU ~25 % cheaper than comparing and counting
        # every key, and ~4x cheaper than topk(2); it is asked only of rows whose top weight lies on a target.
        st["max_sum"][layer, :H] += (top * real[:, None]).sum((0, 2)).to(st["max_sum"])
        st["max_rows"][layer] += n_real
        # Per target entry (b, c, t, s): the weight there, and whether it is the row's unique argmax; summed per
        # category. A unique argmax is one key, so it hits at most one of the row's targets of a category.
        b, c, t, s = entries.unbind(1)  # [N] each
        weight = p[b, :, t, s]  # [N, H]
        hit = maxima.is_unique_argmax(b, t, s, self.tie_tol)  # [N, H]
        C = len(self.categories)
        st["mass"][:, layer, :H] += torch.zeros(C, H, dtype=st["mass"].dtype, device=p.device).index_add_(
            0, c, weight.to(st["mass"].dtype)).to(st["mass"])
        st["hits"][:, layer, :H] += torch.zeros(C, H, dtype=st["hits"].dtype, device=p.device).index_add_(
            0, c, hit.to(st["hits"].dtype)).to(st["hits"])
        st["rows"][:, layer] += rows

    def result(self) -> dict[str, Any]:
        """Per category: ``mass``, ``argmax`` (``[L, H_max]`` means over valid rows, NaN without rows), ``rows``;
        and ``confidence`` ``[L, H_max]``; on the CPU (the state is copied there once)."""
        st = {k: v.cpu() for k, v in self.state.items()}
        out: dict[str, Any] = {}
        for c, cat in enumerate(self.categories):
            rows = st["rows"][c][:, None]  # [L, 1]
            out[cat] = {
                "mass": torch.where(rows > 0, st["mass"][c] / rows.clamp(min=1), torch.nan),
                "argmax": torch.where(rows > 0, st["hits"][c] / rows.clamp(min=1), torch.nan),
                "rows": int(st["rows"][c].max()) if st["rows"].numel() else 0,
            }
        out["confidence"] = st["max_sum"] / st["max_rows"][:, None].clamp(min=1)
        return out
