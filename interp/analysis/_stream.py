"""Shared plumbing of the head analyzers: turning user data into batches, and folding attention patterns.

Every analyzer streams: it runs the model batch by batch with a :class:`~interp.trace.Reducer` attached to
``blocks.*.attn.hook_pattern`` and folds per-head statistics, so a dataset's patterns are never all held in
memory at once (with ``model.set_query_chunk`` not even one batch's full pattern is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from ..hooks import HookPoint, resolve_names
from ..trace import Reducer

Batch = tuple[torch.Tensor, torch.Tensor | None]

PATTERN_HOOKS = "blocks.*.attn.hook_pattern"


def layer_of(name: str) -> int:
    """``"blocks.3.attn.hook_pattern"`` -> 3."""
    return int(name.split(".")[1])


def _as_batch(item: Any, where: str) -> Batch:
    """One dataset item -> ``(tokens [B, T] long, attention_mask [B, T] or None)``."""
    mask = None
    if isinstance(item, Mapping):
        if "tokens" not in item and "input_ids" not in item:
            raise ValueError(f"{where}: a dict batch needs a 'tokens' (or 'input_ids') key, got keys {sorted(item)}")
        tokens = item.get("tokens", item.get("input_ids"))
        mask = item.get("attention_mask")
    elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], torch.Tensor):
        tokens, mask = item
    else:
        tokens = item
    if not isinstance(tokens, torch.Tensor):
        try:
            tokens = torch.as_tensor(tokens, dtype=torch.long)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{where}: expected token ids (a LongTensor or lists of ints), got {type(tokens).__name__}"
                            ) from e
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"{where}: token ids must be integers, got dtype {tokens.dtype}")
    if tokens.dim() == 1:
        tokens = tokens[None]  # [1, T]
        mask = None if mask is None else torch.as_tensor(mask)[None]  # [1, T]
    if tokens.dim() != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"{where}: token ids must have shape [batch, pos] with both > 0, got {tuple(tokens.shape)}")
    if mask is not None:
        mask = torch.as_tensor(mask)
        if tuple(mask.shape) != tuple(tokens.shape):
            raise ValueError(f"{where}: attention_mask has shape {tuple(mask.shape)}, tokens {tuple(tokens.shape)}")
    return tokens.long(), mask


def iter_batches(data: Any, *, batch_size: int = 32, name: str = "tokens") -> Iterator[Batch]:
    """Normalise what a user passes as a dataset into batches.

    Args:
        data: a LongTensor ``[N, T]`` (or ``[T]``), split into ``batch_size`` rows; a dict with ``tokens``
            (and optionally ``attention_mask``); or any iterable of batches, each a tensor, a
            ``(tokens, attention_mask)`` tuple or such a dict (a generator streams).
        batch_size: rows per batch when ``data`` is one tensor.
        name: the argument's name, for error messages.

    Yields:
        ``(tokens [B, T] long, attention_mask [B, T] or None)``.

    Raises:
        ValueError: the dataset is empty, or a batch has a bad shape.
        TypeError: a batch is not made of integer ids.
    """
    if data is None:
        raise ValueError(f"{name} is None: pass token ids (a LongTensor [batch, pos] or an iterable of batches)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    if isinstance(data, (torch.Tensor, Mapping)):
        tokens, mask = _as_batch(data, name)
        for i in range(0, tokens.shape[0], batch_size):
            yield tokens[i:i + batch_size], None if mask is None else mask[i:i + batch_size]
        return
    if not isinstance(data, Iterable) or isinstance(data, (str, bytes)):
        raise TypeError(f"{name} must be a LongTensor or an iterable of batches, got {type(data).__name__}")
    if isinstance(data, list) and data and all(isinstance(x, int) for x in data):
        yield _as_batch(data, name)  # one sequence given as a flat list of ints
        return
    n = 0
    for i, item in enumerate(data):
        n += 1
        yield _as_batch(item, f"{name}[{i}]")
    if n == 0:
        raise ValueError(f"{name} is an empty dataset: nothing to analyse")


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
    return torch.ones(tokens.shape, dtype=torch.bool) if mask is None else mask.bool()


def offset_targets(T: int, offset: int, rows: slice = slice(None)) -> torch.Tensor:
    """``[T', S]`` bool, True at ``(q, q + offset)`` for the queries ``rows`` (nothing outside the sequence)."""
    pos = torch.arange(T)
    return pos[None, :] == pos[rows][:, None] + offset  # [T', S]


def target_rows_any(targets_fn: Callable[[slice], dict[str, torch.Tensor]], kind: str, T: int,
                    chunk: int = 1024) -> torch.Tensor:
    """``[B, T]`` bool: which queries have at least one ``kind`` target, built ``chunk`` rows at a time."""
    return torch.cat([targets_fn(slice(i, min(i + chunk, T)))[kind].any(-1) for i in range(0, T, chunk)], dim=1)


class TargetReducer(Reducer):
    """Folds, per head, how much attention lands on a target set of keys and how often the argmax does.

    Before each forward pass call :meth:`set_batch` with the targets of each category, either boolean masks
    ``[B, T, S]`` or a function ``rows -> {category: [B, T', S]}`` that builds them for a slice of query rows
    (so that, with query chunking, no ``[T, S]`` target mask exists either), and the real-query mask ``[B, T]``. For every category and head it accumulates, over the *valid* rows
    (a real query with at least one target key):

    - ``mass``: attention weight summed over the targets;
    - ``hits``: the row's argmax is a target, counted only when the argmax is unique (the top weight beats
      the runner-up by more than ``tie_tol``). A perfectly flat row has no argmax; without this rule
      ``torch.argmax`` would pick index 0 and a uniform head would look like a first-token head.
    - ``rows``: the number of valid rows.

    It also folds the confidence (mean max weight over real rows, Voita et al. 2019).

    Pattern hooks fire per query chunk under ``model.set_query_chunk``: ``hook.ctx["q_start"]`` says which
    rows arrived, so target masks are sliced to match.
    """

    names = PATTERN_HOOKS

    def __init__(self, n_layers: int, n_heads: int, categories: list[str], *, tie_tol: float = 1e-6) -> None:
        C = len(categories)
        self.categories = list(categories)
        self.tie_tol = tie_tol
        self.mass = torch.zeros(C, n_layers, n_heads, dtype=torch.float64)
        self.hits = torch.zeros(C, n_layers, n_heads, dtype=torch.float64)
        self.rows = torch.zeros(C, n_layers, dtype=torch.float64)
        self.max_sum = torch.zeros(n_layers, n_heads, dtype=torch.float64)
        self.max_rows = torch.zeros(n_layers, dtype=torch.float64)
        self._targets_fn: Callable[[slice], dict[str, torch.Tensor]] | None = None
        self._whole: dict[str, torch.Tensor] | None = None
        self._real: torch.Tensor | None = None

    def set_batch(self, targets: dict[str, torch.Tensor] | Callable[[slice], dict[str, torch.Tensor]],
                  real: torch.Tensor) -> None:
        if callable(targets):
            self._targets_fn = targets
        else:
            missing = [c for c in self.categories if c not in targets]
            if missing:
                raise ValueError(f"set_batch: no target mask for categories {missing}")
            self._targets_fn = lambda rows: {c: t[:, rows] for c, t in targets.items()}
        self._real = real
        self._whole: dict[str, torch.Tensor] | None = None

    def _targets_for(self, q0: int, Tc: int) -> dict[str, torch.Tensor]:
        """The targets of query rows ``q0 .. q0 + Tc``; whole-sequence targets are kept for the next layers,
        chunks are rebuilt (keeping them would hold a [T, S] mask again)."""
        if q0 == 0 and Tc == self._real.shape[1]:
            if self._whole is None:
                self._whole = self._targets_fn(slice(0, Tc))
            return self._whole
        return self._targets_fn(slice(q0, q0 + Tc))

    def update(self, name: str, tensor: torch.Tensor, hook: HookPoint) -> None:
        layer = layer_of(name)
        q0 = hook.ctx.get("q_start", 0) or 0
        p = tensor.detach().float()  # [B, H, Tc, S]
        Tc, S = p.shape[2], p.shape[3]
        real = self._real[:, q0:q0 + Tc].to(p.device)  # [B, Tc]
        top = p.topk(min(2, S), dim=-1)
        best = top.indices[..., 0]  # [B, H, Tc]
        unique = top.values[..., 0] - top.values[..., 1] > self.tie_tol if S > 1 else torch.ones_like(best, dtype=torch.bool)
        self.max_sum[layer] += (top.values[..., 0] * real[:, None]).sum((0, 2)).double().cpu()
        self.max_rows[layer] += float(real.sum())
        chunk_targets = self._targets_for(q0, Tc)
        missing = [c for c in self.categories if c not in chunk_targets]
        if missing:
            raise ValueError(f"set_batch: no target mask for categories {missing}")
        for c, cat in enumerate(self.categories):
            tgt = chunk_targets[cat].to(p.device)  # [B, Tc, S]
            valid = tgt.any(-1) & real  # [B, Tc]
            mass = (p * tgt[:, None]).sum(-1)  # [B, H, Tc]
            hit = tgt[:, None].expand_as(p).gather(-1, best[..., None]).squeeze(-1) & unique  # [B, H, Tc]
            self.mass[c, layer] += (mass * valid[:, None]).sum((0, 2)).double().cpu()
            self.hits[c, layer] += (hit & valid[:, None]).sum((0, 2)).double().cpu()
            self.rows[c, layer] += float(valid.sum())

    def result(self) -> dict[str, Any]:
        """Per category: ``mass``, ``argmax`` (``[L, H]`` means over valid rows, NaN without rows), ``rows``."""
        out: dict[str, Any] = {}
        for c, cat in enumerate(self.categories):
            rows = self.rows[c][:, None]  # [L, 1]
            out[cat] = {
                "mass": torch.where(rows > 0, self.mass[c] / rows.clamp(min=1), torch.nan),
                "argmax": torch.where(rows > 0, self.hits[c] / rows.clamp(min=1), torch.nan),
                "rows": int(self.rows[c, 0]),
            }
        out["confidence"] = self.max_sum / self.max_rows[:, None].clamp(min=1)
        return out


def run_reducer(model, tokens: torch.Tensor, mask: torch.Tensor | None, reducers: list[Reducer]) -> torch.Tensor:
    """One forward pass that feeds ``reducers`` (the :class:`~interp.trace.Reducer` protocol) and stores nothing.

    Hooks are attached directly rather than through ``run_with_cache``: nothing is recorded, and the
    per-batch token strings a Trace would build are not needed here.

    Returns:
        The model output.
    """
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    kwargs = {} if mask is None else {"attention_mask": mask.to(device)}
    fwd_hooks = [(resolve_names(r.names, model.hook_names), lambda t, hook, r=r: r.update(hook.name, t, hook))
                 for r in reducers]
    with torch.no_grad():
        return model.run_with_hooks(tokens.to(device), fwd_hooks=fwd_hooks, **kwargs)


def check_length(model, T: int, what: str = "sequence") -> None:
    """Raise ValueError when a batch is longer than the model's context."""
    if T > model.cfg.n_ctx:
        raise ValueError(f"{what} length {T} exceeds the model's n_ctx={model.cfg.n_ctx}")
