"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?") and iterative pruning by it.

I_h = E_x |d loss(x) / d xi_h| with every gate xi at 1 (or at the current mask): a first-order estimate of how much
the loss changes when head h is gated off. The iterative procedure follows the bertology recipe of Hugging Face
(``run_bertology.py``): mask the least important ``masking_amount`` of the heads, recompute importance with that
mask, and stop when the metric drops below ``masking_threshold`` times the unpruned metric.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tqdm.auto import tqdm

from .. import distributed
from .curve import CurvePoint, PruningCurve
from .gates import head_mask, uniform_heads
from .objectives import Batch, Objective, check_batches
from .surgery import kv_cache_savings


def head_importance(model, batches: Sequence[Batch], objective: Objective, *, normalize_layers: bool = True,
                    pruned: torch.Tensor | None = None, progress: bool = False) -> torch.Tensor:
    """Michel et al.'s head importance: the mean over batches of |d loss / d gate_h|.

    Args:
        model: a Transformer whose layers have equal head counts.
        batches: a non-empty sequence of batches (token tensors or dicts, see :mod:`.objectives`).
        objective: gives ``loss(model, batch)``.
        normalize_layers: divide each layer's scores by their L2 norm (Michel et al. section 4.1; the bertology
            default), which makes scores comparable across layers.
        pruned: ``[L, H]`` bool of heads already gated off (their gate is 0, the others 1); None = all at 1.
        progress: show a tqdm bar.

    Returns:
        ``[L, H]`` float tensor (pruned heads get 0 gradient and so 0 importance).

    Raises:
        ValueError: empty batches, or layers with different head counts.

    Example:
        >>> imp = head_importance(model, [tokens], LanguageModelObjective())
        >>> imp.shape
        torch.Size([2, 4])
    """
    batches = check_batches(batches)
    L, H = uniform_heads(model)
    distributed.check_same(model, distributed.describe_batches(batches))
    p = next(model.parameters())
    gates = torch.ones(L, H, device=p.device, dtype=p.dtype)
    if pruned is not None:
        gates = gates * (~pruned.to(p.device)).to(p.dtype)
    gates.requires_grad_(True)
    flags = [q.requires_grad for q in model.parameters()]
    total = torch.zeros(L, H, dtype=torch.float64)
    try:
        for q in model.parameters():
            q.requires_grad_(False)  # only the gates need gradients
        with head_mask(model, None):
            model.set_head_gates(gates)
            for batch in tqdm(distributed.shard(batches), desc="importance", disable=not progress, leave=False):
                (grad,) = torch.autograd.grad(objective.loss(model, batch), gates)
                total += grad.detach().abs().double().cpu()
    finally:
        for q, f in zip(model.parameters(), flags):
            q.requires_grad_(f)
    count = torch.tensor(float(len(distributed.shard(batches))), dtype=torch.float64)
    distributed.all_reduce_(total, count)  # under torchrun: sums over the ranks' shards (no-op otherwise)
    imp = (total / count).float()
    if normalize_layers:
        imp = imp / (imp.norm(p=2, dim=-1, keepdim=True) + 1e-20)
    return imp


def prune_counts(n_total: int, step: float | int) -> list[int]:
    """Heads pruned after each step: 0, n, 2n, ... n_total, with n = max(1, int(step * n_total)) for a float step
    (the bertology ``masking_amount``), or n = step for an int.

    Raises:
        ValueError: step not in (0, 1] (float) or not >= 1 (int).
    """
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        raise TypeError(f"step={step!r} must be a float fraction or an int head count")
    if isinstance(step, float):
        if not 0.0 < step <= 1.0:
            raise ValueError(f"step={step} must be a fraction in (0, 1]")
        n = max(1, int(step * n_total))
    else:
        if step < 1:
            raise ValueError(f"step={step} must be >= 1 head")
        n = step
    counts = list(range(0, n_total, n)) + [n_total]
    return counts


