"""Induction: random token sequences repeated once; per-head scores, the in-context gain, and the strongest
induction head's pattern."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import streamlit as st

import interp
from interp import progress, viz
from interp.app.disk_cache import cost_caption, disk_cached
from interp.app.inputs import default_sizes
from interp.app.model_picker import ModelKey, load_model
from interp.app.page import Page, PageContext

T = TypeVar("T")


@disk_cached("induction", "Scoring heads on repeated sequences")
def induction_data(key: ModelKey, n_seqs: int, half_len: int, batch: int = 32) -> dict[str, Any]:
    """Induction scores on ``n_seqs`` repeated random sequences, one example sequence, and (for a decoder with an
    unembedding) the loss on each half (disk-cached)."""
    from interp.analysis import induction_scores, repeated_tokens_for

    model = load_model(*key)
    tokens = repeated_tokens_for(model, n_seqs, half_len, seed=0)
    out: dict[str, Any] = {"scores": induction_scores(model, tokens, batch_size=batch),
                           "example": tokens[0].tolist()}
    cfg = model.cfg
    if cfg.causal and cfg.unembed:
        from interp.analysis import in_context_gain

        bos = tokens.shape[1] == 2 * half_len + 1
        out["losses"] = in_context_gain(model, tokens, half_len, bos=bos)
    return out


def partial_induction_map(model: interp.Transformer, slot: Any) -> Callable[[progress.Event], None]:
    """A progress listener that draws the induction scores folded so far into ``slot`` (an ``st.empty``), layer
    by layer as the pass goes: the layers not reached yet are blank.

    Args:
        model: the model being scored.
        slot: where to draw.

    Returns:
        The listener.
    """
    from interp.analysis.induction import induction_table

    L = model.cfg.n_layers

    def draw(event: progress.Event) -> None:
        if "induction" not in event.desc or not event.state or not event.total:
            return
        reached = L if event.done >= 1 else max(1, round(event.done * L))
        where = f"layers 0-{reached - 1}" if event.done < 1 else f"{event.done:.1f} of {event.total} batches"
        try:
            fig = viz.induction_map(induction_table(model, list(event.state), 0),
                                    title=f"partial results, so far: {where}")
        except Exception:  # noqa: BLE001 - nothing folded yet (all NaN): nothing to draw yet
            return
        slot.plotly_chart(fig, width="stretch", key=f"fig_partial_{time.monotonic_ns()}")

    return draw


def with_partial_induction_map(model: interp.Transformer, compute: Callable[[Callable[[progress.Event], None]], T],
                               failure: str) -> T | None:
    """``compute(listener)``, drawing the induction scores folded so far while it runs (see
    :func:`partial_induction_map`); the partial map is cleared when it ends. An error is shown, not raised.

    Args:
        model: the model being scored.
        compute: the cached computation, given the progress listener.
        failure: what the error message says could not be done (``"Could not score the heads"``).

    Returns:
        What ``compute`` returned, or None after showing ``failure: <error>``.
    """
    slot = st.empty()
    try:
        result = compute(partial_induction_map(model, slot))
    except Exception as e:  # noqa: BLE001 - shown to the user
        slot.empty()
        st.error(f"{failure}: {e}")
        return None
    slot.empty()
    return result


def render(ctx: PageContext) -> None:
    """Draw the page (needs the model)."""
    from interp.app.views.attention import pattern_data

    assert ctx.key is not None and ctx.model is not None
    key, model = ctx.key, ctx.model
    st.markdown("Random token sequences repeated once: an **induction head** attends from the second copy of a "
                "token to the token after its first copy, and a **previous-token** head feeds it.")
    c1, c2 = st.columns(2)
    max_half = max(2, min(25, (model.cfg.n_ctx - 2) // 2))
    sizes = default_sizes(model)
    half_len = c1.slider("Length of the repeated half", 2, max_half, min(sizes["ind_half"], max_half), key="ind_half")
    n_seqs = c2.slider("Sequences", 4, 64, sizes["ind_seqs"], step=4, key="ind_n")
    result = with_partial_induction_map(model, lambda partial: induction_data(
        key, n_seqs, half_len, sizes["batch"], partial=partial), "Could not score the heads")
    if result is None:
        return
    data = result["value"]
    st.caption(cost_caption(result, f"data: {n_seqs} random sequences of {half_len} tokens, each repeated once "
                                    f"(default {sizes['ind_seqs']} for this model)"))
    scores = data["scores"]
    if "losses" in data:
        loss = data["losses"]
        m1, m2, m3 = st.columns(3)
        m1.metric("Loss, first half (nats)", f"{loss['first']:.3f}")
        m2.metric("Loss, repeated half", f"{loss['repeated']:.3f}", delta=f"{-loss['gain']:.3f}",
                  delta_color="inverse")
        m3.metric("In-context gain", f"{loss['gain']:.3f}")
    st.plotly_chart(viz.induction_map(scores), width="stretch", key="fig_induction_map")
    best = scores.sort_values("induction", ascending=False).iloc[0]
    layer, head = int(best["layer"]), int(best["head"])
    st.subheader(f"Strongest induction head: L{layer}H{head} (score {best['induction']:.2f})")
    pats = pattern_data(key, tuple(data["example"]))
    st.plotly_chart(viz.attention_heatmap(pats["patterns"][layer, head], pats["str_tokens"],
                                          title=f"L{layer}H{head} on a repeated sequence"),
                    width="stretch", key="fig_induction_head")
    with st.expander("Scores (table)"):
        st.dataframe(scores, width="stretch", hide_index=True)


PAGE = Page("Induction", "induction", render, needs="model")
