"""interp dashboard: look inside the attention heads of a model, in the browser.

Run it with ``interp dashboard`` or ``streamlit run`` on ``interp.app.DASHBOARD``. This script only lays out the
app: a Streamlit multipage app (``st.navigation``) whose pages are the modules of :mod:`interp.app.views`, one
module per page, each at its own URL (``/head-map``). The sidebar holds the page switcher, the model picker
(:mod:`interp.app.model_picker`) and, for pages that read text, the text box (:mod:`interp.app.inputs`).
What the server may read from its disk is :mod:`interp.app.serving`; results are kept on disk per (model
weights hash, data, options) by :mod:`interp.app.disk_cache`; long runs go to background jobs
(:mod:`interp.app.jobs`). All math lives in the library.

URL query parameters preselect the model and the page: ``?model=random-tiny&page=Head+map``.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st
from streamlit import config as st_config
from streamlit.navigation.page import StreamlitPage

from interp.app import inputs
from interp.app.heads import heads_caption
from interp.app.model_picker import AFTER_SWITCH, choose_model, get_model
from interp.app.page import Page, PageContext
from interp.app.views import PAGES

st.set_page_config(page_title="interp dashboard", page_icon="🔍", layout="wide")
# Streamlit runs a full garbage collection (gc.collect(2)) after every script run, fragment reruns included. With a
# 100M-parameter model and its autograd graph in memory, each one holds the GIL for a large part of a second, and a
# background job's progress fragment reruns every POLL_S: a pruning step inside the server took ~700 s for ~40 s
# outside it. Python's own generational collector is enough here.
st_config.set_option("runner.postScriptGC", False, where_defined="interp dashboard")


def page_context(page: Page) -> PageContext | None:
    """Draw the sidebar's model picker (and the text box, for pages that read text) and the page heading.

    They are drawn by this script, not inside the page: every page shares them, and :func:`switch_to` carries
    their values over a page switch.

    Args:
        page: the page about to draw.

    Returns:
        What the page gets, or None when it cannot draw yet (no model, no readable text; a message says why).
    """
    key = choose_model()
    model = get_model(key) if key is not None else None
    st.title(page.title)
    if model is not None:
        st.sidebar.caption(heads_caption(model))
    if page.needs == "nothing":
        return PageContext(key, model)
    if model is None or key is None:
        return None
    if page.needs == "model":
        return PageContext(key, model)
    text = inputs.choose_text(model)
    try:
        ids, note = inputs.tokenize(model, text)
    except ValueError as e:
        if text.strip():
            st.error(f"Cannot read the input: {e}")
        else:
            st.info(str(e))
        return None
    if note:
        st.warning(note)
    return PageContext(key, model, ids)


#: Sidebar widgets every page shares. ``st.switch_page`` resets every widget (it sends no widget state), so
#: their values are carried over a page switch by hand.
SHARED_WIDGETS = ("model", "ckpt_path", "hf_name", "tl_name", "example", "text")


def switch_to(page: StreamlitPage, query_params: dict[str, str] | None = None) -> None:
    """``st.switch_page`` that keeps the shared sidebar widgets' values (and says so to the model picker, which
    keeps an uploaded checkpoint)."""
    state = st.session_state
    state["_carried"] = {k: state[k] for k in SHARED_WIDGETS if k in state}
    st.switch_page(page, query_params=query_params)


def navigate() -> None:
    """Streamlit's navigation over :data:`PAGES` (hidden), switched by the sidebar's page radio.

    The radio (key ``page``) follows the page the URL opened (a link to ``/head-map`` or ``?page=Head+map``),
    and picking another page in it switches to that page's URL.
    """
    state = st.session_state
    carried = state.pop("_carried", None)
    state[AFTER_SWITCH] = carried is not None
    for k, v in (carried or {}).items():
        state[k] = v
    st.sidebar.title("interp")
    ready: dict[str, PageContext | None] = {}

    def runner(page: Page) -> Callable[[], None]:
        def run() -> None:
            ctx = ready.get(page.title)
            if ctx is not None:  # None: the sidebar said what is missing (a model, readable text)
                page.render(ctx)
        return run

    by_title = {p.title: st.Page(runner(p), title=p.title, url_path=p.slug, default=i == 0)
                for i, p in enumerate(PAGES)}
    current = st.navigation(list(by_title.values()), position="hidden")
    wanted = st.query_params.get("page")
    if "_page_seen" not in state and wanted in by_title and wanted != current.title:
        # A link straight to a page (?page=Head+map): keep its other parameters (?model=...).
        switch_to(by_title[wanted], {k: v for k, v in st.query_params.to_dict().items() if k != "page"})
    if state.get("_page_seen") != current.title:
        state["page"] = current.title  # the URL (a link, the back button) chose the page: the radio follows
        state["_page_seen"] = current.title
    choice = str(st.sidebar.radio("Page", list(by_title), key="page"))
    if choice != current.title:
        switch_to(by_title[choice])
    page = next(p for p in PAGES if p.title == current.title)
    ready[page.title] = page_context(page)
    current.run()


navigate()
