"""Progress on the page: a bar moved by the library's own bars (:func:`interp.progress.listen`) with partial
results drawn as they come, and the progress of a background job (:mod:`interp.app.jobs`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import streamlit as st

from interp import progress
from interp.app import jobs

T = TypeVar("T")

#: Seconds between two progress-bar redraws, and between two partial-result drawings (each partial figure is
#: drawn anew by the browser, which shares the cores with the computation).
BAR_EVERY_S, PARTIAL_EVERY_S = 0.25, 1.0
#: Seconds between two redraws of a background job's progress (each is a script run of its own).
POLL_S = 1.0


def no_partial(event: progress.Event) -> None:
    """The default partial-result drawer: draws nothing."""
    return None


def run_with_progress(label: str, compute: Callable[[], T],
                      partial: Callable[[progress.Event], Any] = no_partial) -> T:
    """``compute()`` under a progress bar that every library bar inside it moves, with ``partial(event)`` drawing
    partial results as they come; both are removed when it returns.

    The bar is redrawn at most every :data:`BAR_EVERY_S`, partial results at most every :data:`PARTIAL_EVERY_S`
    and not in the first second (a quick computation is not slowed down by drawing what it is about to show).

    Args:
        label: the bar's caption.
        compute: the computation.
        partial: called with a progress event to draw what is folded so far.

    Returns:
        What ``compute()`` returns.
    """
    bar = st.progress(0.0, text=f"{label} ...")
    t0 = time.monotonic()
    last = {"bar": 0.0, "partial": t0}

    def on_event(event: progress.Event) -> None:
        now = time.monotonic()
        if now - last["bar"] < BAR_EVERY_S and event.fraction not in (0.0, 1.0):
            return  # the page, not the computation, would be the bottleneck
        last["bar"] = now
        done = event.fraction
        bar.progress(done if done is not None else 0.0,
                     text=f"{label}: {event.desc} {event.done:.1f}/{event.total or '?'} ({now - t0:.0f} s)")
        if now - last["partial"] >= PARTIAL_EVERY_S:
            last["partial"] = now
            partial(event)

    try:
        with progress.listen(on_event):
            return compute()
    finally:
        bar.empty()


def show_job(job: jobs.Job) -> None:
    """The progress of a background job, redrawn every :data:`POLL_S` seconds (only this part of the page reruns,
    so the rest stays usable); the whole page reruns when the job ends, to draw its results."""
    @st.fragment(run_every=POLL_S)
    def poll() -> None:
        fraction, text = job.progress
        st.progress(fraction, text=f"{job.label}: {text} (runs in the background; the other pages stay usable)")
        if job.done:
            st.rerun()

    poll()
