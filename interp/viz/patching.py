"""Circuit figures: activation / attribution patching heatmaps, direct logit attribution bars, composition maps."""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ._common import as_frame

__all__ = ["composition_heatmap", "logit_attribution_bar", "patching_heatmap"]


def _check_cols(df: pd.DataFrame, cols: list[str], name: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{name} lacks column(s) {missing}; it has {list(df.columns)}")


def patching_heatmap(df: Any, *, value: str = "normalized", title: str | None = None,
                     pos_labels: list[str] | None = None) -> go.Figure:
    """A heatmap of a patching table (:func:`interp.analysis.activation_patching` or attribution patching).

    Layout follows the table: ``layer x head`` (by head), ``head x position`` (by head and position, rows
    ``L1H3``), ``layer x position`` (per layer and position), or one row of layers.

    Args:
        df: the patching DataFrame.
        value: the column drawn (``"normalized"``: 1 = clean behaviour, 0 = corrupted; or ``"metric"``).
        title: figure title (default: act, direction and method from ``df.attrs``).
        pos_labels: token strings for the position axis.

    Returns:
        A ``go.Figure`` (diverging colours centred on 0.5 for ``normalized``).

    Raises:
        ValueError: the table lacks ``layer`` or ``value``.

    Example:
        >>> from interp.viz.patching import patching_heatmap
        >>> from interp.examples import model, clean, corrupted, answers
        >>> from interp.analysis import activation_patching
        >>> patching_heatmap(activation_patching(model, clean, corrupted, act="z", answer_tokens=answers))
    """
    df = as_frame(df, "df")
    _check_cols(df, ["layer", value], "the patching table")
    has_head, has_pos = "head" in df.columns, "pos" in df.columns
    if has_head and has_pos:
        df = df.assign(row=[f"L{int(layer)}H{int(h)}" for layer, h in zip(df["layer"], df["head"])])
        grid = df.pivot(index="row", columns="pos", values=value)
        grid = grid.loc[list(dict.fromkeys(df["row"]))]
        y, x, ylab, xlab = list(grid.index), list(grid.columns), "head", "position"
    elif has_head:
        grid = df.pivot(index="layer", columns="head", values=value)
        y, x, ylab, xlab = list(grid.index), list(grid.columns), "layer", "head"
    elif has_pos:
        grid = df.pivot(index="layer", columns="pos", values=value)
        y, x, ylab, xlab = list(grid.index), list(grid.columns), "layer", "position"
    else:
        grid = df.set_index("layer")[[value]].T
        y, x, ylab, xlab = [value], list(grid.columns), "", "layer"
    if pos_labels is not None and xlab == "position":
        if len(pos_labels) <= max(int(p) for p in x):
            raise ValueError(f"pos_labels has {len(pos_labels)} entries, positions go up to {max(x)}")
        x = [f"{p}: {pos_labels[int(p)]}" for p in x]
    z = grid.to_numpy(dtype=float)
    kw = dict(colorscale="RdBu", zmid=0.5) if value == "normalized" else dict(colorscale="RdBu", zmid=0.0)
    fig = go.Figure(go.Heatmap(
        z=z, x=[str(v) for v in x], y=[str(v) for v in y], colorbar=dict(title=value), **kw,
        hovertemplate=f"{ylab} %{{y}}, {xlab} %{{x}}<br>{html.escape(value)} %{{z:.3f}}<extra></extra>"))
    a = df.attrs
    default = " ".join(str(a[k]) for k in ("method", "act", "direction") if k in a) + " patching"
    fig.update_xaxes(title_text=xlab, type="category")
    fig.update_yaxes(title_text=ylab, type="category", autorange="reversed")
    fig.update_layout(title=title or default.strip(), height=max(240, 26 * len(y) + 140),
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def logit_attribution_bar(df: Any, *, title: str | None = None, top: int | None = None) -> go.Figure:
    """Bars of a direct logit attribution table (:func:`interp.analysis.direct_logit_attribution`).

    Args:
        df: the attribution DataFrame (``component``, ``kind``, ``attribution``).
        title: figure title (default: the model's logit difference from ``df.attrs``).
        top: keep only the ``top`` components of largest absolute attribution.

    Returns:
        A ``go.Figure``, one bar per component, coloured by kind.

    Raises:
        ValueError: a required column is missing.

    Example:
        >>> from interp.viz.patching import logit_attribution_bar
        >>> from interp.examples import model, tokens, answers
        >>> from interp.analysis import direct_logit_attribution
        >>> logit_attribution_bar(direct_logit_attribution(model, tokens, answers), top=10)
    """
    df = as_frame(df, "df")
    _check_cols(df, ["component", "kind", "attribution"], "the attribution table")
    if top is not None:
        df = df.loc[df["attribution"].abs().sort_values(ascending=False).index[:top]]
    fig = go.Figure()
    for kind, part in df.groupby("kind", sort=False):
        fig.add_bar(x=part["component"], y=part["attribution"], name=str(kind))
    total = df.attrs.get("logit_diff")
    fig.update_layout(title=title or ("direct logit attribution" + (f" (logit diff {total:.3f})" if total is not None
                                                                      else "")),
                      xaxis_title="component", yaxis_title="logit difference", barmode="relative",
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def composition_heatmap(scores: Any, *, title: str = "composition", zmin: float = 0.0) -> go.Figure:
    """Source head x destination head map of composition scores.

    Args:
        scores: ``[L, H, L, H]`` from :func:`interp.analysis.composition_scores` (NaN where not composable).
        title: figure title.
        zmin: lower end of the colour scale.

    Returns:
        A ``go.Figure``; rows are writing heads ``L0H2``, columns reading heads.

    Raises:
        ValueError: scores is not ``[L, H, L, H]``.

    Example:
        >>> from interp.viz.patching import composition_heatmap
        >>> from interp.examples import model
        >>> from interp.analysis import composition_scores
        >>> composition_heatmap(composition_scores(model, "K"), title="K-composition")
    """
    if hasattr(scores, "detach"):
        scores = scores.detach().float().cpu().numpy()
    s = np.asarray(scores, dtype=float)
    if s.ndim != 4 or s.shape[:2] != s.shape[2:]:
        raise ValueError(f"scores must be [L, H, L, H], got shape {s.shape}")
    L, H = s.shape[:2]
    labels = [f"L{layer}H{h}" for layer in range(L) for h in range(H)]
    z = s.reshape(L * H, L * H)  # [src heads, dst heads]
    keep_rows = [i for i in range(L * H) if not np.isnan(z[i]).all()]
    keep_cols = [j for j in range(L * H) if not np.isnan(z[:, j]).all()]
    z = z[np.ix_(keep_rows, keep_cols)]
    fig = go.Figure(go.Heatmap(
        z=z, x=[labels[j] for j in keep_cols], y=[labels[i] for i in keep_rows], colorscale="Viridis", zmin=zmin,
        colorbar=dict(title="score"), hovertemplate="%{y} -> %{x}<br>score %{z:.3f}<extra></extra>"))
    fig.update_xaxes(title_text="reading head", type="category")
    fig.update_yaxes(title_text="writing head", type="category", autorange="reversed")
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=50, b=10))
    return fig
