"""Pruning curves: the metric against the fraction of heads pruned, one line per method (or seed)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from ..pruning.curve import PruningCurve, common_range


def _frame(curve: Any) -> pd.DataFrame:
    """A long DataFrame from a DataFrame or a PruningCurve (its ``to_frame()``)."""
    if isinstance(curve, pd.DataFrame):
        return curve
    if isinstance(curve, PruningCurve):
        return curve.to_frame()
    raise TypeError(f"cannot read a pruning curve from {type(curve).__name__}: pass a DataFrame or a PruningCurve")


def _auc_labels(items: Sequence[Any]) -> dict[str, str]:
    """``method -> "method (AUC[0, u] a)"`` when every item is a PruningCurve, on their common range."""
    if not items or not all(isinstance(c, PruningCurve) and c.points for c in items):
        return {}
    upto = common_range(items)
    return {c.method: f"{c.method} (AUC[0, {upto:.2f}] {c.auc(upto=upto):.3f})" for c in items}


def pruning_curves(
    curves: Any,
    *,
    x: str = "fraction_pruned",
    y: str = "metric",
    group: str = "method",
    title: str | None = None,
    y_title: str | None = None,
    baseline: float | None = None,
) -> go.Figure:
    """Metric against the fraction of heads pruned, one line (with markers) per method.

    Args:
        curves: a ``PruningCurve``, a list of them, or a long DataFrame with the ``x``, ``y`` and ``group``
            columns. PruningCurves are labelled with their AUC on the range every curve reaches.
        x: the fraction column (``PruningCurve.to_frame()`` and ``interp prune --json`` call it
            ``fraction_pruned``).
        y: the metric column.
        group: the column naming each line (default ``method``; all points form one line without it).
            A ``{y}_std`` column (``metric_std`` of a random baseline) is drawn as error bars.
        title, y_title: figure title (default: "Head pruning - {model}" for PruningCurves) and y-axis title
            (default: the curves' metric name, else ``y``).
        baseline: draw the unpruned metric as a dashed horizontal line.

    Returns:
        A ``go.Figure`` with one scatter line per group.

    Raises:
        ValueError: missing columns or no points.
        TypeError: an input that is not a curve.

    Example:
        >>> import pandas as pd
        >>> from interp.viz.pruning import pruning_curves
        >>> df = pd.DataFrame({"method": ["random"] * 3, "fraction_pruned": [0, .5, 1], "metric": [1, .6, .1]})
        >>> pruning_curves(df)
    """
    # A list, so a generator of curves is read once and still there for the labels and the title.
    items = list(curves) if isinstance(curves, Iterable) and not isinstance(curves, pd.DataFrame) else [curves]
    frames = [_frame(c) for c in items]
    if not frames:
        raise ValueError("no pruning curves given")
    df = pd.concat(frames, ignore_index=True)
    if df.empty:
        raise ValueError("the pruning curves hold no points")
    missing = [c for c in (x, y) if c not in df.columns]
    if missing:
        raise ValueError(f"no column(s) {missing} in the curves' table {list(df.columns)}; pass x= / y=")
    xc, yc = x, y
    labels = _auc_labels(items)
    if title is None:
        names = {getattr(c, "model_name", "") for c in items} - {""}
        title = "Head pruning" + (f" - {names.pop()}" if len(names) == 1 else "")
    if y_title is None and items and all(isinstance(c, PruningCurve) for c in items):
        y_title = items[0].metric_name
    groups = df.groupby(group, sort=False) if group in df.columns else [("curve", df)]
    palette = plotly.colors.qualitative.D3
    fig = go.Figure()
    for i, (name, g) in enumerate(groups):
        name = name[0] if isinstance(name, tuple) else name
        g = g.sort_values(xc)
        std = g[f"{yc}_std"] if f"{yc}_std" in g.columns else None
        # Spread over seeds (the random baseline) as error bars.
        err = (dict(type="data", array=std.fillna(0.0).astype(float).tolist(), visible=True)
               if std is not None and std.notna().any() else None)
        fig.add_trace(go.Scatter(x=g[xc], y=g[yc], mode="lines+markers", name=labels.get(name, str(name)), error_y=err,
                                 line=dict(color=palette[i % len(palette)]),
                                 hovertemplate=f"{name}<br>pruned %{{x:.0%}}<br>{yc} %{{y:.4f}}<extra></extra>"))
    if baseline is not None:
        fig.add_hline(y=baseline, line_dash="dash", line_color="grey", annotation_text="unpruned")
    fig.update_layout(title=title, xaxis=dict(title="fraction of heads pruned", tickformat=".0%"),
                      yaxis_title=y_title or yc, height=420, margin=dict(l=10, r=10, t=60, b=10))
    return fig
