"""Circuits, found automatically: what the issue asks to show, measured.

Parts (``--only``, comma-separated):
- ``induction2l``: induction-2l on repeated random tokens: EAP, EAP-IG, exact patching of every edge; ACDC; Edge
  Pruning; the top edges must contain previous-token -> induction-head K-composition edges and reach
  faithfulness >= 0.9 with <= 10 % of the edges; curves beside 20 random circuits.
- ``speed``: SmolLM2-135M, 4 x 128 tokens (repeated random halves of 64): one forward, a plain forward +
  backward (the floor of a gradient step) of the batch and of m copies of it, EAP, EAP-IG (m steps) with its
  default points per pass, in one batched pass and in one pass per step, interleaved, as multiples of the forward in process
  CPU time (and wall time) at the benchmark's threads, with each ratio's spread over the repetitions (targets
  <= 4x and <= (m + 2)x).
- ``memory``: the peak resident memory of EAP, and of EAP-IG (m steps) with its default points per pass and in
  one pass, at 4 x 128 on SmolLM2 (each in a fresh process: the peak resident set during the run, VmHWM reset
  before it, minus the resident set after loading the model and running one forward).
- ``ioi`` / ``induction``: SmolLM2-135M on IOI-style prompts / repeated tokens: EAP, EAP-IG, exact patching of
  the top-200 EAP-IG edges in shared passes (and a naive one-pass-per-edge loop on a slice, scaled), Spearman of
  EAP and EAP-IG against exact; faithfulness curves of EAP, EAP-IG and Edge Pruning beside 20 random circuits;
  which of the heads ``classify_heads`` calls induction / previous-token each circuit touches, beside 20 random
  circuits of as many edges.

Usage:
    python experiments/benchmarks/bench_circuits.py [--only induction2l,speed,memory,ioi,induction] [--steps 5]
        [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
import warnings

import torch
from benchutil import fix_threads, machine_info

import interp
from interp.circuits import (
    build_graph,
    eap,
    eap_ig,
    edge_pruning,
    exact_scores,
    exact_scores_naive,
    faithfulness,
    faithfulness_curve,
    kind_overlap,
    top_n,
)
from interp.circuits.evaluate import top_mask
from interp.circuits.tasks import circuit_task


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra = a.argsort().argsort().double()
    rb = b.argsort().argsort().double()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def cpu_timed(fn):
    """(result, process CPU seconds): at one thread, far less sensitive than wall time to the other processes
    of a shared machine."""
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def summarize_curve(df) -> dict:
    out = {}
    for (method, n), g in df.groupby(["method", "n_edges"]):
        out.setdefault(method, {})[int(n)] = {"faithfulness": float(g.faithfulness.mean()),
                                              "normalized": float(g.normalized.mean()),
                                              **({"p90_random": float(g.faithfulness.quantile(0.9))}
                                                 if method == "random" else {})}
    return out


def part_induction2l(args) -> dict:
    model = interp.load("induction-2l")
    task = circuit_task(model, "induction", n=16)
    c, x, m = task.clean, task.corrupted, task.metric
    graph = build_graph(model)
    E = graph.n_edges
    s_eap, t_eap = timed(lambda: eap(model, c, x, m, graph=graph))
    s_ig, t_ig = timed(lambda: eap_ig(model, c, x, m, steps=args.steps, graph=graph))
    s_ex, t_ex = timed(lambda: exact_scores(model, c, x, m, graph=graph))
    n10 = max(1, E // 10)
    out: dict = {"n_edges": E, "budget_10pct": n10, "seconds": {"eap": t_eap, "eap_ig": t_ig, "exact_all": t_ex}}
    allowed = graph.allowed
    out["spearman_vs_exact_all_edges"] = {"eap": spearman(s_eap.scores[allowed], s_ex.scores[allowed]),
                                          "eap_ig": spearman(s_ig.scores[allowed], s_ex.scores[allowed])}
    from interp.analysis import classify_heads
    report = classify_heads(model)
    prev = [f"a{layer}.h{head}" for layer, head in report.heads("previous-token")]
    ind = [f"a{layer}.h{head}" for layer, head in report.heads("induction")]
    out["classify_heads"] = {"previous-token": prev, "induction": ind}
    kcomp = {(p, f"{i}<k>") for p in prev for i in ind}
    circuits = {}
    abl = task.ablation
    out["ablation"] = abl
    for name, scores in (("eap", s_eap), ("eap-ig", s_ig), ("exact", s_ex)):
        circ = top_n(scores, n10)
        f = faithfulness(model, circ, c, x, m, graph=graph, ablation=abl)
        circuits[name] = {"edges": circ.edges, "faithfulness": f["faithfulness"], "normalized": f["normalized"],
                          "completeness": f["completeness"], "k_composition_edges": sorted(set(circ.edges) & kcomp)}
    for keep in (n10, n10 + 1):
        ep, t_ep = timed(lambda: edge_pruning(model, c, x, m, target=1 - keep / E, steps=args.ep_steps_2l,
                                              graph=graph, ablation=abl, progress=False))
        f = faithfulness(model, ep, c, x, m, graph=graph, ablation=abl)
        circuits[f"edge-pruning-{keep}"] = {"edges": ep.edges, "faithfulness": f["faithfulness"],
                                            "normalized": f["normalized"], "completeness": f["completeness"],
                                            "k_composition_edges": sorted(set(ep.edges) & kcomp), "seconds": t_ep}
    from interp.circuits import Circuit, acdc
    ac, t_ac = timed(lambda: acdc(model, c, x, m, threshold=args.acdc_threshold, graph=graph, ablation=abl))
    f = faithfulness(model, ac, c, x, m, graph=graph, ablation=abl)
    circuits["acdc"] = {"n_edges": len(ac), "threshold": args.acdc_threshold, "faithfulness": f["faithfulness"],
                        "k_composition_edges": sorted(set(ac.edges) & kcomp), "seconds": t_ac}
    # The textbook circuit: previous-token head a0.h2 into the keys of induction heads a1.h1 and a1.h3.
    textbook = Circuit([("input", "a0.h2<v>"), ("a0.h2", "a1.h1<k>"), ("a0.h2", "a1.h3<k>"), ("input", "a1.h1<q>"),
                        ("input", "a1.h3<q>"), ("input", "a1.h1<v>"), ("input", "a1.h3<v>"), ("a1.h1", "logits"),
                        ("a1.h3", "logits")])
    f = faithfulness(model, textbook, c, x, m, graph=graph, ablation=abl)
    circuits["textbook-9"] = {"faithfulness": f["faithfulness"], "completeness": f["completeness"]}
    out["circuits"] = circuits
    from interp.circuits.evaluate import head_circuits
    heads = head_circuits(report, graph, ["induction", "previous-token"], [1, 2, 3, 4, 6])
    df = faithfulness_curve(model, [s_eap, s_ig, s_ex], c, x, m, sizes=[1, 2, 4, n10, n10 + 1, 16, 32, E],
                            n_random=20, ablation=abl, extra={"classify_heads": heads})
    out["curve"] = summarize_curve(df)
    return out


@functools.cache
def _smollm2():  # one model for every part of a run (the analyses leave it as loaded)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return interp.load("smollm2-135m")


def part_speed(args) -> dict:
    model = _smollm2()
    task = circuit_task(model, "induction", n=4, half_len=64)
    c, x, m = task.clean, task.corrupted, task.metric
    graph = build_graph(model)
    def forward():
        with torch.no_grad():
            model(c)

    def forward_backward(copies: int = 1):  # the floor of one gradient step over copies of the batch
        e = torch.zeros((), requires_grad=True)
        with torch.enable_grad(), model.hooks([("blocks.0.hook_resid_pre", lambda t, hook: t + e)]):
            logits = model(c.repeat(copies, 1))  # [copies*B, T, V]
            B = c.shape[0]
            value = sum(m(logits[k * B:(k + 1) * B]) for k in range(copies))
        torch.autograd.backward(value, inputs=[e])

    fns = {"forward": forward, "forward_backward": forward_backward,
           f"forward_backward_x{args.steps}": lambda: forward_backward(args.steps),
           "eap": lambda: eap(model, c, x, m, graph=graph),
           # the default (points per pass chosen by device), every point in one batched pass, one pass per point
           "eap_ig": lambda: eap_ig(model, c, x, m, steps=args.steps, graph=graph, progress=False),
           "eap_ig_one_pass": lambda: eap_ig(model, c, x, m, steps=args.steps, graph=graph,
                                             steps_per_pass=args.steps, progress=False),
           "eap_ig_pass_per_step": lambda: eap_ig(model, c, x, m, steps=args.steps, graph=graph, steps_per_pass=1,
                                                  progress=False)}
    ig = (eap_ig(model, c, x, m, steps=args.steps, graph=graph, steps_per_pass=args.steps, progress=False).scores,
          eap_ig(model, c, x, m, steps=args.steps, graph=graph, steps_per_pass=1, progress=False).scores)
    forward()
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    wall: dict[str, list[float]] = {n: [] for n in fns}
    import random
    import statistics
    rng = random.Random(0)
    for _ in range(args.reps):  # interleaved, in a new order each repetition: load drift hits all alike
        for n in rng.sample(list(fns), len(fns)):
            w = time.perf_counter()
            _, t = cpu_timed(fns[n])
            cpu[n].append(t)
            wall[n].append(time.perf_counter() - w)
    med = {n: statistics.median(v) for n, v in cpu.items()}
    med_wall = {n: statistics.median(v) for n, v in wall.items()}
    # Each repetition's ratio to that repetition's forward: the spread of the ratio itself.
    per_rep = {n: [a / f for a, f in zip(v, cpu["forward"])] for n, v in cpu.items()}
    return {"tokens": list(c.shape), "n_edges": graph.n_edges, "threads": torch.get_num_threads(), "reps": args.reps,
            "cpu_s": med, "wall_s_median": med_wall,
            "x_forward_cpu": {n: med[n] / med["forward"] for n in med},
            "x_forward_cpu_min_max": {n: [min(v), max(v)] for n, v in per_rep.items()},
            "eap_ig_batched_vs_pass_per_step_max_abs_diff": float((ig[0] - ig[1]).abs().max()),
            "eap_ig_max_abs_score": float(ig[1].abs().max()),
            "x_forward_wall": {n: med_wall[n] / med_wall["forward"] for n in med_wall},
            "eap_target": 4, "eap_ig_steps": args.steps, "eap_ig_target": args.steps + 2}


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def _reset_peak() -> float:
    """The resident memory now (MiB), after resetting the peak to it. ru_maxrss cannot be reset, and a child
    forked from a large process starts with the parent's peak (kept across exec)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (Linux 4.0+)
    return _status_mb("VmRSS")


