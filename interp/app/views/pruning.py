"""Pruning: switch heads off and see the loss and metric move; run pruning curves in the background through the
library's experiment runner (:func:`interp.pruning.run_experiment`), or load saved ones."""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import streamlit as st
import torch

import interp
from interp import progress, viz
from interp.app import jobs, results_cache, serving
from interp.app.heads import head_counts, head_labels
from interp.app.inputs import PRUNING_SENTENCES, default_sizes
from interp.app.model_picker import ModelKey, load_model, model_hash
from interp.app.page import Page, PageContext
from interp.app.progress_view import show_job

_METRIC_HAS_ARROW = "delta_arrow" in inspect.signature(st.metric).parameters
#: What each pruning metric measures, in words.
METRIC_WORDS = {"accuracy": "next-token accuracy on the repeated half", "neg_loss": "minus the next-token loss",
                "cosine_to_unpruned": "cosine similarity of sentence embeddings to the unpruned model's"}
METHODS = ("importance", "random")


def metric_delta(change: float, *, higher_is_better: bool, digits: int = 4) -> dict[str, Any]:
    """``st.metric`` delta arguments: green when the change is better, red when worse, grey without an arrow
    when it rounds to zero (a +0.0000 is no change).

    Example:
        >>> from interp.app.views.pruning import metric_delta
        >>> metric_delta(0.01, higher_is_better=False)
        {'delta': '+0.0100', 'delta_color': 'inverse'}
    """
    if round(change, digits) == 0:
        arrow = {"delta_arrow": "off"} if _METRIC_HAS_ARROW else {}  # Streamlit >= 1.50 can drop the arrow
        return {"delta": f"±{0:.{digits}f}", "delta_color": "off", **arrow}
    return {"delta": f"{change:+.{digits}f}", "delta_color": "normal" if higher_is_better else "inverse"}


def task_data(model: interp.Transformer) -> dict[str, Any]:
    """The ``data`` settings of the page's pruning task (:func:`interp.pruning.build_task`): repeated sequences
    for a decoder, the example sentences for an encoder, smaller for a large model."""
    sizes = default_sizes(model)
    return {"n_seqs": sizes["prune_seqs"], "half_len": sizes["prune_half"], "eval_seed": 123,
            "texts": PRUNING_SENTENCES, "batch_size": 8}


def pruning_setup(model: interp.Transformer) -> tuple[Any, list[Any]]:
    """The objective and held-out batches of the page's pruning task.

    Raises:
        ValueError: the model cannot be pruned on this task (the message says why).
    """
    from interp.pruning import build_task

    task = build_task(model, data=task_data(model))
    return task.objective, task.held_out


@st.cache_data(show_spinner="Evaluating the model with these heads off ...", max_entries=256)
def gated_scores(key: ModelKey, heads_off: tuple[tuple[int, int], ...]) -> dict[str, float]:
    """Loss and metric of the model with ``heads_off`` gated to zero (the model's own per-layer head counts)."""
    from interp.pruning import head_mask

    model = load_model(*key)
    objective, batches = pruning_setup(model)
    pruned = [torch.zeros(n, dtype=torch.bool) for n in head_counts(model)]  # [H_layer] per layer
    for layer, head in heads_off:
        pruned[layer][head] = True
    with torch.no_grad(), head_mask(model, pruned):
        loss = float(np.mean([float(objective.loss(model, b)) for b in batches]))
        metric = float(objective.metric(model, batches))
    return {"loss": loss, "metric": metric, "metric_name": objective.metric_name}


def experiment_config(model: interp.Transformer, method: str, step: int) -> dict[str, Any]:
    """The :func:`interp.pruning.run_experiment` config of one curve: the page's task, ``step`` heads per point.

    Example:
        >>> import interp
        >>> from interp.app.views.pruning import experiment_config
        >>> cfg = experiment_config(interp.load("random-tiny"), "random", 2)
        >>> cfg["methods"], cfg["random"]["step"]
        (['random'], 2)
    """
    seeds = list(range(default_sizes(model)["prune_seeds"]))
    return {"name": model.name, "model": model.name, "methods": [method], "data": task_data(model),
            "importance": {"step": step}, "random": {"seeds": seeds, "step": step}}


