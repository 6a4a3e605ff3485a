"""Pruning curves with the KV cache they free: the metric (left axis) and the KV-cache bytes per token saved
(right axis) against the fraction of heads pruned. In a GQA model head-level pruning frees cache only when a
whole K/V group is gone; group-level pruning frees it at every step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def pruning_kv_figure(curves: Sequence[Any], *, title: str | None = None) -> go.Figure:
    """Metric and KV bytes saved against the fraction of heads pruned, one colour per curve.

    Args:
        curves: :class:`interp.pruning.PruningCurve` objects (their points carry ``kv_bytes_saved``).
        title: figure title (default: the model name).

    Returns:
        A ``go.Figure``: solid lines = metric (left axis, error bars where a std is known), dotted lines =
        KV-cache bytes per token saved (right axis).

    Raises:
        ValueError: no curves.

    Example:
        >>> from interp.viz.pruning_kv import pruning_kv_figure
        >>> from interp.examples import model, train, objective
        >>> from interp.pruning import importance_curve
    >>> pruning_kv_figure([importance_curve(model, train, objective, step=0.5)]).show()
    """
    if not curves:
        raise ValueError("pruning_kv_figure needs at least one curve")
    palette = plotly.colors.qualitative.Plotly
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for i, c in enumerate(curves):
        c = c.sorted()
        color = palette[i % len(palette)]
        std = [p.metric_std or 0.0 for p in c.points]
        err = dict(type="data", array=std, visible=True) if any(std) else None
        fig.add_trace(go.Scatter(x=c.fractions, y=c.metrics, mode="lines+markers", name=f"{c.method}: metric",
                                 line=dict(color=color), error_y=err, legendgroup=c.method), secondary_y=False)
        saved = [p.kv_bytes_saved for p in c.points]
        if any(s is not None for s in saved):
            fig.add_trace(go.Scatter(x=c.fractions, y=[s or 0 for s in saved], mode="lines",
                                     name=f"{c.method}: KV bytes saved", legendgroup=c.method,
                                     line=dict(color=color, dash="dot")), secondary_y=True)
    name = curves[0].model_name
    fig.update_layout(title=title or f"Head pruning and KV cache{' - ' + name if name else ''}",
                      template="plotly_white", xaxis_title="fraction of heads pruned", xaxis_range=[0, 1])
    fig.update_yaxes(title_text=curves[0].metric_name, secondary_y=False)
    fig.update_yaxes(title_text="KV-cache bytes per token saved (fp16)", secondary_y=True, rangemode="tozero")
    return fig