#: EAP, EAP-IG with its default points per pass, EAP-IG with every point in one pass.
_MEMORY_RUNS = ("eap", "eap_ig", "eap_ig_one_pass")


def part_memory(args) -> dict:
    """The peak resident memory each run adds (VmHWM after the run, reset before it, minus VmRSS then), each in a
    fresh process."""
    if not args.child:
        out = {}
        for name in _MEMORY_RUNS:
            res = subprocess.run([sys.executable, __file__, "--only", "memory", "--child", name,
                                  "--steps", str(args.steps)], capture_output=True, text=True, check=True)
            out.update(json.loads(res.stdout.strip().splitlines()[-1]))
        return out
    model = _smollm2()
    task = circuit_task(model, "induction", n=4, half_len=64)
    with torch.no_grad():
        model(task.clean)
    graph = build_graph(model)
    base = _reset_peak()
    name = args.child
    if name == "eap":
        eap(model, task.clean, task.corrupted, task.metric, graph=graph)
    else:
        eap_ig(model, task.clean, task.corrupted, task.metric, steps=args.steps, graph=graph, progress=False,
               steps_per_pass=args.steps if name == "eap_ig_one_pass" else None)
    peak = _status_mb("VmHWM")
    print(json.dumps({"tokens": list(task.clean.shape), "rss_after_model_and_forward_mb": base,
                      f"rss_peak_after_{name}_mb": peak, f"{name}_extra_peak_mb": peak - base}))
    sys.exit(0)


