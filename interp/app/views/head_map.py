"""Head map: every head classified by the registered head kinds (:mod:`interp.analysis.kinds`), the kinds to
run picked from the registry, with each kind's threshold, reason and source beside the map."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

import interp
from interp import viz
from interp.analysis.kinds import HeadKind, head_kinds
from interp.app.disk_cache import cost_caption, disk_cached, file_option
from interp.app.heads import head_counts
from interp.app.inputs import EXAMPLE_SENTENCES, PRUNING_SENTENCES, default_sizes, reads_text
from interp.app.model_picker import ModelKey, load_model
from interp.app.page import Page, PageContext
from interp.app.views.attention import pattern_data
from interp.app.views.induction import with_partial_induction_map

#: Above this many heads the mass-by-target panel shows one layer, or the largest head per layer.
MAX_POSITIONAL_ROWS = 48
#: Session-state key of the kinds last picked (the selector's own value is dropped on other pages).
KINDS_VALUE = "_head_kinds_value"
#: The data a kind reads that the user supplies on this page, by the kind's data name.
USER_DATA = {"treebank": "conllu", "coref": "coref"}


def available_kinds(model: interp.Transformer, given: set[str]) -> dict[str, HeadKind]:
    """The registered kinds this page can run on ``model``, in registration order.

    A kind that reads a user's file (a treebank, coreference data) is offered once the file is given; a kind that
    needs ``texts=`` is offered for a model with a text tokenizer (the page passes its example sentences).

    Args:
        model: the model.
        given: the keywords of :func:`interp.analysis.classify_heads` the page has data for (``conllu``,
            ``coref``).

    Returns:
        ``{name: HeadKind}``.

    Example:
        >>> import interp
        >>> from interp.app.views.head_map import available_kinds
        >>> kinds = available_kinds(interp.load("random-tiny"), set())
        >>> "induction" in kinds, "syntactic" in kinds, "induction:natural" in kinds
        (True, False, False)
    """
    have = set(given) | ({"texts"} if reads_text(model) else set())
    out = {}
    for name, kind in head_kinds().items():
        if kind.data in USER_DATA and USER_DATA[kind.data] not in have:
            continue
        if any(n not in have for n in kind.needs):
            continue
        out[name] = kind
    return out


def kinds_table(kinds: list[HeadKind]) -> pd.DataFrame:
    """One row per kind: its name, the data it is measured on, its threshold with the reason, and its source.

    Example:
        >>> from interp.analysis.kinds import head_kinds
        >>> from interp.app.views.head_map import kinds_table
        >>> list(kinds_table([head_kinds()["induction"]]).columns)
        ['kind', 'data', 'threshold', 'reason', 'source']
    """
    return pd.DataFrame([{"kind": k.name, "data": k.data, "threshold": k.threshold, "reason": k.reason,
                          "source": k.source} for k in kinds], columns=["kind", "data", "threshold", "reason", "source"])


@disk_cached("head_report", "Classifying heads",
             options=lambda kinds, treebank, max_sentences, coref, n_texts, n_seqs, half_len, batch: {
                 "kinds": list(kinds), "treebank": file_option(treebank), "max_sentences": max_sentences,
                 "coref": file_option(coref), "n_texts": n_texts, "n_seqs": n_seqs, "half_len": half_len,
                 "batch": batch})
def head_report(key: ModelKey, kinds: tuple[str, ...], treebank: str | None, max_sentences: int, coref: str | None,
                n_texts: int, n_seqs: int, half_len: int, batch: int) -> Any:
    """:func:`interp.analysis.classify_heads` with the page's kinds and data (disk-cached)."""
    from interp.analysis import classify_heads

    model = load_model(*key)
    kwargs: dict[str, Any] = {"n_seqs": n_seqs, "half_len": half_len or None, "batch_size": batch,
                              "kinds": list(kinds)}
    if reads_text(model):
        kwargs["texts"] = (list(EXAMPLE_SENTENCES.values()) + PRUNING_SENTENCES)[:n_texts]
    if treebank:
        kwargs.update(conllu=treebank, max_sentences=max_sentences)
    if coref:
        kwargs["coref"] = coref
    return classify_heads(model, **kwargs)


def positional_columns(pos: pd.DataFrame) -> list[str]:
    """The mass columns worth drawing: offsets -2..+1 and first / delimiter, minus those no query can reach (the
    +1 column of a causal model is all NaN).

    Example:
        >>> import pandas as pd
        >>> from interp.app.views.head_map import positional_columns
        >>> positional_columns(pd.DataFrame({"mass_-1": [0.5], "mass_+1": [float("nan")], "x": [1]}))
        ['mass_-1']
    """
    wanted = [f"mass_{t}" for t in ("-2", "-1", "0", "+1", "first", "delimiter")]
    return [c for c in wanted if c in pos.columns and pos[c].notna().any()]


def _data_files(model: interp.Transformer) -> tuple[str | None, str | None]:
    """The treebank and coreference files typed on the page (the app hard-codes no data path)."""
    if not reads_text(model):
        return None, None
    treebank = coref = None
    ud = st.text_input("CoNLL-U treebank for syntactic heads (path; slower)", key="treebank_path").strip()
    if ud and not Path(ud).is_file():
        st.warning(f"No file at {ud!r}: syntactic heads skipped.")
    elif ud:
        treebank = ud
    gap = st.text_input("Coreference data for coreference heads (GAP .tsv or CorefUD .conllu path; slower)",
                        key="coref_path").strip()
    if gap and not Path(gap).is_file():
        st.warning(f"No file at {gap!r}: coreference heads skipped.")
    elif gap:
        coref = gap
    return treebank, coref


