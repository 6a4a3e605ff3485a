"""Shared helpers of the side-by-side benchmarks: fixed threads, interleaved timing with medians, machine info.

Every benchmark compares variants in one process: each repetition runs every variant once, in an order
shuffled anew for every repetition, so drift in machine load hits all variants alike and no variant always
follows the same one; the reported figure is the median over repetitions, after warm-up runs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import random
import statistics
import time
from collections.abc import Callable

import torch
from results_file import cpu_model  # beside this file (experiments/ is not a package)

DEFAULT_THREADS = 2


def fix_threads(n: int | None = None) -> int:
    """Fix torch's intra-op threads (``$BENCH_THREADS`` or 2) and return the number used."""
    n = n or int(os.environ.get("BENCH_THREADS", DEFAULT_THREADS))
    torch.set_num_threads(n)
    return torch.get_num_threads()


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, e.g. ``"0.52 0.61 0.70"`` (``"n/a"`` where the OS has none)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def machine_info() -> str:
    """One line: date, CPU model, nproc, torch threads, torch and python versions, load average."""
    cpu = cpu_model()
    load = load_average()
    return (f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC | {cpu} | nproc {os.cpu_count()} | "
            f"torch threads {torch.get_num_threads()} | torch {torch.__version__} | python {platform.python_version()}"
            f" | load avg {load}")


def time_reps(fns: dict[str, Callable[[], object]], *, reps: int = 10, warmup: int = 2,
              cpu: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Wall-clock seconds of every repetition of each function, timed interleaved, in a new shuffled order every
    repetition (keeping each repetition, so that two variants' ratio can pair within one: see :func:`paired_ratio`).

    Shuffled rather than rotated: rotating keeps each variant behind the same predecessor in every repetition,
    so whatever that predecessor leaves in the caches (or the allocator) biases the comparison one way. The
    shuffle is seeded, so a rerun times the same orders.

    Args:
        fns: name -> zero-argument callable (run under ``torch.inference_mode`` by the caller if wanted).
        reps: timed repetitions per function.
        warmup: untimed runs of each function first.
        cpu: if given, filled with name -> this process's CPU seconds (all its threads) of each repetition:
            on a machine other jobs share, wall time counts the time they held the cores, CPU time mostly not.

    Returns:
        name -> the ``reps`` wall-clock times, in seconds, in repetition order.
    """
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu_times: dict[str, list[float]] = cpu if cpu is not None else {}
    cpu_times.update({n: [] for n in names})
    rng = random.Random(0)
    for _ in range(reps):
        order = rng.sample(names, len(names))  # [names], shuffled
        for n in order:
            t0, c0 = time.perf_counter(), time.process_time()
            fns[n]()
            times[n].append(time.perf_counter() - t0)
            cpu_times[n].append(time.process_time() - c0)
    return times


def time_interleaved(fns: dict[str, Callable[[], object]], *, reps: int = 10, warmup: int = 2) -> dict[str, float]:
    """Median wall-clock seconds of each function over :func:`time_reps`' interleaved repetitions.

    Returns:
        name -> median seconds.
    """
    return {n: statistics.median(v) for n, v in time_reps(fns, reps=reps, warmup=warmup).items()}


def paired_ratio(ours: list[float], theirs: list[float]) -> tuple[float, float, float]:
    """(ratio of the medians, min and max of the per-repetition ratios): the spread shows a loaded machine's noise
    beside the median, each per-repetition ratio pairing two variants timed in the same repetition."""
    paired = [a / b for a, b in zip(ours, theirs)]
    return statistics.median(ours) / statistics.median(theirs), min(paired), max(paired)


def spread_tables(times: dict[str, list[float]], ratios: list[tuple[str, str, str]],
                  cpu: dict[str, list[float]] | None = None) -> str:
    """Markdown: each variant's median and range (ms), then each ratio ``(ours, baseline, target)`` with its
    per-repetition range and whether the median meets the target (``"<= 1.0"``; empty for none). With ``cpu``
    (:func:`time_reps`' CPU seconds), the same for CPU time beside the wall-clock columns."""
    def ms(v: list[float]) -> str:
        return f"{statistics.median(v) * 1e3:.0f} | {min(v) * 1e3:.0f}-{max(v) * 1e3:.0f}"

    cpu_head = (" CPU median ms | CPU range ms |", "---:|---:|") if cpu else ("", "")
    rows = [f"| variant | median ms | range ms |{cpu_head[0]}", f"|---|---:|---:|{cpu_head[1]}"]
    rows += [f"| {n} | {ms(v)} |" + (f" {ms(cpu[n])} |" if cpu else "") for n, v in times.items()]
    cpu_head = (" CPU-time median | CPU per-repetition |", "---:|---:|") if cpu else ("", "")
    rows += ["", f"| ratio | median | per-repetition | target | met |{cpu_head[0]}",
             f"|---|---:|---:|---|---|{cpu_head[1]}"]
    for ours, base, target in ratios:
        med, lo, hi = paired_ratio(times[ours], times[base])
        met = "" if not target else ("yes" if med <= float(target.split()[-1]) else "**no**")
        row = f"| {ours} / {base} | **{med:.3f}** | {lo:.3f}-{hi:.3f} | {target} | {met} |"
        if cpu:
            c_med, c_lo, c_hi = paired_ratio(cpu[ours], cpu[base])
            row += f" {c_med:.3f} | {c_lo:.3f}-{c_hi:.3f} |"
        rows.append(row)
    return "\n".join(rows)


def ratio_table(medians: dict[str, float], baseline: str, *, targets: dict[str, str] | None = None) -> str:
    """A markdown table: variant, median ms, ratio to ``baseline`` (and a target column when given)."""
    targets = targets or {}
    head = "| variant | median ms | ratio vs " + baseline + " |" + (" target |" if targets else "")
    sep = "|---|---:|---:|" + ("---|" if targets else "")
    rows = [head, sep]
    for n, t in medians.items():
        row = f"| {n} | {t * 1e3:.2f} | {t / medians[baseline]:.3f} |"
        if targets:
            row += f" {targets.get(n, '')} |"
        rows.append(row)
    return "\n".join(rows)


def hf_side_by_side_args(description: str, *, layers: int, reps: int = 5) -> argparse.Namespace:
    """The options every interp-vs-transformers timing script takes (``--batch``, ``--seq``, ``--reps``,
    ``--layers``, ``--device``, ``--quick``: 2 layers and 2 repetitions), parsed from the command line."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="2 layers, 2 reps (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.reps = 2, 2
    return args