def make_point(model, pruned: torch.Tensor, metric: float, **extra) -> CurvePoint:
    """A curve point for a bool mask ``[L, H]`` (fraction, count, mask, KV bytes saved)."""
    n = int(pruned.sum())
    saved = kv_cache_savings(model, pruned.cpu())["bytes_saved_per_token"]
    return CurvePoint(fraction=n / pruned.numel(), n_pruned=n, metric=float(metric),
                      mask=pruned.cpu().tolist(), kv_bytes_saved=int(saved), extra=extra)


def masked_metric(model, batches: Sequence[Batch], objective: Objective, pruned: torch.Tensor) -> float:
    """The objective's metric with the heads in ``pruned`` gated to 0."""
    with head_mask(model, pruned):
        return float(objective.metric(model, batches))


def importance_curve(model, batches: Sequence[Batch], objective: Objective, *,
                     eval_batches: Sequence[Batch] | None = None, step: float | int = 0.1,
                     threshold: float | None = None, normalize_layers: bool = True, recompute: bool = True,
                     resume: PruningCurve | None = None, on_point: Callable[[PruningCurve], None] | None = None,
                     progress: bool = False) -> PruningCurve:
    """Iterative pruning by head importance (bertology ``mask_heads``): a curve from 0 heads pruned upward.

    Args:
        model: a Transformer with equal head counts per layer (gates are restored afterwards).
        batches: data for the importance scores.
        objective: loss for the scores, metric for the curve.
        eval_batches: held-out data for the metric (default: ``batches``).
        step: heads masked per step, a fraction of all heads (bertology ``masking_amount``, default 0.1) or a count.
        threshold: stop once the metric falls below ``threshold`` times the unpruned metric (bertology
            ``masking_threshold``, e.g. 0.9); None = prune down to zero heads.
        normalize_layers: per-layer L2 normalisation of the scores.
        recompute: recompute importance after each step with the current mask (Michel et al. compute it once).
        resume: a partial curve from an interrupted run; pruning continues from its last mask.
        on_point: called with the curve after each new point (to save partial results).
        progress: show tqdm bars.

    Returns:
        A :class:`PruningCurve` with ``method="importance"``; each point keeps its mask.

    Raises:
        ValueError: empty data, a bad step, or threshold outside (0, 1].

    Example:
        >>> curve = importance_curve(model, train, LanguageModelObjective(), eval_batches=held_out, step=1)
    """
    batches = check_batches(batches)
    eval_batches = batches if eval_batches is None else check_batches(eval_batches, "eval_batches")
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold={threshold} must be in (0, 1] (a fraction of the unpruned metric)")
    L, H = uniform_heads(model)
    counts = prune_counts(L * H, step)
    config = {"step": step, "threshold": threshold, "normalize_layers": normalize_layers, "recompute": recompute}
    curve = resume if resume is not None and resume.points else PruningCurve(
        "importance", objective.metric_name, L * H, model_name=getattr(model, "name", ""), config=config)
    if not curve.points:
        pruned = torch.zeros(L, H, dtype=torch.bool)
        curve.points.append(make_point(model, pruned, masked_metric(model, eval_batches, objective, pruned)))
        if on_point:
            on_point(curve)
    base = curve.points[0].metric
    pruned = torch.tensor(curve.points[-1].mask, dtype=torch.bool)
    imp = None if recompute else head_importance(model, batches, objective, normalize_layers=normalize_layers)
    todo = [c for c in counts if c > int(pruned.sum())]
    for n_target in tqdm(todo, desc="importance pruning", disable=not progress):
        if threshold is not None and curve.points[-1].metric < threshold * base:
            break
        if recompute or imp is None:
            imp = head_importance(model, batches, objective, normalize_layers=normalize_layers, pruned=pruned)
        scores = imp.clone().flatten()
        scores[pruned.flatten()] = float("inf")  # never re-pick a pruned head
        n_new = n_target - int(pruned.sum())
        order = torch.argsort(scores, stable=True)[:n_new]
        flat = pruned.flatten().clone()
        flat[order] = True
        pruned = flat.view(L, H)  # [L*H] -> [L, H]
        metric = masked_metric(model, eval_batches, objective, pruned)
        curve.points.append(make_point(model, pruned, metric, step_heads=[divmod(int(i), H) for i in order]))
        if on_point:
            on_point(curve)
    return curve
