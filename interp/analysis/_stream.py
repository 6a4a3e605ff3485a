"""Shared pieces of the head analyzers: per-layer head counts, target masks, and the target reducer.

Every analyzer is a :class:`~interp.streaming.Reducer` fed by :func:`~interp.streaming.stream`: it prepares its
targets from each :class:`~interp.data.Batch` in ``begin_batch`` and folds the attention patterns in
``update``, so several analyzers share one forward pass and no dataset's patterns are held at once (with
``model.set_query_chunk`` not even one batch's full pattern is).
"""

from __future__ import annotations

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
    on a model split over devices), so that folding a batch never waits on a copy to the host."""
    param = next(model.parameters(), None)
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


#: Categories whose target bits are counted together (one bincount of ``H * 2**bits`` bins per group).
_CODE_BITS = 10


def _code_groups(C: int) -> list[range]:
    """Categories ``0..C-1`` cut into groups of at most ``_CODE_BITS``."""
    return [range(c0, min(c0 + _CODE_BITS, C)) for c0 in range(0, C, _CODE_BITS)]


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
    """

    names = PATTERN_HOOKS

    def __init__(self, model: Transformer, categories: list[str], *, tie_tol: float = 1e-6) -> None:
        super().__init__()
        L, H = model.cfg.n_layers, max(head_counts(model), default=0)
        C = len(categories)
        self.model = model
        self.categories = list(categories)
        self.tie_tol = tie_tol
        self._bit_values = 2.0 ** torch.arange(_CODE_BITS, dtype=torch.float32)  # [_CODE_BITS]
        self._bits = {len(g): ((torch.arange(1 << len(g))[:, None] >> torch.arange(len(g))) & 1).double()
                      for g in _code_groups(C)}  # G -> [2^G, G]: the bits of every pattern of G categories
        dev = state_device(model)
        self.state = {"mass": zeros64(C, L, H, device=dev), "hits": zeros64(C, L, H, device=dev),
                      "rows": zeros64(C, L, device=dev), "max_sum": zeros64(L, H, device=dev),
                      "max_rows": zeros64(L, device=dev)}
        self._batch: Batch | None = None
        # (codes, weights, valid rows, real rows) of the whole sequence, kept for the next layers
        self._whole: tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def targets(self, batch: Batch, rows: slice) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        """``{category: [B, T', S] bool}`` for the query ``rows`` of ``batch``."""
        raise NotImplementedError

    def begin_batch(self, batch: Batch) -> None:
        self._batch = batch
        self._real = batch.real
        self._whole = None

    def _targets_for(self, q0: int, Tc: int, device: torch.device) -> tuple[list[torch.Tensor], torch.Tensor,
                                                                             torch.Tensor, torch.Tensor]:
        """Targets of query rows ``q0 .. q0 + Tc`` on valid rows (a real query with a target), on ``device``:
        ``(codes, weights [B, C, Tc*S] float, valid rows per category [C] float64, real rows float64)``;
        ``codes`` holds, per group of categories (:func:`_code_groups`), a ``[B, Tc, S]`` long whose bit
        ``c - group start`` says that the key is a target of category ``c``.

        Whole-sequence targets are kept for the next layers; chunks are rebuilt (keeping them would hold a
        ``[T, S]`` mask again)."""
        whole = q0 == 0 and Tc == self._real.shape[1]
        if whole and self._whole is not None and self._whole[1].device == device:  # a split model: per device
            return self._whole
        if self._batch is None:
            raise RuntimeError(f"{type(self).__name__}: a pattern arrived before begin_batch gave its batch")
        targets = self.targets(self._batch, slice(q0, q0 + Tc))
        missing = [c for c in self.categories if c not in targets]
        if missing:
            raise ValueError(f"{type(self).__name__}: no target mask for categories {missing}")
        tgt = torch.stack([targets[c] for c in self.categories], dim=1)  # [B, C, Tc, S]
        real = self._real[:, q0:q0 + Tc]  # [B, Tc]
        valid = tgt.any(-1) & real[:, None]  # [B, C, Tc]: real rows with a target
        B, C, _, S = tgt.shape
        w = (tgt & valid[..., None]).to(device, torch.float32).view(B, C, Tc * S)  # [B, C, Tc*S]: valid targets
        # Each key's categories as bits of one integer per group (a sum of powers of two, exact in float32):
        # the argmax's categories are then one gather.
        codes = [(w[:, g.start:g.stop] * self._bit_values[: len(g), None].to(device)).sum(1).long().view(B, Tc, S)
                 for g in _code_groups(C)]  # [B, Tc, S] each
        acc = self.state["rows"]
        out = (codes, w, valid.sum((0, 2)).to(acc), real.sum().to(acc))  # counts on the state's device
        if whole:
            self._whole = out
        return out

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = layer_of(name)
        q0 = q_start
        p = tensor.detach().float()  # [B, H, Tc, S]
        B, H, Tc, S = p.shape
        if H == 0:
            return
        st = self.state
        codes, w, rows, n_real = self._targets_for(q0, Tc, p.device)
        real = self._real[:, q0:q0 + Tc].to(p.device)  # [B, Tc]
        top, best = p.max(-1)  # [B, H, Tc]
        # The argmax is unique when no other key lies within tie_tol of the top. The runner-up is the maximum
        # of a copy with the argmax knocked out: on CPU ~25 % cheaper than comparing and counting every key,
        # and ~4x cheaper than topk(2).
        others = p.clone().scatter_(-1, best.unsqueeze(-1), float("-inf"))  # [B, H, Tc, S]
        unique = others.amax(-1) < top - self.tie_tol  # [B, H, Tc]
        st["max_sum"][layer, :H] += (top * real[:, None]).sum((0, 2)).to(st["max_sum"])
        st["max_rows"][layer] += n_real
        # Mass on the targets of every category over the valid rows, as one batched matmul over (query, key):
        # sum_{t,s} p[b,h,t,s] * tgt[b,c,t,s] * valid[b,c,t]; no [B, C, H, Tc, S] product is formed.
        mass = p.reshape(B, H, Tc * S) @ w.transpose(1, 2)  # [B, H, C]
        st["mass"][:, layer, :H] += mass.to(st["mass"]).sum(0).T
        # Is the (unique) argmax key a target? Read the categories' bits at each row's argmax and count every
        # (head, bit pattern) with one bincount; a pattern's count goes to each category whose bit it holds.
        best = best.transpose(1, 2)  # [B, Tc, H]: gathered along the keys of each row
        for g, code in zip(_code_groups(len(self.categories)), codes):
            n_codes, bits = 1 << len(g), self._bits[len(g)].to(st["hits"])  # bits: [2^G, G], pattern -> its bits
            at_best = code.gather(-1, best).transpose(1, 2)  # [B, H, Tc]
            head = torch.arange(0, H * n_codes, n_codes, device=p.device)[:, None]  # [H, 1]: each head's first bin
            # A tied row counts in bin 0 (head 0, no bits): it hits nothing.
            count = torch.bincount(torch.where(unique, at_best + head, 0).flatten(), minlength=H * n_codes)
            st["hits"][g.start:g.stop, layer, :H] += (count.view(H, n_codes).to(bits) @ bits).T
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
