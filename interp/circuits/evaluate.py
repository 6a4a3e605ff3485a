"""How faithful a circuit is: the metric with only its edges left, every other edge ablated.

Ablated edges carry a source run's values: ``"resample"`` the corrupted run's (each clean prompt paired with its
corrupted counterpart), ``"mean"`` the corrupted runs' mean write of each node at each position.
``faithfulness = metric(circuit) / metric(full model)``; ``normalized`` rescales it so that the empty circuit is
0: ``(metric(circuit) - metric(empty)) / (metric(full) - metric(empty))``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..analysis import patching_checks as checks
from ..progress import bar as progress_bar
from .circuit import Circuit
from .graph import Graph, build_graph
from .patch import edge_pass, node_writes
from .scores import EdgeScores, check_pair

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["ABLATIONS", "ablation_source", "circuit_metrics", "faithfulness", "faithfulness_curve", "head_circuits",
           "heads_circuit", "kind_overlap", "random_masks", "top_mask"]

Metric = Callable[[torch.Tensor], torch.Tensor]
ABLATIONS = ("resample", "mean")


def ablation_source(model: Transformer, graph: Graph, corrupted: torch.Tensor, ablation: str = "resample",
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The writes ablated edges carry: ``[U, B, T, M]`` (resample) or ``[U, 1, T, M]`` (mean over the batch).

    Raises:
        ValueError: an unknown ablation.

    Example:
        >>> from interp.circuits.evaluate import ablation_source
        >>> from interp.examples import model, corrupted
        >>> from interp.circuits import build_graph
        >>> ablation_source(model, build_graph(model), corrupted, "mean").shape
        torch.Size([9, 1, 21, 128])
    """
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    _, writes = node_writes(model, graph, corrupted, attention_mask)
    return writes if ablation == "resample" else writes.mean(dim=1, keepdim=True)  # [U, 1, T, M]


