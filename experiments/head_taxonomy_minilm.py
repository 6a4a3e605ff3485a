"""Head taxonomy of all-MiniLM-L6-v2 on the UD English EWT dev treebank.

Runs :func:`interp.analysis.classify_heads` (positional statistics over the treebank's sentences, induction
family on repeated random sequences, syntactic accuracy per relation against the best fixed-offset baseline)
and writes to the folder given with ``--out`` (the tracked ``experiments/results/`` is rewritten only when named
on purpose):

- ``minilm_positional.csv``: per head, mass and argmax share at offsets -3..+3, [CLS], delimiters, confidence;
- ``minilm_induction.csv``: previous-token / duplicate-token / induction scores;
- ``minilm_syntactic.csv``: per head, relation and direction: accuracy, offset baseline, gain;
- ``minilm_syntactic_baseline.csv``: the offset baseline per relation and direction;
- ``minilm_taxonomy.csv`` / ``.json``: the head report (kinds, scores, evidence) and a summary;
- ``minilm_taxonomy.html``: the layer x head figure;
- ``minilm_summary.md``: the table for the README (best head per relation vs baseline).

Usage (from the repository root)::

    python experiments/head_taxonomy_minilm.py --out runs/taxonomy
        [--conllu ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu] [--max-sentences N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from interp.analysis import classify_heads
from interp.viz import save_figure
from interp.zoo import load

ROOT = Path(__file__).resolve().parent
from expt_common import UD_DEV as DEFAULT_CONLLU  # noqa: E402 - the scripts' folder is on sys.path

MIN_COUNT = 100
MARGIN = 0.1


def best_per_relation(syn: pd.DataFrame) -> pd.DataFrame:
    """The best head per relation (either direction), with its baseline and gain; relations with >= MIN_COUNT arcs."""
    syn = syn[syn.n >= MIN_COUNT]
    best = syn.sort_values("accuracy", ascending=False).drop_duplicates(["relation"])
    best = best.assign(head_name=[f"L{r.layer}H{r.head}" for r in best.itertuples()])
    cols = ["relation", "direction", "n", "head_name", "accuracy", "baseline_offset", "baseline_accuracy", "gain"]
    return best[cols].sort_values("gain", ascending=False).reset_index(drop=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conllu", type=Path, default=DEFAULT_CONLLU)
    ap.add_argument("--max-sentences", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True,
                    help="folder to write the results to (experiments/results to update the tracked ones)")
    args = ap.parse_args()
    if not args.conllu.is_file():
        raise SystemExit(f"treebank not found: {args.conllu}")
    args.out.mkdir(parents=True, exist_ok=True)
    model = load("minilm-l6")
    t0 = time.time()
    report = classify_heads(model, conllu=args.conllu, max_sentences=args.max_sentences,
                            syntactic_margin=MARGIN, syntactic_min_count=MIN_COUNT, progress=True)
    seconds = time.time() - t0
    pos, ind, syn = report.details["positional"], report.details["induction"], report.details["syntactic"]
    pos.to_csv(args.out / "minilm_positional.csv", index=False)
    ind.to_csv(args.out / "minilm_induction.csv", index=False)
    syn.to_csv(args.out / "minilm_syntactic.csv", index=False)
    pd.DataFrame(syn.attrs["baseline"]).to_csv(args.out / "minilm_syntactic_baseline.csv", index=False)
    report.df.to_csv(args.out / "minilm_taxonomy.csv", index=False)
    save_figure(report.figure(), args.out / "minilm_taxonomy.html")  # plotly.js embedded: opens offline
    best = best_per_relation(syn)
    kinds = report.df.kind.str.split(":").str[0].value_counts().to_dict()
    summary = {
        "model": model.name, "treebank": args.conllu.name, "seconds": round(seconds, 1),
        "n_sentences": syn.attrs["n_sentences"], "n_skipped_too_long": syn.attrs["n_skipped_too_long"],
        "n_arcs": syn.attrs["n_arcs"], "thresholds": report.thresholds, "kind_counts": kinds,
        "heads_by_kind": {k: [f"L{a}H{b}" for a, b in report.heads(k)] for k in sorted(set(report.df.kind))},
        "best_head_per_relation": best.to_dict("records"),
    }
    (args.out / "minilm_taxonomy.json").write_text(json.dumps(summary, indent=2, default=str))
    pos_heads = report.df[report.df.kind.str.startswith("positional:")]
    lines = [
        f"## Head taxonomy of all-MiniLM-L6-v2 ({syn.attrs['n_sentences']} sentences of {args.conllu.name}, "
        f"{syn.attrs['n_skipped_too_long']} skipped as too long)",
        "",
        f"Best head per relation (relations with >= {MIN_COUNT} arcs; accuracy of the most-attended other word; "
        "baseline = best fixed offset):",
        "",
        best.to_markdown(index=False, floatfmt=".2f") if _has_tabulate() else best.to_string(index=False),
        "",
        f"Syntactic heads (gain >= {MARGIN}): "
        + ", ".join(f"{k} {len(v)}" for k, v in summary["heads_by_kind"].items() if k.startswith("syntactic:")),
        "",
        "Positional heads (argmax share >= 0.9): "
        + ", ".join(f"L{r.layer}H{r.head} {r.kind} ({r.score:.2f})" for r in pos_heads.itertuples()),
        "",
    ]
    (args.out / "minilm_summary.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(report)
    print(f"wrote results to {args.out} in {seconds:.0f}s")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