def choose_kinds(model: interp.Transformer, treebank: str | None, coref: str | None) -> list[str]:
    """The head-kind selector, fed by the registry: the kinds this model can run, the default kinds first
    selected (a kind whose data was just given joins the selection)."""
    given = {name for name, path in (("conllu", treebank), ("coref", coref)) if path}
    offered = available_kinds(model, given)
    defaults = [n for n, k in offered.items() if k.default]
    state = st.session_state
    # Streamlit forgets a widget's value on runs that do not draw it (another page): keep a copy under
    # KINDS_VALUE and restore the box from it.
    if state.get("_kinds_offered") != list(offered):
        # Another model or other data: keep what is still offered, and select newly offered default kinds.
        before = set(state.get("_kinds_offered") or [])
        kept = [n for n in state.get(KINDS_VALUE, defaults) if n in offered]
        state["head_kinds"] = kept + [n for n in defaults if n not in before and n not in kept]
        state["_kinds_offered"] = list(offered)
    elif "head_kinds" not in state:
        state["head_kinds"] = [n for n in state.get(KINDS_VALUE, defaults) if n in offered]
    picked = st.multiselect("Head kinds", list(offered), key="head_kinds",
                            help="the kinds of interp.analysis.head_kinds() this model can run; the new kinds "
                                 "(sink, copy suppression, successor, retrieval...) are opt-in")
    state[KINDS_VALUE] = list(picked)
    return [n for n in picked if n in offered]


def render(ctx: PageContext) -> None:
    """Draw the page (needs the model and the text's ids)."""
    assert ctx.key is not None and ctx.model is not None and ctx.ids is not None
    key, model, ids = ctx.key, ctx.model, ctx.ids
    st.markdown("Each head is classified by the registered head kinds: each kind's score, threshold and source "
                "are in the table below the map. Kinds that need a treebank or coreference data appear once "
                "the file is given.")
    treebank, coref = _data_files(model)
    kinds = choose_kinds(model, treebank, coref)
    if not kinds:
        st.info("Pick at least one head kind.")
        return
    sizes = default_sizes(model)
    with st.expander("Data sizes", expanded=False):
        c1, c2 = st.columns(2)
        n_texts = sizes["head_texts"]
        if reads_text(model):
            n_texts = c1.slider("Example sentences (positional pass)", 1,
                                len(EXAMPLE_SENTENCES) + len(PRUNING_SENTENCES), sizes["head_texts"], key="head_texts")
        n_seqs = c2.slider("Repeated random sequences (induction, copying)", 4, 64, sizes["head_seqs"], step=4,
                           key="head_seqs")
    result = with_partial_induction_map(model, lambda partial: head_report(
        key, tuple(kinds), treebank, 200, coref, n_texts, n_seqs, sizes["head_half"], sizes["batch"],
        partial=partial), f"Could not classify the heads with the kinds {kinds}")
    if result is None:
        return
    report = result["value"]
    data_words = f"{n_texts} example sentences" if reads_text(model) else "random tokens"
    half = sizes["head_half"] or "default"
    st.caption(cost_caption(result, f"data: {data_words} and {n_seqs} repeated random sequences (half length "
                                    f"{half}){', the treebank' if treebank else ''}"
                                    f"{', the coreference data' if coref else ''}"))
    st.plotly_chart(viz.head_map(report, title=f"head taxonomy of {model.name}"), width="stretch",
                    key="fig_head_map")
    with st.expander("The kinds run: threshold, reason, source", expanded=False):
        registry = head_kinds()
        st.dataframe(kinds_table([registry[n] for n in kinds]), width="stretch", hide_index=True, key="kinds_table")
    with st.expander("All kinds found (table)", expanded=False):
        st.dataframe(report.df, width="stretch", hide_index=True)
    for name, cor in getattr(report, "details", {}).items():
        if name.startswith("coreference:"):
            st.plotly_chart(viz.coreference_figure(cor, title=f"{name}: pronoun -> antecedent accuracy"),
                            width="stretch", key=f"fig_{name}")
    data = pattern_data(key, tuple(ids[0].tolist()))
    c1, c2 = st.columns(2)
    with c1:
        st.plotly_chart(viz.head_norms_figure(data["norms"], title="residual-write norm on the input text"),
                        width="stretch", key="fig_head_norms")
    pos = report.details.get("positional") if hasattr(report, "details") else None
    with c2:
        if pos is not None:
            _positional_panel(model, pos)


def _positional_panel(model: interp.Transformer, pos: pd.DataFrame) -> None:
    cols = positional_columns(pos) or None
    L, n_heads = model.cfg.n_layers, sum(head_counts(model))
    if n_heads <= MAX_POSITIONAL_ROWS:
        fig = viz.positional_map(pos, cols, title="attention mass by target")
    else:
        rows = str(st.selectbox("Rows", ["largest head of each layer", *(f"layer {i}" for i in range(L))],
                                key="positional_rows",
                                help=f"{n_heads} heads do not fit one screen: aggregate, or pick a layer"))
        if rows.startswith("layer "):
            layer = int(rows.split()[1])
            fig = viz.positional_map(pos, cols, layers=[layer], title=f"attention mass by target, layer {layer}")
        else:
            fig = viz.positional_map(pos, cols, aggregate=True,
                                     title="attention mass by target (largest head of each layer)")
    st.plotly_chart(fig, width="stretch", key="fig_positional")


PAGE = Page("Head map", "head-map", render, needs="text")
