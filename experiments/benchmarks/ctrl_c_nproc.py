"""Ctrl-C to the whole process group of ``interp heads --nproc 2`` at moments spread over a run (issue 38, item 9).

A terminal's Ctrl-C sends SIGINT to its foreground process group; here the command runs in its own session and
the script sends SIGINT to that group (``os.killpg``) at evenly spread moments from the start (torch still
importing) to past the end of a run measured first without interruption. For each try it records the exit status
and whether stderr holds a Python traceback. Wanted: no traceback ever, and status 130 whenever the run was cut
short (a run that had already finished may exit 0, but never with a traceback).

Usage:
    OMP_NUM_THREADS=1 python experiments/benchmarks/ctrl_c_nproc.py [--tries 10] [--model induction-2l]
        [--window 0.8 1.05]   # only near the end of the run (the teardown)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def run(model: str, delay: float | None) -> tuple[int, bool, bool, str]:
    cmd = [sys.executable, "-m", "interp", "heads", "--model", model, "--nproc", "2", "--json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    sent = False
    if delay is not None:
        try:
            p.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
            sent = True
    out, err = p.communicate(timeout=300)
    return p.returncode, "Traceback (most recent call last)" in err, sent, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--model", default="induction-2l")
    ap.add_argument("--window", type=float, nargs=2, default=(0.0, 1.1), metavar=("FROM", "TO"),
                    help="spread the Ctrl-C moments over this part of an uninterrupted run (1 = its end)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    status, tb, _, err = run(args.model, None)
    whole = time.perf_counter() - t0
    print(f"uninterrupted run: status {status}, {whole:.1f} s, traceback: {tb}")
    print("| try | Ctrl-C after | sent | status | traceback | last stderr line |")
    print("|---|---|---|---|---|---|")
    tracebacks, bad_status = 0, 0
    shown_errs: list[tuple[int, str]] = []
    for i in range(args.tries):
        lo, hi = args.window
        delay = (lo + (i + 0.5) / args.tries * (hi - lo)) * whole  # default: from torch's imports to past the end
        status, tb, sent, err = run(args.model, delay)
        tracebacks += tb
        if tb:
            shown_errs.append((i, err))
        bad_status += sent and status != 130  # a run that ended before the signal may exit 0
        last = (err.strip().splitlines() or [""])[-1][:60]
        shown = f"{status} (killed by signal {-status})" if status < 0 else str(status)
        print(f"| {i} | {delay:.1f} s | {'yes' if sent else 'no (run over)'} | {shown} | {'yes' if tb else 'no'} | "
              f"{last} |", flush=True)
    print(f"\n{args.tries} tries: {tracebacks} with a traceback, {bad_status} interrupted runs not ending with 130")
    for i, text in shown_errs:
        print(f"\n--- try {i}: stderr with a traceback ---\n{text[-3000:]}")


if __name__ == "__main__":
    main()
