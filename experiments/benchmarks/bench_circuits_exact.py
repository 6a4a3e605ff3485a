"""Exact verification of the top-200 EAP-IG edges on SmolLM2 (IOI, induction): shared growing passes against a
naive one-pass-per-edge loop on 20 edges (scaled to 200), in process CPU seconds at one thread; also the
Spearman correlation of EAP-IG with exact patching on those edges.

Usage:
    python experiments/benchmarks/bench_circuits_exact.py > experiments/results/circuits/exact_shared_vs_naive_smollm2.jsonl
"""

from __future__ import annotations

import json
import time
import warnings

import torch

import interp
from interp.circuits import build_graph, eap_ig, exact_scores, exact_scores_naive
from interp.circuits.evaluate import top_mask
from interp.circuits.tasks import circuit_task


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def cpu_timed(fn):
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def main(top: int = 200, naive: int = 20) -> None:
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = interp.load("smollm2-135m")
    for name in ("ioi", "induction"):
        task = circuit_task(model, name, n=8, half_len=10)
        c, x, m = task.clean, task.corrupted, task.metric
        g = build_graph(model)
        s_ig = eap_ig(model, c, x, m, steps=5, graph=g, progress=False)
        picked = top_mask(s_ig, top).nonzero().tolist()
        edges = [(g.upstream[u], g.downstream[d]) for u, d in picked]
        s_ex, t_ex = cpu_timed(lambda: exact_scores(model, c, x, m, edges=edges, graph=g, batch_size=64))
        s_nv, t_nv = cpu_timed(lambda: exact_scores_naive(model, c, x, m, edges=edges[:naive], graph=g))
        idx, sub = tuple(torch.tensor(picked).T), tuple(torch.tensor(picked[:naive]).T)
        scaled = t_nv * len(edges) / naive
        print(json.dumps({"task": name, "shape": list(c.shape), f"exact_{top}_cpu_s": t_ex,
                          f"naive_{naive}_cpu_s": t_nv, f"naive_scaled_{top}": scaled,
                          "ratio_naive_over_shared": scaled / t_ex,
                          f"max_abs_diff_first{naive}": float((s_ex.scores[sub] - s_nv.scores[sub]).abs().max()),
                          f"spearman_eapig_vs_exact_top{top}": spearman(s_ig.scores[idx], s_ex.scores[idx])}),
              flush=True)


if __name__ == "__main__":
    main()
