"""Attention-pattern figures: one head as a labelled heatmap, all heads of a layer, a layer x head grid."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import PATTERN_SCALE, to_numpy, token_labels

_HOVER = "query %{customdata[0]}<br>key %{customdata[1]}<br>weight %{z:.3f}<extra></extra>"


def _hover_data(q_labels: list[str], k_labels: list[str]) -> np.ndarray:
    """``[T, S, 2]`` strings "pos: token" for query and key, so hover names both tokens of every cell."""
    q = [f"{i}: {t}" for i, t in enumerate(q_labels)]
    k = [f"{j}: {t}" for j, t in enumerate(k_labels)]
    data = np.empty((len(q), len(k), 2), dtype=object)
    data[:, :, 0] = np.array(q, dtype=object)[:, None]
    data[:, :, 1] = np.array(k, dtype=object)[None, :]
    return data


def _pattern_trace(pattern: np.ndarray, q_labels: list[str], k_labels: list[str], **kwargs: Any) -> go.Heatmap:
    # Positions on numeric axes (labels via tick text): a categorical axis would merge repeated tokens.
    return go.Heatmap(z=pattern, x=list(range(pattern.shape[1])), y=list(range(pattern.shape[0])),
                      customdata=_hover_data(q_labels, k_labels), hovertemplate=_HOVER, **kwargs)


def attention_heatmap(
    pattern: Any,
    tokens: Sequence[str] | None = None,
    *,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    zmax: float | None = 1.0,
) -> go.Figure:
    """One head's attention pattern: queries down, keys across, token labels and hover text.

    Args:
        pattern: ``[query_pos, key_pos]`` weights (tensor, array or nested list).
        tokens: query token strings (also the keys' unless ``key_tokens`` is given); positions if ``None``.
        key_tokens: key token strings when keys differ from queries (cross-attention, a KV cache).
        title: figure title.
        zmax: top of the colour scale (1.0; ``None`` scales to the largest weight).

    Returns:
        A ``go.Figure`` with one heatmap whose hover shows query token, key token and weight.

    Raises:
        ValueError: ``pattern`` is not 2-D or a label list has the wrong length.

    Example:
        >>> from interp.viz.attention import attention_heatmap
        >>> from interp.examples import model, tokens
        >>> _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
        >>> attention_heatmap(trace.pattern(1)[0, 3], model.to_str_tokens(tokens[0])).show()
    """
    z = to_numpy(pattern, "pattern", 2)
    T, S = z.shape
    q_labels = token_labels(tokens, T, "tokens")
    if key_tokens is None and tokens is not None and S != T:
        # A cached decode step: the queries are the last T of the S keys.
        raise ValueError(f"pattern is {T}x{S}: pass key_tokens for the {S} keys")
    k_labels = token_labels(key_tokens if key_tokens is not None else tokens, S, "key_tokens")
    fig = go.Figure(_pattern_trace(z, q_labels, k_labels, colorscale=PATTERN_SCALE, zmin=0, zmax=zmax,
                                   colorbar=dict(title="weight")))
    side = max(320, min(900, 22 * max(T, S) + 160))
    fig.update_layout(
        title=title, width=None, height=side, margin=dict(l=10, r=10, t=50 if title else 20, b=10),
        xaxis=dict(title="key", tickmode="array", tickvals=list(range(S)), ticktext=k_labels, side="top",
                   tickangle=-60),
        yaxis=dict(title="query", tickmode="array", tickvals=list(range(T)), ticktext=q_labels,
                   autorange="reversed"),
    )
    return fig


def layer_heads(
    patterns: Any,
    tokens: Sequence[str] | None = None,
    *,
    layer: int | None = None,
    cols: int = 4,
    head_labels: Sequence[str] | None = None,
    n_kv_heads: int | None = None,
) -> go.Figure:
    """All heads of one layer as small heatmaps, ``cols`` per row, one shared colour scale.

    Args:
        patterns: ``[n_heads, query_pos, key_pos]``.
        tokens: token strings for hover text, and for tick labels when they fit (up to 24 tokens).
        layer: used in the title and subplot titles.
        cols: panels per row.
        head_labels: subplot titles (default ``"L{layer}H{h}"``, with the K/V head for GQA).
        n_kv_heads: K/V heads of the layer (GQA): each title names its head's K/V group.

    Returns:
        A ``go.Figure`` with one heatmap per head.

    Raises:
        ValueError: ``patterns`` is not 3-D or ``cols`` < 1.

    Example:
        >>> from interp.viz.attention import layer_heads
        >>> from interp.examples import model, tokens, trace
        >>> layer_heads(trace.pattern(0)[0], model.to_str_tokens(tokens[0]), layer=0)
    """
    z = to_numpy(patterns, "patterns", 3)
    if cols < 1:
        raise ValueError(f"cols={cols} must be >= 1")
    H, T, S = z.shape
    labels = token_labels(tokens, T, "tokens")
    k_labels = labels if S == T else token_labels(None, S)
    prefix = "" if layer is None else f"L{layer}"
    group = _kv_group_size(H, n_kv_heads)
    kv = (lambda h: f" · kv{h // group}") if group > 1 else (lambda h: "")
    titles = list(head_labels) if head_labels is not None else [f"{prefix}H{h}{kv(h)}" for h in range(H)]
    cols = min(cols, H)
    rows = math.ceil(H / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.02,
                        vertical_spacing=0.06 if rows > 1 else 0.02)
    for h in range(H):
        fig.add_trace(_pattern_trace(z[h], labels, k_labels, coloraxis="coloraxis", name=titles[h]),
                      row=h // cols + 1, col=h % cols + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    if T <= MAX_TICK_TOKENS and S <= MAX_TICK_TOKENS:  # token ticks on the outer panels, where they fit
        for h in range(H):
            r, c = h // cols + 1, h % cols + 1
            if c == 1:
                _token_ticks(fig, "y", labels, row=r, col=c)
            if h + cols >= H:  # nothing below this panel
                _token_ticks(fig, "x", k_labels, row=r, col=c)
    fig.update_layout(coloraxis=dict(colorscale=PATTERN_SCALE, cmin=0, cmax=1, colorbar=dict(title="weight")),
                      title=None if layer is None else f"layer {layer}: all heads",
                      height=max(260, 230 * rows + (60 if T <= MAX_TICK_TOKENS else 0)),
                      margin=dict(l=10, r=10, t=60, b=10))
    return fig


#: Token tick labels are drawn on small panels only up to this many tokens (more would overlap).
MAX_TICK_TOKENS = 24
GRID_TICK_TOKENS = 16


def _kv_group_size(H: int, n_kv_heads: int | None) -> int:
    """Query heads per K/V head (1: no grouping to show)."""
    if n_kv_heads is None or n_kv_heads >= H:
        return 1
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1 or H % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads!r} must be a positive int dividing the {H} heads")
    return H // n_kv_heads


def _token_ticks(fig: go.Figure, axis: str, labels: list[str], *, row: int, col: int, size: int = 8) -> None:
    kw = dict(showticklabels=True, tickmode="array", tickvals=list(range(len(labels))), ticktext=labels,
              tickfont=dict(size=size), row=row, col=col)
    (fig.update_xaxes(tickangle=-90, **kw) if axis == "x" else fig.update_yaxes(**kw))


def head_grid(
    patterns: Any,
    tokens: Sequence[str] | None = None,
    *,
    batch: int = 0,
    layers: Sequence[int] | None = None,
    n_kv_heads: int | None = None,
) -> go.Figure:
    """A layer x head grid of small attention patterns (rows are layers, columns heads), with token ticks on the
    outer panels when the sequence is short and a line between K/V groups (GQA).

    Args:
        patterns: ``[L, H, T, S]``, ``[L, B, H, T, S]`` (as ``Trace.patterns()``; ``batch`` picks the
            sequence) or a :class:`~interp.Trace` with recorded patterns.
        tokens: token strings for hover text (default: the trace's, when it has them).
        batch: which sequence of a batched input to draw.
        layers: row labels (the layers the patterns belong to; default ``0..L-1``).
        n_kv_heads: K/V heads per layer (GQA): heads of one group share a column title tag and sit between
            separator lines.

    Returns:
        A ``go.Figure`` of ``L x H`` heatmaps sharing one colour scale.

    Raises:
        ValueError: wrong rank or ``batch`` out of range.

    Example:
        >>> from interp.viz.attention import head_grid
        >>> from interp.examples import model, tokens
        >>> _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
        >>> head_grid(trace)
    """
    if hasattr(patterns, "patterns") and hasattr(patterns, "meta"):  # a Trace
        trace = patterns
        if tokens is None and trace.str_tokens is not None:
            tokens = trace.str_tokens[batch] if batch < len(trace.str_tokens) else None
        if layers is None:
            layers = [layer for layer in trace.layers if f"blocks.{layer}.attn.hook_pattern" in trace]
        patterns = trace.patterns(layers)
    z = to_numpy(patterns, "patterns", (4, 5))
    if z.ndim == 5:
        if not 0 <= batch < z.shape[1]:
            raise ValueError(f"batch={batch} out of range for {z.shape[1]} sequences")
        z = z[:, batch]  # [L, B, H, T, S] -> [L, H, T, S]
    L, H, T, S = z.shape
    layers = list(range(L)) if layers is None else list(layers)
    if len(layers) != L:
        raise ValueError(f"layers has {len(layers)} entries for {L} rows of patterns")
    labels = token_labels(tokens, T, "tokens")
    k_labels = labels if S == T else token_labels(None, S)
    group = _kv_group_size(H, n_kv_heads)
    gap = 0.01 if group == 1 else 0.015
    v_gap = min(0.02, 0.12 / max(L - 1, 1))  # the gaps take at most 12% of the height, whatever L
    fig = make_subplots(rows=L, cols=H, horizontal_spacing=gap, vertical_spacing=v_gap,
                        row_titles=[f"L{layer}" for layer in layers],
                        column_titles=[f"H{h}" + (f" · kv{h // group}" if group > 1 else "") for h in range(H)])
    for i in range(L):
        for h in range(H):
            fig.add_trace(_pattern_trace(z[i, h], labels, k_labels, coloraxis="coloraxis",
                                         name=f"L{layers[i]}H{h}"), row=i + 1, col=h + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    ticks = T <= GRID_TICK_TOKENS and S <= GRID_TICK_TOKENS
    if ticks:  # token ticks on the left column and the bottom row
        for i in range(L):
            _token_ticks(fig, "y", labels, row=i + 1, col=1, size=7)
        for h in range(H):
            _token_ticks(fig, "x", k_labels, row=L, col=h + 1, size=7)
    if group > 1:  # a line between K/V groups, over the whole grid
        for h in range(group, H, group):
            left = fig.layout[f"xaxis{'' if h == 1 else h}"].domain[1]
            right = fig.layout[f"xaxis{h + 1}"].domain[0]
            fig.add_shape(type="line", xref="paper", yref="paper", x0=(left + right) / 2, x1=(left + right) / 2,
                          y0=0, y1=1, line=dict(color="#d6604d", width=2))
    # Square-ish cells: a row as tall as a column is wide on a ~1200 px page (SmolLM2's 9 heads: 120 px).
    cell = int(min(130, max(70, 1100 / H)))
    fig.update_layout(coloraxis=dict(colorscale=PATTERN_SCALE, cmin=0, cmax=1, colorbar=dict(title="weight")),
                      height=max(240, cell * L + 110 + (50 if ticks else 0)), margin=dict(l=10, r=40, t=80, b=10),
                      title="attention patterns: layers x heads" + (f" (lines: K/V groups of {group} heads)"
                                                                  if group > 1 else ""))
    return fig
