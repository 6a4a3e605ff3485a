"""classify_heads on SmolLM2-135M in bfloat16 against float32: how many heads carry the same kinds?

The bf16 model computes attention scores and softmax in float32 and hands the float32 pattern to the reducers,
which sum in float64 (see docs/gpu.md, "Mixed precision"); what differs between the runs is the bf16 forward
pass itself (bf16 weights, activations and residual stream). For every head whose kinds differ, the script
prints each differing kind's score in both runs with its threshold, and the score step of one query row (a share
over ``n`` rows moves in steps of ``1 / n``), to tell a head sitting on a threshold from a real disagreement.

It also says how many heads lie within bf16's reach of a threshold: for each thresholded score, the largest
float32-vs-bf16 difference over all heads is bf16's reach on this run, and a head whose float32 score lies within
that distance of the threshold could land on either side.

``--texts N`` adds UD EWT dev sentences (five to a text) after the two short built-in texts, so that one query
row is a smaller share of a positional score. The thresholds are classify_heads' defaults, never moved.

Usage:
    python experiments/bf16_classify_kinds.py [--threads 2] [--texts 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

TEXTS = ["The cat sat on the mat. The cat sat on the mat.",
         "When Mary and John went to the store, John gave a drink to Mary. Later, they walked home together."]
# The shared data folder sits beside the checkout (a worktree) or inside it.
EWT = [root / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu" for root in Path(__file__).resolve().parents[1:3]]
# Scores that classify_heads thresholds (column of its details table -> threshold name).
POSITIONAL = "positional_threshold"
MASS = {"previous_token": "previous_token_threshold", "duplicate_token": "duplicate_token_threshold",
        "induction": "induction_threshold", "copying": "copying_threshold"}


def texts(n: int) -> list[str]:
    """The two built-in texts, then UD EWT dev sentences of at least 8 words, five to a text, up to ``n``."""
    if n <= len(TEXTS):
        return TEXTS[:n]
    path = next((q for q in EWT if q.exists()), EWT[0])
    sents = [line[len("# text = "):].strip() for line in path.read_text().splitlines()
             if line.startswith("# text = ") and len(line.split()) >= 11]
    extra = [" ".join(sents[i:i + 5]) for i in range(0, 5 * (n - len(TEXTS)), 5)]
    return TEXTS + extra


def near(f32, bf16, th: float, step: float) -> dict:
    """How bf16 moved one thresholded score: its largest move, and the heads within that move (and within one
    query row) of the threshold in float32."""
    both = f32.index.intersection(bf16.index)
    a, b = f32.loc[both].astype(float), bf16.loc[both].astype(float)
    ok = a.notna() & b.notna()
    a, b = a[ok], b[ok]
    reach = float((a - b).abs().max()) if len(a) else 0.0
    close = (a - th).abs() <= reach
    return {"threshold": th, "heads": int(len(a)), "max_abs_diff": reach,
            "mean_abs_diff": float((a - b).abs().mean()) if len(a) else 0.0,
            "within_reach": int(close.sum()),
            "close_heads": [{"layer": int(h[0]), "head": int(h[1]), "float32": float(a[h]), "bfloat16": float(b[h])}
                            for h in a.index[close]],
            "within_one_row": int(((a - th).abs() <= step).sum()) if step == step else None,
            "sides_differ": int(((a >= th) != (b >= th)).sum())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--texts", type=int, default=2, help="number of texts (2: the built-in two; more: + UD EWT)")
    p.add_argument("--json", default=None, help="write the comparison there")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    import interp

    data = texts(a.texts)
    reports, secs = {}, {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        model = interp.load("smollm2-135m", dtype=dtype).eval()
        t0 = time.perf_counter()
        reports[name] = interp.classify_heads(model, texts=data, progress=False)
        secs[name] = time.perf_counter() - t0
        del model
    f32, bf16 = (reports[k].as_dict() for k in ("float32", "bfloat16"))
    heads = sorted(set(f32) | set(bf16))
    same = [h for h in heads if f32.get(h, set()) == bf16.get(h, set())]
    th = reports["float32"].thresholds or {}
    pos = {k: r.details["positional"].set_index(["layer", "head"]) for k, r in reports.items()}
    ind = {k: r.details["induction"].set_index(["layer", "head"]) for k, r in reports.items()}
    n_rows = reports["float32"].details["positional"].attrs["rows"]
    diffs = []
    for h in heads:
        a32, a16 = f32.get(h, set()), bf16.get(h, set())
        for kind in sorted(a32 ^ a16):
            if kind.startswith("positional:"):
                lab = kind.split(":", 1)[1]
                col, step = f"argmax_{lab}", 1 / max(n_rows[lab], 1)
                s32, s16 = (float(pos[k].loc[h, col]) for k in ("float32", "bfloat16"))
            else:
                col = kind.replace("-", "_")
                s32, s16 = (float(ind[k].loc[h, col]) for k in ("float32", "bfloat16")) if col in ind[
                    "float32"] else (float("nan"), float("nan"))
                step = float("nan")
            diffs.append({"layer": h[0], "head": h[1], "kind": kind, "in": "float32" if kind in a32 else "bfloat16",
                          "score_float32": s32, "score_bfloat16": s16, "one_row_step": step})
    reach = {}
    for col in pos["float32"].columns:
        if col.startswith("argmax_"):
            lab = col.removeprefix("argmax_")
            reach[col] = near(pos["float32"][col], pos["bfloat16"][col], th[POSITIONAL],
                              1 / max(n_rows.get(lab, 0), 1))
    for col, th_name in MASS.items():
        if col in ind["float32"]:
            reach[col] = near(ind["float32"][col], ind["bfloat16"][col], th[th_name], float("nan"))
    out = {"texts": len(data), "rows": {k: int(v) for k, v in n_rows.items()},
           "heads_classified": len(heads), "same_kinds": len(same), "differing": diffs, "near_threshold": reach,
           "seconds": secs, "thresholds": {k: v for k, v in th.items() if isinstance(v, (int, float))},
           "precision": "bf16 weights and activations; scores, softmax and recorded patterns float32; "
                        "reducer sums float64"}
    print(f"bf16 vs float32 classify_heads on SmolLM2-135M ({len(data)} texts, defaults, {a.threads} threads): "
          f"{len(same)} of {len(heads)} classified heads carry identical kinds")
    print(f"  positional rows: {out['rows']}")
    for d in diffs:
        print(f"  L{d['layer']}H{d['head']} {d['kind']} only in {d['in']}: score float32 {d['score_float32']:.4f}, "
              f"bf16 {d['score_bfloat16']:.4f}, one query row = {d['one_row_step']:.4f}")
    print("  score                 threshold  max|f32-bf16|  mean  heads within that of the threshold  "
          "(within one row)  on opposite sides")
    for col, r in reach.items():
        row = "-" if r["within_one_row"] is None else str(r["within_one_row"])
        if math.isnan(r["max_abs_diff"]):
            continue
        print(f"  {col:22s} {r['threshold']:9.2f}  {r['max_abs_diff']:13.4f}  {r['mean_abs_diff']:.4f}  "
              f"{r['within_reach']:5d} of {r['heads']:<4d}  {row:>16s}  {r['sides_differ']:5d}")
    print(f"  float32 {secs['float32']:.1f} s, bf16 {secs['bfloat16']:.1f} s")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
