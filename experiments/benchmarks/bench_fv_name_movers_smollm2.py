"""Function-vector heads and name movers on SmolLM2-135M: each kind's heads with scores and intervals, stability
over 3 disjoint prompt sets, heads near the threshold and uncertain ones, the causal test against 20 random head
sets of the same size, and bf16 against float32.

- function-vector (Todd et al. 2024): AIE of each head's task-mean output on shuffled-label ICL prompts
  (``interp.data.icl``: antonym, country-capital, lowercase-uppercase, number-next-word, english-french-number).
  The 3 sets are disjoint: each task's pairs are dealt into 3 parts (``split_pairs``), so no set shares an input
  or an output with another. Causal: ICL accuracy on set 2's clean prompts (held out from set 1, where the heads
  were found) with the heads mean-ablated, against 20 random head sets of the same size; then the same for the
  top 10 heads by AIE (Todd et al. keep the top-ranked heads).
- name movers / negative name movers (Wang et al. 2022): attention END -> IO on IOI prompts
  (``interp.data.circuit_tasks.ioi_prompts``) plus the OV copying score on the names. The 3 sets are disjoint
  thirds of one draw of prompts. Causal: the logit difference IO - S on set 2's prompts with the heads
  mean-ablated (the mean over every position of the clean prompts; then Wang et al.'s knockout, the per-position
  mean over the "ABC" prompts), against 20 random head sets of the same size.

Usage:
    OMP_NUM_THREADS=1 python experiments/benchmarks/bench_fv_name_movers_smollm2.py [--out /tmp/fv_nm.json]
        [--icl-prompts 8] [--ioi-prompts 96] [--draws 20] [--bootstrap 1000] [--fv-top 10] [--no-bf16]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

KINDS = {"function-vector": "function_vector_threshold", "name-mover": "name_mover_threshold",
         "negative-name-mover": "name_mover_threshold"}


def label(h: tuple[int, int]) -> str:
    return f"L{h[0]}H{h[1]}"


def near_threshold(report: Any, kind: str) -> int:
    """Heads whose score lies within 0.02 of the threshold (function vector: every head's AIE; name movers: the
    heads that pass the copying gate of that sign)."""
    th = report.thresholds[KINDS[kind]]
    if kind == "function-vector":
        scores = report.details["function-vector"].aie
    else:
        d = report.details["name-mover"]
        gate = report.thresholds["name_mover_copying"]
        col = "copying" if kind == "name-mover" else "negative_copying"
        scores = d.attention_to_io[d[col] >= gate]
    return int(((scores - th).abs() <= 0.02).sum())


def summary(report: Any, kind: str) -> dict[str, Any]:
    df = report.df[report.df.kind == kind]
    sure = df[~df.uncertain.astype(bool)]
    return {"heads": [label((r.layer, r.head)) for r in sure.itertuples()],
            "scores": {label((r.layer, r.head)): [round(r.score, 4), round(r.low, 4), round(r.high, 4)]
                       for r in df.sort_values("score", ascending=False).itertuples()},
            "uncertain": [label((r.layer, r.head)) for r in df[df.uncertain.astype(bool)].itertuples()],
            "within_0.02": near_threshold(report, kind), "probe": report.probes.get("name-mover" if "name" in kind
                                                                                     else kind)}


def parse(h: str) -> tuple[int, int]:
    layer, head = h[1:].split("H")
    return int(layer), int(head)


def causal(model: Any, heads: list[tuple[int, int]], per: Any, draws: int) -> dict[str, Any]:
    from interp.analysis.kind_causal import paired_random_test

    t = time.perf_counter()
    df = paired_random_test(model, heads, per, n_draws=draws, seed=0)
    a = df.attrs
    return {"heads": [label(h) for h in heads], "clean": float(df.value[0]), "ablated": a["target_value"],
            "target_effect": a["target_effect"], "random_effect_mean": a["random_effect"],
            "random_min": a["random_min"], "random_max": a["random_max"], "paired_mean": a["paired_mean"],
            "paired_ci": [a["paired_low"], a["paired_high"]], "p_value": a["p_value"],
            "n_examples": a["n_examples"], "n_random": a["n_random"], "random_sets_as_far": a["beyond_random"],
            "seconds": round(time.perf_counter() - t, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/interp_fv_name_movers_smollm2.json"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--icl-prompts", type=int, default=8, help="ICL prompts per task and set")
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--ioi-prompts", type=int, default=96, help="IOI prompts, dealt into 3 sets")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--fv-top", type=int, default=10, help="also test the top-k AIE heads (0: no)")
    ap.add_argument("--no-bf16", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import interp
    from interp.analysis import classify_heads
    from interp.analysis.function_vector import icl_accuracy
    from interp.analysis.kind_causal import kind_metric
    from interp.data.circuit_tasks import TaskPrompts, ioi_prompts
    from interp.data.icl import icl_prompts, icl_token_pairs, split_pairs

    t0 = time.perf_counter()
    model = interp.load("smollm2-135m", dtype=torch.float32).eval()
    tok = model.tokenizer
    colon, newline = icl_token_pairs(tok, {"sep": [(":", "\n")]}, output_prefix="")["sep"][0]
    parts = split_pairs(icl_token_pairs(tok), 3)
    icl = [icl_prompts(p, args.icl_prompts, args.shots, bos_id=tok.bos_token_id, between=colon, after=newline,
                       seed=i) for i, p in enumerate(parts)]
    pool = ioi_prompts(model, args.ioi_prompts, seed=0)
    assert pool.answers is not None
    ioi = [TaskPrompts("ioi", pool.clean[i::3], pool.corrupted[i::3], answers=pool.answers[i::3]) for i in range(3)]
    out: dict[str, Any] = {"model": "smollm2-135m", "threads": args.threads, "icl_prompts": [len(p) for p in icl],
                           "ioi_prompts": [len(p.clean) for p in ioi], "sets": {}}

    def classify(m: Any, i: int, bootstrap: int) -> Any:
        return classify_heads(m, kinds=["function-vector", "name-mover"], bootstrap=bootstrap, seed=i,
                              progress=False, options={"icl_prompts": icl[i], "ioi_prompts": ioi[i]})

    reports = []
    for i in range(3):
        t = time.perf_counter()
        r = classify(model, i, args.bootstrap)
        reports.append(r)
        out["sets"][i] = {"seconds": round(time.perf_counter() - t, 1), **{k: summary(r, k) for k in KINDS}}
        print(f"set {i + 1} ({out['sets'][i]['seconds']} s): " + "; ".join(
            f"{k}: {out['sets'][i][k]['heads']} (uncertain {out['sets'][i][k]['uncertain']})" for k in KINDS),
            flush=True)
    fv = reports[0].details["function-vector"].sort_values("aie", ascending=False)
    out["function_vector_top10"] = [(label((int(r.layer), int(r.head))), round(float(r.aie), 4))
                                    for r in fv.head(10).itertuples()]
    out["stability"] = {}
    for k in KINDS:
        found = [set(out["sets"][i][k]["heads"]) for i in range(3)]
        out["stability"][k] = {"per_set": [len(f) for f in found], "in_all_3": sorted(set.intersection(*found)),
                               "in_any": sorted(set().union(*found))}
    print("stability:", json.dumps(out["stability"]), flush=True)

    # --- causal: heads found on set 1, measured on set 2 -----------------------------------------------------
    out["causal"] = {}
    clean_acc = icl_accuracy(model, icl[1])
    tasks = icl[1].tasks
    acc0 = clean_acc([])
    out["icl_accuracy_per_task"] = {t: float(acc0[[j for j, x in enumerate(tasks) if x == t]].mean())
                                    for t in dict.fromkeys(tasks)}
    per_nm = kind_metric(model, "name-mover", ioi[1].clean, answers=ioi[1].answers)
    for k, per in (("function-vector", clean_acc), ("name-mover", per_nm), ("negative-name-mover", per_nm)):
        heads = [parse(h) for h in out["sets"][0][k]["heads"]]
        tested = k
        if not heads:
            if k != "function-vector":
                out["causal"][k] = {"tested": "nothing: no head has the kind"}
                continue
            heads = [parse(h) for h, _ in out["function_vector_top10"][:3]]
            tested = f"{k} (no head passed; the 3 top-AIE heads)"
        out["causal"][k] = {"tested": tested, **causal(model, heads, per, args.draws)}
        print(f"causal {k}: {json.dumps(out['causal'][k])}", flush=True)
    # Wang et al.'s knockout: each head's per-position mean over the "ABC" prompts (three unrelated names).
    per_abc = kind_metric(model, "name-mover", ioi[1].clean, answers=ioi[1].answers, reference=ioi[1].corrupted,
                          per_position=True)
    for k in ("name-mover", "negative-name-mover"):
        heads = [parse(h) for h in out["sets"][0][k]["heads"]]
        if heads:
            key = f"{k} (per-position mean over ABC prompts)"
            out["causal"][key] = {"tested": key, **causal(model, heads, per_abc, args.draws)}
            print(f"causal {key}: {json.dumps(out['causal'][key])}", flush=True)
    if args.fv_top:  # Todd et al. keep the top-ranked heads: the same test on the top AIE heads of set 1
        heads = [parse(h) for h, _ in out["function_vector_top10"][:args.fv_top]]
        key = f"function-vector (top {len(heads)} by AIE)"
        out["causal"][key] = {"tested": key, **causal(model, heads, clean_acc, args.draws)}
        print(f"causal {key}: {json.dumps(out['causal'][key])}", flush=True)

    if not args.no_bf16:
        t = time.perf_counter()
        bf = interp.load("smollm2-135m", dtype=torch.bfloat16).eval()
        r16 = classify(bf, 0, args.bootstrap)
        agree = {}
        for k in KINDS:
            s32 = set(out["sets"][0][k]["heads"])
            s16 = set(summary(r16, k)["heads"])
            u32 = set(out["sets"][0][k]["uncertain"])
            agree[k] = {"float32": len(s32), "bf16": len(s16), "both": len(s32 & s16),
                        "only_float32": sorted(s32 - s16), "only_bf16": sorted(s16 - s32),
                        "only_bf16_uncertain_in_float32": sorted((s16 - s32) & u32)}
        a32 = reports[0].details["function-vector"].aie.values
        a16 = r16.details["function-vector"].aie.values
        agree["function-vector"]["aie_max_abs_diff"] = float(abs(a32 - a16).max())
        n32 = reports[0].details["name-mover"].attention_to_io.values
        n16 = r16.details["name-mover"].attention_to_io.values
        agree["name-mover"]["attention_max_abs_diff"] = float(abs(n32 - n16).max())
        agree["seconds"] = round(time.perf_counter() - t, 1)
        out["bf16_vs_float32"] = agree
        print("bf16:", json.dumps(agree), flush=True)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.out} ({out['seconds']} s in all)")


if __name__ == "__main__":
    main()
