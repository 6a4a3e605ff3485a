"""classify_heads on SmolLM2-135M in bfloat16 against float32: how many heads carry the same kinds?

The bf16 model records bf16 patterns; every reducer reads them in float32 and sums in float64 (see the
``interp.analysis`` docstrings), so what differs is only what the bf16 forward pass computes. For every head whose
kinds differ, the script prints each differing kind's score in both runs with its threshold, and the score step of
one query row (a share over ``n`` rows moves in steps of ``1 / n``), to tell a head sitting on a threshold
from a real disagreement.

Usage:
    python experiments/bf16_classify_kinds.py [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

TEXTS = ["The cat sat on the mat. The cat sat on the mat.",
         "When Mary and John went to the store, John gave a drink to Mary. Later, they walked home together."]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="write the comparison there")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    import interp

    reports, secs = {}, {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        model = interp.load("smollm2-135m", dtype=dtype).eval()
        t0 = time.perf_counter()
        reports[name] = interp.classify_heads(model, texts=TEXTS, progress=False)
        secs[name] = time.perf_counter() - t0
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
    out = {"heads_classified": len(heads), "same_kinds": len(same), "differing": diffs, "seconds": secs,
           "thresholds": {k: v for k, v in th.items() if isinstance(v, (int, float))}}
    print(f"bf16 vs float32 classify_heads on SmolLM2-135M ({len(TEXTS)} short texts, defaults, "
          f"{a.threads} threads): {len(same)} of {len(heads)} classified heads carry identical kinds")
    for d in diffs:
        print(f"  L{d['layer']}H{d['head']} {d['kind']} only in {d['in']}: score float32 {d['score_float32']:.4f}, "
              f"bf16 {d['score_bfloat16']:.4f}, one query row = {d['one_row_step']:.4f}")
    print(f"  float32 {secs['float32']:.1f} s, bf16 {secs['bfloat16']:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
