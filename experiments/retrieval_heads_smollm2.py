"""Retrieval heads of SmolLM2-135M (Wu et al. 2024) on generated needle-in-a-haystack prompts, and the causal test:
mean-ablating them vs 20 random head sets of the same size, on needle recall (the log-probability of the needle's
tokens as the answer copies them), with a paired Wilcoxon test and a bootstrap interval. Also 3 disjoint prompt
sets (seeds) for stability.

Usage:
    OMP_NUM_THREADS=1 python experiments/retrieval_heads_smollm2.py --json out.json [--context 512] [--needle 16] [--seqs 16]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--needle", type=int, default=16)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--causal-seqs", type=int, default=8)
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--heads", help="skip the classification: the causal test of these heads (L18H6,L17H3,...)")
    ap.add_argument("--json", type=Path, required=True, help="where the figures go")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import interp
    from interp.analysis import classify_heads
    from interp.analysis.kind_causal import kind_metric, paired_random_test
    from interp.data.needle import needle_batches

    t0 = time.perf_counter()
    model = interp.load("smollm2-135m", dtype=torch.float32).eval()
    opts = {"needle_len": args.needle, "needle_context": args.context}
    out: dict = {"model": "smollm2-135m", "context": args.context, "needle": args.needle, "seqs": args.seqs,
                 "sets": {}}
    found = []
    for seed in range(0 if args.heads else 3):
        t = time.perf_counter()
        r = classify_heads(model, kinds=["retrieval"], n_seqs=args.seqs, seed=seed, batch_size=4, options=opts,
                           progress=False)
        table = r.df.sort_values("score", ascending=False)
        out["sets"][seed] = {"seconds": round(time.perf_counter() - t, 1),
                             "heads": {f"L{x.layer}H{x.head}": round(x.score, 3) for x in table.itertuples()},
                             "near_threshold": int(((r.details["retrieval"].retrieval - 0.1).abs() <= 0.02).sum()),
                             "top5": {f"L{x.layer}H{x.head}": round(x.retrieval, 3) for x in
                                      r.details["retrieval"].nlargest(5, "retrieval").itertuples()}}
        found.append(set(out["sets"][seed]["heads"]))
        print(f"seed {seed}: {out['sets'][seed]}")
    if found:
        out["stability"] = {"in_all_3": sorted(set.intersection(*found)), "in_any": sorted(set().union(*found))}
    names = args.heads.split(",") if args.heads else list(out["sets"][0]["heads"])
    heads = [(int(h[1:].split("H")[0]), int(h.split("H")[1])) for h in names]
    tok = model.tokenizer
    bos = tok.bos_token_id
    batches = needle_batches(model.cfg.d_vocab, args.causal_seqs, args.context, args.needle, n_ctx=model.cfg.n_ctx,
                             bos_id=bos, seed=10, batch_size=args.causal_seqs)
    tokens = batches[0].tokens
    if heads:
        t = time.perf_counter()
        df = paired_random_test(model, heads, kind_metric(model, "retrieval", tokens, half_len=args.needle),
                                n_draws=args.draws)
        a = df.attrs
        out["causal"] = {"heads": names, "recall_clean": float(df.value[0]), "recall_target": a["target_value"],
                         "target_effect": a["target_effect"], "random_effect_mean": a["random_effect"],
                         "random_min": a["random_min"], "random_max": a["random_max"],
                         "paired_mean": a["paired_mean"], "paired_ci": [a["paired_low"], a["paired_high"]],
                         "p_value": a["p_value"], "n_examples": a["n_examples"], "n_random": a["n_random"],
                         "random_sets_as_far": a["beyond_random"], "seconds": round(time.perf_counter() - t, 1)}
    else:
        out["causal"] = "no retrieval head: nothing to ablate"
    print("causal:", json.dumps(out["causal"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json} ({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
