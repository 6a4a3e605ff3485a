"""Attention patterns: one head, all heads of a layer, or the layer x head grid, on the sidebar's text."""

from __future__ import annotations

from typing import Any

import numpy as np
import streamlit as st
import torch

from interp import viz
from interp.app.disk_cache import cost_caption, disk_cached
from interp.app.heads import head_counts, kv_heads
from interp.app.model_picker import ModelKey, load_model
from interp.app.page import Page, PageContext

MAX_GRID_TOKENS = 96  # the layer x head grid draws L*H heatmaps: keep each small enough for the browser


def _pattern_data(key: ModelKey, ids: tuple[int, ...]) -> dict[str, Any]:
    model = load_model(*key)
    tokens = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        _, trace = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_result")))
    counts = head_counts(model)
    H, T = max(counts, default=0), len(ids)
    # Layers may hold different head counts (a pruned model): a head a layer lacks is NaN (drawn blank).
    patterns = np.full((len(counts), H, T, T), np.nan, dtype=np.float32)  # [L, H_max, T, S]
    norms = np.full((len(counts), H), np.nan)  # [L, H_max]
    for layer, n in enumerate(counts):
        if n:
            patterns[layer, :n] = trace.pattern(layer)[0].float().numpy()  # [H_l, T, S]
            norms[layer, :n] = trace.head_out(layer)[0].float().norm(dim=-1).mean(0).numpy()  # [T, H_l] -> [H_l]
    return {"patterns": patterns, "norms": norms, "n_heads": counts,
            # A checkpoint without a tokenizer still has token ids to label the axes with.
            "str_tokens": model.to_str_tokens(tokens) if model.tokenizer is not None else [f"t{i}" for i in ids]}


pattern_cached = disk_cached("patterns", "Running the model")(_pattern_data)


def pattern_data(key: ModelKey, ids: tuple[int, ...]) -> dict[str, Any]:
    """Attention patterns ``[L, H_max, T, S]`` and per-head write norms ``[L, H_max]`` of ``ids`` (NaN for heads
    a layer lacks), the heads per layer and the token labels; disk-cached.

    Args:
        key: the model's key.
        ids: the token ids.

    Returns:
        ``{"patterns", "norms", "n_heads", "str_tokens"}``.
    """
    value: dict[str, Any] = pattern_cached(key, ids)["value"]
    return value


pattern_data.clear = pattern_cached.clear  # type: ignore[attr-defined]


def render(ctx: PageContext) -> None:
    """Draw the page (needs the model and the text's ids)."""
    assert ctx.key is not None and ctx.model is not None and ctx.ids is not None
    key, model, ids = ctx.key, ctx.model, ctx.ids
    result = pattern_cached(key, tuple(ids[0].tolist()))
    data = result["value"]
    st.caption(cost_caption(result, f"one forward pass over the {ids.shape[1]} tokens of the input"))
    pats, toks = data["patterns"], data["str_tokens"]
    counts = data.get("n_heads") or [pats.shape[1]] * pats.shape[0]
    L, T = pats.shape[0], pats.shape[2]
    uniform = len(set(counts)) == 1
    views = ["One head", "All heads of a layer"] + (["All layers x heads"] if uniform else [])
    view = st.radio("View", views, horizontal=True, key="attn_view")
    if not uniform:
        st.caption(f"Heads per layer: {counts} (a pruned model): the layer x head grid needs equal counts.")
    if view == "One head":
        c1, c2 = st.columns(2)
        layer = int(c1.selectbox("Layer", [i for i in range(L) if counts[i]], key="attn_layer") or 0)
        # Per-layer head counts: one box per count, so a head picked in a wider layer is never out of range.
        head = int(c2.selectbox("Head", range(counts[layer]), key="attn_head" if uniform else f"attn_head_{counts[layer]}")
                   or 0)
        st.plotly_chart(viz.attention_heatmap(pats[layer, head], toks, title=f"layer {layer}, head {head}"),
                        width="stretch", key="fig_attn_head")
        top = pats[layer, head].argmax(-1)
        st.caption("Each query's strongest key: " + ", ".join(
            f"{toks[q]} → {toks[k]}" for q, k in list(enumerate(top))[: min(T, 12)]) + (" ..." if T > 12 else ""))
    elif view == "All heads of a layer":
        layer = int(st.selectbox("Layer", [i for i in range(L) if counts[i]], key="attn_layer_all") or 0)
        st.plotly_chart(viz.layer_heads(pats[layer, :counts[layer]], toks, layer=layer, cols=min(counts[layer], 6),
                                        n_kv_heads=kv_heads(model)), width="stretch", key="fig_attn_layer")
    else:
        n = min(T, MAX_GRID_TOKENS)
        if n < T:
            st.warning(f"The grid shows the first {n} of {T} tokens (one small heatmap per head).")
        st.plotly_chart(viz.head_grid(pats[:, :, :n, :n], toks[:n], n_kv_heads=kv_heads(model)), width="stretch",
                        key="fig_attn_grid")


PAGE = Page("Attention patterns", "attention", render, needs="text")