def part_smollm2_task(args, name: str) -> dict:
    model = _smollm2()
    task = circuit_task(model, name, n=args.n, half_len=10)
    c, x, m = task.clean, task.corrupted, task.metric
    graph = build_graph(model)
    E = graph.n_edges
    s_eap, t_eap = timed(lambda: eap(model, c, x, m, graph=graph))
    s_ig, t_ig = timed(lambda: eap_ig(model, c, x, m, steps=args.steps, graph=graph))
    top = top_mask(s_ig, args.top).nonzero().tolist()
    edges = [(graph.upstream[u], graph.downstream[d]) for u, d in top]
    s_ex, t_ex = timed(lambda: exact_scores(model, c, x, m, edges=edges, graph=graph, batch_size=args.batch_size))
    naive_n = min(len(edges), args.naive_edges)
    _, t_naive = timed(lambda: exact_scores_naive(model, c, x, m, edges=edges[:naive_n], graph=graph))
    idx = tuple(torch.tensor(top).T)
    out = {"shape": list(c.shape), "n_edges": E, "metric_clean": s_eap.metric_clean,
           "metric_corrupted": s_eap.metric_corrupted,
           "seconds": {"eap": t_eap, "eap_ig": t_ig, f"exact_{len(edges)}_shared": t_ex,
                       f"naive_{naive_n}_edges": t_naive, "naive_scaled_to_all": t_naive * len(edges) / naive_n},
           f"spearman_top{len(edges)}": {"eap_ig_vs_exact": spearman(s_ig.scores[idx], s_ex.scores[idx]),
                                          "eap_vs_exact": spearman(s_eap.scores[idx], s_ex.scores[idx])}}
    sizes = [n for n in args.sizes if n <= E]
    extra = {}
    if not args.n_random and not args.ep_steps:
        return out
    if args.ep_steps:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            ep, t_ep = timed(lambda: edge_pruning(model, c, x, m, target=1 - args.ep_keep / E, steps=args.ep_steps,
                                                  lr=args.ep_lr, lagrangian_lr=args.ep_lagrangian_lr, graph=graph,
                                                  ablation=task.ablation, progress=False))
        extra = {"edge-pruning": {len(ep): ep}}
        out["seconds"]["edge_pruning"] = t_ep
        out["edge_pruning"] = {"edges": len(ep), "target_edges": args.ep_keep, "steps": args.ep_steps,
                               "lr": args.ep_lr, "lagrangian_lr": args.ep_lagrangian_lr,
                               "warning": [str(w.message) for w in caught]}
        sizes = sorted(set(sizes) | {len(ep)})  # the attribution methods and random circuits at its size too
    df, t_curve = timed(lambda: faithfulness_curve(model, [s_eap, s_ig], c, x, m, sizes=sizes, n_random=args.n_random,
                                                   extra=extra, batch_size=args.batch_size, ablation=task.ablation))
    out["seconds"]["curve"] = t_curve
    out["curve"] = summarize_curve(df)
    # Which of the heads classify_heads calls induction / previous-token each circuit touches, beside random
    # circuits of as many edges.
    report, t_cls = timed(lambda: _smollm2_report(model))
    out["seconds"]["classify_heads"] = t_cls
    kinds = ["induction", "previous-token"]
    out["classify_heads"] = {k: [f"a{layer}.h{head}" for layer, head in report.heads(k)] for k in kinds}
    circuits = {f"{s.method}-{n}": top_n(s, n) for s in (s_eap, s_ig) for n in sizes}
    circuits.update({f"edge-pruning-{n}": ep for n, ep in extra.get("edge-pruning", {}).items()})
    out["kind_overlap"] = {name: kind_overlap(circ, report, graph, kinds, n_random=args.n_random)
                           .set_index("kind").to_dict(orient="index") for name, circ in circuits.items()}
    return out


