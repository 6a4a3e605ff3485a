"""Syntax tables (Clark et al. 2019) for any model with a word tokenizer: for every relation with enough arcs,
the best head in each direction (dep->head, head<-dep) against the best fixed-offset baseline (-3..+2), subtypes
kept; plus the pooled view (subtypes folded, per-subtype baseline mixture) and interp's older head->dep.

Writes under ``--out``: ``syntactic.csv`` (every head x relation x direction, subtypes kept),
``syntactic_pooled.csv``, ``baseline.csv``, ``summary.md`` (best heads; for causal models also the scorable arcs).
Resumable: finished CSVs are read back (``--fresh`` recomputes).

Usage (from the repository root)::

    python experiments/syntax_tables.py --model minilm-l6 --out experiments/results/syntax_minilm-l6
    python experiments/syntax_tables.py --model smollm2-135m --out experiments/results/smollm2/syntax
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

# The shared data folder sits beside the repository (../shared/data); a default here, never in the library.
from expt_common import UD_DEV  # noqa: E402 - the scripts' folder is on sys.path

from interp.analysis import syntactic_scores


def best_table(df: pd.DataFrame, min_n: int) -> pd.DataFrame:
    """Best head per (relation, direction), relations with at least ``min_n`` arcs, by gain."""
    d = df[df.n >= min_n]
    best = d.sort_values("accuracy", ascending=False).drop_duplicates(["relation", "direction"])
    best = best.assign(best_head=[f"L{a}H{b}" for a, b in zip(best.layer, best["head"])])
    cols = ["relation", "direction", "n", "n_scorable", "best_head", "accuracy", "baseline_offset",
            "baseline_accuracy", "gain"]
    return best[cols].sort_values(["gain"], ascending=False).reset_index(drop=True)


def to_markdown(t: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
    for r in t.itertuples(index=False):
        cells = [f"{v:+.2f}" if k == "gain" else f"{v:.2f}" if isinstance(v, float) else
                 (f"{v:+d}" if k == "baseline_offset" and isinstance(v, int) else str(v)) for k, v in zip(t.columns, r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--conllu", type=Path, default=UD_DEV)
    ap.add_argument("--max-sentences", type=int, default=None)
    ap.add_argument("--min-n", type=int, default=100, help="relations with at least this many arcs in the tables")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from interp.zoo import load

    model = load(args.model)
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    f_kept, f_pool = args.out / "syntactic.csv", args.out / "syntactic_pooled.csv"
    if f_kept.exists() and f_pool.exists() and not args.fresh:
        kept, pooled = pd.read_csv(f_kept), pd.read_csv(f_pool)
    else:
        kept = syntactic_scores(model, args.conllu, max_sentences=args.max_sentences, batch_size=args.batch_size,
                                directions=["dep->head", "head<-dep", "head->dep"], progress=True)
        pd.DataFrame(kept.attrs["baseline"]).to_csv(args.out / "baseline.csv", index=False)
        n_sent = kept.attrs["n_sentences"]
        pooled = syntactic_scores(model, args.conllu, max_sentences=args.max_sentences, batch_size=args.batch_size,
                                  strip_subtypes=True, progress=True)
        kept.to_csv(f_kept, index=False)
        pooled.to_csv(f_pool, index=False)
        (args.out / "n_sentences.txt").write_text(f"{n_sent}\n")
    n_sent = (args.out / "n_sentences.txt").read_text().strip()
    clark = kept[kept.direction != "head->dep"]
    parts = [f"# {args.model}: syntactic heads on {args.conllu.name} ({n_sent} sentences)", "",
             "Clark et al. (2019): best head per relation and direction, subtypes kept; baseline = best fixed "
             f"offset from the dependent in -3..+2; relations with >= {args.min_n} arcs.", "",
             "## dep->head and head<-dep, subtypes kept", "", to_markdown(best_table(clark, args.min_n)), "",
             "## Subtypes pooled (per-subtype baseline mixture)", "",
             to_markdown(best_table(pooled, args.min_n)), "",
             "## interp's older head->dep (is the head word's own argmax the dependent?)", "",
             to_markdown(best_table(kept[kept.direction == "head->dep"], args.min_n)), ""]
    (args.out / "summary.md").write_text("\n".join(parts))
    print("\n".join(parts))


if __name__ == "__main__":
    main()
