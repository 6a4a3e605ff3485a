"""Data parallel head statistics: 1 process x 2 threads vs 2 processes x 1 thread vs 8 processes x 1 thread.

``classify_heads(minilm-l6, conllu=UD EWT dev)`` (positional + syntactic from one pass over the treebank, then
the induction family on repeated random sequences) runs under ``torchrun --standalone --nproc_per_node N``:
each rank loads the model, waits at a barrier, and times classify_heads alone (the statistic's throughput,
sentences per second); the wall time of the whole command (start-up, imports and model loads included) is
reported beside it. One process is plain ``torch.distributed``-free code (WORLD_SIZE=1). Runs of the
configurations are interleaved in rotating order; medians over repetitions. Results are compared with the
1-process run: the same classification rows and the score tables within 1e-6.

Usage:
    python experiments/benchmarks/bench_distributed.py [--quick] [--reps N] [--max-sentences N] [--conllu FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_CONLLU = REPO.parent / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
CONFIGS = [("1 proc x 2 threads", 1, 2), ("1 proc x 1 thread", 1, 1), ("2 procs x 1 thread", 2, 1),
           ("8 procs x 1 thread", 8, 1)]
TARGET, OVERSUBSCRIBED = CONFIGS[2][0], CONFIGS[3][0]


def worker(out: Path, conllu: str, max_sentences: int | None) -> None:
    """One rank: load, barrier, time classify_heads; rank 0 writes the report and the time."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from interp import distributed
    from interp.analysis import classify_heads
    from interp.zoo import load

    distributed.init_from_env()
    model = load("minilm-l6")
    if distributed.active():
        torch.distributed.barrier()
    t0 = time.perf_counter()
    report = classify_heads(model, conllu=conllu, max_sentences=max_sentences)
    dt = time.perf_counter() - t0
    if distributed.active():
        slowest = torch.tensor([dt], dtype=torch.float64)
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        dt = float(slowest)
    if distributed.rank() == 0:
        with open(out, "wb") as f:
            pickle.dump({"seconds": dt, "df": report.df, "details": report.details,
                         "sentences": int(report.details["syntactic"].attrs.get("n_sentences", 0) or 0)}, f)
    if distributed.active():
        torch.distributed.destroy_process_group()


def run_config(nproc: int, threads: int, conllu: str, max_sentences: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.pkl"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads),
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(Path(__file__).resolve()), "--worker", str(out), "--conllu", conllu]
        if max_sentences:
            cmd += ["--max-sentences", str(max_sentences)]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise RuntimeError(f"{nproc} x {threads} failed ({res.returncode}):\n{res.stderr[-3000:]}")
        with open(out, "rb") as f:
            result = pickle.load(f)
    result["wall"] = wall
    return result


def max_diff(a: dict, b: dict) -> tuple[bool, float]:
    """(same classification rows, max abs difference over every numeric score-table cell)."""
    import numpy as np

    same_rows = a["df"][["layer", "head", "kind"]].equals(b["df"][["layer", "head", "kind"]])
    worst = float(np.nanmax(np.abs(a["df"]["score"].to_numpy() - b["df"]["score"].to_numpy()))) if len(a["df"]) else 0.0
    for name, t in a["details"].items():
        u = b["details"][name]
        num = t.select_dtypes("number").columns
        d = np.abs(t[num].to_numpy(float) - u[num].to_numpy(float))
        nan_same = np.array_equal(np.isnan(t[num].to_numpy(float)), np.isnan(u[num].to_numpy(float)))
        same_rows &= nan_same
        if np.isfinite(d).any():
            worst = max(worst, float(np.nanmax(d)))
    return same_rows, worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--conllu", default=str(DEFAULT_CONLLU))
    p.add_argument("--max-sentences", type=int, help="cap on treebank sentences (default: all; --quick: 300)")
    p.add_argument("--reps", type=int, help="repetitions per configuration (default 2; --quick: 1)")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker, a.conllu, a.max_sentences)
        return 0
    if not Path(a.conllu).is_file():
        print(f"## bench_distributed\n\nskipped: treebank not found at {a.conllu}")
        return 0
    max_sentences = a.max_sentences or (300 if a.quick else None)
    reps = a.reps or (1 if a.quick else 2)
    sys.path.insert(0, str(HERE))
    from benchutil import machine_info

    print(f"## bench_distributed (classify_heads, minilm-l6, UD EWT dev"
          f"{f', {max_sentences} sentences' if max_sentences else ''})\n")
    print(machine_info() + "\n")
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in CONFIGS}
    for r in range(reps):
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]  # rotate: load bursts hit all alike
        for name, nproc, threads in order:
            runs[name].append(run_config(nproc, threads, a.conllu, max_sentences))
            print(f"  rep {r + 1}: {name}: {runs[name][-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    ref, ref1 = runs[CONFIGS[0][0]][0], runs[CONFIGS[1][0]][0]
    n_sent = ref["sentences"]
    base = statistics.median(x["seconds"] for x in runs[CONFIGS[0][0]])
    print("| configuration | classify_heads s (median) | sentences/s | throughput vs 1 x 2 | whole command s | "
          "same rows | max abs diff vs 1 x 2 | vs 1 x 1 |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for name, _, _ in CONFIGS:
        sec = statistics.median(x["seconds"] for x in runs[name])
        wall = statistics.median(x["wall"] for x in runs[name])
        checks = [max_diff(ref, x) for x in runs[name]]
        same = all(c[0] for c in checks)
        diff = max(c[1] for c in checks)
        diff1 = max(max_diff(ref1, x)[1] for x in runs[name])
        summary[name] = base / sec
        print(f"| {name} | {sec:.1f} | {n_sent / sec:.1f} | {base / sec:.3f} | {wall:.1f} | {same} | {diff:.1e} | "
              f"{diff1:.1e} |")
    print(f"\nTarget: 2 procs x 1 thread / 1 proc x 2 threads throughput >= 0.9: "
          f"{summary[TARGET]:.3f} ({'met' if summary[TARGET] >= 0.9 else 'missed'}). "
          "Timings on a 2-core machine shared with other engineers' work: noisy. Differences against 1 x 2 come "
          "from float32 GEMM blocking with 2 threads vs 1; against 1 x 1 (same thread count) they isolate the "
          "sharding and the all-reduce.")
    print(json.dumps({"ratio_2x1_vs_1x2": round(summary[TARGET], 3),
                      "ratio_8x1_vs_1x2": round(summary[OVERSUBSCRIBED], 3)}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
