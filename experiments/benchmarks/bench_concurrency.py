"""What the per-model lock costs (hooks and gates made safe for threads that share one model).

Two measurements, side by side in one run:

1. One call: the forward pass inside the model's re-entrant lock (what ``model(tokens)`` does) against the
   same pass without it (``model._forward``), on induction-2l with short inputs, where a fixed overhead shows most. Target: ratio
   <= 1.01.
2. Many sessions: the dashboard's two jobs (record patterns and per-head writes; a loss under head gates) run
   by 8 threads that share the model, against the same jobs run one after another in one thread. With the lock
   the threads take turns, so the ratio says what turn-taking costs on top of the work itself (target <= 1.1).
   The alternative, one model per session, would hold a copy of the weights per session instead (printed
   for induction-2l and MiniLM-L6).

Usage:
    python experiments/benchmarks/bench_concurrency.py [--quick]
"""

from __future__ import annotations

import argparse
import threading
import time

import torch
import torch.nn.functional as F
from benchutil import fix_threads, machine_info, ratio_table, time_interleaved

import interp
from interp.pruning import head_mask


def pattern_job(model, tokens):
    with torch.no_grad():
        _, trace = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_result")))
    return trace.head_outs().norm(dim=-1)


def gated_job(model, tokens, pruned):
    with torch.no_grad(), head_mask(model, pruned):
        logits = model(tokens)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    # One intra-op thread: with several, threads that share a core spin against each other and the
    # comparison would measure OpenMP's oversubscription, not the lock.
    fix_threads(1)
    print(machine_info())
    print("\nTimings are noisy on a shared machine: compare the ratios, not the milliseconds.\n")
    model = interp.load("induction-2l")
    reps = 30 if args.quick else 200
    tokens = torch.randint(1, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    kw = dict(attention_mask=None, token_type_ids=None, position_ids=None, context=None, context_mask=None,
              kv_cache=None)
    def locked():
        with model.lock:  # what Transformer.forward adds around the pass
            return model._forward(tokens, **kw)

    with torch.inference_mode():
        med = time_interleaved({"forward with lock": locked,
                                "forward without lock": lambda: model._forward(tokens, **kw)}, reps=reps, warmup=5)
    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        with model.lock:
            pass
    lock_ns = (time.perf_counter() - t0) / n * 1e9
    print("## One forward pass (induction-2l, 1 x 16 tokens)\n")
    print(ratio_table(med, "forward without lock", targets={"forward with lock": "<= 1.01"}))
    print(f"\nTaking and releasing the lock alone: {lock_ns:.0f} ns.")

    n_threads, per_thread = 8, (3 if args.quick else 10)
    jobs = []
    for i in range(n_threads):
        toks = torch.randint(1, 128, (4, 48), generator=torch.Generator().manual_seed(i))
        pruned = torch.zeros(2, 4, dtype=torch.bool)
        pruned.view(-1)[i % 8] = True
        jobs.append((lambda t=toks: pattern_job(model, t)) if i % 2 else (lambda t=toks, p=pruned: gated_job(model, t, p)))

    def sequential():
        for job in jobs:
            for _ in range(per_thread):
                job()

    def threaded():
        def run(job):
            for _ in range(per_thread):
                job()
        threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    med = time_interleaved({"8 threads sharing the model": threaded, "same jobs in one thread": sequential},
                           reps=3 if args.quick else 7, warmup=1)
    print(f"\n## {n_threads} sessions x {per_thread} jobs (patterns + per-head writes, or a gated loss)\n")
    print(ratio_table(med, "same jobs in one thread", targets={"8 threads sharing the model": "<= 1.1"}))

    print("\n## Memory of the alternative (one model per session)\n")
    print("| model | weights per session copy |\n|---|---:|")
    for name in ("induction-2l", "minilm-l6"):
        try:
            m = model if name == "induction-2l" else interp.load(name)
        except Exception as e:  # noqa: BLE001 - MiniLM needs the hf extra
            print(f"| {name} | skipped ({type(e).__name__}) |")
            continue
        size = sum(p.numel() * p.element_size() for p in m.parameters())
        print(f"| {name} | {size / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
