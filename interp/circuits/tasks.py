"""Circuit tasks: clean / corrupted prompts with the metric that reads them, by name.

The prompts come from :mod:`interp.data.circuit_tasks` (and, for induction, :func:`interp.data.repeated_sequences`);
the metrics are :func:`~interp.analysis.patching.logit_diff_metric` (IOI, agreement, docstring),
:func:`~interp.analysis.patching.in_context_metric` (induction) and a probability difference (greater-than).
Your own task is any :class:`CircuitTask` built from a clean / corrupted pair and a ``metric(logits) -> scalar``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..analysis.patching import in_context_metric, logit_diff_metric
from ..data import repeated_sequences
from ..data.circuit_tasks import agreement_prompts, docstring_prompts, greater_than_prompts, ioi_prompts

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["TASKS", "TEXT_TASKS", "CircuitTask", "circuit_task", "prob_diff_metric"]

TASKS = ("induction", "ioi", "greater-than", "agreement", "docstring")
#: The tasks built from text, which need the model's text tokenizer (induction runs on any vocabulary).
TEXT_TASKS = tuple(t for t in TASKS if t != "induction")
Metric = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class CircuitTask:
    """A clean / corrupted pair ``[B, T]``, the metric (higher = the clean behaviour) and the ablation the
    task's faithfulness is measured with (``"resample"`` or ``"mean"``)."""

    name: str
    clean: torch.Tensor
    corrupted: torch.Tensor
    metric: Metric
    ablation: str = "resample"


def prob_diff_metric(good: torch.Tensor, bad: torch.Tensor) -> Metric:
    """Mean over the batch of ``P(good tokens) - P(bad tokens)`` at the last position (greater-than's metric; it
    says so with ``reads_last_only``).

    Args:
        good, bad: ``[B, V]`` bool masks.

    Example:
        >>> import torch
        >>> from interp.circuits.tasks import prob_diff_metric
        >>> m = prob_diff_metric(torch.eye(4, dtype=torch.bool)[:1], torch.eye(4, dtype=torch.bool)[1:2])
        >>> round(float(m(torch.tensor([[[2.0, 0.0, 0.0, 0.0]]]))), 3)
        0.615
    """
    def metric(logits: torch.Tensor) -> torch.Tensor:
        p = logits[:, -1].float().softmax(-1)  # [B, V]
        return ((p * good.to(p.device)).sum(-1) - (p * bad.to(p.device)).sum(-1)).mean()

    metric.reads_last_only = True  # type: ignore[attr-defined]  # the passes may unembed the last position alone
    return metric


def circuit_task(model: Transformer, name: str, *, n: int = 16, seed: int = 0, half_len: int = 10) -> CircuitTask:
    """Build a task by name for ``model``.

    Args:
        model: the model (text tasks need its tokenizer).
        name: one of :data:`TASKS`.
        n: prompts.
        seed: seed of the prompts.
        half_len: induction only: the length of the repeated half.

    Returns:
        A :class:`CircuitTask`.

    Raises:
        ValueError: an unknown task, a text task on a model without a text tokenizer.

    Example:
        >>> from interp.circuits.tasks import circuit_task
        >>> from interp.examples import model
        >>> task = circuit_task(model, "induction", n=4)
        >>> task.clean.shape
        torch.Size([4, 21])
    """
    if name == "induction":
        tok = getattr(model, "tokenizer", None)
        bos = getattr(tok, "bos_id", None)
        clean = repeated_sequences(n, half_len, model.cfg.d_vocab, seed=seed, bos_id=bos)
        # Corrupted: other repeated sequences. Replacing only the repeated half (corrupt_repeats) leaves every
        # first-half key and value as it was, so the previous-token -> induction-head K-composition edges
        # would carry the same value in both runs and could never score. Mean ablation over these sequences
        # removes the tokens but keeps the structure: resampling one other sequence instead makes each ablated
        # induction head predict that sequence's tokens, which the circuit must then outvote.
        corrupted = repeated_sequences(n, half_len, model.cfg.d_vocab, seed=seed + 1_000_003, bos_id=bos)
        return CircuitTask(name, clean, corrupted, in_context_metric(clean, half_len, bos=bos is not None),
                           ablation="mean")
    builders = {"ioi": ioi_prompts, "greater-than": greater_than_prompts, "agreement": agreement_prompts,
                "docstring": docstring_prompts}
    if name not in builders:
        raise ValueError(f"task must be one of {TASKS}, got {name!r}")
    p = builders[name](model, n, seed=seed)
    if p.answers is not None:
        metric = logit_diff_metric(p.answers)
    else:
        assert p.good is not None and p.bad is not None
        metric = prob_diff_metric(p.good, p.bad)
    return CircuitTask(name, p.clean, p.corrupted, metric)
