"""Per-head maps: the head taxonomy, residual-write norms, and score maps (positional, induction, ...).

Every map is a ``[layer, head]`` grid: layers down, heads across, so the same head sits in the same cell in
every figure.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import SCORE_SCALE, as_frame, layer_head_grid, to_numpy

#: Kinds that mean "nothing found": drawn light grey.
# Labels a user's table may use for "no kind" (HeadReport itself simply has no row for such a head).
_NO_KIND = {"", "no kind", "none", "other", "unclassified", "unknown", "mixed", "diffuse"}
_GREY = "#e5e5e5"
_UNCLASSIFIED = "no kind"


def _axes(fig: go.Figure, L: int, H: int, row: int | None = None, col: int | None = None) -> None:
    kw = {} if row is None else dict(row=row, col=col)
    fig.update_xaxes(title_text="head", tickmode="array", tickvals=list(range(H)), **kw)
    fig.update_yaxes(title_text="layer", tickmode="array", tickvals=list(range(L)), autorange="reversed", **kw)


def score_map(
    scores: Any,
    *,
    title: str | None = None,
    value: str | None = None,
    colorscale: str = SCORE_SCALE,
    zmin: float | None = None,
    zmax: float | None = None,
    text_format: str = ".2f",
) -> go.Figure:
    """A ``[layer, head]`` heatmap of one score per head, with the value written in each cell.

    Args:
        scores: ``[L, H]`` (tensor/array) or a long DataFrame with ``layer``, ``head`` and ``value`` columns.
        title: figure title (default: ``value``).
        value: the DataFrame column to draw (required with a DataFrame).
        colorscale, zmin, zmax: colour scale and its range (default: the data's range).
        text_format: d3 format of the number printed in each cell.

    Returns:
        A ``go.Figure``.

    Raises:
        ValueError: a DataFrame without ``value``, or scores that are not 2-D.

    Example:
        >>> from interp.viz.heads import score_map
        >>> from interp.examples import model
        >>> from interp.analysis import induction_scores
        >>> score_map(induction_scores(model), value="induction", zmin=0, zmax=1)
    """
    if isinstance(scores, pd.DataFrame):
        if value is None:
            raise ValueError(f"value= must name the column to draw; columns are {list(scores.columns)}")
        z = layer_head_grid(scores, value)
    else:
        z = to_numpy(scores, "scores", 2)
    L, H = z.shape
    label = value or "score"
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(H)), y=list(range(L)), colorscale=colorscale, zmin=zmin, zmax=zmax,
        texttemplate=f"%{{z:{text_format}}}", colorbar=dict(title=label),
        hovertemplate=f"layer %{{y}} head %{{x}}<br>{html.escape(label)} %{{z:.4f}}<extra></extra>"))
    _axes(fig, L, H)
    fig.update_layout(title=title or label, height=max(220, 48 * L + 120), margin=dict(l=10, r=10, t=50, b=10))
    return fig


def score_maps(
    df: pd.DataFrame,
    columns: Sequence[str],
    *,
    title: str | None = None,
    zmin: float | None = 0.0,
    zmax: float | None = None,
    colorscale: str = SCORE_SCALE,
) -> go.Figure:
    """Several per-head scores side by side (one ``[layer, head]`` panel per column, one colour scale).

    Args:
        df: long table with ``layer``, ``head`` and the ``columns``.
        columns: score columns to draw, one panel each.
        title: figure title.
        zmin, zmax: shared colour range (``zmax`` defaults to the largest value drawn).

    Returns:
        A ``go.Figure``.

    Raises:
        ValueError: no columns, or a column is missing.

    Example:
        >>> from interp.viz.heads import score_maps
        >>> from interp.examples import model
        >>> from interp.analysis import induction_scores
        >>> score_maps(induction_scores(model), ["previous_token", "induction"])
    """
    df = as_frame(df, "df")
    columns = list(columns)
    if not columns:
        raise ValueError("columns is empty: name at least one score column")
    grids = [layer_head_grid(df, c) for c in columns]
    L, H = grids[0].shape
    if zmax is None:
        zmax = float(np.nanmax([np.nanmax(g) for g in grids]))
    fig = make_subplots(rows=1, cols=len(columns), subplot_titles=[c.replace("_", " ") for c in columns],
                        horizontal_spacing=0.04)
    for i, (c, z) in enumerate(zip(columns, grids)):
        fig.add_trace(go.Heatmap(
            z=z, x=list(range(H)), y=list(range(L)), coloraxis="coloraxis", texttemplate="%{z:.2f}",
            hovertemplate=f"layer %{{y}} head %{{x}}<br>{html.escape(c)} %{{z:.4f}}<extra></extra>"),
            row=1, col=i + 1)
        _axes(fig, L, H, row=1, col=i + 1)
        if i:
            fig.update_yaxes(title_text=None, row=1, col=i + 1)
    fig.update_layout(coloraxis=dict(colorscale=colorscale, cmin=zmin, cmax=zmax), title=title,
                      height=max(240, 48 * L + 140), margin=dict(l=10, r=10, t=70, b=10))
    return fig


#: Score columns of ``interp.analysis.induction_scores``.
INDUCTION_COLUMNS = ("previous_token", "duplicate_token", "induction", "copying")


def induction_map(df: pd.DataFrame, columns: Sequence[str] | None = None, *, title: str | None = None) -> go.Figure:
    """The induction-circuit scores per head: previous-token, duplicate-token, induction and copying.

    Args:
        df: the DataFrame of :func:`interp.analysis.induction_scores` (``layer``, ``head`` + score columns).
        columns: which scores (default: those of :data:`INDUCTION_COLUMNS` present in ``df``).
        title: figure title.

    Returns:
        A ``go.Figure`` with one panel per score.

    Raises:
        ValueError: none of the score columns are present.

    Example:
        >>> import interp
        >>> from interp.viz.heads import induction_map
        >>> from interp.examples import model
        >>> induction_map(interp.analysis.induction_scores(model))
    """
    df = as_frame(df, "df")
    # A score that is NaN for every head (copying on a model without unembedding) gets no panel.
    cols = [c for c in (columns or INDUCTION_COLUMNS) if c in df.columns and df[c].notna().any()]
    if not cols:
        raise ValueError(f"no induction score columns {list(columns or INDUCTION_COLUMNS)} in {list(df.columns)}")
    # Copying scores can be negative (the head suppresses the token): let the colour range follow the data.
    lo = min(0.0, float(np.nanmin(df[cols].to_numpy(dtype=float))))
    return score_maps(df, cols, title=title or "induction circuit scores", zmin=lo)


def positional_map(
    df: pd.DataFrame,
    columns: Sequence[str] | None = None,
    *,
    stat: str = "mass",
    title: str | None = None,
    layers: Sequence[int] | None = None,
    aggregate: bool = False,
) -> go.Figure:
    """Where each head looks, relative to the query: heads down, targets (offsets, first token, delimiters) across.

    Args:
        df: the table of :func:`interp.analysis.positional_scores` (``layer``, ``head`` and ``{stat}_{target}``
            columns such as ``mass_-1``, ``mass_first``), or any long table of per-head scores.
        columns: score columns to draw instead of the ``{stat}_*`` family.
        stat: ``"mass"`` (mean attention weight on the target) or ``"argmax"`` (how often the target is the
            head's top key).
        title: figure title.
        layers: only these layers' heads (a page-sized panel for a model with hundreds of heads).
        aggregate: one row per layer holding the largest value of any of its heads (hover names the head).

    Returns:
        A ``go.Figure``: one heatmap row per head (``L{layer}H{head}``) or per layer, one column per target; the
        x-axis title names the kinds of target actually drawn.

    Raises:
        ValueError: no matching score column, or ``layers`` selects no head.

    Example:
        >>> import pandas as pd
        >>> from interp.viz.heads import positional_map
        >>> positional_map(pd.DataFrame({"layer": [0, 0], "head": [0, 1], "mass_-1": [0.9, 0.1]}))
    """
    df = as_frame(df, "df")
    prefix = f"{stat}_"
    if columns is None:
        columns = [c for c in df.columns if c.startswith(prefix) and pd.api.types.is_numeric_dtype(df[c])]
    if not columns:
        raise ValueError(f"no {prefix}* score columns in {list(df.columns)}")
    df = df.sort_values(["layer", "head"])
    if layers is not None:
        df = df[df["layer"].isin(list(layers))]
        if df.empty:
            raise ValueError(f"layers={list(layers)} selects no head of the table")
    targets = [c[len(prefix):] if c.startswith(prefix) else c for c in columns]
    if aggregate:
        z_rows, heads, best = [], [], []
        for layer, g in df.groupby("layer", sort=True):
            vals = g[list(columns)].to_numpy(dtype=float)  # [heads of the layer, targets]
            filled = np.where(np.isnan(vals), -np.inf, vals)
            arg = filled.argmax(0)  # [targets]
            z_rows.append(np.where(np.isnan(vals).all(0), np.nan, filled[arg, np.arange(len(columns))]))
            best.append([f"H{int(g['head'].iloc[i])}" for i in arg])
            heads.append(f"L{int(layer)}")
        z, custom, row_title = np.array(z_rows), np.array(best, dtype=object), "layer (largest head)"
        hover = f"%{{y}} %{{customdata}}<br>target %{{x}}<br>{stat} %{{z:.3f}}<extra></extra>"
    else:
        z = df[list(columns)].to_numpy(dtype=float)  # [heads, targets]
        heads = [f"L{int(a)}H{int(b)}" for a, b in zip(df["layer"], df["head"])]
        custom, row_title = None, "head"
        hover = f"%{{y}}<br>target %{{x}}<br>{stat} %{{z:.3f}}<extra></extra>"
    fig = go.Figure(go.Heatmap(
        z=z, x=targets, y=heads, colorscale=SCORE_SCALE, zmin=0, zmax=1, texttemplate="%{z:.2f}",
        colorbar=dict(title=stat), customdata=custom, hovertemplate=hover))
    fig.update_xaxes(title_text=_target_title(targets), type="category")
    fig.update_yaxes(title_text=row_title, autorange="reversed", type="category")
    fig.update_layout(title=title or f"positional scores ({stat})", height=max(260, 22 * len(heads) + 140),
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def _target_title(targets: Sequence[str]) -> str:
    """The x-axis title naming only the kinds of target drawn (offsets, first token, delimiter)."""
    parts = []
    if any(t.lstrip("+-").isdigit() for t in targets):
        parts.append("offset from the query")
    parts += [{"first": "first token", "delimiter": "delimiter"}[t] for t in ("first", "delimiter") if t in targets]
    others = [t for t in targets if not t.lstrip("+-").isdigit() and t not in ("first", "delimiter")]
    return "target" + (f" ({', '.join(parts + others)})" if parts or others else "")


def head_write_norms(trace: Any, *, attention_mask: Any = None) -> np.ndarray:
    """Mean L2 norm of each head's residual-stream write ``z_h W_O[h]`` over sequences and positions.

    Args:
        trace: a :class:`~interp.Trace` with ``blocks.{l}.attn.hook_result`` recorded
            (``model.run_with_cache(tokens, names_filter="*hook_result")``).
        attention_mask: optional ``[B, T]`` 1/0 mask; padded positions are left out of the mean.

    Returns:
        ``[L, H]`` array of mean norms.

    Raises:
        KeyError: the trace holds no per-head writes.
        ValueError: the mask does not match the recorded shape.

    Example:
        >>> from interp.viz.heads import head_write_norms
        >>> from interp.examples import model, tokens
        >>> _, trace = model.run_with_cache(tokens, names_filter="*hook_result")
        >>> head_write_norms(trace).shape
        (2, 4)
    """
    outs = to_numpy(trace.head_outs(), "head_outs", 5)  # [L, B, T, H, M]
    norms = np.linalg.norm(outs, axis=-1)  # [L, B, T, H]
    if attention_mask is None:
        return norms.mean(axis=(1, 2))
    keep = to_numpy(attention_mask, "attention_mask", 2)
    if keep.shape != norms.shape[1:3]:
        raise ValueError(f"attention_mask has shape {keep.shape}, expected {norms.shape[1:3]}")
    w = keep[None, :, :, None]  # [1, B, T, 1]
    return (norms * w).sum(axis=(1, 2)) / w.sum(axis=(1, 2))


def head_norms_figure(norms: Any, *, title: str = "per-head residual-write norm",
                      clip_outliers: bool = True) -> go.Figure:
    """``[layer, head]`` map of how much each head writes into the residual stream.

    The colour scale (Viridis: dark small, yellow large, every step a distinct colour) runs from 0 to the largest
    norm, or, with ``clip_outliers``, to Tukey's far-out fence (third quartile + 3 x the interquartile range) when
    some heads lie above it, so that one outlier head does not wash every other cell into one colour; those cells
    take the top colour, the colour bar says where it was cut, and every cell prints its value.

    Args:
        norms: ``[L, H]`` (for example :func:`head_write_norms`).
        title: figure title.
        clip_outliers: cut the colour scale at the far-out fence.

    Returns:
        A ``go.Figure``.

    Example:
        >>> from interp.viz.heads import head_norms_figure
        >>> fig = head_norms_figure([[0.1, 40.0], [3.0, 500.0], [30.0, 20.0]])
        >>> fig.data[0].zmax < 500
        True
    """
    z = to_numpy(norms, "norms", 2)
    finite = z[np.isfinite(z)]
    biggest = float(finite.max()) if finite.size else 1.0
    top = biggest
    if clip_outliers and finite.size >= 4:
        q1, q3 = np.quantile(finite, [0.25, 0.75])
        top = min(biggest, float(q3 + 3 * (q3 - q1)))
    label = "mean ||z W_O||" + (f"<br>(colours cut at {top:.3g};<br>max {biggest:.3g})" if biggest > top * 1.001 else "")
    fig = score_map(z, title=title, value=label, colorscale="Viridis", zmin=0, zmax=max(top, 1e-12),
                    text_format=".1f" if biggest >= 10 else ".2f")
    fig.update_traces(colorbar=dict(title=dict(text=label, side="right"), thickness=18, len=0.9, tickformat=".3g"),
                      hovertemplate="layer %{y} head %{x}<br>mean ||z W_O|| %{z:.4g}<extra></extra>")
    return fig


def _kind_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per head: its kinds (highest score first), every kind as text, and hover text."""
    rows = []
    for (layer, head), g in df.groupby(["layer", "head"], sort=True):
        g = g.sort_values("score", ascending=False) if "score" in g.columns else g
        kinds = [str(k) for k in g["kind"]]
        real = [k for k in kinds if k.lower() not in _NO_KIND]
        parts = []
        for _, r in g.iterrows():
            line = f"{html.escape(str(r['kind']))}"
            if "score" in g.columns and pd.notna(r["score"]):
                line += f" (score {float(r['score']):.3f})"
            if "low" in g.columns and pd.notna(r["low"]):
                line += f" [{float(r['low']):.3f}, {float(r['high']):.3f}]"
            if "uncertain" in g.columns and pd.notna(r["uncertain"]) and bool(r["uncertain"]):
                line += " UNCERTAIN: the interval straddles the threshold"
            if "evidence" in g.columns and pd.notna(r["evidence"]) and str(r["evidence"]):
                line += f": {html.escape(str(r['evidence']))}"
            parts.append(line)
        shown = list(dict.fromkeys(real)) or kinds[:1]
        rows.append({"layer": int(layer), "head": int(head), "kinds": shown, "main": shown[0],
                     "all": ", ".join(shown), "hover": "<br>".join(parts)})
    return pd.DataFrame(rows)


#: Fixed colours for the kinds classify_heads reports (the same kind looks the same in every figure); other kinds
#: take the next free colour of a qualitative palette.
KIND_COLOURS = {
    "induction": "#d62728", "previous-token": "#1f77b4", "duplicate-token": "#9467bd",
    "positional:first": "#bcbd22", "positional:delimiter": "#8c564b", "positional:0": "#17becf",
    "positional:-1": "#aec7e8", "positional:-2": "#98df8a", "positional:-3": "#c5b0d5",
    "positional:+1": "#ffbb78", "positional:+2": "#f7b6d2", "positional:+3": "#c49c94",
    # One registered kind, two labels: the negative name mover gets a lighter shade of the name mover's colour.
    "negative-name-mover": "#e59866",
}
# Colours for the other kinds (syntactic:*, coreference:*...): no reds or blues, which mean induction and
# previous-token, and far enough apart to tell neighbouring stripes apart.
_OTHER_COLOURS = ("#ff7f0e", "#2ca02c", "#e377c2", "#393b79", "#8c6d31", "#7b4173", "#e7ba52",
                  "#636363", "#fd8d3c", "#756bb1", "#637939", "#de9ed6", "#bd9e39", "#a1d99b", "#6b6ecf",
                  "#fdd0a2", "#843c39", "#bcbddc", "#cedb9c")
#: At most this many kinds get a stripe of their own in a cell (hover and the legend still name every kind).
MAX_STRIPES = 4


def _legend_source(label: str) -> str:
    """The paper a registered kind's score comes from ("" for labels no registered kind writes)."""
    from ..analysis.kinds import kind_of_label

    kind = kind_of_label(label)
    return kind.source if kind is not None else ""


def _registry_colour(label: str) -> str | None:
    """The colour a registered head kind asks for (:class:`interp.analysis.kinds.HeadKind`), if any."""
    from ..analysis.kinds import kind_of_label

    kind = kind_of_label(label)
    return kind.colour if kind is not None else None


def kind_colours(kinds: Sequence[str]) -> dict[str, str]:
    """A distinct colour per kind: :data:`KIND_COLOURS` for the known ones, then the colour a registered kind
    asks for (:func:`interp.analysis.kinds.head_kinds`), grey for "no kind", then a palette.

    Args:
        kinds: the kind labels to colour.

    Returns:
        ``{label: "#rrggbb"}``.

    Example:
        >>> from interp.viz.heads import kind_colours
        >>> kind_colours(["induction", "sink", "syntactic:nsubj"])["induction"]
        '#d62728'
    """
    from ..analysis.kinds import head_kinds

    taken = set(KIND_COLOURS.values()) | {k.colour for k in head_kinds().values() if k.colour}
    palette = [c for c in _OTHER_COLOURS if c not in taken]
    out, free = {}, iter(palette * (1 + len(kinds) // max(1, len(palette))))
    for k in kinds:
        out[k] = _GREY if k.lower() in _NO_KIND else KIND_COLOURS.get(k) or _registry_colour(k) or next(free)
    return out


def head_map(report: Any, *, n_layers: int | None = None, n_heads: int | None = None,
             title: str = "head taxonomy") -> go.Figure:
    """The taxonomy map: each ``[layer, head]`` cell split into one stripe per kind the head carries.

    Args:
        report: a ``HeadReport`` (``.df``) or a DataFrame with ``layer``, ``head``, ``kind`` and optionally
            ``score`` and ``evidence``. A head may appear in several rows (several kinds): its cell is split
            into vertical stripes, one per kind (highest score first, at most :data:`MAX_STRIPES`), and hover
            lists them all. Heads without a row are grey ("no kind").
        n_layers, n_heads: the grid size (default: the report's ``n_layers``/``n_heads`` attributes, else the
            largest layer and head in the table).
        title: figure title.

    Returns:
        A ``go.Figure``: a heatmap of stripes plus a legend entry for every kind present on any head.

    Raises:
        ValueError: required columns are missing or the table is empty.

    Example:
        >>> import pandas as pd
        >>> from interp.viz.heads import head_map
        >>> fig = head_map(pd.DataFrame({"layer": [0, 1, 1], "head": [0, 0, 0],
        ...                              "kind": ["previous-token", "induction", "positional:first"]}))
        >>> sorted(t.name for t in fig.data if t.type == "scatter" and t.name)
        ['induction', 'positional:first', 'previous-token']
    """
    df = as_frame(report, "report")
    missing = [c for c in ("layer", "head", "kind") if c not in df.columns]
    if missing:
        raise ValueError(f"head table lacks column(s) {missing}; it has {list(df.columns)}")
    L = int(n_layers or getattr(report, "n_layers", None) or 0)  # 0: unknown, from the table below
    H = int(n_heads or getattr(report, "n_heads", None) or 0)
    if df.empty and not (L and H):
        raise ValueError("head table is empty and n_layers/n_heads are unknown")
    table = (_kind_table(df) if not df.empty
             else pd.DataFrame(columns=["layer", "head", "kinds", "main", "all", "hover"]))
    if not df.empty:
        L = max(L, int(table["layer"].max()) + 1)
        H = max(H, int(table["head"].max()) + 1)
    # A pruned model's layers may have fewer heads (HeadReport.layer_heads): the missing cells stay empty.
    given = getattr(report, "layer_heads", None)
    layer_heads = list(given) if given is not None and len(given) == L else [H] * L
    unclassified = sum(min(h, H) for h in layer_heads) - len(table)
    present = {k for ks in table["kinds"] for k in ks}
    kinds = sorted(present | ({_UNCLASSIFIED} if unclassified else set()), key=lambda k: (k.lower() in _NO_KIND, k))
    colour = kind_colours(kinds)
    code = {k: i for i, k in enumerate(kinds)}
    most = max([min(len(ks), MAX_STRIPES) for ks in table["kinds"]] or [1])
    S = int(np.lcm.reduce(np.arange(1, most + 1)))  # stripes per cell: any count up to `most` divides it evenly
    # Heads without a row get the grey "no kind" code; removed heads stay NaN (blank).
    z = np.full((L, H * S), float(code[_UNCLASSIFIED]) if unclassified else np.nan)  # [L, H * S]
    hover = np.full((L, H), "no kind found", dtype=object)
    for layer, n in enumerate(layer_heads):
        z[layer, n * S:] = np.nan
        hover[layer, n:] = "removed"
    labels = []
    for r in table.itertuples():
        drawn = r.kinds[:MAX_STRIPES]
        width = S // len(drawn)
        for i, k in enumerate(drawn):
            z[r.layer, r.head * S + i * width: r.head * S + (i + 1) * width] = code[k]
        more = len(r.kinds) - len(drawn)
        hover[r.layer, r.head] = r.hover + (f"<br>({more} more kinds than stripes)" if more > 0 else "")
        labels.append((r.head, r.layer, "<br>".join(k.replace("_", " ") for k in r.kinds)))
    n = max(1, len(kinds))
    # A stepwise colour scale: code i covers [i/n, (i+1)/n] of the normalised range.
    scale = [[0.0, _GREY], [1.0, _GREY]] if not kinds else []
    for i, k in enumerate(kinds):
        scale += [[i / n, colour[k]], [(i + 1) / n, colour[k]]]
    x = (np.arange(H * S) + 0.5) / S - 0.5  # stripe centres: head h spans [h - 0.5, h + 0.5]
    heads = np.repeat(np.arange(H), S)  # [H * S]: the head of each stripe
    custom = np.empty((L, H * S, 2), dtype=object)
    custom[:, :, 0] = heads[None, :]
    custom[:, :, 1] = hover[:, heads]
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=list(range(L)), colorscale=scale, zmin=-0.5, zmax=n - 0.5, showscale=False,
        customdata=custom, hovertemplate="layer %{y} head %{customdata[0]}<br>%{customdata[1]}<extra></extra>"))
    big = L <= 12 and H <= 16  # room to print the kinds in each cell; otherwise hover tells
    if big and labels:
        fig.add_trace(go.Scatter(x=[h for h, _, _ in labels], y=[lay for _, lay, _ in labels], mode="text",
                                 text=[t for _, _, t in labels], textfont=dict(size=10), hoverinfo="skip",
                                 showlegend=False))
    for k in kinds:  # legend: one invisible marker per kind present on any head, named as the registry names it
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=k.replace("_", " "),
                                 marker=dict(size=12, color=colour[k], symbol="square"),
                                 meta=_legend_source(k)))
    # White borders between cells (the stripes of one cell touch).
    lines = [dict(type="line", x0=h + 0.5, x1=h + 0.5, y0=-0.5, y1=L - 0.5) for h in range(H - 1)]
    lines += [dict(type="line", x0=-0.5, x1=H - 0.5, y0=lay + 0.5, y1=lay + 0.5) for lay in range(L - 1)]
    fig.update_layout(shapes=[dict(**ln, line=dict(color="white", width=3), layer="above") for ln in lines])
    _axes(fig, L, H)
    fig.update_xaxes(range=[-0.5, H - 0.5], showgrid=False, zeroline=False)
    fig.update_yaxes(range=[L - 0.5, -0.5], autorange=None, showgrid=False, zeroline=False)
    fig.update_layout(title=title, height=max(260, (60 if big else 26) * L + 140), plot_bgcolor="white",
                      legend=dict(title="kind"), margin=dict(l=10, r=10, t=50, b=10))
    return fig
