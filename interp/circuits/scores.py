"""Edge scores: how much the metric moves when one edge carries the corrupted run's value instead of the clean one.

- :func:`eap` (Syed et al. 2023, edge attribution patching): ``(source_u - clean_u) . d metric / d input_d`` at
  the clean run, for every edge at once from two forwards and one backward.
- :func:`eap_ig` (Hanna et al. 2024): the same product with the gradient averaged over ``m`` points on the
  straight line from the corrupted to the clean input embeddings (integrated gradients).
- :func:`exact_scores`: the metric of a run with that edge alone patched, minus the clean metric; patched copies
  of the batch share forward passes (:func:`exact_scores_naive` runs one pass per edge, the reference).

Every score is ``metric(patched) - metric(clean)`` (exact) or its estimate: a large negative score is an edge the
behaviour needs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..analysis import patching_checks as checks
from ..analysis._stream import state_device
from ..progress import bar as progress_bar
from .exact import CleanRun, growing_exact
from .gradients import DEFAULT_BUFFER_BYTES, gradient_scores
from .graph import Graph, build_graph
from .patch import node_writes

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["EdgeScores", "check_pair", "eap", "eap_ig", "exact_scores", "exact_scores_naive"]

Metric = Callable[[torch.Tensor], torch.Tensor]

#: EAP-IG's default bound on the token rows of one pass on a CPU (``steps_per_pass=None``).
CPU_ROWS_PER_PASS = 1024


@dataclass
class EdgeScores:
    """Scores of every edge of a graph.

    Attributes:
        graph: the :class:`~interp.circuits.graph.Graph`.
        scores: ``[U, D]`` float, 0 where there is no edge.
        method: ``"eap"``, ``"eap-ig"`` or ``"exact"``.
        metric_clean: the metric of the clean run.
        metric_corrupted: the metric of the corrupted run (a property: see below).

    The scores need only the corrupted run's writes, so EAP and EAP-IG stop that run before the unembedding (on
    SmolLM2 a fifth of a forward pass); its logits, and ``metric_corrupted``, are computed the first time it is
    read, from the final residual kept for it (``[B, T, M]``).
    """

    graph: Graph
    scores: torch.Tensor
    method: str
    metric_clean: float
    corrupted_metric: Callable[[], float] = field(repr=False, compare=False)

    @functools.cached_property
    def metric_corrupted(self) -> float:
        """The metric of the corrupted run (computed when first read, then kept)."""
        value = float(self.corrupted_metric())
        self.corrupted_metric = lambda: value  # lets go of the final residual and the model
        return value

    def edge_scores(self) -> dict[tuple[str, str], float]:
        """``{(upstream, downstream): score}`` for every edge."""
        return dict(zip(self.graph.edges, self.scores[self.graph.allowed].tolist()))


def check_pair(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, metric: Any) -> Metric:
    """Check a clean / corrupted pair and a metric before any pass; returns the checked metric.

    Raises:
        ValueError: clean and corrupted of different shapes (naming both), identical, or token ids out of range.
        TypeError: a metric that is not callable.

    Example:
        >>> from interp.circuits.scores import check_pair
        >>> from interp.examples import model, clean, corrupted, metric
        >>> m = check_pair(model, clean, corrupted, metric)
    """
    clean, corrupted = model._check_tokens(clean), model._check_tokens(corrupted)
    if clean.shape != corrupted.shape:
        raise ValueError(f"clean has shape {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)}: edge "
                         "patching needs one corrupted sequence of the same length per clean one")
    checks.check_clean_corrupted(clean, corrupted)
    if not callable(metric):
        raise TypeError(f"metric must be callable(logits) -> scalar tensor, got {type(metric).__name__}")
    checked = checks.checked_metric(metric)
    assert checked is not None
    return checked


def _graph(model: Transformer, graph: Graph | None) -> Graph:
    return build_graph(model) if graph is None else graph


def eap(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, *,
        graph: Graph | None = None, attention_mask: torch.Tensor | None = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> EdgeScores:
    """Edge attribution patching: every edge's first-order score from two forwards and one backward.

    The corrupted forward records every node's write; the clean forward records them too and keeps the graph;
    the backward folds each input's gradient into the scores as it arrives
    (:func:`~interp.circuits.gradients.gradient_scores`).

    Args:
        model: an interp Transformer (see :func:`~interp.circuits.graph.check_decomposable`).
        clean: ``[B, T]`` ids where the behaviour is present.
        corrupted: ``[B, T]`` ids where it is not.
        metric: ``metric(logits [B, T, V]) -> scalar`` (differentiable).
        graph: the model's graph (built when None).
        attention_mask: optional ``[B, T]`` padding mask for both runs.
        buffer_bytes: bound on the gradient columns held at once (they are folded into the scores when the
            next input's would not fit; the scores do not depend on it).

    Returns:
        :class:`EdgeScores` with ``method="eap"``.

    Raises:
        ValueError: clean / corrupted of different shapes or identical, a metric that does not depend on the
            logits, or a model that does not decompose.

    Example:
        >>> from interp.circuits.scores import eap
        >>> from interp.examples import model, clean, corrupted, metric
        >>> s = eap(model, clean, corrupted, metric)
        >>> s.scores.shape
        torch.Size([9, 25])
    """
    metric = check_pair(model, clean, corrupted, metric)
    graph = _graph(model, graph)
    buffer_bytes = _check_buffer(buffer_bytes)
    m_corrupted, source, scores = _corrupted_run(model, graph, corrupted, metric, attention_mask)
    m_clean, _ = gradient_scores(model, graph, clean, metric, scores, source=source, attention_mask=attention_mask,
                                 buffer_bytes=buffer_bytes)
    scores = scores.cpu() * graph.allowed
    return EdgeScores(graph, scores, "eap", float(m_clean), m_corrupted)


def eap_ig(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, *, steps: int = 5,
           graph: Graph | None = None, attention_mask: torch.Tensor | None = None,
           buffer_bytes: int = DEFAULT_BUFFER_BYTES, steps_per_pass: int | None = None,
           progress: bool | None = None) -> EdgeScores:
    """EAP with integrated gradients over the input embeddings (Hanna et al. 2024).

    The gradient at each downstream input is averaged over ``steps`` runs whose embedding is
    ``corrupted + k / steps (clean - corrupted)``, ``k = 1 .. steps``; the score is ``(source_u - clean_u)``
    times that average. One step is EAP. The points run as copies of the batch, ``steps_per_pass`` at a time, in
    one forward and one backward each; the last point is the clean run itself, whose pass runs first and records
    the clean writes. The cost is one corrupted forward plus the forward-backward of ``steps`` copies.

    Args:
        model, clean, corrupted, metric, graph, attention_mask, buffer_bytes: as :func:`eap`.
        steps: m, the number of points on the path (>= 1).
        steps_per_pass: points per forward-backward pass; each pass holds ``steps_per_pass`` times one run's
            activations. None: every point in one pass on an accelerator, where the copies run in parallel; on a
            CPU, as many as keep a pass within :data:`CPU_ROWS_PER_PASS` token rows (at least one), since a
            compute-bound CPU gains nothing from larger passes but their memory. The scores do not depend on it.
        progress: a bar over the passes (None: on in terminals and notebooks).

    Returns:
        :class:`EdgeScores` with ``method="eap-ig"``.

    Raises:
        ValueError: as :func:`eap`, ``steps`` < 1 or a bad ``steps_per_pass``.

    Example:
        >>> from interp.circuits.scores import eap_ig
        >>> from interp.examples import model, clean, corrupted, metric
        >>> s = eap_ig(model, clean, corrupted, metric, steps=3)
        >>> s.method
        'eap-ig'
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int (the points of the integrated-gradient path), got {steps!r}")
    if steps_per_pass is not None and (isinstance(steps_per_pass, bool) or not isinstance(steps_per_pass, int)
                                       or steps_per_pass < 1):
        raise ValueError(f"steps_per_pass must be a positive int or None (chosen by device), got {steps_per_pass!r}")
    metric = check_pair(model, clean, corrupted, metric)
    per_pass = steps_per_pass if steps_per_pass is not None else _points_per_pass(model, clean, steps)
    graph = _graph(model, graph)
    buffer_bytes = _check_buffer(buffer_bytes)
    m_corrupted, source, scores = _corrupted_run(model, graph, corrupted, metric, attention_mask)
    start = source[0].clone()  # [B, T, M]: the "input" node's write is the embedding
    alphas = [k / steps for k in range(1, steps + 1)]
    # The pass holding the clean point (alpha 1, last) runs first: its writes give the differences.
    passes = [tuple(alphas[max(0, stop - per_pass):stop]) for stop in range(steps, 0, -per_pass)]
    m_clean = torch.zeros(())
    diff: torch.Tensor | None = None
    for chunk in progress_bar(passes, desc="eap_ig", progress=progress, unit="pass"):
        if diff is None:
            m_clean, diff = gradient_scores(model, graph, clean, metric, scores, source=source, alphas=chunk,
                                            start=start, attention_mask=attention_mask, buffer_bytes=buffer_bytes)
            del source
        else:
            gradient_scores(model, graph, clean, metric, scores, diff=diff, alphas=chunk, start=start,
                            attention_mask=attention_mask, buffer_bytes=buffer_bytes)
    scores = scores.cpu() / steps * graph.allowed
    return EdgeScores(graph, scores, "eap-ig", float(m_clean), m_corrupted)


def _points_per_pass(model: Transformer, clean: torch.Tensor, steps: int) -> int:
    """EAP-IG's default points per pass: all on an accelerator; on a CPU, a pass of at most
    :data:`CPU_ROWS_PER_PASS` token rows (SmolLM2 at 4 x 128, m = 5: one pass peaked at +5.9 GB and ran no
    faster than five)."""
    if state_device(model).type != "cpu":
        return steps
    return max(1, min(steps, CPU_ROWS_PER_PASS // clean.numel()))


def _corrupted_run(model: Transformer, graph: Graph, corrupted: torch.Tensor, metric: Metric,
                   attention_mask: torch.Tensor | None) -> tuple[Callable[[], float], torch.Tensor, torch.Tensor]:
    """The corrupted run of EAP and EAP-IG: its metric (a function, computed when asked: the run stops before the
    unembedding), every node's write ``[U, B, T, M]`` and zero scores ``[U, D]`` (float32) on the writes' device."""
    final, source = node_writes(model, graph, corrupted, attention_mask)  # [B, T, M], [U, B, T, M]

    def m_corrupted() -> float:
        with torch.no_grad():
            return float(metric(model.unembed_residual(final)))
    return m_corrupted, source, torch.zeros(graph.allowed.shape, dtype=torch.float32, device=source.device)


def _check_buffer(buffer_bytes: int) -> int:
    if isinstance(buffer_bytes, bool) or not isinstance(buffer_bytes, int) or buffer_bytes < 1:
        raise ValueError(f"buffer_bytes must be a positive int (bytes of gradient columns held at once), got "
                         f"{buffer_bytes!r}")
    return buffer_bytes


def _edge_list(graph: Graph, edges: Any) -> list[tuple[int, int]]:
    if edges is None:
        return [tuple(e) for e in graph.allowed.nonzero().tolist()]  # type: ignore[misc]
    mask = graph.edge_mask(list(edges))
    if not bool(mask.any()):
        raise ValueError("edges is empty: give at least one (upstream, downstream) edge to patch")
    return [(graph.up(u), graph.down(d)) for u, d in edges]


def exact_scores(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, *,
                 edges: Any = None, graph: Graph | None = None, batch_size: int = 64,
                 attention_mask: torch.Tensor | None = None, progress: bool | None = None) -> EdgeScores:
    """Exact edge patching: the metric with one edge patched (corrupted value on it), minus the clean metric.

    Patching edge ``(u, d)`` changes nothing before ``d`` reads, so patched copies of the batch share growing
    passes, as :func:`~interp.analysis.activation_patching` does: a pass starts at the lowest layer it patches
    and each copy joins it at its own input's layer, from the clean run's residual there; the input reads the
    clean residual plus ``u``'s corrupted minus clean write. Edges into the logits need no block at all: the
    final norm and unembedding of the clean final residual plus the difference. A metric with
    ``reads_last_only = True`` gets the last position's logits only.

    Args:
        model, clean, corrupted, metric, graph, attention_mask: as :func:`eap`.
        edges: ``(upstream, downstream)`` names to score (default every edge); the others score 0.
        batch_size: rows per forward pass (patched copies of the batch).
        progress: a bar over the passes.

    Returns:
        :class:`EdgeScores` with ``method="exact"``.

    Raises:
        ValueError: as :func:`eap`, an empty ``edges``, an edge that does not exist, a bad ``batch_size``.

    Example:
        >>> from interp.circuits.scores import exact_scores
        >>> from interp.examples import model, clean, corrupted, metric
        >>> s = exact_scores(model, clean, corrupted, metric, edges=[("a0.h0", "a1.h0<k>")])
        >>> s.scores.count_nonzero().item()
        1
    """
    batch_size = checks.check_batch_size(batch_size)
    metric = check_pair(model, clean, corrupted, metric)
    graph = _graph(model, graph)
    todo = _edge_list(graph, edges)
    final, source = node_writes(model, graph, corrupted, attention_mask)  # [B, T, M], [U, B, T, M]
    with torch.no_grad():
        m_corrupted = float(metric(model.unembed_residual(final)))
        base = CleanRun.record(model, graph, clean, attention_mask)
    m_clean = float(metric(base.logits))
    values = growing_exact(model, graph, base, source, todo, metric, batch_size=batch_size,
                           attention_mask=attention_mask, progress=progress)
    scores = torch.zeros(graph.allowed.shape, dtype=torch.float64)
    for (u, d), v in zip(todo, values):
        scores[u, d] = v - m_clean
    return EdgeScores(graph, scores.float(), "exact", m_clean, lambda: m_corrupted)


def _naive_hook(model: Transformer, graph: Graph, u: int, d: int, diff: torch.Tensor,
                resid: dict[str, torch.Tensor]) -> tuple[str, Callable]:
    """A plain model hook that rebuilds input ``d`` as the clean residual plus ``diff`` (``[B, T, M]``, the
    upstream node's corrupted minus clean write) and recomputes what ``d`` feeds: one head's q / k / v, an
    MLP's output or the final residual."""
    name = graph.downstream[d]
    if name == "logits":
        last = f"blocks.{graph.n_layers - 1}.hook_resid_post"
        return last, lambda t, hook: t + diff.to(t.dtype)
    layer = int(name[1:].split(".")[0].split("<")[0])
    block: Any = model.blocks[layer]
    if name.startswith("m"):
        where = "hook_resid_pre" if graph.parallel else "hook_resid_mid"
        norm = block.ln2 if hasattr(block, "ln2") else block.ln1
        x = resid[f"blocks.{layer}.{where}"] + diff  # [B, T, M]
        return f"blocks.{layer}.hook_mlp_out", lambda t, hook: block.mlp(norm(x)).to(t.dtype)
    head, kind = int(name.split(".h")[1].split("<")[0]), name[-2]
    attn: Any = block.attn
    D, H, K = attn.d_head, attn.n_heads, attn.n_kv_heads
    start = {"q": 0, "k": H * D, "v": (H + K) * D}[kind] + head * D
    x = block.ln1(resid[f"blocks.{layer}.hook_resid_pre"] + diff)  # [B, T, M]
    b = attn.W_qkv.bias
    new = torch.nn.functional.linear(x, attn.W_qkv.weight[start:start + D],
                                     None if b is None else b[start:start + D])  # [B, T, D]

    def hook(t: torch.Tensor, hook: Any) -> torch.Tensor:
        t = t.clone()
        t[:, :, head] = new.to(t.dtype)
        return t
    return f"blocks.{layer}.attn.hook_{kind}", hook


def _write_of(graph: Graph, u: int, trace: Any) -> torch.Tensor:
    """Upstream node ``u``'s write ``[B, T, M]`` read from a plain run's trace."""
    name = graph.upstream[u]
    if name == "input":
        return trace["blocks.0.hook_resid_pre"]
    if name.startswith("m"):
        return trace[f"blocks.{name[1:]}.hook_mlp_out"]
    layer, head = (int(x) for x in name[1:].split(".h"))
    return trace[f"blocks.{layer}.attn.hook_result"][:, :, head]


def exact_scores_naive(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, *,
                       edges: Any = None, graph: Graph | None = None,
                       attention_mask: torch.Tensor | None = None) -> EdgeScores:
    """The reference for :func:`exact_scores`, written on the model's own hooks: one forward pass per edge, the
    edge's input rebuilt as the clean residual minus the upstream node's clean write plus its corrupted write
    (nothing upstream of the patched input changes, so this is the edge's exact patch).

    Args and Returns: as :func:`exact_scores`.

    Example:
        >>> from interp.circuits.scores import exact_scores_naive
        >>> from interp.examples import model, clean, corrupted, metric
        >>> s = exact_scores_naive(model, clean, corrupted, metric, edges=[("a0.h0", "a1.h0<k>")])
    """
    metric = check_pair(model, clean, corrupted, metric)
    graph = _graph(model, graph)
    todo = _edge_list(graph, edges)
    wanted = ("hook_result", "hook_mlp_out", "hook_resid_pre", "hook_resid_mid")
    names = [n for n in model.hook_names if n.endswith(wanted)]
    scores = torch.zeros(graph.allowed.shape, dtype=torch.float64)
    with torch.no_grad():
        logits_c, trace_c = model.run_with_cache(corrupted, attention_mask=attention_mask, names_filter=names)
        logits_b, trace_b = model.run_with_cache(clean, attention_mask=attention_mask, names_filter=names)
        m_clean = float(metric(logits_b))
        resid = {n: trace_b[n] for n in trace_b.keys() if "resid" in n}
        for u, d in todo:
            diff = _write_of(graph, u, trace_c) - _write_of(graph, u, trace_b)  # [B, T, M]
            name, hook = _naive_hook(model, graph, u, d, diff, resid)
            logits = model.run_with_hooks(clean, attention_mask=attention_mask, fwd_hooks=[(name, hook)])
            scores[u, d] = float(metric(logits)) - m_clean
    m_corrupted = float(metric(logits_c))
    return EdgeScores(graph, scores.float(), "exact", m_clean, lambda: m_corrupted)
