"""classify_heads on a treebank vs one recorded forward pass over the same batches, side by side in one process.

classify_heads feeds every text-based scorer (positional and syntactic) from one forward pass per treebank
batch, then runs the induction scorers on their own small synthetic batches. Its cost is compared with the
least any analysis of those patterns can cost: one forward pass over the same (length-bucketed) batches that
records every attention pattern. Target: ratio <= 1.3. For reference, the scorers run one by one (positional,
syntactic and induction each over their own data: two passes over the treebank, as before the one-pass
design).

Then the SmolLM2-135M section of ``bench_analysis_smollm2.py`` (every analysis against the forward passes it
needs; ``--no-smollm2`` skips it).

Usage:
    python experiments/benchmarks/bench_analysis.py [--conllu PATH] [--max-sentences N] [--reps 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from benchutil import fix_threads, machine_info, ratio_table, time_interleaved

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONLLU = os.path.join(HERE, "..", "..", "..", "shared", "data", "ud-english-ewt", "en_ewt-ud-dev.conllu")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conllu", default=DEFAULT_CONLLU, help="a CoNLL-U treebank (default: UD EWT dev beside the repo)")
    p.add_argument("--max-sentences", type=int, default=None, help="use only the first sentences (default: all)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="300 sentences, 2 repetitions")
    p.add_argument("--no-reference", action="store_true", help="skip the scorers-one-by-one variant")
    p.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2 section (bench_analysis_smollm2.py)")
    a = p.parse_args(argv)
    if a.quick:
        a.max_sentences, a.reps = a.max_sentences or 300, 2
    threads = fix_threads()
    print("## analysis: classify_heads vs one recorded forward pass\n")
    print(machine_info() + "\n")
    if not os.path.isfile(a.conllu):
        print(f"skipped: no treebank at {os.path.abspath(a.conllu)}")
        return 0
    try:
        import interp
        from interp.analysis import induction_scores, positional_scores, syntactic_scores
        from interp.data import TreebankStats, treebank_batches

        model = interp.load("minilm-l6")
    except ImportError as e:  # MiniLM's weights come with the hf extra
        print(f"skipped: {e}")
        return 0
    stats = TreebankStats()
    batches = list(treebank_batches(model, a.conllu, batch_size=32, max_sentences=a.max_sentences, stats=stats))

    def recorded_pass() -> None:
        for b in batches:
            model.run_with_cache(b.tokens, attention_mask=b.mask, names_filter="*hook_pattern")

    def classify() -> None:
        interp.classify_heads(model, conllu=a.conllu, max_sentences=a.max_sentences)

    def one_by_one() -> None:
        pos_batches = ((b.tokens, b.mask) for b in treebank_batches(model, a.conllu, max_sentences=a.max_sentences))
        positional_scores(model, pos_batches)
        syntactic_scores(model, a.conllu, max_sentences=a.max_sentences, batch_size=32)
        induction_scores(model)

    with torch.inference_mode():
        variants = {"one recorded forward pass": recorded_pass, "classify_heads": classify}
        if not a.no_reference:
            variants["scorers one by one"] = one_by_one
        med = time_interleaved(variants, reps=a.reps, warmup=1)  # one untimed run each: lazy imports, caches
    print(f"minilm-l6 on {stats.batched} sentences of {os.path.basename(a.conllu)} ({stats.skipped} longer than "
          f"n_ctx skipped), batches of 32 bucketed by length; {threads} torch threads; median of {a.reps} "
          "interleaved repetitions after one untimed run of each\n")
    print(ratio_table(med, "one recorded forward pass", targets={"classify_heads": "<= 1.3"}) + "\n")
    if not a.no_smollm2:  # every analysis on SmolLM2 against the forward passes it needs
        from bench_analysis_smollm2 import main as smollm2_main

        quick = ["--reps", "2", "--gap-rows", "100", "--max-sentences", "100", "--only", "texts,induction,patch14"]
        return smollm2_main(quick if a.quick else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
