"""Head taxonomy of any model: positional, previous-token, duplicate-token, induction and (for models with a word
tokenizer) syntactic heads on UD EWT dev, via :func:`interp.analysis.classify_heads`.

Writes under ``--out``: ``taxonomy.csv`` (the report: layer, head, kind, score, evidence), one CSV per analysis
(``positional.csv``, ``induction.csv``, ``syntactic.csv``), ``taxonomy.html`` (layer x head figure) and
``summary.md`` (heads per kind; the top induction heads by score). Subtypes are kept in the syntactic scores,
with Clark et al.'s two directions (interp.analysis.syntactic).

Usage (from the repository root)::

    python experiments/head_taxonomy.py --model smollm2-135m --out experiments/results/smollm2/taxonomy
    python experiments/head_taxonomy.py --model induction-2l --out /tmp/taxonomy_induction-2l
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

# The shared data folder sits beside the repository (../shared/data); a default here, never in the library.
from expt_common import UD_DEV  # noqa: E402 - the scripts' folder is on sys.path

from interp.analysis import classify_heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="induction-2l")
    ap.add_argument("--conllu", type=Path, default=UD_DEV)
    ap.add_argument("--max-sentences", type=int, default=None)
    ap.add_argument("--top", type=int, default=10, help="top induction heads listed in the summary")
    ap.add_argument("--n-seqs", type=int, default=32, help="repeated random sequences for the induction scores")
    ap.add_argument("--half-len", type=int, default=None, help="tokens repeated per sequence (default: the "
                    "library's); the copying score costs n_seqs * half_len * heads * vocab, large for a 49k vocab")
    ap.add_argument("--copying-rows", type=int, default=None, help="score copying on at most this many random "
                    "rows per induction batch (default: all rows; SmolLM2 wants ~128)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from interp.zoo import load

    model = load(args.model)
    model.eval()
    # Each condition on its own, so that the summary says which one stopped the syntactic scores.
    why_not = []
    if not hasattr(getattr(model, "tokenizer", None), "encode_words"):
        why_not.append(f"{args.model} has no word tokenizer (its tokenizer cannot map tokens to treebank words)")
    if not args.conllu.is_file():
        why_not.append(f"no treebank file at {str(args.conllu.resolve())!r} (pass --conllu)")
    words = not why_not
    report = classify_heads(model, conllu=args.conllu if words else None, max_sentences=args.max_sentences,
                            n_seqs=args.n_seqs, half_len=args.half_len, copying_rows=args.copying_rows,
                            progress=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report.df.to_csv(args.out / "taxonomy.csv", index=False)
    for name, df in report.details.items():
        if isinstance(df, pd.DataFrame):
            df.to_csv(args.out / f"{name}.csv", index=False)
    report.figure().write_html(args.out / "taxonomy.html", include_plotlyjs="cdn")
    kinds = report.df.kind.str.replace(r":.*", "", regex=True).value_counts()
    lines = [f"# {args.model}: head taxonomy", "", "| kind | heads |", "|---|---|"]
    lines += [f"| {k} | {n} |" for k, n in kinds.items()]
    ind = report.details.get("induction")
    if isinstance(ind, pd.DataFrame) and "induction" in ind:
        top = ind.sort_values("induction", ascending=False).head(args.top)
        lines += ["", f"Top {args.top} induction heads (prefix-matching score on repeated random tokens):", "",
                  "| head | induction | previous_token | copying |", "|---|---|---|---|"]
        lines += [f"| L{r.layer}H{r.head} | {r.induction:.2f} | {r.previous_token:.2f} | {r.copying:.2f} |"
                  for r in top.itertuples()]
    if not words:
        lines += ["", f"(no syntactic scores: {'; and '.join(why_not)})"]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