def circuit_metrics(model: Transformer, graph: Graph, clean: torch.Tensor, source: torch.Tensor, keep: torch.Tensor,
                    metric: Metric, *, batch_size: int = 64, attention_mask: torch.Tensor | None = None,
                    progress: bool | None = None) -> list[float]:
    """The metric of each of ``V`` circuits given as keep masks ``[V, U, D]``; the rest of each graph is ablated
    to ``source``. Circuits share forward passes, ``batch_size // B`` at a time.

    Example:
        >>> from interp.circuits.evaluate import ablation_source, circuit_metrics
        >>> from interp.examples import model, clean, corrupted, metric
        >>> from interp.circuits import build_graph
        >>> g = build_graph(model); src = ablation_source(model, g, corrupted)
        >>> full = circuit_metrics(model, g, clean, src, g.allowed[None], metric)  # every edge kept: the model
        >>> abs(full[0] - float(metric(model(clean)))) < 1e-4
        True
    """
    batch_size = checks.check_batch_size(batch_size)
    B = clean.shape[0]
    per = max(1, batch_size // B)
    rows = clean.repeat(per, 1)
    mask = None if attention_mask is None else attention_mask.repeat(per, 1)
    out: list[float] = []
    for start in progress_bar(range(0, keep.shape[0], per), desc="circuits", progress=progress, unit="pass"):
        chunk = keep[start:start + per]
        V = chunk.shape[0]
        ablate = (~chunk.bool() & graph.allowed).float()  # [V, U, D]
        with torch.no_grad(), edge_pass(model, graph, source=source, ablate=ablate):
            logits = model(rows[:V * B], attention_mask=None if mask is None else mask[:V * B])
        out += [float(metric(logits[v * B:(v + 1) * B])) for v in range(V)]
    return out


def faithfulness(model: Transformer, circuit: Circuit, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, *,
                 ablation: str = "resample", graph: Graph | None = None,
                 attention_mask: torch.Tensor | None = None) -> dict[str, float]:
    """The circuit's metric over the full model's, every edge outside the circuit ablated.

    Args:
        model: the model.
        circuit: the :class:`Circuit` to keep.
        clean, corrupted: ``[B, T]`` the task's prompts and their corrupted counterparts (the ablation source).
        metric: ``metric(logits) -> scalar``.
        ablation: ``"resample"`` or ``"mean"``.
        graph: the model's graph (built when None).
        attention_mask: optional padding mask.

    Returns:
        ``{"faithfulness", "normalized", "metric_circuit", "metric_full", "metric_empty", "n_edges",
        "metric_complement", "completeness"}``. The complement is the model with the circuit's edges ablated
        and every other edge kept; ``completeness = (metric_full - metric_complement) / (metric_full -
        metric_empty)`` is the share of the behaviour lost without the circuit: 1 when nothing outside it
        carries the task, 0 when the rest does it all.

    Raises:
        ValueError: an empty circuit, an edge that does not exist, an unknown ablation, clean / corrupted of
            different shapes.

    Example:
        >>> from interp.circuits.evaluate import Circuit, faithfulness
        >>> from interp.examples import model, clean, corrupted, metric
        >>> c = Circuit([("a1.h0", "logits"), ("a1.h1", "logits")])
        >>> round(faithfulness(model, c, clean, corrupted, metric)["faithfulness"], 2) < 1
        True
    """
    circuit.check_nonempty()
    metric = check_pair(model, clean, corrupted, metric)
    graph = build_graph(model) if graph is None else graph
    mask = circuit.mask(graph)
    keep = torch.stack([mask, graph.allowed, torch.zeros_like(graph.allowed), graph.allowed & ~mask])  # [4, U, D]
    source = ablation_source(model, graph, corrupted, ablation, attention_mask)
    m_c, m_full, m_empty, m_rest = circuit_metrics(model, graph, clean, source, keep, metric,
                                                   attention_mask=attention_mask)
    denom = m_full - m_empty
    return {"faithfulness": m_c / m_full if m_full else float("nan"),
            "normalized": (m_c - m_empty) / denom if denom else float("nan"),
            "metric_circuit": m_c, "metric_full": m_full, "metric_empty": m_empty, "n_edges": float(len(circuit)),
            "metric_complement": m_rest, "completeness": (m_full - m_rest) / denom if denom else float("nan")}


def top_mask(scores: EdgeScores, n: int) -> torch.Tensor:
    """``[U, D]`` mask of the ``n`` edges of largest absolute score."""
    flat = scores.scores.abs().masked_fill(~scores.graph.allowed, -1).flatten()
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[torch.argsort(flat, descending=True, stable=True)[:n]] = True
    return keep.view_as(scores.graph.allowed) & scores.graph.allowed  # [U*D] -> [U, D]


def random_masks(graph: Graph, n: int, count: int, seed: int = 0) -> torch.Tensor:
    """``[count, U, D]``: ``count`` random circuits of ``n`` edges each (uniform over the edges)."""
    gen = torch.Generator().manual_seed(seed)
    idx = graph.allowed.flatten().nonzero().flatten()
    out = torch.zeros(count, graph.allowed.numel(), dtype=torch.bool)
    for i in range(count):
        out[i, idx[torch.randperm(len(idx), generator=gen)[:n]]] = True
    return out.view(count, *graph.allowed.shape)  # [count, U*D] -> [count, U, D]


def kind_overlap(circuit: Circuit, report: Any, graph: Graph, kinds: Sequence[str], *, n_random: int = 20,
                 seed: int = 0) -> pd.DataFrame:
    """How many of the heads :func:`~interp.analysis.classify_heads` gave each kind the circuit touches, beside
    ``n_random`` random circuits of as many edges.

    Args:
        circuit: the circuit (its heads: every head an edge writes from or reads into).
        report: a :class:`~interp.analysis.HeadReport`.
        graph: the model's graph.
        kinds: head kinds (``"induction"``, ``"previous-token"``...).
        n_random: random circuits of the circuit's size (0: none).
        seed: their seed.

    Returns:
        One row per kind: ``kind``, ``kind_heads`` (found by ``classify_heads``), ``circuit_heads``, ``shared``,
        ``recall`` (shared / kind heads), ``precision`` (shared / circuit heads), ``random_shared_mean`` and
        ``random_shared_p90`` (the same count in the random circuits), ``random_as_many`` (how many of them share
        at least as many).

    Raises:
        ValueError: an empty circuit, or an edge that is not in ``graph``.

    Example:
        >>> from interp.circuits.evaluate import kind_overlap
        >>> from interp.circuits import Circuit, build_graph
        >>> from interp.analysis import classify_heads
        >>> from interp.examples import model
        >>> c = Circuit([("a0.h2", "a1.h1<k>"), ("a1.h1", "logits")])
        >>> df = kind_overlap(c, classify_heads(model), build_graph(model), ["induction"], n_random=5)
        >>> int(df.loc[0, "circuit_heads"])
        2
    """
    circuit.check_nonempty()
    circuit.mask(graph)  # names an edge that does not exist
    mine = circuit.heads
    draws = [Circuit(graph.edges_of(m)).heads for m in random_masks(graph, len(circuit), n_random, seed=seed)]
    rows = []
    for kind in kinds:
        found = set(report.heads(kind))
        shared = len(mine & found)
        rand = [len(h & found) for h in draws]
        rows.append({"kind": kind, "kind_heads": len(found), "circuit_heads": len(mine), "shared": shared,
                     "recall": shared / len(found) if found else float("nan"),
                     "precision": shared / len(mine) if mine else float("nan"),
                     "random_shared_mean": sum(rand) / len(rand) if rand else float("nan"),
                     "random_shared_p90": float(pd.Series(rand).quantile(0.9)) if rand else float("nan"),
                     "random_as_many": sum(r >= shared for r in rand)})
    return pd.DataFrame(rows)


def heads_circuit(graph: Graph, heads: Sequence[tuple[int, int]], *, mlps: bool = True,
                  method: str = "heads") -> Circuit:
    """The circuit of a set of heads: every edge between the embedding, those heads (each of their query, key
    and value inputs), the MLPs (with ``mlps``) and the logits.

    Args:
        graph: the model's graph.
        heads: ``(layer, head)`` pairs.
        mlps: keep every MLP node too (a heads-only comparison on a model with MLPs would lose them all).
        method: the circuit's ``method``.

    Returns:
        A :class:`Circuit`.

    Raises:
        ValueError: a head the graph does not have (naming it).

    Example:
        >>> from interp.circuits.evaluate import heads_circuit
        >>> from interp.examples import model
        >>> from interp.circuits import build_graph
        >>> len(heads_circuit(build_graph(model), [(0, 2), (1, 1)]))  # 3 x 3 q/k/v inputs, 3 into the logits
        12
    """
    nodes = {"input", "logits"}
    for layer, head in heads:
        name = f"a{layer}.h{head}"
        graph.up(name)  # raises naming a head the graph does not have
        nodes.add(name)
    if mlps and graph.mlp:
        nodes |= {f"m{layer}" for layer in range(graph.n_layers)}
    # An input is kept when a kept node reads it: a key or value input feeds every query head of its group.
    kept_inputs = {d for i, d in enumerate(graph.downstream)
                   if d == "logits" or any(graph.upstream[u] in nodes for u in graph.feeds[i])}
    edges = [(u, d) for u, d in graph.edges if u in nodes and d in kept_inputs]
    return Circuit(edges, method=method, n_edges_total=graph.n_edges, info={"heads": [list(h) for h in heads]})


def head_circuits(report: Any, graph: Graph, kinds: Sequence[str], counts: Sequence[int], *,
                  mlps: bool = True) -> dict[int, Circuit]:
    """Circuits of the top-n heads that :func:`~interp.analysis.classify_heads` gave one of ``kinds``, by score.

    Args:
        report: a :class:`~interp.analysis.HeadReport`.
        graph: the model's graph.
        kinds: head kinds (``"induction"``, ``"previous-token"``...).
        counts: numbers of heads n (each at most the heads found).
        mlps: as :func:`heads_circuit`.

    Returns:
        ``{n_edges: Circuit}`` (``method="classify_heads"``), ready for :func:`faithfulness_curve`'s ``extra``.

    Raises:
        ValueError: no head of ``kinds`` in the report.

    Example:
        >>> from interp.circuits.evaluate import head_circuits
        >>> from interp.examples import model
        >>> from interp.analysis import classify_heads
        >>> from interp.circuits import build_graph
        >>> cs = head_circuits(classify_heads(model), build_graph(model), ["induction", "previous-token"], [2])
        >>> [len(c.info["heads"]) for c in cs.values()]
        [2]
    """
    df = report.df[report.df.kind.isin(list(kinds))].sort_values("score", ascending=False, kind="stable")
    ranked: list[tuple[int, int]] = []
    for r in df.itertuples():
        if (int(r.layer), int(r.head)) not in ranked:
            ranked.append((int(r.layer), int(r.head)))
    if not ranked:
        raise ValueError(f"classify_heads found no head of kinds {list(kinds)} (found: {sorted(set(report.df.kind))})")
    out: dict[int, Circuit] = {}
    for n in counts:
        c = heads_circuit(graph, ranked[:max(1, int(n))], mlps=mlps, method="classify_heads")
        out[len(c)] = c
    return out


def faithfulness_curve(model: Transformer, scores: Sequence[EdgeScores] | EdgeScores, clean: torch.Tensor,
                       corrupted: torch.Tensor, metric: Metric, *, sizes: Sequence[int] | None = None,
                       n_random: int = 20, ablation: str = "resample", batch_size: int = 64, seed: int = 0,
                       extra: dict[str, Any] | None = None, attention_mask: torch.Tensor | None = None,
                       progress: bool | None = None) -> pd.DataFrame:
    """Faithfulness over the number of edges: the top-n edges of each method beside ``n_random`` random circuits.

    Args:
        model, clean, corrupted, metric, ablation, attention_mask: as :func:`faithfulness`.
        scores: one :class:`~interp.circuits.scores.EdgeScores` per method (all of one graph).
        sizes: numbers of edges (default: 12 sizes from 1 to every edge, geometric).
        n_random: random circuits per size (0: none).
        batch_size: rows per forward pass.
        seed: seed of the random circuits.
        extra: more circuits by name, each a ``{n_edges: Circuit}`` (Edge Pruning's runs at several targets).
        progress: a bar over the passes.

    Returns:
        DataFrame with ``method``, ``n_edges``, ``fraction`` (of all edges), ``metric``, ``faithfulness``,
        ``normalized``; random circuits have ``method="random"`` and one row per draw (``draw``).
        ``attrs``: ``metric_full``, ``metric_empty``, ``n_edges_total``.

    Raises:
        ValueError: scores of different graphs, an empty size list, a size outside [1, n_edges].

    Example:
        >>> from interp.circuits.evaluate import faithfulness_curve
        >>> from interp.examples import model, clean, corrupted, metric
        >>> from interp.circuits import eap
        >>> df = faithfulness_curve(model, eap(model, clean, corrupted, metric), clean, corrupted, metric,
        ...                         sizes=[5, 20], n_random=2)
        >>> sorted(df.method.unique())
        ['eap', 'random']
    """
    runs = [scores] if isinstance(scores, EdgeScores) else list(scores)
    metric = check_pair(model, clean, corrupted, metric)
    graph = runs[0].graph if runs else build_graph(model)
    E = graph.n_edges
    if sizes is None:
        sizes = sorted({max(1, round(E ** (i / 11))) for i in range(12)})
    sizes = [int(n) for n in sizes]
    if not sizes or any(n < 1 or n > E for n in sizes):
        raise ValueError(f"sizes must be numbers of edges in [1, {E}], got {sizes}")
    labels: list[tuple[str, int, int]] = []
    masks: list[torch.Tensor] = [graph.allowed, torch.zeros_like(graph.allowed)]
    for run in runs:
        if run.graph.upstream != graph.upstream or run.graph.downstream != graph.downstream:
            raise ValueError(f"scores of {run.method!r} belong to another graph")
        for n in sizes:
            labels.append((run.method, n, 0))
            masks.append(top_mask(run, n))
    for name, circuits in (extra or {}).items():
        for _, c in sorted(circuits.items()):
            labels.append((name, len(c), 0))
            masks.append(c.mask(graph))
    for n in sizes:
        for i, m in enumerate(random_masks(graph, n, n_random, seed=seed + n)):
            labels.append(("random", n, i))
            masks.append(m)
    source = ablation_source(model, graph, corrupted, ablation, attention_mask)
    values = circuit_metrics(model, graph, clean, source, torch.stack(masks), metric, batch_size=batch_size,
                             attention_mask=attention_mask, progress=progress)
    m_full, m_empty = values[0], values[1]
    df = pd.DataFrame([{"method": meth, "n_edges": n, "draw": i, "fraction": n / E, "metric": v}
                       for (meth, n, i), v in zip(labels, values[2:])])
    df["faithfulness"] = df["metric"] / m_full if m_full else float("nan")
    denom = m_full - m_empty
    df["normalized"] = (df["metric"] - m_empty) / denom if denom else float("nan")
    df.attrs.update({"metric_full": m_full, "metric_empty": m_empty, "n_edges_total": E, "ablation": ablation})
    return df
