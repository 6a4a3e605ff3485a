"""Target heads against random head sets: the measure left after ablating the heads a claim is about, beside the
spread of the same measure after ablating random sets of the same size (``interp.analysis.ablate.compare_with_random``
tables)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go


def ablation_vs_random_figure(tables: Mapping[str, Any], *, title: str = "ablation: target heads vs random sets",
                              measure: str = "in-context gain left (nats)") -> go.Figure:
    """One column per table: random sets as grey dots, the target set as a red diamond, unablated as a line.

    Args:
        tables: ``{label: DataFrame}`` as returned by ``compare_with_random`` (rows ``none``, ``target``,
            ``random i``; columns ``set``, ``value``).
        title, measure: figure title and y-axis title.

    Returns:
        A ``go.Figure`` with three traces per table (random, target, unablated).

    Raises:
        ValueError: no tables, or a table without the ``none`` / ``target`` / random rows.

    Example:
        >>> import interp
        >>> from interp.viz.ablation import ablation_vs_random_figure
        >>> from interp.examples import model
        >>> df = interp.analysis.compare_with_random(lambda hs: sum(h for _, h in hs), [(1, 3)], model, n_draws=3)
        >>> ablation_vs_random_figure({"random/sum of head indices": df}).show()
    """
    if not tables:
        raise ValueError("ablation_vs_random_figure needs at least one table")
    fig = go.Figure()
    for i, (label, df) in enumerate(tables.items()):
        sets = list(df["set"])
        if "none" not in sets or "target" not in sets or not any(str(s).startswith("random") for s in sets):
            raise ValueError(f"table {label!r} lacks the none / target / random rows: sets={sets[:5]!r}")
        vals = dict(zip(df["set"], df["value"]))
        rand = [float(v) for s, v in zip(df["set"], df["value"]) if str(s).startswith("random")]
        show = i == 0
        fig.add_trace(go.Scatter(x=[label] * len(rand), y=rand, mode="markers", name="random sets",
                                 marker={"color": "grey", "size": 7, "opacity": 0.6}, showlegend=show,
                                 legendgroup="random"))
        fig.add_trace(go.Scatter(x=[label], y=[float(vals["target"])], mode="markers", name="target heads",
                                 marker={"color": "crimson", "size": 13, "symbol": "diamond"}, showlegend=show,
                                 legendgroup="target"))
        fig.add_trace(go.Scatter(x=[label], y=[float(vals["none"])], mode="markers", name="nothing ablated",
                                 marker={"color": "black", "size": 16, "symbol": "line-ew-open", "line": {"width": 3}},
                                 showlegend=show, legendgroup="none"))
    fig.update_layout(title=title, template="plotly_white", yaxis_title=measure)
    fig.add_hline(y=0, line={"color": "lightgrey", "dash": "dot"})
    return fig
