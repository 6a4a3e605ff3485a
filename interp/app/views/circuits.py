"""Circuits: pick a task and a method (:mod:`interp.circuits`), see the circuit as a layered graph of the kept
edges and its faithfulness curve beside random circuits of the same size, with progress."""

from __future__ import annotations

from typing import Any

import streamlit as st

import interp
from interp.app.disk_cache import cost_caption, disk_cached
from interp.app.inputs import default_sizes, reads_text
from interp.app.model_picker import ModelKey, load_model
from interp.app.page import Page, PageContext
from interp.viz.circuits import circuit_figure, faithfulness_figure

#: The methods, as ``interp circuit --method`` names them.
METHODS = {"eap": "EAP (two forwards, one backward)", "eap-ig": "EAP-IG (integrated gradients)",
           "acdc": "ACDC (greedy, exact patching)", "edge-pruning": "Edge Pruning (Hard-Concrete gates)"}


def available_tasks(model: interp.Transformer) -> list[str]:
    """The generated tasks of :func:`interp.circuits.tasks.circuit_task` this model can read.

    Example:
        >>> import interp
        >>> from interp.app.views.circuits import available_tasks
        >>> available_tasks(interp.load("random-tiny"))
        ['induction']
    """
    from interp.circuits.tasks import TASKS, TEXT_TASKS

    return [t for t in TASKS if t not in TEXT_TASKS or reads_text(model)]


def find_circuit(model: interp.Transformer, task_name: str, method: str, *, n_keep: int, steps: int = 5,
                 threshold: float = 0.05, train_steps: int = 100, n_prompts: int = 16, seed: int = 0,
                 n_random: int = 20) -> dict[str, Any]:
    """Score, search and evaluate a circuit as ``interp circuit`` does (:func:`interp.circuits.find_circuit` on the
    named task).

    Args:
        model: the model.
        task_name: one of :func:`available_tasks`.
        method: one of :data:`METHODS`.
        n_keep: edges to keep (EAP, EAP-IG: the top ``n_keep``; Edge Pruning: its target); ACDC keeps what its
            threshold keeps.
        steps: EAP-IG's integration steps.
        threshold: ACDC's largest metric change of a removed edge.
        train_steps: Edge Pruning's gate training steps.
        n_prompts, seed: the task's prompts.
        n_random: random circuits per size on the curve.

    Returns:
        ``{"circuit": Circuit, "faithfulness": {...} (empty for an empty circuit), "curve": DataFrame,
        "n_edges_total": int}``.

    Raises:
        ValueError: an unknown method or task, ``n_keep`` outside ``[1, edges]``, or what the search refuses.

    Example:
        >>> import interp
        >>> from interp.app.views.circuits import find_circuit
        >>> out = find_circuit(interp.load("random-tiny"), "induction", "eap", n_keep=5, n_random=2)
        >>> len(out["circuit"]), sorted(out["curve"].method.unique())
        (5, ['eap', 'random'])
    """
    from interp import circuits
    from interp.circuits.tasks import circuit_task

    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    task = circuit_task(model, task_name, n=n_prompts, seed=seed)
    run = circuits.find_circuit(model, task, method, n_keep=n_keep, steps=steps, threshold=threshold,
                                train_steps=train_steps, n_random=n_random)
    return {"circuit": run.circuit, "faithfulness": run.faithfulness, "curve": run.curve,
            "n_edges_total": run.n_edges_total}


@disk_cached("circuit", "Finding the circuit")
def circuit_data(key: ModelKey, task_name: str, method: str, n_keep: int, steps: int, threshold: float,
                 train_steps: int, n_prompts: int, n_random: int) -> dict[str, Any]:
    """:func:`find_circuit` on the model ``key`` names (disk-cached)."""
    return find_circuit(load_model(*key), task_name, method, n_keep=n_keep, steps=steps, threshold=threshold,
                        train_steps=train_steps, n_prompts=n_prompts, n_random=n_random)


def head_kinds_report(ctx: PageContext) -> Any:
    """The Head map page's report with its default kinds and data sizes (the same disk-cache entry), or None with
    a message when the heads cannot be classified."""
    from interp.app.views.head_map import available_kinds, head_report

    assert ctx.key is not None and ctx.model is not None
    sizes = default_sizes(ctx.model)
    kinds = tuple(n for n, k in available_kinds(ctx.model, set()).items() if k.default)
    try:
        result = head_report(ctx.key, kinds, None, 200, None, sizes["head_texts"], sizes["head_seqs"],
                             sizes["head_half"], sizes["batch"])
    except Exception as e:  # noqa: BLE001 - shown to the user; the circuit is drawn without kinds
        st.error(f"Could not classify the heads: {e}")
        return None
    return result["value"]


