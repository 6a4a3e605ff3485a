"""Is there an 8-edge circuit of induction-2l (<= 10 % of its 81 edges) with faithfulness >= 0.9 on the induction
task? Searched with exact patching (every circuit's metric from a real ablated forward, never a gradient):

1. beam backward elimination from the full graph (width ``--beam``), the best circuit of each size;
2. hill climbing by one-edge swaps from each 8-edge subset of the 9-edge textbook circuit;
3. every 8-edge subset of a pool: the textbook edges, the hill climb's best and then the edges exact patching
   scores largest.

Usage:
    OMP_NUM_THREADS=1 python experiments/benchmarks/search_induction_8edges.py \
        > experiments/results/circuits/induction_8edges.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

import interp
from interp.circuits import build_graph, exact_scores
from interp.circuits.evaluate import ablation_source, circuit_metrics
from interp.circuits.tasks import circuit_task

TEXTBOOK = [("input", "a0.h2<v>"), ("a0.h2", "a1.h1<k>"), ("a0.h2", "a1.h3<k>"), ("input", "a1.h1<q>"),
            ("input", "a1.h3<q>"), ("input", "a1.h1<v>"), ("input", "a1.h3<v>"), ("a1.h1", "logits"),
            ("a1.h3", "logits")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--beam", type=int, default=16)
    parser.add_argument("--pool", type=int, default=15)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = interp.load("induction-2l")
    task = circuit_task(model, "induction", n=args.n, seed=args.seed)
    graph = build_graph(model)
    source = ablation_source(model, graph, task.corrupted, task.ablation)
    edges = [tuple(e) for e in graph.allowed.nonzero().tolist()]
    index = {(graph.upstream[u], graph.downstream[d]): i for i, (u, d) in enumerate(edges)}
    [m_full] = circuit_metrics(model, graph, task.clean, source, graph.allowed[None], task.metric)
    evaluated = 0

    def faith(circuits: list[tuple[int, ...]]) -> list[float]:
        nonlocal evaluated
        out: list[float] = []
        for start in range(0, len(circuits), 512):
            chunk = circuits[start:start + 512]
            keep = torch.zeros(len(chunk), *graph.allowed.shape, dtype=torch.bool)  # [V, U, D]
            for v, c in enumerate(chunk):
                for i in c:
                    keep[v, edges[i][0], edges[i][1]] = True
            out += [m / m_full for m in circuit_metrics(model, graph, task.clean, source, keep, task.metric,
                                                        batch_size=16 * task.clean.shape[0])]
        evaluated += len(circuits)
        return out

    def named(c: tuple[int, ...]) -> list[tuple[str, str]]:
        return [(graph.upstream[edges[i][0]], graph.downstream[edges[i][1]]) for i in c]

    def report(method: str, c: tuple[int, ...], f: float, **extra) -> None:
        print(json.dumps({"method": method, "n_edges": len(c), "faithfulness": round(f, 4), "edges": named(c),
                          "circuits_evaluated": evaluated, "elapsed_s": round(time.time() - t0, 1), **extra}),
              flush=True)

    t0 = time.time()
    textbook = tuple(sorted(index[e] for e in TEXTBOOK))
    report("textbook", textbook, faith([textbook])[0], metric_full=m_full)

    # 1. Beam backward elimination from the full graph.
    beam = [tuple(range(len(edges)))]
    best_at: dict[int, tuple[float, tuple[int, ...]]] = {}
    while len(beam[0]) > args.size:
        children = sorted({tuple(x for x in c if x != r) for c in beam for r in c})
        fs = faith(children)
        ranked = sorted(zip(fs, children), reverse=True)[:args.beam]
        beam = [c for _, c in ranked]
        best_at[len(beam[0])] = ranked[0]
    f, c = best_at[args.size]
    report(f"beam{args.beam}_elimination", c, f, best_by_size={k: round(v[0], 4) for k, v in sorted(best_at.items())
                                                                  if k <= 12})

    # 2. Hill climbing by one-edge swaps, from each (size)-subset of the textbook circuit and the beam's best.
    starts = [tuple(sorted(s)) for s in itertools.combinations(textbook, args.size)] + [c]
    best = (-float("inf"), ())
    for start in starts:
        cur, fcur = start, faith([start])[0]
        while True:
            swaps = sorted({tuple(sorted([x for x in cur if x != r] + [a])) for r in cur for a in range(len(edges))
                            if a not in cur})
            fs = faith(swaps)
            fbest, cbest = max(zip(fs, swaps))
            if fbest <= fcur + 1e-6:
                break
            cur, fcur = cbest, fbest
        best = max(best, (fcur, cur))
    report("swap_hill_climb", best[1], best[0], starts=len(starts))

    # 3. Every (size)-subset of a pool: the textbook edges and then the edges exact patching scores most.
    exact = exact_scores(model, task.clean, task.corrupted, task.metric, graph=graph, batch_size=2048)
    order = sorted(range(len(edges)), key=lambda i: -abs(float(exact.scores[edges[i]])))
    pool = list(dict.fromkeys(list(textbook) + list(best[1]) + order))[:args.pool]
    combos = list(itertools.combinations(sorted(pool), args.size))
    fs = faith(combos)
    fbest, cbest = max(zip(fs, combos))
    report(f"exhaustive_pool{args.pool}", cbest, fbest, subsets=len(combos),
           reaching_0_9=sum(f >= 0.9 for f in fs))


if __name__ == "__main__":
    main()