@functools.cache
def _smollm2_report(model):
    """classify_heads' induction and previous-token heads of SmolLM2 (once a model: both tasks share it)."""
    from interp.analysis import classify_heads
    return classify_heads(model, kinds=["induction", "previous-token"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="induction2l,speed,memory,ioi,induction")
    p.add_argument("--steps", type=int, default=5, help="EAP-IG steps m")
    p.add_argument("--reps", type=int, default=3, help="speed: interleaved repetitions")
    p.add_argument("--n", type=int, default=8, help="SmolLM2 prompts per task")
    p.add_argument("--top", type=int, default=200)
    p.add_argument("--naive-edges", type=int, default=16)
    p.add_argument("--n-random", type=int, default=20)
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 1000, 5000])
    p.add_argument("--ep-steps", type=int, default=100, help="Edge Pruning steps on SmolLM2")
    p.add_argument("--ep-lr", type=float, default=0.3, help="Edge Pruning's log-alpha learning rate on SmolLM2")
    p.add_argument("--ep-lagrangian-lr", type=float, default=10.0,
                   help="Edge Pruning's multiplier ascent rate on SmolLM2 (its 70,651 gates: at the default 0.3 the "
                        "sparsity term barely moves them in 100 steps)")
    p.add_argument("--ep-steps-2l", type=int, default=1000,
                   help="Edge Pruning steps on induction-2l (at 200 its gates keep 12 of 81 edges for a target of 8)")
    p.add_argument("--ep-keep", type=int, default=1000)
    p.add_argument("--acdc-threshold", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", help="also write each part's figures there as bench_circuits_<part>.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # memory: the run a fresh process measures
    args = p.parse_args()
    fix_threads()
    parts = args.only.split(",")
    results = {"machine": machine_info()}
    for part in parts:
        t = time.perf_counter()
        fn = {"induction2l": part_induction2l, "speed": part_speed, "memory": part_memory,
              "ioi": lambda a: part_smollm2_task(a, "ioi"), "induction": lambda a: part_smollm2_task(a, "induction")}
        results[part] = fn[part](args)
        results[part]["wall_s"] = time.perf_counter() - t
        print(json.dumps({part: results[part]}, indent=1, default=str), flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"bench_circuits_{part}.json"), "w") as f:
                json.dump({"machine": results["machine"], part: results[part]}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
