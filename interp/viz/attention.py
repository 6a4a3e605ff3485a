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
) -> go.Figure:
    """All heads of one layer as small heatmaps, ``cols`` per row, one shared colour scale.

    Args:
        patterns: ``[n_heads, query_pos, key_pos]``.
        tokens: token strings for hover text (axes stay unlabelled: the panels are small).
        layer: used in the title and subplot titles.
        cols: panels per row.
        head_labels: subplot titles (default ``"L{layer}H{h}"``).

    Returns:
        A ``go.Figure`` with one heatmap per head.

    Raises:
        ValueError: ``patterns`` is not 3-D or ``cols`` < 1.

    Example:
        >>> layer_heads(trace.pattern(0)[0], model.to_str_tokens(tokens[0]), layer=0)
    """
    z = to_numpy(patterns, "patterns", 3)
    if cols < 1:
        raise ValueError(f"cols={cols} must be >= 1")
    H, T, S = z.shape
    labels = token_labels(tokens, T, "tokens")
    k_labels = labels if S == T else token_labels(None, S)
    prefix = "" if layer is None else f"L{layer}"
    titles = list(head_labels) if head_labels is not None else [f"{prefix}H{h}" for h in range(H)]
    cols = min(cols, H)
    rows = math.ceil(H / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.02,
                        vertical_spacing=0.06 if rows > 1 else 0.02)
    for h in range(H):
        fig.add_trace(_pattern_trace(z[h], labels, k_labels, coloraxis="coloraxis", name=titles[h]),
                      row=h // cols + 1, col=h % cols + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_layout(coloraxis=dict(colorscale=PATTERN_SCALE, cmin=0, cmax=1, colorbar=dict(title="weight")),
                      title=None if layer is None else f"layer {layer}: all heads",
                      height=max(260, 230 * rows), margin=dict(l=10, r=10, t=60, b=10))
    return fig


def head_grid(
    patterns: Any,
    tokens: Sequence[str] | None = None,
    *,
    batch: int = 0,
    layers: Sequence[int] | None = None,
) -> go.Figure:
    """A layer x head grid of small attention patterns (rows are layers, columns heads).

    Args:
        patterns: ``[L, H, T, S]``, ``[L, B, H, T, S]`` (as ``Trace.patterns()``; ``batch`` picks the
            sequence) or a :class:`~interp.Trace` with recorded patterns.
        tokens: token strings for hover text (default: the trace's, when it has them).
        batch: which sequence of a batched input to draw.
        layers: row labels (the layers the patterns belong to; default ``0..L-1``).

    Returns:
        A ``go.Figure`` of ``L x H`` heatmaps sharing one colour scale.

    Raises:
        ValueError: wrong rank or ``batch`` out of range.

    Example:
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
    fig = make_subplots(rows=L, cols=H, horizontal_spacing=0.01, vertical_spacing=0.02,
                        row_titles=[f"L{layer}" for layer in layers],
                        column_titles=[f"H{h}" for h in range(H)])
    for i in range(L):
        for h in range(H):
            fig.add_trace(_pattern_trace(z[i, h], labels, k_labels, coloraxis="coloraxis",
                                         name=f"L{layers[i]}H{h}"), row=i + 1, col=h + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    cell = 90 if H <= 8 else 70
    fig.update_layout(coloraxis=dict(colorscale=PATTERN_SCALE, cmin=0, cmax=1, colorbar=dict(title="weight")),
                      height=max(240, cell * L + 110), margin=dict(l=10, r=40, t=80, b=10),
                      title="attention patterns: layers x heads")
    return fig
