"""Long dashboard runs (pruning curves) in a background thread: the page stays usable and polls the progress.

A job is keyed like a cached result; asking for a running key returns the running job, so two sessions (or
two clicks) share one run. The job's function gets a ``report(fraction, text)`` callback; its result is kept
on the job (the function itself also stores it in the results cache). Jobs never touch Streamlit: the page
reads :attr:`Job.progress` and draws it.
"""

from __future__ import annotations

import atexit
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

#: Finished jobs kept for the pages to read their result or error (the oldest are dropped first).
KEEP_FINISHED = 32
#: At exit, seconds to wait for running jobs to stop at their next progress report.
EXIT_WAIT_S = 30.0


class Cancelled(Exception):
    """Raised by :meth:`Job.report` once the job is cancelled: the run stops at its next step."""

_lock = threading.Lock()
_jobs: dict[str, Job] = {}


class Job:
    """One background run: its progress, then its result or error. Every field is read under the job's lock."""

    def __init__(self, key: str, label: str) -> None:
        self.key, self.label = key, label
        self._lock = threading.Lock()
        self._fraction, self._text = 0.0, "starting ..."
        self.result: Any = None
        self.error: str | None = None
        self.started = time.monotonic()
        self.finished: float | None = None
        self.thread: threading.Thread | None = None
        self._cancel = threading.Event()

    def report(self, fraction: float, text: str) -> None:
        """Set the progress (``fraction`` in [0, 1]) and its caption; called from the job's thread.

        Raises:
            Cancelled: the job was cancelled (:meth:`cancel`); the run stops here.
        """
        if self._cancel.is_set():
            raise Cancelled(f"{self.label} was cancelled")
        with self._lock:
            self._fraction, self._text = min(1.0, max(0.0, float(fraction))), text

    def cancel(self) -> None:
        """Ask the job to stop at its next progress report."""
        self._cancel.set()

    @property
    def progress(self) -> tuple[float, str]:
        with self._lock:
            return self._fraction, self._text

    @property
    def done(self) -> bool:
        with self._lock:
            return self.finished is not None

    def _run(self, fn: Callable[[Callable[[float, str], None]], Any]) -> None:
        try:
            result, error = fn(self.report), None
        except Cancelled as e:
            result, error = None, str(e)
        except Exception as e:  # noqa: BLE001 - the page shows the error; the server keeps running
            result, error = None, f"{type(e).__name__}: {e}"
            traceback.print_exc()
        with self._lock:
            self.result, self.error, self.finished = result, error, time.monotonic()
            if error is None:
                self._fraction, self._text = 1.0, "done"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the job to finish; True when it has."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.done


def get(key: str) -> Job | None:
    """The running or recently finished job of ``key``, or None."""
    with _lock:
        return _jobs.get(key)


def start(key: str, label: str, fn: Callable[[Callable[[float, str], None]], Any]) -> Job:
    """Start ``fn(report)`` in a daemon thread under ``key``, unless a job of that key is running already
    (that job is returned). A finished job of the key is replaced (a rerun).

    Example:
        >>> from interp.app.jobs import start
        >>> job = start("demo", "demo", lambda report: (report(0.5, "half"), 42)[1])
        >>> job.wait(10), job.result
        (True, 42)
    """
    with _lock:
        running = _jobs.get(key)
        if running is not None and not running.done:
            return running
        job = Job(key, label)
        _jobs[key] = job
        finished = [k for k, j in _jobs.items() if j.done]
        for k in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del _jobs[k]
        job.thread = threading.Thread(target=job._run, args=(fn,), name=f"interp-job-{label}", daemon=True)
        job.thread.start()
    return job


@atexit.register
def _stop_running_jobs() -> None:
    # A daemon thread still inside torch when the interpreter finalises aborts the process ("terminate called
    # without an active exception"): ask every running job to stop at its next step, and wait a little.
    with _lock:
        running = [j for j in _jobs.values() if not j.done]
    for job in running:
        job.cancel()
    deadline = time.monotonic() + EXIT_WAIT_S
    for job in running:
        job.wait(max(0.0, deadline - time.monotonic()))
