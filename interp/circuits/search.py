"""Circuit search: top-n edges by score, ACDC-style greedy pruning with exact patching, and Edge Pruning.

- :func:`top_n`: the ``n`` edges of largest absolute score (EAP, EAP-IG or exact).
- :func:`acdc` (Conmy et al. 2023): from the full graph, visit the downstream inputs from the logits back to
  the embedding; ablate each incoming edge in turn and keep it ablated when the metric moves by less than
  ``threshold`` (exact patching, every earlier removal in place).
- :func:`edge_pruning` (Bhaskar et al. 2024): one Hard-Concrete gate per edge
  (:class:`~interp.pruning.gates.HardConcreteGate` over the ``[U, D]`` grid), a sampled gate ``z`` ablates
  ``1 - z`` of its edge; trained so that the metric stays the full model's while the expected fraction of closed
  edges is driven to ``target`` by the Lagrangian of :func:`~interp.pruning.l0.train_l0_gates`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..progress import bar as progress_bar
from ..pruning.gates import LOUIZOS_TEMPERATURE, HardConcreteGate
from ..pruning.l0 import check_target
from .circuit import Circuit
from .evaluate import ablation_source, circuit_metrics, top_mask
from .graph import Graph, build_graph
from .patch import edge_pass
from .scores import EdgeScores, check_pair

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["acdc", "edge_pruning", "top_n"]

Metric = Callable[[torch.Tensor], torch.Tensor]


def _circuit(graph: Graph, keep: torch.Tensor, values: torch.Tensor, method: str, **info: Any) -> Circuit:
    edges = graph.edges_of(keep)
    scores = {(u, d): float(values[graph.up(u), graph.down(d)]) for u, d in edges}
    return Circuit(edges, scores, method=method, n_edges_total=graph.n_edges, info=info)


def top_n(scores: EdgeScores, n: int, *, connected: bool = False) -> Circuit:
    """The ``n`` edges of largest absolute score.

    With ``connected`` (Hanna et al. 2024's greedy search) the circuit grows from the logits: each step adds
    the edge of largest absolute score among those into an input of a node already in the circuit, so every
    kept edge lies on a path to the logits (plain top-n can keep an upstream edge whose node reaches nothing).

    Raises:
        ValueError: ``n`` outside [1, number of edges].

    Example:
        >>> from interp.circuits.search import top_n
        >>> from interp.examples import model, clean, corrupted, metric
        >>> from interp.circuits import eap
        >>> len(top_n(eap(model, clean, corrupted, metric), 8))
        8
        >>> c = top_n(eap(model, clean, corrupted, metric), 8, connected=True)
        >>> any(d == "logits" for _, d in c.edges)
        True
    """
    graph = scores.graph
    E = graph.n_edges
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= E:
        raise ValueError(f"n must be an int in [1, {E}] (the graph's edges), got {n!r}")
    keep = top_mask(scores, n) if not connected else _connected_mask(scores, n)
    return _circuit(graph, keep, scores.scores, scores.method, metric_clean=scores.metric_clean,
                    metric_corrupted=scores.metric_corrupted, connected=connected)


def _connected_mask(scores: EdgeScores, n: int) -> torch.Tensor:
    """``[U, D]``: the greedy circuit of :func:`top_n` with ``connected``."""
    graph = scores.graph
    size = scores.scores.abs().masked_fill(~graph.allowed, -1.0)  # [U, D]
    keep = torch.zeros_like(graph.allowed)
    # The inputs each upstream node reads (a key / value input is read by every head of its group).
    reads = torch.zeros_like(graph.allowed)  # [U, D]: reads[u, d] = node u reads input d
    for d, feeds in enumerate(graph.feeds):
        reads[list(feeds), d] = True
    open_inputs = torch.zeros(graph.allowed.shape[1], dtype=torch.bool)
    open_inputs[graph.down("logits")] = True
    for _ in range(n):
        cand = size.masked_fill(~open_inputs[None] | keep, -1.0)
        best = int(cand.argmax())
        if float(cand.flatten()[best]) < 0:
            break  # nothing more is connected
        u, d = divmod(best, size.shape[1])
        keep[u, d] = True
        open_inputs |= reads[u]
    return keep


def acdc(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, *, threshold: float,
         ablation: str = "resample", graph: Graph | None = None, attention_mask: torch.Tensor | None = None,
         progress: bool | None = None) -> Circuit:
    """ACDC-style greedy pruning with exact edge patching.

    Downstream inputs are visited from the logits back; an input whose node feeds no kept edge loses every
    incoming edge at once (nothing reads it). Otherwise each incoming edge is ablated in turn and stays ablated
    when ``|metric - metric before|`` is below ``threshold``.

    Args:
        model, clean, corrupted, metric, ablation, graph, attention_mask: as
            :func:`~interp.circuits.evaluate.faithfulness`.
        threshold: the largest metric change an edge may cause and still be removed (>= 0).
        progress: a bar over the downstream inputs.

    Returns:
        A :class:`Circuit` (``method="acdc"``); each edge's score is the metric change its removal caused.

    Raises:
        ValueError: a negative threshold, or the errors of :func:`~interp.circuits.evaluate.faithfulness`.

    Example:
        >>> from interp.circuits.search import acdc
        >>> from interp.examples import model, clean, corrupted, metric
        >>> c = acdc(model, clean, corrupted, metric, threshold=0.5)
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 0:
        raise ValueError(f"threshold must be a number >= 0 (a metric change), got {threshold!r}")
    metric = check_pair(model, clean, corrupted, metric)
    graph = build_graph(model) if graph is None else graph
    source = ablation_source(model, graph, corrupted, ablation, attention_mask)
    keep = graph.allowed.clone()
    effect = torch.zeros(graph.allowed.shape)

    def value(mask: torch.Tensor) -> float:
        return circuit_metrics(model, graph, clean, source, mask[None], metric, attention_mask=attention_mask)[0]

    current = value(keep)
    for d in progress_bar(range(len(graph.downstream) - 1, -1, -1), desc="acdc", progress=progress, unit="input"):
        feeds = graph.feeds[d]
        if feeds and not bool(keep[list(feeds)].any()):  # its node's writes reach nothing: it cannot matter
            keep[:, d] = False
            continue
        for u in keep[:, d].nonzero().flatten().tolist()[::-1]:
            keep[u, d] = False
            trial = value(keep)
            effect[u, d] = trial - current
            if abs(trial - current) < threshold:
                current = trial
            else:
                keep[u, d] = True
    return _circuit(graph, keep, effect, "acdc", threshold=threshold, ablation=ablation, metric_circuit=current)


def edge_pruning(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, *, target: float,
                 steps: int = 200, lr: float = 0.1, lagrangian_lr: float = 0.3, warmup: float = 0.5,
                 init_lambda2: float = 10.0, init_log_alpha: float = 3.0, ablation: str = "resample",
                 graph: Graph | None = None, seed: int = 0, attention_mask: torch.Tensor | None = None,
                 progress: bool | None = None) -> Circuit:
    """Edge Pruning: Hard-Concrete gates on edges trained to a target sparsity (Bhaskar et al. 2024).

    The loss keeps the gated model's metric at the full model's: ``((m(gated) - m_full) / (m_full - m_empty))^2``;
    the Lagrangian ``l1 (s - t) + l2 (s - t)^2`` on the expected fraction ``s`` of closed edges (``t`` ramped
    to ``target`` over the first ``warmup`` of the steps) is the one :func:`~interp.pruning.l0.train_l0_gates`
    uses for heads. At the end the ``round((1 - s) E)`` edges of largest log-alpha are kept (the gates' expected
    count, as ``HardConcreteGate.deterministic("expected")``).

    Args:
        model, clean, corrupted, metric, ablation, graph, attention_mask: as
            :func:`~interp.circuits.evaluate.faithfulness`.
        target: the fraction of edges to remove, in [0, 1].
        steps, lr, lagrangian_lr, warmup, init_lambda2, init_log_alpha: the optimisation (Adam on log-alpha,
            ascent on the multipliers).
        seed: seeds the gates' noise.
        progress: a bar over the steps.

    Returns:
        A :class:`Circuit` (``method="edge-pruning"``); each edge's score is its final log-alpha. ``info``
        holds the ``target`` and the gates' ``expected_sparsity``.

    Warns:
        RuntimeWarning: the gates kept more than 1.25x the target's edges (plus one): too few steps to reach it.

    Raises:
        ValueError: a target outside [0, 1], steps < 1, or the errors of
            :func:`~interp.circuits.evaluate.faithfulness`.

    Example:
        >>> from interp.circuits.search import edge_pruning
        >>> from interp.examples import model, clean, corrupted, metric
        >>> c = edge_pruning(model, clean, corrupted, metric, target=0.8, steps=100, progress=False)
        >>> len(c), c.n_edges_total  # 20 % of the edges kept
        (16, 81)
    """
    target = check_target(target)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an int >= 1")
    metric = check_pair(model, clean, corrupted, metric)
    graph = build_graph(model) if graph is None else graph
    source = ablation_source(model, graph, corrupted, ablation, attention_mask)
    m_full, m_empty = circuit_metrics(model, graph, clean, source,
                                      torch.stack([graph.allowed, torch.zeros_like(graph.allowed)]), metric,
                                      attention_mask=attention_mask)
    scale = (m_full - m_empty) or 1.0
    p = next(model.parameters())
    U, D = graph.allowed.shape
    gate = HardConcreteGate(U, D, temperature=LOUIZOS_TEMPERATURE, init_log_alpha=init_log_alpha,
                            seed=seed).to(p.device)
    allowed = graph.allowed.to(p.device)
    opt = torch.optim.Adam(gate.parameters(), lr=lr)
    lambdas = torch.tensor([0.0, float(init_lambda2)], device=p.device, requires_grad=True)
    lag_opt = torch.optim.Adam([lambdas], lr=lagrangian_lr, maximize=True)
    gen = torch.Generator().manual_seed(seed)
    frozen = [q for q in model.parameters() if q.requires_grad]
    for q in frozen:
        q.requires_grad_(False)
    try:
        for step in progress_bar(range(steps), desc="edge_pruning", progress=progress, unit="step"):
            z = gate.sample(gen)  # [U, D]
            with torch.enable_grad(), edge_pass(model, graph, source=source, ablate=(1 - z) * allowed):
                loss = ((metric(model(clean, attention_mask=attention_mask)) - m_full) / scale) ** 2
            s = 1 - gate.expected_l0()[allowed].mean()
            t = target * min(1.0, (step + 1) / max(1.0, warmup * steps))
            penalty = lambdas[0] * (s - t) + lambdas[1] * (s - t) ** 2
            opt.zero_grad()
            lag_opt.zero_grad()
            (loss + penalty).backward()
            opt.step()
            lag_opt.step()
    finally:
        for q in frozen:
            q.requires_grad_(True)
    log_alpha = gate.log_alpha.detach().cpu().masked_fill(~graph.allowed, float("-inf"))
    n_keep = max(1, int(round(float(gate.expected_l0().detach().cpu()[graph.allowed].sum()))))
    wanted = max(1, int(round((1 - target) * graph.n_edges)))
    if n_keep > 1.25 * wanted + 1:
        # The gates are kept as trained, not cut to the target: a circuit of the target's size would be chosen
        # by log-alphas that never learnt to close.
        warnings.warn(f"edge_pruning: the gates kept {n_keep} of {graph.n_edges} edges after {steps} steps, "
                      f"against {wanted} for target={target:.4g}; train longer (steps) or faster (lr, "
                      f"lagrangian_lr)", RuntimeWarning, stacklevel=2)
    keep = torch.zeros(U * D, dtype=torch.bool)
    keep[torch.argsort(log_alpha.flatten(), descending=True, stable=True)[:n_keep]] = True
    return _circuit(graph, keep.view(U, D) & graph.allowed, log_alpha, "edge-pruning", target=target,
                    expected_sparsity=float(1 - gate.expected_l0().detach().cpu()[graph.allowed].mean()))
