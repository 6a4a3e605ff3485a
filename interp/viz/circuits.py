"""Circuit figures: the layered graph of a :class:`~interp.circuits.circuit.Circuit` and faithfulness curves."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd
import plotly.graph_objects as go

__all__ = ["circuit_figure", "faithfulness_figure"]

_KIND_COLOURS = {"induction": "#d62728", "previous-token": "#1f77b4", "duplicate-token": "#9467bd",
                 "copying": "#ff7f0e", "positional": "#8c564b", "syntactic": "#2ca02c", "coreference": "#e377c2"}
_OTHER = "#7f7f7f"


def _place(node: str, n_layers: int) -> tuple[float, float]:
    """(x, y) of a node: columns input, then per layer attention and MLP, then logits; heads stacked by index."""
    if node == "input":
        return 0.0, 0.0
    if node == "logits":
        return 2.0 * n_layers + 1, 0.0
    if node.startswith("m"):
        return 2.0 * int(node[1:]) + 2, -1.0
    layer, head = (int(x) for x in re.match(r"a(\d+)\.h(\d+)", node).groups())  # type: ignore[union-attr]
    return 2.0 * layer + 1, float(head)


def _kind_of(report: Any, node: str) -> str | None:
    m = re.match(r"a(\d+)\.h(\d+)$", node)
    if report is None or m is None:
        return None
    kinds = sorted(report.kinds(int(m.group(1)), int(m.group(2))))
    for k in kinds:
        base = k.split(":")[0]
        if base in _KIND_COLOURS:
            return base
    return kinds[0].split(":")[0] if kinds else None


def circuit_figure(circuit: Any, *, report: Any = None, title: str | None = None, max_width: float = 8.0) -> go.Figure:
    """A layered graph of a circuit's edges: edge width by |score|, heads coloured by kind.

    Columns: the embedding, then each layer's heads (stacked by head index) and its MLP (below), then the logits.
    An edge into a head's query, key or value input is drawn to the head, its hover text names the input.

    Args:
        circuit: a :class:`~interp.circuits.circuit.Circuit` with at least one edge.
        report: a :class:`~interp.analysis.taxonomy.HeadReport` (``classify_heads``): heads coloured by kind.
        title: the figure's title (default: the method and the number of edges).
        max_width: the line width of the edge of largest |score|.

    Returns:
        A plotly ``go.Figure``.

    Raises:
        ValueError: an empty circuit.

    Example:
        >>> from interp.viz.circuits import circuit_figure
        >>> from interp.circuits import Circuit
        >>> fig = circuit_figure(Circuit([("input", "a0.h1<v>"), ("a0.h1", "a1.h0<k>"), ("a1.h0", "logits")],
        ...                              {("a1.h0", "logits"): -2.0}, method="eap"))
        >>> len(fig.data) > 3
        True
    """
    circuit.check_nonempty()
    nodes = circuit.nodes
    layers = [int(m.group(1)) for n in nodes for m in [re.match(r"[am](\d+)", n)] if m]
    L = (max(layers) + 1) if layers else 1
    top = max((abs(v) for v in circuit.scores.values()), default=0.0) or 1.0
    fig = go.Figure()
    for u, d in circuit.edges:
        (x0, y0), (x1, y1) = _place(u, L), _place(d.split("<")[0], L)
        score = circuit.scores.get((u, d))
        width = 1.0 if score is None else max(0.5, max_width * abs(score) / top)
        colour = "#555" if score is None or score <= 0 else "#2ca02c"
        fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", line={"width": width, "color": colour},
                                 hoverinfo="text", text=f"{u} -> {d}" + ("" if score is None else f": {score:.4g}"),
                                 showlegend=False, opacity=0.7))
    groups: dict[str, list[str]] = {}
    for n in nodes:
        groups.setdefault(_kind_of(report, n) or ("node" if report is None else "other"), []).append(n)
    for kind, members in groups.items():
        xy = [_place(n, L) for n in members]
        fig.add_trace(go.Scatter(x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers+text", text=members,
                                 textposition="top center", name=kind,
                                 marker={"size": 14, "color": _KIND_COLOURS.get(kind, _OTHER)},
                                 showlegend=report is not None))
    ticks = [0] + [v for layer in range(L) for v in (2 * layer + 1, 2 * layer + 2)] + [2 * L + 1]
    labels = ["embed"] + [t for layer in range(L) for t in (f"L{layer} attn", f"L{layer} mlp")] + ["logits"]
    fig.update_layout(title=title or f"circuit ({circuit.method or 'edges'}): {len(circuit)} edges",
                      xaxis={"tickvals": ticks, "ticktext": labels, "showgrid": False},
                      yaxis={"title": "head (MLP below 0)", "showgrid": False, "zeroline": False},
                      template="plotly_white", height=500)
    return fig


def faithfulness_figure(df: pd.DataFrame, *, title: str = "faithfulness over circuit size") -> go.Figure:
    """Faithfulness curves from :func:`~interp.circuits.evaluate.faithfulness_curve`: one line per method, the
    random circuits' mean with their 10-90 % band.

    Raises:
        ValueError: a frame without ``method``, ``n_edges`` and ``faithfulness`` columns.

    Example:
        >>> import pandas as pd
        >>> from interp.viz.circuits import faithfulness_figure
        >>> df = pd.DataFrame({"method": ["eap", "eap", "random", "random"], "n_edges": [1, 2, 1, 2],
        ...                    "faithfulness": [0.5, 1.0, 0.1, 0.2]})
        >>> len(faithfulness_figure(df).data)
        3
    """
    missing = {"method", "n_edges", "faithfulness"} - set(df.columns)
    if missing:
        raise ValueError(f"df lacks the columns {sorted(missing)} (pass faithfulness_curve's frame)")
    fig = go.Figure()
    for method, g in df.groupby("method"):
        stats = g.groupby("n_edges")["faithfulness"]
        mean = stats.mean()
        if method == "random":
            lo, hi = stats.quantile(0.1), stats.quantile(0.9)
            fig.add_trace(go.Scatter(x=list(hi.index) + list(lo.index[::-1]), y=list(hi) + list(lo[::-1]),
                                     fill="toself", line={"width": 0}, fillcolor="rgba(127,127,127,0.2)",
                                     name="random 10-90 %", hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=mean.index, y=mean.values, mode="lines+markers", name=str(method),
                                 line={"dash": "dot"} if method == "random" else {}))
    fig.update_layout(title=title, xaxis={"title": "edges kept", "type": "log"},
                      yaxis={"title": "metric / full model's"}, template="plotly_white")
    return fig
