"""The head kinds of issue 35 on SmolLM2-135M: sinks, copy suppression and successor heads, with their intervals,
their stability over 3 disjoint text sets, and the causal test against 20 random head sets of the same size.

- sink: measured on 3 disjoint sets of UD EWT dev sentences (five to a text; ``--texts`` texts a set);
- copy suppression: the weights, on 3 disjoint samples of vocabulary tokens (``--cs-tokens`` each);
- successor: the weights, on the ordinal tasks of :mod:`interp.data.ordinal` that SmolLM2 holds as single tokens
  (the whole set, then each task alone);
- causal: mean ablation of the kind's heads (found on set 1) vs 20 random sets of the same size
  (:mod:`interp.analysis.kind_causal`): text loss (sink), log-prob of earlier-seen tokens (copy suppression),
  log-prob of the next ordinal item after three (successor); a paired Wilcoxon test and a bootstrap interval.

Usage:
    OMP_NUM_THREADS=1 python experiments/new_head_kinds_smollm2.py --json out.json [--threads 1] [--texts 24]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

EWT = [root / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
       for root in Path(__file__).resolve().parents[1:4]]
KINDS = ["sink", "copy-suppression", "successor"]


def text_sets(n_sets: int, per_set: int) -> list[list[str]]:
    """``n_sets`` disjoint lists of ``per_set`` texts, each five consecutive UD EWT dev sentences of 8+ words."""
    path = next((q for q in EWT if q.exists()), None)
    if path is None:
        raise SystemExit(f"needs UD EWT dev beside the project: {EWT[0]}")
    sents = [line[len("# text = "):].strip() for line in path.read_text().splitlines()
             if line.startswith("# text = ") and len(line.split()) >= 11]
    texts = [" ".join(sents[i:i + 5]) for i in range(0, len(sents) - 5, 5)]
    if len(texts) < n_sets * per_set:
        raise SystemExit(f"only {len(texts)} texts for {n_sets} x {per_set}")
    return [texts[i * per_set:(i + 1) * per_set] for i in range(n_sets)]


def summary(report, kind: str, threshold: float) -> dict:
    df = report.df[report.df.kind == kind]
    sure = df[~df.uncertain.astype(bool)]
    detail = report.details.get("sink") if kind == "sink" else None
    scores = (detail.sink_mass if detail is not None else None)
    near = None
    if scores is not None:
        near = int(((scores - threshold).abs() <= 0.02).sum())
    return {"heads": [f"L{r.layer}H{r.head}" for r in sure.itertuples()],
            "scores": {f"L{r.layer}H{r.head}": [round(r.score, 4), round(r.low, 4), round(r.high, 4)]
                       for r in df.itertuples()},
            "uncertain": [f"L{r.layer}H{r.head}" for r in df[df.uncertain.astype(bool)].itertuples()],
            "within_0.02_of_threshold": near, "probe": report.probes.get(kind)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--texts", type=int, default=24, help="texts per disjoint set (five sentences each)")
    ap.add_argument("--cs-tokens", type=int, default=1024)
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--causal-texts", type=int, default=16)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--bf16", action="store_true", help="also classify in bfloat16 and compare")
    ap.add_argument("--json", type=Path, required=True, help="where the figures go")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import interp
    from interp.analysis import classify_heads
    from interp.analysis.copy_suppression import copy_suppression_scores
    from interp.analysis.kind_causal import kind_metric, ordinal_prompts, paired_random_test
    from interp.analysis.successor import succession_scores
    from interp.data.ordinal import ordinal_token_sequences

    t0 = time.perf_counter()
    model = interp.load("smollm2-135m", dtype=torch.float32).eval()
    print(f"loaded in {time.perf_counter() - t0:.1f} s")
    out: dict = {"model": "smollm2-135m", "threads": args.threads, "sets": {}}
    sets = text_sets(3, args.texts)
    reports = []
    for i, texts in enumerate(sets):
        t = time.perf_counter()
        r = classify_heads(model, texts=texts, kinds=["positional", "sink", "copy-suppression", "successor"],
                           bootstrap=args.bootstrap, seed=i, batch_size=8, progress=False,
                           options={"copy_suppression_tokens": args.cs_tokens})
        secs = time.perf_counter() - t
        reports.append(r)
        th = r.thresholds
        out["sets"][i] = {"seconds": round(secs, 1), **{k: summary(r, k, th[{"sink": "sink_threshold",
                          "copy-suppression": "copy_suppression_threshold",
                          "successor": "successor_threshold"}[k]]) for k in KINDS}}
        print(f"set {i}: {secs:.1f} s; " + "; ".join(f"{k}: {out['sets'][i][k]['heads']} (uncertain "
                                                     f"{out['sets'][i][k]['uncertain']})" for k in KINDS))
    # Stability: heads keeping each kind in all 3 sets (sink: disjoint texts; copy suppression: its token draw
    # follows the seed, so the 3 sets score different vocabulary samples; successor: the weights, same data).
    stab = {}
    for k in KINDS:
        found = [set(out["sets"][i][k]["heads"]) for i in range(3)]
        union = set().union(*found)
        stab[k] = {"in_all_3": sorted(set.intersection(*found)), "in_any": sorted(union)}
    out["stability"] = stab
    print("stability:", json.dumps(stab))

    # Near thresholds over all heads, set 0 (copy suppression and successor from their full score tables).
    cs = copy_suppression_scores(model, n_tokens=args.cs_tokens, seed=0).mean(-1)  # [L, H]
    tok = model.tokenizer
    seqs = ordinal_token_sequences(tok)
    hits = succession_scores(model, seqs)  # [L, H, n]
    sc = hits.mean(-1)
    out["near_threshold"] = {
        "sink": out["sets"][0]["sink"]["within_0.02_of_threshold"],
        "copy-suppression": int(((cs - 0.9).abs() <= 0.02).sum()),
        "successor": int(((sc - 0.5).abs() <= 0.02).sum()),
    }
    out["ordinal_tasks"] = {k: len(v) for k, v in seqs.items()}
    top = lambda m, n=5: [(f"L{i // m.shape[1]}H{i % m.shape[1]}", round(float(m.flatten()[i]), 3))  # noqa: E731
                          for i in m.flatten().nan_to_num(-1).argsort(descending=True)[:n].tolist()]
    out["top"] = {"copy-suppression": top(cs), "successor": top(sc),
                  "sink": top(torch.tensor(reports[0].details["sink"].sink_mass.values).view(cs.shape))}
    # Successor per task: the top head's share of hits on each task alone.
    per_task = {}
    for name, ids in seqs.items():
        h = succession_scores(model, {name: ids}).mean(-1)
        per_task[name] = top(h, 3)
    out["successor_per_task"] = per_task
    print("top:", json.dumps(out["top"]))
    print("successor per task:", json.dumps(per_task))

    # Causal: the heads found on set 0, against random sets of the same size.
    bos = tok.bos_token_id
    ids, mask = tok.encode_batch_with_mask(sets[1][:2 * args.causal_texts], max_length=48)
    text = ids[mask.bool().all(1)][:args.causal_texts]  # [N, 48]: texts without padding
    prompts, answers = ordinal_prompts(seqs, bos_id=bos)
    out["causal"] = {}
    for k in KINDS:
        heads = [(int(h[1:].split("H")[0]), int(h.split("H")[1])) for h in out["sets"][0][k]["heads"]]
        label = k
        if not heads:  # no head passed: test the 3 top-scoring candidates instead, and say so
            heads = [(int(h[1:].split("H")[0]), int(h.split("H")[1])) for h, _ in out["top"][k][:3]]
            label = f"{k} (no head passed; the 3 top-scoring heads)"
        t = time.perf_counter()
        if k == "successor":
            per = kind_metric(model, k, prompts, answers=answers)
        else:
            per = kind_metric(model, k, text)
        df = paired_random_test(model, heads, per, n_draws=args.draws, seed=0)
        a = df.attrs
        out["causal"][k] = {"tested": label, "heads": [f"L{a}H{b}" for a, b in heads] if len(heads) <= 10 else len(heads), "metric_clean": float(df.value[0]),
                            "metric_target": a["target_value"], "target_effect": a["target_effect"],
                            "random_effect_mean": a["random_effect"], "random_min": a["random_min"],
                            "random_max": a["random_max"], "paired_mean": a["paired_mean"],
                            "paired_ci": [a["paired_low"], a["paired_high"]], "p_value": a["p_value"],
                            "n_examples": a["n_examples"], "n_random": a["n_random"],
                            "random_sets_as_far": a["beyond_random"], "seconds": round(time.perf_counter() - t, 1)}
        print(f"causal {k}: {json.dumps(out['causal'][k])}")

    if args.bf16:
        bf = interp.load("smollm2-135m", dtype=torch.bfloat16).eval()
        r16 = classify_heads(bf, texts=sets[0], kinds=["sink", "copy-suppression", "successor"], seed=0,
                             batch_size=8, progress=False, options={"copy_suppression_tokens": args.cs_tokens})
        agree = {}
        for k in KINDS:
            a32 = set(reports[0].heads(k)) - {(int(h[1:].split("H")[0]), int(h.split("H")[1]))
                                               for h in out["sets"][0][k]["uncertain"]}
            a16 = set(r16.heads(k))
            agree[k] = {"float32": len(a32), "bf16": len(a16), "both": len(a32 & a16),
                        "only_f32": sorted(f"L{a}H{b}" for a, b in a32 - a16),
                        "only_bf16": sorted(f"L{a}H{b}" for a, b in a16 - a32)}
        out["bf16_vs_float32"] = agree
        print("bf16:", json.dumps(agree))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.json} ({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
