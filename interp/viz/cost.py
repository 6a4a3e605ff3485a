"""Figures of the cost calculators in :mod:`interp.flops`: KV-cache bytes by attention kind, FLOPs by operation."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..config import ModelConfig
from ..flops import flops_per_layer, format_bytes, format_flops, kv_cache_table

_KIND_LABEL = {"mha": "MHA", "gqa": "GQA", "mqa": "MQA", "mla": "MLA"}


def kv_cache_figure(
    cfg: ModelConfig | pd.DataFrame,
    *,
    batch: int = 1,
    tokens: int = 1,
    dtype: str | int = "fp16",
    n_kv_groups: int | None = None,
    kv_latent_dim: int | None = None,
    rope_dim: int | None = None,
    per_token: bool = True,
) -> go.Figure:
    """Bars of KV-cache size for MHA, GQA, MQA and MLA versions of one stack.

    Args:
        cfg: a config (see :func:`interp.flops.kv_cache_table` for the variants) or a table it returned.
        batch, tokens, dtype, n_kv_groups, kv_latent_dim, rope_dim: as :func:`interp.flops.kv_cache_table`.
        per_token: draw bytes per token (True) or the total for ``batch x tokens`` (False).

    Returns:
        A ``go.Figure``; each bar is labelled with its size (SI units) and its fraction of MHA.

    Example:
        >>> import interp
        >>> from interp.viz.cost import kv_cache_figure
        >>> kv_cache_figure(interp.flops.worked_example_config(), batch=32, tokens=4096, per_token=False)
    """
    table = cfg if isinstance(cfg, pd.DataFrame) else kv_cache_table(
        cfg, batch=batch, tokens=tokens, dtype=dtype, n_kv_groups=n_kv_groups, kv_latent_dim=kv_latent_dim,
        rope_dim=rope_dim)
    col = "bytes_per_token" if per_token else "total_bytes"
    labels = [f"MLA (latent {c})" if k == "mla" else f"{_KIND_LABEL.get(k, k.upper())} ({n:.3g} KV head{'' if n == 1 else 's'})"
              for k, n, c in zip(table["kind"], table["n_kv_heads"], table["cached_per_layer"])]
    colours = ["#1f77b4" if this else "#9ecae1" for this in table["this_model"]]
    fig = go.Figure(go.Bar(
        x=labels, y=table[col], marker_color=colours,
        text=[f"{format_bytes(v)}<br>{r:.1%} of MHA" for v, r in zip(table[col], table["vs_mha"])],
        textposition="outside", cliponaxis=False,
        hovertemplate="%{x}<br>%{y:,} bytes<extra></extra>"))
    what = "per token (all layers)" if per_token else f"for batch {batch} x {tokens} tokens"
    fig.update_layout(title=f"KV cache {what}", yaxis=dict(title="bytes", tickformat="~s", ticksuffix="B"),
                      xaxis_title=None, height=420,
                      margin=dict(l=10, r=10, t=60, b=10), showlegend=False)
    return fig


def flops_figure(
    cfg: ModelConfig | pd.DataFrame,
    *,
    seq_len: int = 1,
    batch: int = 1,
    kv_len: int | None = None,
) -> go.Figure:
    """Horizontal bars of one block's forward FLOPs by operation.

    Args:
        cfg: a config or the table :func:`interp.flops.flops_per_layer` returned.
        seq_len, batch, kv_len: as :func:`interp.flops.flops_per_layer`.

    Returns:
        A ``go.Figure`` with one bar per operation (attention operations blue, MLP orange).

    Example:
        >>> import interp
        >>> from interp.viz.cost import flops_figure
        >>> flops_figure(interp.flops.worked_example_config(), seq_len=4096)
    """
    table = cfg if isinstance(cfg, pd.DataFrame) else flops_per_layer(cfg, seq_len=seq_len, batch=batch,
                                                                      kv_len=kv_len)
    colours = ["#ff7f0e" if op.startswith("mlp") else "#1f77b4" for op in table["operation"]]
    total = table["flops"].sum()
    fig = go.Figure(go.Bar(
        y=table["operation"], x=table["flops"], orientation="h", marker_color=colours,
        text=[f"{format_flops(v)} ({s:.0%})" for v, s in zip(table["flops"], table["share"])],
        textposition="auto", hovertemplate="%{y}<br>%{x:,} FLOPs<extra></extra>"))
    fig.update_layout(title=f"FLOPs per layer by operation (total {format_flops(total)})",
                      xaxis=dict(title="FLOPs", tickformat="~s"), yaxis=dict(autorange="reversed"), height=max(300, 40 * len(table) + 120),
                      margin=dict(l=10, r=10, t=60, b=10), showlegend=False)
    return fig
