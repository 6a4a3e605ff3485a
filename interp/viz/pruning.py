"""Pruning curves: the metric against the fraction of heads pruned, one line per method (or seed)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import plotly.colors
import plotly.graph_objects as go

_X_NAMES = ("fraction_pruned", "fraction", "sparsity", "frac_pruned", "pruned_fraction")
_Y_NAMES = ("metric", "value", "loss", "score")


def _frame(curve: Any) -> pd.DataFrame:
    """A long DataFrame from a DataFrame or a PruningCurve-like object."""
    if isinstance(curve, pd.DataFrame):
        return curve
    for attr in ("to_frame", "to_dataframe", "frame"):
        fn = getattr(curve, attr, None)
        if callable(fn):
            return fn()
    df = getattr(curve, "df", None)
    if isinstance(df, pd.DataFrame):
        return df
    raise TypeError(f"cannot read a pruning curve from {type(curve).__name__}: pass a DataFrame or a PruningCurve")


def _pick(df: pd.DataFrame, given: str | None, names: Sequence[str], what: str) -> str:
    if given is not None:
        if given not in df.columns:
            raise ValueError(f"{what} column {given!r} not in {list(df.columns)}")
        return given
    for n in names:
        if n in df.columns:
            return n
    raise ValueError(f"no {what} column (one of {list(names)}) in {list(df.columns)}; pass {what}=")


def pruning_curves(
    curves: Any,
    *,
    x: str | None = None,
    y: str | None = None,
    group: str = "method",
    title: str = "pruning curves",
    y_title: str | None = None,
    baseline: float | None = None,
) -> go.Figure:
    """Metric against the fraction of heads pruned, one line (with markers) per method.

    Args:
        curves: a ``PruningCurve`` (anything with ``to_frame()``/``.df``), a list of them, or a long DataFrame
            with a fraction column, a metric column and a ``group`` column.
        x: the fraction column (default: the first of ``fraction_pruned``, ``fraction``, ``sparsity``...).
        y: the metric column (default: the first of ``metric``, ``value``, ``loss``, ``score``).
        group: the column naming each line (default ``method``; all points form one line without it).
            A ``{y}_std`` column (``metric_std`` of a random baseline) is drawn as error bars.
        title, y_title: figure title and y-axis title (default: ``y``).
        baseline: draw the unpruned metric as a dashed horizontal line.

    Returns:
        A ``go.Figure`` with one scatter line per group.

    Raises:
        ValueError: missing columns or no points.
        TypeError: an input that is not a curve.

    Example:
        >>> df = pd.DataFrame({"method": ["random"] * 3, "fraction": [0, .5, 1], "metric": [1, .6, .1]})
        >>> pruning_curves(df)
    """
    items = curves if isinstance(curves, Iterable) and not isinstance(curves, pd.DataFrame) else [curves]
    frames = [_frame(c) for c in items]
    if not frames:
        raise ValueError("no pruning curves given")
    df = pd.concat(frames, ignore_index=True)
    if df.empty:
        raise ValueError("the pruning curves hold no points")
    xc = _pick(df, x, _X_NAMES, "x")
    yc = _pick(df, y, _Y_NAMES, "y")
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
        fig.add_trace(go.Scatter(x=g[xc], y=g[yc], mode="lines+markers", name=str(name), error_y=err,
                                 line=dict(color=palette[i % len(palette)]),
                                 hovertemplate=f"{name}<br>pruned %{{x:.0%}}<br>{yc} %{{y:.4f}}<extra></extra>"))
    if baseline is not None:
        fig.add_hline(y=baseline, line_dash="dash", line_color="grey", annotation_text="unpruned")
    fig.update_layout(title=title, xaxis=dict(title="fraction of heads pruned", tickformat=".0%"),
                      yaxis_title=y_title or yc, height=420, margin=dict(l=10, r=10, t=60, b=10))
    return fig
