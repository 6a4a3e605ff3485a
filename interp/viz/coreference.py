"""Coreference-head figures: a layer x head map of antecedent accuracy and the best heads against the baselines."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import SCORE_SCALE, layer_head_grid

__all__ = ["coreference_figure"]

_NEEDED = ("layer", "head", "group", "n", "accuracy", "ci_low", "ci_high", "baseline_accuracy", "best_baseline")


def coreference_figure(df: pd.DataFrame, *, group: str = "all", top: int = 10, title: str | None = None) -> go.Figure:
    """Left: each head's antecedent accuracy (layer x head). Right: the ``top`` heads with 95 % intervals, and
    every baseline of ``df.attrs["baselines"]`` (with its interval) as a band.

    Args:
        df: from :func:`interp.analysis.coreference.coreference_scores`.
        group: the query group to draw (``"all"``, ``"pronoun"``, ``"backward"``...).
        top: heads shown on the right, best accuracy first.
        title: figure title (default: the group, its count and the best baseline).

    Returns:
        A ``go.Figure``.

    Raises:
        ValueError: a missing column, or a group the table does not hold.

    Example:
        >>> import interp
        >>> from interp.viz.coreference import coreference_figure
        >>> from interp.analysis import coreference_scores
    >>> df = coreference_scores(interp.load("minilm-l6"), "../shared/data/gap/gap-development.tsv", max_items=10, n_boot=0)
    >>> coreference_figure(df, group="all")
    """
    missing = [c for c in _NEEDED if c not in df.columns]
    if missing:
        raise ValueError(f"coreference table lacks column(s) {missing}; it has {list(df.columns)}")
    sel = df[df.group == group]
    if sel.empty:
        raise ValueError(f"group {group!r} is not in the table; it has {sorted(set(df.group))}")
    n = int(sel.n.iloc[0])
    best, best_acc = str(sel.best_baseline.iloc[0]), float(sel.baseline_accuracy.iloc[0])
    grid = layer_head_grid(sel, "accuracy")
    L, H = grid.shape
    hover = [[""] * H for _ in range(L)]
    for r in sel.itertuples():
        hover[r.layer][r.head] = (f"L{r.layer}H{r.head}: {r.accuracy:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]"
                                  f"<br>{best} {best_acc:.3f} (gain {r.accuracy - best_acc:+.3f})")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=("accuracy per head", f"top {top} heads vs baselines (95% CI)"))
    fig.add_trace(go.Heatmap(z=grid, x=list(range(H)), y=list(range(L)), colorscale=SCORE_SCALE, zmin=0, zmax=1,
                             text=[[f"{v:.2f}" for v in row] for row in grid], texttemplate="%{text}",
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                             colorbar={"title": "accuracy", "x": 0.5}), row=1, col=1)
    fig.update_xaxes(title_text="head", tickmode="array", tickvals=list(range(H)), row=1, col=1)
    fig.update_yaxes(title_text="layer", tickmode="array", tickvals=list(range(L)), autorange="reversed", row=1, col=1)
    best_heads = sel.sort_values("accuracy", ascending=False).head(top)
    names = [f"L{r.layer}H{r.head}" for r in best_heads.itertuples()]
    fig.add_trace(go.Scatter(
        x=names, y=best_heads.accuracy, mode="markers", name="head", marker={"size": 9, "color": "#1f77b4"},
        error_y={"type": "data", "symmetric": False, "array": best_heads.ci_high - best_heads.accuracy,
                 "arrayminus": best_heads.accuracy - best_heads.ci_low}), row=1, col=2)
    palette = ["#d62728", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f"]
    base: list[dict[str, Any]] = [b for b in df.attrs.get("baselines", []) if b.get("group") == group]
    for i, b in enumerate(base):
        colour = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=[names[0], names[-1]], y=[b["accuracy"]] * 2, mode="lines", name=b["baseline"],
                                 line={"color": colour, "dash": "dash"},
                                 hovertemplate=f"{b['baseline']}: {b['accuracy']:.3f} "
                                               f"[{b['ci_low']:.3f}, {b['ci_high']:.3f}]<extra></extra>"),
                      row=1, col=2)
    fig.update_yaxes(title_text="antecedent accuracy", range=[0, 1], row=1, col=2)
    fig.update_layout(title=title or f"coreference heads, group {group!r} (n={n}; best baseline {best} "
                                     f"{best_acc:.2f})", height=max(360, 40 * L + 160), width=1100,
                      template="plotly_white", legend={"title": "baseline"})
    return fig
