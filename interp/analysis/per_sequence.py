"""Per-sequence attention mass on target keys: the rows a bootstrap interval resamples.

:class:`~interp.analysis._stream.TargetReducer` folds sums over every row of the dataset, which is all a score
needs; an interval needs the score of each sequence. :class:`PerSequenceMass` keeps, for each sequence seen and
each category, the mean attention mass on the targets over the sequence's valid rows (a real query with a
target), from the same targets. ``classify_heads(bootstrap=N)`` adds it to the pass of the kinds it serves; it
costs one more masked sum over each pattern chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..data import Batch
from ..streaming import Reducer
from ._stream import PATTERN_HOOKS, head_grid, layer_of

__all__ = ["PerSequenceMass"]

Targets = Callable[[Batch, slice], dict[str, torch.Tensor]]


class PerSequenceMass(Reducer):
    """Per sequence, category and head: mean attention mass on the target keys over the sequence's valid rows.

    Args:
        model: the model whose patterns are read.
        categories: the target categories.
        targets: ``targets(batch, rows) -> {category: [B, T', S] bool}`` (the same function the scorer uses).

    Example:
        >>> import interp
        >>> from interp.analysis.per_sequence import PerSequenceMass
        >>> from interp.examples import model, tokens
        >>> from interp.analysis.induction import induction_targets
        >>> red = PerSequenceMass(model, ["induction"],
        ...                       lambda b, rows: induction_targets(b.tokens, b.mask, True, rows))
        >>> _ = interp.streaming.stream(model, tokens, [red])
        >>> red.values()["induction"].shape      # [N sequences, L, H]
        torch.Size([2, 2, 4])
    """

    names = PATTERN_HOOKS
    reads_query_chunks = True
    reads_cut_rows = True  # the targets are cut to the chunk's keys for the mass

    def __init__(self, model: Any, categories: list[str], targets: Targets) -> None:
        super().__init__()
        self.model = model
        self.categories = list(categories)
        self._targets = targets
        self._shape = head_grid(model)
        self._seen: dict[str, list[torch.Tensor]] = {c: [] for c in self.categories}

    def begin_batch(self, batch: Batch) -> None:
        self._batch = batch
        B = batch.tokens.shape[0]
        L, H = self._shape
        self._mass = {c: torch.zeros(B, L, H, dtype=torch.float64) for c in self.categories}
        self._rows = {c: torch.zeros(B, L, dtype=torch.float64) for c in self.categories}

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = layer_of(name)
        p = tensor.detach().float()  # [B, H, Tc, S]
        B, H, Tc, S = p.shape
        if not H:
            return
        tgt = self._targets(self._batch, slice(q_start, q_start + Tc))
        real = self._batch.real[:, q_start:q_start + Tc]  # [B, Tc]
        for c in self.categories:
            t = tgt[c] & real[..., None]  # [B, Tc, T]
            valid = t.any(-1)  # [B, Tc]
            # A cut chunk's rows end at its last query (S = q_start + Tc): the weight on any later key is zero.
            mass = (p * t[:, None, :, :S].to(p)).sum((2, 3))  # [B, H]
            self._mass[c][:, layer, :H] += mass.double().cpu()
            self._rows[c][:, layer] += valid.sum(-1).double()

    def end_batch(self) -> None:
        for c in self.categories:
            rows = self._rows[c][..., None]  # [B, L, 1]
            self._seen[c].append(torch.where(rows > 0, self._mass[c] / rows.clamp(min=1), torch.nan))  # [B, L, H]

    def values(self) -> dict[str, torch.Tensor]:
        """``{category: [N, L, H]}`` per-sequence mean mass (NaN for a sequence without a valid row)."""
        L, H = self._shape
        return {c: torch.cat(v) if v else torch.zeros(0, L, H, dtype=torch.float64) for c, v in self._seen.items()}

    def result(self) -> dict[str, torch.Tensor]:
        """:meth:`values` (the per-sequence values are the result)."""
        return self.values()