def pruning_key(key: ModelKey, method: str, step: int) -> str:
    """The results-cache key of one pruning curve of the model ``key`` names."""
    config = experiment_config(load_model(*key), method, step)
    config.pop("name"), config.pop("model")  # the weights hash names the model
    return results_cache.key_of("pruning", model_hash(key), config)


def run_pruning(model: interp.Transformer, plan: list[tuple[str, str]], step: int,
                report: Callable[[float, str], None]) -> dict[str, Any]:
    """Run each ``(method, cache key)`` of ``plan`` through :func:`interp.pruning.run_experiment`, in a background
    job (so it touches no Streamlit state); every curve lands in the disk cache as soon as it is done.

    Args:
        model: the model.
        plan: the methods and their results-cache keys.
        step: heads pruned per point.
        report: the job's progress callback, fed by the library's own bars.

    Returns:
        ``{method: PruningCurve}``.
    """
    from interp.pruning import run_experiment

    out = {}
    for m_i, (method, ckey) in enumerate(plan):
        hit, curve = results_cache.load("pruning", ckey)
        if not hit:
            t0 = time.monotonic()
            report(m_i / len(plan), f"{method}: starting")

            def tick(event: progress.Event, m_i: int = m_i, method: str = method, t0: float = t0) -> None:
                done = event.fraction or 0.0
                report((m_i + done) / len(plan), f"{method}: {event.desc} {event.done:.0f} of "
                                                 f"{event.total or '?'} ({time.monotonic() - t0:.0f} s)")

            with progress.listen(tick):
                curve = run_experiment(experiment_config(model, method, step), model=model)[method]
            results_cache.store("pruning", ckey, curve)
        out[method] = curve
    return out


def _saved_curves() -> list[Any]:
    """The "Load a saved curve" controls: listed experiment results, an upload, or a served path."""
    from interp.pruning import PruningCurve

    curves: list[PruningCurve] = []
    results = serving.results_folder()
    found = serving.saved_curve_files(results)
    picked = st.multiselect("Saved curves in experiments/results/", found,
                            key="curve_files") if results is not None and found else []
    upload = st.file_uploader("... or upload a curve (.json from PruningCurve.save)", type=["json"],
                              key="curve_upload")
    typed = ""
    if serving.served_folder() is not None:
        typed = st.text_input("... or a curve file, or a folder written by interp prune --out, in the served "
                              "folder", key="curve_path")
    paths = [results / name for name in picked if results is not None and name in found]
    if typed.strip():
        try:
            paths.extend(serving.served_curves(typed))
        except (FileNotFoundError, ValueError) as e:
            st.error(str(e))
    for path in paths:
        try:
            curves.append(PruningCurve.from_dict(json.loads(serving.read_limited(path, serving.MAX_CURVE_MB))))
        except Exception as e:  # noqa: BLE001 - shown to the user
            st.error(f"{path.name} is not a pruning curve (JSON written by PruningCurve.save): {e}")
    if upload is not None:
        try:
            curves.append(PruningCurve.from_dict(json.loads(upload.getvalue())))
        except Exception as e:  # noqa: BLE001 - shown to the user
            st.error(f"{upload.name} is not a pruning curve (JSON written by PruningCurve.save): {e}")
    return curves


