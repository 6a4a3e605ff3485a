"""Random baseline: prune heads in a random order, averaged over several seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from ..progress import enabled as progress_enabled
from .curve import CurvePoint, PruningCurve
from .gates import uniform_heads
from .importance import make_point, masked_metric, prune_counts
from .objectives import Batch, Objective, check_batches

if TYPE_CHECKING:
    from ..model import Transformer


def random_curve(model: Transformer, batches: Sequence[Batch], objective: Objective, *, seeds: Sequence[int] = (0, 1, 2),
                 step: float | int = 0.1, resume: Sequence[PruningCurve] = (),
                 on_seed: Callable[[PruningCurve], None] | None = None,
                 on_point: Callable[[PruningCurve], None] | None = None, progress: bool | None = None) -> PruningCurve:
    """The metric when heads are pruned in a random order, mean and std over ``seeds``.

    Args:
        model: a Transformer with equal head counts per layer.
        batches: data for the metric (held-out data, as for the other methods' evaluation).
        objective: gives the metric.
        seeds: one random order per seed.
        step: heads pruned per step (fraction of all heads or a count), as :func:`importance_curve`.
        resume: per-seed curves already computed (``config["seed"]`` says which); those seeds are skipped.
        on_seed: called with each finished per-seed curve (to save partial results).
        on_point: called after every point with the growing per-seed curve (``config["seed"]`` says which), for
            progress finer than one seed.
        progress: show a tqdm bar (None: in terminals and notebooks).

    Returns:
        A :class:`PruningCurve` ``method="random"`` whose points hold the mean metric, its std over seeds, and the
        per-seed values in ``extra["per_seed"]``.

    Raises:
        ValueError: empty data or no seeds.

    Example:
        >>> from interp.pruning.baseline import random_curve
        >>> from interp.examples import model, held_out, objective
        >>> rand = random_curve(model, held_out, objective, seeds=range(2))
    """
    batches = check_batches(batches)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty: the random baseline needs at least one seed")
    L, H = uniform_heads(model)
    counts = prune_counts(L * H, step)
    done = {int(c.config["seed"]): c for c in resume}
    per_seed = []
    bar = tqdm(total=len(seeds) * len(counts), desc="random pruning", disable=not progress_enabled(progress))
    for seed in seeds:
        if seed in done:
            per_seed.append(done[seed])
            bar.update(len(counts))
            continue
        order = torch.randperm(L * H, generator=torch.Generator().manual_seed(seed))
        curve = PruningCurve("random", objective.metric_name, L * H, model_name=getattr(model, "name", ""),
                             config={"seed": seed, "step": step})
        for n in counts:
            flat = torch.zeros(L * H, dtype=torch.bool)
            flat[order[:n]] = True
            pruned = flat.view(L, H)  # [L*H] -> [L, H]
            curve.points.append(make_point(model, pruned, masked_metric(model, batches, objective, pruned), seed=seed))
            bar.update(1)
            if on_point:
                on_point(curve)
        per_seed.append(curve)
        if on_seed:
            on_seed(curve)
    bar.close()
    return average_curves(per_seed, config={"seeds": seeds, "step": step})


def average_curves(curves: Sequence[PruningCurve], config: dict | None = None) -> PruningCurve:
    """Mean and std, point by point, of curves with the same pruned counts (one per seed).

    Raises:
        ValueError: no curves, or curves with different pruned counts.
    """
    if not curves:
        raise ValueError("average_curves needs at least one curve")
    counts = [p.n_pruned for p in curves[0].points]
    for c in curves:
        if [p.n_pruned for p in c.points] != counts:
            raise ValueError(f"curves have different pruned counts: {counts} vs {[p.n_pruned for p in c.points]}")
    first = curves[0]
    points = []
    for i, n in enumerate(counts):
        vals = np.array([c.points[i].metric for c in curves])
        saved = [c.points[i].kv_bytes_saved or 0 for c in curves]
        points.append(CurvePoint(fraction=n / first.n_heads_total, n_pruned=n, metric=float(vals.mean()),
                                 metric_std=float(vals.std()), mask=None, kv_bytes_saved=int(np.mean(saved)),
                                 extra={"per_seed": vals.tolist()}))
    return PruningCurve(first.method, first.metric_name, first.n_heads_total, points, first.model_name,
                        config or {"seeds": [c.config.get("seed") for c in curves]})
