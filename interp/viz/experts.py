"""Mixture-of-experts routing: the share of tokens each expert receives per layer
(:class:`interp.analysis.experts.ExpertStats`)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go


def expert_share_figure(stats: Any, *, title: str = "token share per expert") -> go.Figure:
    """A heatmap of token share (layers x experts); each row's label carries its routing entropy and balance.

    Args:
        stats: an :class:`~interp.analysis.experts.ExpertStats` (``layers``, ``share`` ``[L_moe, E]``,
            ``token_entropy``, ``load_entropy``, ``n_tokens``, ``top_k``).
        title: the figure title.

    Returns:
        A ``go.Figure`` with one heatmap trace; ``1 / E`` (a balanced router) is the colour scale's midpoint.

    Raises:
        ValueError: ``stats`` holds no layer.

    Example:
        >>> from interp.viz.experts import expert_share_figure
        >>> import torch
        >>> from interp.analysis.experts import ExpertStats
        >>> stats = ExpertStats(layers=[1], share=torch.full((1, 4), 0.25), token_entropy=torch.tensor([1.2]),
        ...                     load_entropy=torch.tensor([1.0]), n_tokens=10, top_k=2)
        >>> len(expert_share_figure(stats).data)
        1
    """
    share = stats.share
    if share.dim() != 2 or share.shape[0] == 0 or len(stats.layers) != share.shape[0]:
        raise ValueError(f"stats.share must be [MoE layers, experts] with one row per layer in stats.layers, "
                         f"got shape {tuple(share.shape)} for layers {stats.layers}")
    E = share.shape[1]
    rows = [f"L{layer}  H={float(h):.2f}  balance={float(b):.2f}"
            for layer, h, b in zip(stats.layers, stats.token_entropy, stats.load_entropy)]
    fig = go.Figure(go.Heatmap(z=share.tolist(), x=[f"E{e}" for e in range(E)], y=rows, colorscale="RdBu_r",
                               zmid=1.0 / E, colorbar={"title": "share"},
                               hovertemplate="%{y}<br>%{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"{title} ({stats.n_tokens} tokens, top-{stats.top_k}; H: routing entropy, nats)",
                      template="plotly_white", xaxis_title="expert", yaxis={"autorange": "reversed"})
    return fig