def _run_curves(key: ModelKey, model: interp.Transformer, encoder: bool) -> list[Any]:
    """The "Run on this model" controls: methods and step, a background run, the stored curves."""
    n_heads = sum(head_counts(model))
    c1, c2 = st.columns(2)
    methods = c1.multiselect("Methods", list(METHODS), default=list(METHODS), key="curve_methods")
    sizes = default_sizes(model)
    default_step = max(1, n_heads // sizes["prune_points"])  # about that many points per curve
    steps = sorted({s for s in (1, 2, 4, 8, 16, max(1, n_heads // 4), default_step) if s <= n_heads})
    step = c2.select_slider("Heads pruned per step", options=steps, value=default_step,
                            key="curve_step") if len(steps) > 1 else 1
    plan = [(m, pruning_key(key, m, step)) for m in methods]
    stored = {m: results_cache.load("pruning", k) for m, k in plan}
    job_key = "|".join(k for _, k in plan)
    job = jobs.get(job_key) if plan else None
    running = job is not None and not job.done
    if st.button("Run", key="curve_run", type="primary", disabled=running or not plan):
        def work(report: Callable[[float, str], None]) -> dict[str, Any]:
            return run_pruning(model, plan, step, report)

        job = jobs.start(job_key, f"pruning {model.name}", work)
        running = not job.done
    if running and job is not None:
        show_job(job)
    elif job is not None and job.error:
        st.error(f"The pruning run failed: {job.error}")
    curves = [curve for m, (hit, curve) in stored.items() if hit]
    if job is not None and job.done and job.result:
        curves = [job.result[m] for m in methods if m in job.result]
    what_data = (f"{len(PRUNING_SENTENCES)} sentences" if encoder
                 else f"{sizes['prune_seqs']} repeated random sequences of 2 x {sizes['prune_half']} tokens")
    n_points = n_heads // step + 1
    if not curves and not running:
        st.info(f"Press **Run** to prune this model step by step in the background: {n_points} points per curve "
                f"on {what_data} (importance recomputed at each point, random over {sizes['prune_seeds']} "
                f"seed{'s' if sizes['prune_seeds'] > 1 else ''}), with interp.pruning.run_experiment. The curves "
                "are kept on disk for the next visit.")
    elif curves:
        st.caption(f"{n_points} points per curve on {what_data}; kept in the disk cache")
    return curves


def render(ctx: PageContext) -> None:
    """Draw the page (needs the model)."""
    from interp.pruning import LanguageModelObjective, auc_table

    assert ctx.key is not None and ctx.model is not None
    key, model = ctx.key, ctx.model
    try:
        objective, _ = pruning_setup(model)
    except ValueError as e:
        st.error(str(e))
        return
    encoder = not isinstance(objective, LanguageModelObjective)
    what = ("1 - cosine similarity of sentence embeddings to the unpruned model's" if encoder
            else "next-token cross-entropy on the repeated half of repeated random sequences")
    metric = METRIC_WORDS.get(objective.metric_name, objective.metric_name)
    st.markdown(f"Loss (lower is better): **{what}**. Metric (higher is better): **{metric}** "
                f"(`{objective.metric_name}`).")

    st.subheader("Switch heads off")
    labels = head_labels(model)
    off = st.multiselect("Heads to switch off", list(labels), key="heads_off")
    heads_off = tuple(labels[x] for x in off if x in labels)
    base = gated_scores(key, ())
    now = gated_scores(key, heads_off)
    c1, c2, c3 = st.columns(3)
    c1.metric("Heads off", f"{len(heads_off)} / {len(labels)}")
    c2.metric("Loss (lower is better)", f"{now['loss']:.4f}",
              **metric_delta(now["loss"] - base["loss"], higher_is_better=False))
    c3.metric(f"{now['metric_name']} (higher is better)", f"{now['metric']:.4f}",
              **metric_delta(now["metric"] - base["metric"], higher_is_better=True))

    st.subheader("Pruning curves")
    source = st.radio("Curves", ["Run on this model", "Load a saved curve"], horizontal=True, key="curve_source")
    if source == "Load a saved curve":
        curves = _saved_curves()
    elif len(set(head_counts(model))) != 1:
        st.info(f"This model's layers hold different head counts ({head_counts(model)}, a model reduced by "
                "remove_heads): the pruning methods prune a model with equal counts. Prune the original model, "
                "or load a saved curve.")
        curves = []
    else:
        curves = _run_curves(key, model, encoder)
    if curves:
        st.plotly_chart(viz.pruning_curves(curves, baseline=curves[0].points[0].metric if curves[0].points else None,
                                           y_title=curves[0].metric_name,
                                           title=f"pruning curves of {curves[0].model_name or model.name}"),
                        width="stretch", key="fig_pruning")
        try:
            st.dataframe(auc_table(curves), hide_index=True)
        except Exception as e:  # noqa: BLE001 - a malformed curve only loses its AUC table
            st.caption(f"(no AUC table: {e})")


PAGE = Page("Pruning", "pruning", render, needs="model")