def _edge_count(n_total: int) -> int:
    return max(1, round(0.1 * n_total))


def render(ctx: PageContext) -> None:
    """Draw the page (needs the model)."""
    from interp.circuits import build_graph, check_decomposable

    assert ctx.key is not None and ctx.model is not None
    key, model = ctx.key, ctx.model
    st.markdown("Which edges between the embedding, the heads, the MLPs and the logits carry a task: score every "
                "edge, keep a circuit, and measure its **faithfulness** (its metric over the full model's, every "
                "other edge resample-ablated) beside random circuits of the same size.")
    try:
        check_decomposable(model)
        n_total = build_graph(model).n_edges
    except ValueError as e:
        st.error(f"No circuit graph for {model.name}: {e}")
        return
    tasks = available_tasks(model)
    c1, c2 = st.columns(2)
    task_name = c1.selectbox("Task", tasks, key="circuit_task",
                             help="generated prompts with corrupted counterparts (interp.circuits.tasks); text "
                                  "tasks need a text tokenizer")
    method = c2.selectbox("Method", list(METHODS), format_func=lambda m: METHODS[m], key="circuit_method")
    sizes = default_sizes(model)
    c1, c2, c3 = st.columns(3)
    n_keep = int(c1.number_input(f"Edges to keep (of {n_total})", 1, n_total, _edge_count(n_total),
                                 key=f"circuit_edges_{n_total}", disabled=method == "acdc"))
    steps, threshold, train_steps = 5, 0.05, 100
    if method == "eap-ig":
        steps = int(c2.number_input("Integration steps m", 1, 64, 5, key="circuit_steps"))
    elif method == "acdc":
        threshold = float(c2.number_input("ACDC threshold", 0.0, 10.0, 0.05, step=0.01, format="%.3f",
                                          key="circuit_threshold"))
    elif method == "edge-pruning":
        train_steps = int(c2.number_input("Training steps", 1, 2000, 100, key="circuit_train_steps"))
    n_random = int(c3.number_input("Random circuits per size", 0, 50, 20, key="circuit_random"))
    args = (task_name, method, n_keep, steps, threshold, train_steps, sizes["circuit_prompts"], n_random)
    if st.session_state.get("_circuit_asked") != (key, args) and not circuit_data.stored(key, *args):
        if st.button("Find the circuit", key="circuit_run", type="primary"):
            st.session_state["_circuit_asked"] = (key, args)
        else:
            st.info(f"Press **Find the circuit** to run {method} on {sizes['circuit_prompts']} {task_name} prompts; "
                    "the result is kept on disk for the next visit.")
            return
    try:
        result = circuit_data(key, *args)
    except Exception as e:  # noqa: BLE001 - shown to the user
        st.error(f"Could not find the circuit ({method} on {task_name}): {e}")
        return
    data = result["value"]
    found, faith, curve = data["circuit"], data["faithfulness"], data["curve"]
    st.caption(cost_caption(result, f"{method} on {sizes['circuit_prompts']} {task_name} prompts, the curve with "
                                    f"{n_random} random circuits per size"))
    m1, m2, m3 = st.columns(3)
    m1.metric("Edges kept", f"{len(found)} / {data['n_edges_total']}")
    m2.metric("Faithfulness", f"{faith['faithfulness']:.3f}" if faith else "-",
              help="the circuit's metric over the full model's")
    m3.metric("Normalized", f"{faith['normalized']:.3f}" if faith else "-",
              help="(circuit - empty) / (full - empty)")
    if not len(found):
        st.warning(f"{method} kept no edge: lower the threshold or keep more edges.")
    else:
        report = head_kinds_report(ctx) if st.toggle(
            "Colour heads by kind", key="circuit_kinds",
            help="classify the heads with the Head map page's default kinds and data (cached on disk, shared with "
                 "that page)") else None
        st.plotly_chart(circuit_figure(found, report=report, title=f"{method} circuit of {model.name} on {task_name}"),
                        width="stretch", key="fig_circuit")
    st.plotly_chart(faithfulness_figure(curve, title=f"faithfulness over circuit size ({task_name})"),
                    width="stretch", key="fig_faithfulness")
    with st.expander("Edges (table)"):
        st.dataframe([{"from": u, "to": d, "score": found.scores.get((u, d))} for u, d in found.edges],
                     hide_index=True, key="circuit_edges_table")


PAGE = Page("Circuits", "circuits", render, needs="model")
