"""The analyses on SmolLM2-135M against the forward passes each one needs, side by side in one process.

Each analysis is timed interleaved with its reference (see benchutil), and the table gives the ratio:

- ``classify_heads(texts=[a short text])`` vs its forward passes (the text, and the 32 repeated sequences of the
  induction scores), target <= 2;
- ``classify_heads(conllu=UD EWT dev, max_sentences=500)`` vs one recorded pass over the same treebank batches,
  target <= 1.3;
- ``induction_scores(n_seqs=32)`` vs its forward pass, target <= 1.5;

  these three pairs are timed together, interleaved in one run (ratios within each repetition, with their range);
- then the parts of ``bench_patching.py`` (the same functions, so one implementation):
  ``coreference_scores(GAP dev)`` vs one recorded pass over the same (length-bucketed) windows, target <= 1.3;
  ``activation_patching(by="head")`` on a 14-token and a 64-token prompt pair vs the implementation before
  patched runs resumed (``patching_before.py``), target >= 2x faster, with nnsight's and TransformerLens' loops;
  ``by="head_pos"`` on the 64-token pair.

Usage:
    python experiments/benchmarks/bench_analysis_smollm2.py [--reps 3] [--gap-rows N] [--loop-every K]
        [--only texts,treebank,induction,coref,patch14,patch64,head_pos]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from typing import Any

import bench_patching
import torch
from benchutil import fix_threads, machine_info

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared", "data")
UD_DEV = os.path.join(SHARED, "ud-english-ewt", "en_ewt-ud-dev.conllu")
GAP_DEV = os.path.join(SHARED, "gap", "gap-development.tsv")
SHORT = "The cat sat on the mat. The cat sat on the mat."
PARTS = ("texts", "treebank", "induction", "coref", "patch14", "patch64", "head_pos")


def _side_by_side(model, interp, induction_scores, treebank_batches, ind_tokens, parts, a, threads) -> None:
    """classify_heads on a short text, classify_heads on the treebank and induction_scores, each with the
    forward passes it needs, all six timed in one interleaved run: every repetition runs each once, in a fresh
    seeded shuffle, so load drift hits them alike. A pair's ratio is taken within each repetition; the table
    gives its median and range over the repetitions."""
    pairs: dict[str, tuple[str, Any, str, Any, str]] = {}
    if "texts" in parts:
        text_tokens = model.to_tokens(SHORT)

        def forwards() -> None:
            model(text_tokens)
            model(ind_tokens)

        pairs["classify_heads(texts=[a short text])"] = (
            "its forward passes (the text + 32 repeated sequences)", forwards, "classify_heads(texts=...)",
            lambda: interp.classify_heads(model, texts=[SHORT], progress=False), "<= 2")
    if "treebank" in parts and os.path.isfile(UD_DEV):
        batches = list(treebank_batches(model, UD_DEV, batch_size=32, max_sentences=a.max_sentences))

        def recorded() -> None:
            for b in batches:
                model.run_with_cache(b.tokens, attention_mask=b.mask, names_filter="*hook_pattern")

        pairs[f"classify_heads(conllu=UD EWT dev, max_sentences={a.max_sentences})"] = (
            f"one recorded pass over the {len(batches)} treebank batches", recorded, "classify_heads(conllu=...)",
            lambda: interp.classify_heads(model, conllu=UD_DEV, max_sentences=a.max_sentences, progress=False),
            "<= 1.3")
    if "induction" in parts:
        pairs["induction_scores(n_seqs=32)"] = (
            "its forward pass (32 repeated sequences)", lambda: model(ind_tokens), "induction_scores",
            lambda: induction_scores(model, n_seqs=32, progress=False), "<= 1.5")
    fns = {}
    for title, (ref, ref_fn, call, call_fn, _) in pairs.items():
        fns[(title, "ref")], fns[(title, "call")] = ref_fn, call_fn
    times: dict[Any, list[float]] = {k: [] for k in fns}
    rng = random.Random(0)
    with torch.inference_mode():
        for k, fn in fns.items():  # one untimed run each (lazy imports, caches), the treebank only if asked
            if a.warmup_treebank or not k[0].startswith("classify_heads(conllu"):
                fn()
        for rep in range(a.reps):
            for k in rng.sample(list(fns), len(fns)):
                t0 = time.perf_counter()
                fns[k]()
                times[k].append(time.perf_counter() - t0)
            print(f"repetition {rep + 1}: " + "; ".join(
                f"{k[0]} {k[1]} {times[k][-1]:.1f} s" for k in fns), flush=True)
    print(f"\n### The three analyses side by side ({a.reps} interleaved repetitions in one run, each pair's ratio taken "
          f"within a repetition; {threads} torch threads)\n")
    print(f"{machine_info()}\n")
    print("| call | reference | reference median s | call median s | ratio median | ratio range | target |")
    print("|---|---|---:|---:|---:|---|---|")
    for title, (ref, _, call, _, target) in pairs.items():
        r, c = times[(title, "ref")], times[(title, "call")]
        ratios = [ci / ri for ci, ri in zip(c, r)]
        print(f"| {title} | {ref} | {statistics.median(r):.2f} | {statistics.median(c):.2f} | "
              f"{statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} | {target} |")
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gap-rows", type=int, default=None, help="only the first GAP dev rows (default: all 2000)")
    p.add_argument("--max-sentences", type=int, default=500)
    p.add_argument("--loop-every", type=int, default=30, help="nnsight / TL loops patch every K-th head (scaled)")
    p.add_argument("--before-runs", type=int, default=4, help="passes of the old code timed for head_pos")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    p.add_argument("--warmup-treebank", action="store_true",
                   help="also give the treebank pair an untimed run first (the others always get one)")
    a = p.parse_args(argv)
    parts = a.only.split(",")
    threads = fix_threads()
    print("## analysis on SmolLM2-135M: each call vs the forward passes it needs\n")
    print(machine_info() + "\n")
    import interp
    from interp.analysis import induction_scores
    from interp.data import repeated_tokens_for, treebank_batches

    model = interp.load("smollm2-135m").eval()

    ind_tokens = repeated_tokens_for(model, 32)
    if any(part in parts for part in ("texts", "treebank", "induction")):
        _side_by_side(model, interp, induction_scores, treebank_batches, ind_tokens, parts, a, threads)
    # Coreference and patching: bench_patching's parts, on the same model.
    if "coref" in parts and os.path.isfile(GAP_DEV):
        print(bench_patching.bench_coref(model, a.gap_rows, 1) + "\n", flush=True)
    for n in (14, 64):
        if f"patch{n}" in parts:
            print(bench_patching.bench_patch(model, n, a.reps if n == 14 else 1, a.loop_every) + "\n", flush=True)
    if "head_pos" in parts:
        print(bench_patching.bench_head_pos(model, a.before_runs) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
