"""Plotly figures for interp: every function returns a ``plotly.graph_objects.Figure``.

No Streamlit here: notebooks display the figures inline (``fig`` as the last expression of a cell, or
``fig.show()``), the dashboard (interp/app/dashboard.py) embeds them with ``st.plotly_chart``.

Example:
    >>> from interp.examples import model, tokens
    >>> from interp import viz
    >>> _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
    >>> viz.attention_heatmap(trace.pattern(0)[0, 1], model.to_str_tokens(tokens[0]))
    >>> viz.head_grid(trace)
    >>> viz.attention_view(model, tokens[:1])   # interactive: hover a token
"""

from .attention import attention_heatmap, head_grid, layer_heads
from .attention_view import AttentionView, attention_view
from .coreference import coreference_figure
from .cost import flops_figure, kv_cache_figure
from .experts import expert_share_figure
from .export import save_figure
from .heads import (
    INDUCTION_COLUMNS,
    head_map,
    head_norms_figure,
    head_write_norms,
    induction_map,
    positional_map,
    score_map,
    score_maps,
)
from .patching import composition_heatmap, logit_attribution_bar, patching_heatmap
from .pruning import pruning_curves

__all__ = [
    "AttentionView", "attention_view", "composition_heatmap", "expert_share_figure", "logit_attribution_bar",
    "patching_heatmap",
    "INDUCTION_COLUMNS", "attention_heatmap", "coreference_figure", "flops_figure", "head_grid", "head_map",
    "head_norms_figure",
    "head_write_norms", "induction_map", "kv_cache_figure", "layer_heads", "positional_map", "pruning_curves",
    "save_figure", "score_map", "score_maps",
]
