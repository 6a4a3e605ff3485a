"""Argument checks of the circuit tools (:mod:`interp.analysis.patching`), run before any forward pass.

Kept apart from the patching loops so that each check is written once and every public function starts
with the same ones: bad input is refused with the argument, the value and what was expected, instead of a
raw torch error deep inside a hook or a table of NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

Metric = Callable[[torch.Tensor], torch.Tensor]


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as a positive int; 0, -1, 1.5 and True are refused, naming the argument.

    Args:
        name: the argument, for the error.
        value: what was passed.

    Returns:
        ``value``.

    Raises:
        ValueError: anything but an int >= 1 (a bool is no count).

    Example:
        >>> from interp.analysis.patching_checks import check_positive_int
        >>> check_positive_int("n_samples", 16)
        16
        >>> check_positive_int("batch_size", 0)
        Traceback (most recent call last):
        ValueError: batch_size must be a positive int, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_batch_size(batch_size: Any) -> int:
    """``batch_size`` as a positive int (:func:`check_positive_int`), the check every patching tool starts with."""
    return check_positive_int("batch_size", batch_size)


def check_clean_corrupted(clean: torch.Tensor, corrupted: torch.Tensor) -> None:
    """Refuse identical clean and corrupted inputs: every site would score 0 / 0 (a NaN table).

    Example:
        >>> import torch
        >>> from interp.analysis.patching_checks import check_clean_corrupted
        >>> check_clean_corrupted(torch.tensor([[1, 2]]), torch.tensor([[1, 3]]))
    """
    if isinstance(clean, torch.Tensor) and isinstance(corrupted, torch.Tensor) and \
            clean.shape == corrupted.shape and torch.equal(clean, corrupted):
        raise ValueError("clean and corrupted are the same tokens: patching would change nothing and every "
                         "normalized score would be 0/0; pass a corrupted input that removes the behaviour")


def check_answer_tokens(answer_tokens: Any, clean: torch.Tensor, d_vocab: int) -> None:
    """``answer_tokens``: ``[B, 2]`` (or one pair ``[2]``) integer ids in ``[0, d_vocab)``, ``B`` = the batch.

    Example:
        >>> import torch
        >>> from interp.analysis.patching_checks import check_answer_tokens
        >>> check_answer_tokens(torch.tensor([[1, 2]]), torch.zeros(1, 4, dtype=torch.long), 10)
    """
    if answer_tokens is None:
        return
    answers = torch.as_tensor(answer_tokens)
    if answers.dtype.is_floating_point or answers.dtype == torch.bool:
        raise ValueError(f"answer_tokens must be integer token ids, got {answers.dtype}")
    if answers.dim() == 1:
        answers = answers[None]
    batch = clean.shape[0] if isinstance(clean, torch.Tensor) and clean.dim() == 2 else None
    if answers.dim() != 2 or answers.shape[1] != 2 or (batch is not None and answers.shape[0] not in (1, batch)):
        raise ValueError(f"answer_tokens must be [batch, 2] (correct, wrong) ids with batch {batch} (or one "
                         f"pair [2]), got shape {tuple(torch.as_tensor(answer_tokens).shape)}")
    bad = answers[(answers < 0) | (answers >= d_vocab)]
    if bad.numel():
        raise ValueError(f"answer_tokens {bad[:4].tolist()} are outside the vocabulary [0, {d_vocab})")


def checked_metric(metric: Metric | None) -> Metric | None:
    """``metric`` wrapped so that a result other than one finite number is refused, naming what came back.

    A ``[B]`` metric (one value per sequence) and a NaN metric would otherwise give torch's "only one
    element tensors can be converted" or a table of NaN.

    Example:
        >>> import torch
        >>> from interp.analysis.patching_checks import checked_metric
        >>> float(checked_metric(lambda lg: lg.sum())(torch.ones(1, 2, 3)))
        6.0
    """
    if metric is None or not callable(metric):
        return metric

    def checked(logits: torch.Tensor) -> torch.Tensor:
        value = metric(logits)
        value = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if value.numel() != 1:
            raise ValueError(f"metric must return one number for the batch, got a tensor of shape "
                             f"{tuple(value.shape)}; reduce it (for example .mean())")
        number = float(value.detach())
        if not math.isfinite(number):
            raise ValueError(f"metric returned {number} on logits of shape {tuple(logits.shape)}; patching scores "
                             f"would all be NaN (check the metric, the answer ids, or the logits)")
        return value.reshape(())

    # What the metric says of the positions it reads lets the callers unembed only those.
    checked.reads_last_only = bool(getattr(metric, "reads_last_only", False))  # type: ignore[attr-defined]
    return checked


def check_heads(heads: Any) -> list[tuple[int, int]]:
    """``heads`` as a list of ``(layer, head)`` int pairs; ``[(0.5, 0)]`` and ``[0]`` are refused by name.

    Example:
        >>> from interp.analysis.patching_checks import check_heads
        >>> check_heads([(1, 0), (1, 2)])
        [(1, 0), (1, 2)]
    """
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise TypeError(f"heads must be a list of (layer, head) int pairs, got {heads!r}")
    out = []
    for pair in heads:
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in pair)
        if not ok:
            raise TypeError(f"heads must be (layer, head) int pairs, got {pair!r} in {heads!r}")
        out.append((int(pair[0]), int(pair[1])))
    return out


def check_n_samples(n_samples: Any) -> int:
    """``n_samples`` as a positive int (:func:`check_positive_int`; 0 would average nothing: NaN)."""
    return check_positive_int("n_samples", n_samples)


__all__ = ["check_answer_tokens", "check_batch_size", "check_clean_corrupted", "check_heads", "check_n_samples",
           "check_positive_int", "checked_metric"]
