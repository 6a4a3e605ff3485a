"""The analyses on SmolLM2-135M against the forward passes each one needs, side by side in one process.

Each analysis is timed interleaved with its reference (see benchutil), and the table gives the ratio:

- ``classify_heads(texts=[a short text])`` vs its forward passes (the text, and the 32 repeated sequences of the
  induction scores), target <= 2;
- ``classify_heads(conllu=UD EWT dev, max_sentences=500)`` vs one recorded pass over the same treebank batches,
  target <= 1.3;
- ``induction_scores(n_seqs=32)`` vs its forward pass, target <= 1.5;

  these three pairs are timed together, interleaved in one run (ratios within each repetition, with their range);
- ``coreference_scores(GAP dev)`` vs one recorded pass over the same (length-bucketed) windows, target <= 1.3;
- ``activation_patching(by="head")`` on a 14-token and a 64-token prompt pair vs the implementation before
  patched runs resumed at the patched layer (kept below as ``_patching_before``), target >= 2x faster, with the
  largest difference of the metrics.

Usage:
    python experiments/benchmarks/bench_analysis_smollm2.py [--reps 3] [--gap-rows N] [--only a,b,...]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from typing import Any

import torch
from benchutil import fix_threads, machine_info, ratio_table, time_interleaved

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared", "data")
UD_DEV = os.path.join(SHARED, "ud-english-ewt", "en_ewt-ud-dev.conllu")
GAP_DEV = os.path.join(SHARED, "gap", "gap-development.tsv")
SHORT = "The cat sat on the mat. The cat sat on the mat."
PARTS = ("texts", "treebank", "induction", "coref", "patch14", "patch64")


def _patching_before(model, clean, corrupted, *, act="z", by="head", metric=None, answer_tokens=None,
                     direction="noising", attention_mask=None, batch_size=256):
    """activation_patching as it was before resumed runs: every patched copy recomputes the whole model."""
    from interp.analysis.patching import _frame, _index, _sites, _source_run

    metric, names, base, src, m_src = _source_run(model, clean, corrupted, act, by, metric, answer_tokens,
                                                  direction, attention_mask)
    with torch.no_grad():
        m_base = float(metric(model(base, attention_mask=attention_mask)))
        n_units = [t.shape[2] if by.startswith("head") else 1 for t in src]
        sites = _sites(by, n_units, base.shape[1])
        values = []
        B = base.shape[0]
        per_run = max(1, batch_size // B)
        for start in range(0, len(sites), per_run):
            chunk = sites[start:start + per_run]
            tokens = base.repeat(len(chunk), 1)  # [n B, T]
            mask = None if attention_mask is None else attention_mask.repeat(len(chunk), 1)

            def hook(t: torch.Tensor, hook: Any, chunk=chunk) -> torch.Tensor:
                layer = names.index(hook.name)
                t = t.clone()
                for j, site in enumerate(chunk):
                    if site[0] == layer:
                        idx = _index(site)
                        t[j * B:(j + 1) * B][idx] = src[layer][idx].to(t.dtype)
                return t

            logits = model.run_with_hooks(tokens, attention_mask=mask,
                                          fwd_hooks=[(sorted({names[s[0]] for s in chunk}), hook)])
            values += [float(metric(logits[j * B:(j + 1) * B])) for j in range(len(chunk))]
    m_clean, m_corr = (m_base, m_src) if direction == "noising" else (m_src, m_base)
    return _frame(by, sites, values, m_clean, m_corr, {"act": act, "direction": direction, "method": "activation"})


def _prompt_pair(model, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n``-token clean / corrupted ids (names swapped in an IOI-style story) and the answer pair."""
    story = ("When Mary and John went to the store, John gave a drink to" if n <= 14 else
             "It was a quiet morning in the village. The baker opened his shop early, the children walked to "
             "school and the old dog slept by the fountain. When Mary and John went to the store after lunch, "
             "they met their neighbour, who talked about the weather for a long time. Later, John gave a drink to")
    ids = model.to_tokens(story)[0]
    ids = torch.cat([ids[:1], ids[len(ids) - (n - 1):]]) if len(ids) > n else ids  # keep BOS-like first id
    clean = ids[None]
    mary, john = model.to_tokens(" Mary")[0, -1], model.to_tokens(" John")[0, -1]
    corrupted = clean.clone()
    corrupted[clean == john] = -1
    corrupted[clean == mary] = john
    corrupted[corrupted == -1] = mary
    return clean, corrupted, torch.tensor([[int(mary), int(john)]])


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
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    p.add_argument("--warmup-treebank", action="store_true",
                   help="also give the treebank pair an untimed run first (the others always get one)")
    a = p.parse_args(argv)
    parts = a.only.split(",")
    threads = fix_threads()
    print("## analysis on SmolLM2-135M: each call vs the forward passes it needs\n")
    print(machine_info() + "\n")
    import interp
    from interp.analysis import activation_patching, coreference_scores, induction_scores
    from interp.analysis import coreference as coref_mod
    from interp.data import repeated_tokens_for, treebank_batches

    model = interp.load("smollm2-135m").eval()

    def show(title: str, variants: dict, baseline: str, targets: dict, reps: int) -> dict:
        with torch.inference_mode():
            med = time_interleaved(variants, reps=reps, warmup=1)
        print(f"### {title}\n\nmedian of {reps} interleaved repetitions after one untimed run each; {threads} "
              "torch threads\n")
        print(ratio_table(med, baseline, targets=targets) + "\n", flush=True)
        return med

    ind_tokens = repeated_tokens_for(model, 32)
    if any(part in parts for part in ("texts", "treebank", "induction")):
        _side_by_side(model, interp, induction_scores, treebank_batches, ind_tokens, parts, a, threads)
    if "coref" in parts and os.path.isfile(GAP_DEV):
        seen: list = []
        real_stream = coref_mod.stream

        def capture(model_, batches_, reducers, **kw):  # the windows exactly as coreference_scores batches them
            seen.extend(batches_)
            return real_stream(model_, batches_, reducers, **kw)

        coref_mod.stream = capture
        try:
            coreference_scores(model, GAP_DEV, max_items=a.gap_rows, progress=False)
        finally:
            coref_mod.stream = real_stream

        def recorded_windows() -> None:
            for b in seen:
                model.run_with_cache(b.tokens, attention_mask=b.mask, names_filter="*hook_pattern")

        rows = a.gap_rows or 2000
        show(f"coreference_scores(GAP dev, {rows} rows, {len(seen)} batches)", {
            "one recorded pass": recorded_windows,
            "coreference_scores": lambda: coreference_scores(model, GAP_DEV, max_items=a.gap_rows, progress=False)},
            "one recorded pass", {"coreference_scores": "<= 1.3"}, 1)
    for n in (14, 64):
        if f"patch{n}" not in parts:
            continue
        clean, corrupted, answers = _prompt_pair(model, n)
        new = activation_patching(model, clean, corrupted, answer_tokens=answers, progress=False)
        old = _patching_before(model, clean, corrupted, answer_tokens=answers)
        diff = float((new["metric"] - old["metric"]).abs().max())
        med = show(f"activation_patching(by='head') on a {clean.shape[1]}-token pair ({len(new)} heads; largest "
                   f"metric difference {diff:.2e})", {
                       "before (every patched run from the embedding)": lambda: _patching_before(
                           model, clean, corrupted, answer_tokens=answers),
                       "activation_patching": lambda: activation_patching(model, clean, corrupted,
                                                                          answer_tokens=answers, progress=False)},
                   "before (every patched run from the embedding)", {"activation_patching": "<= 0.5"},
                   a.reps if n == 14 else 1)
        print(f"speed-up: {med['before (every patched run from the embedding)'] / med['activation_patching']:.2f}x\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
