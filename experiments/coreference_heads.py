"""Coreference heads of a model on GAP development and GUM (CorefUD): per-head tables, baselines and a figure.

For each dataset, :func:`interp.analysis.coreference.coreference_scores` gives every head's antecedent accuracy
(Clark et al. 2019: the candidate whose tokens get the most attention from the mention's head word) with a
Wilson 95 % interval, and the baselines on the same mentions. Writes to ``<out>/`` (default
``experiments/results/coref/<model>/``):

- ``<dataset>_heads.csv``: ``layer, head, group, n, accuracy, ci_low, ci_high, best_baseline, baseline_accuracy,
  gain, gain_ci_low, gain_ci_high`` (Wilson interval of the accuracy, paired bootstrap interval of the gain);
- ``<dataset>_baselines.csv``: ``group, baseline, n, accuracy, ci_low, ci_high``;
- ``<dataset>.json``: counts (rows / mentions scored and skipped), baselines, the best heads, run time;
- ``<dataset>.html`` (and ``.png`` when static export works): :func:`interp.viz.coreference_figure`;
- ``summary.md``: the README table (best heads per group against the best baseline).

Resumable: a dataset whose ``_heads.csv`` exists is read back, not recomputed (``--fresh`` recomputes). Any
model of the zoo works unchanged (``--model smollm2-135m`` once the GGUF loader is in): causal models score
only backward antecedents (on GAP, the rows whose two names precede the pronoun: group ``backward``).

Usage (from the repository root)::

    python experiments/coreference_heads.py --model minilm-l6 --out DIR [--datasets gap gum]
        [--max-items N] [--fresh]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
from expt_common import SHARED_DATA as DATA  # noqa: E402 - the scripts' folder is on sys.path

from interp.analysis.coreference import coreference_scores
from interp.viz import coreference_figure
from interp.zoo import load

DATASETS = {"gap": DATA / "gap" / "gap-development.tsv", "gum": DATA / "gum-coref" / "en_gum-ud-dev.ccby.conllu"}
FIGURE_GROUP = {"gap": "all", "gum": "all"}


def best_heads(heads: pd.DataFrame, k: int = 3) -> pd.DataFrame:
    """The ``k`` most accurate heads per group, with the group's best baseline and the gain."""
    order = {g: i for i, g in enumerate(dict.fromkeys(heads.group))}
    top = heads.sort_values("accuracy", ascending=False).groupby("group", sort=False).head(k)
    top = top.sort_values(["group", "accuracy"], key=lambda c: c.map(order) if c.name == "group" else -c,
                          kind="stable")
    top = top.assign(head_name=[f"L{r.layer}H{r.head}" for r in top.itertuples()])
    cols = ["group", "n", "head_name", "accuracy", "ci_low", "ci_high", "best_baseline", "baseline_accuracy", "gain",
            "gain_ci_low", "gain_ci_high"]
    return top[cols].reset_index(drop=True)


def run_dataset(model, name: str, path: Path, out: Path, args: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame]:
    heads_csv, base_csv = out / f"{name}_heads.csv", out / f"{name}_baselines.csv"
    if heads_csv.is_file() and base_csv.is_file() and not args.fresh:
        print(f"{name}: reading back {heads_csv} (--fresh recomputes)", file=sys.stderr)
        heads, base = pd.read_csv(heads_csv), pd.read_csv(base_csv)
        heads.attrs["baselines"] = base.to_dict("records")
        return heads, base
    t0 = time.time()
    heads = coreference_scores(model, path, dataset="gap" if name == "gap" else "corefud", batch_size=args.batch_size,
                               max_items=args.max_items, progress=True)
    seconds = time.time() - t0
    base = pd.DataFrame(heads.attrs["baselines"])
    heads.to_csv(heads_csv, index=False)
    base.to_csv(base_csv, index=False)
    info = {"model": args.model, "dataset": name, "file": str(path), "max_items": args.max_items,
            "seconds": round(seconds, 1), "stats": heads.attrs["stats"], "n_windows": heads.attrs["n_windows"],
            "not_scorable_causal": heads.attrs["not_scorable_causal"], "baselines": heads.attrs["baselines"],
            "best_heads": best_heads(heads).to_dict("records")}
    (out / f"{name}.json").write_text(json.dumps(info, indent=1, default=float))
    fig = coreference_figure(heads, group=FIGURE_GROUP[name], title=f"{args.model}: coreference heads on {name} "
                                                                    f"({FIGURE_GROUP[name]} mentions)")
    fig.write_html(out / f"{name}.html", include_plotlyjs="cdn")
    try:
        fig.write_image(out / f"{name}.png", width=1100, height=520)
    except Exception as e:  # kaleido (static export) is optional; the HTML figure is always written
        print(f"(no PNG: {type(e).__name__}: {str(e).strip().splitlines()[0][:120]})", file=sys.stderr)
    print(f"{name}: {seconds:.0f} s", file=sys.stderr)
    return heads, base


def summary(model_name: str, results: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> str:
    lines = [f"# Coreference heads of {model_name}", ""]
    for name, (heads, base) in results.items():
        lines += [f"## {name}", "", "Baselines (Wilson 95% interval; random: expected accuracy):", "",
                  "| group | baseline | n | accuracy | 95% CI |", "|---|---|---|---|---|"]
        lines += [f"| {b.group} | {b.baseline} | {b.n} | {b.accuracy:.3f} | {b.ci_low:.3f}-{b.ci_high:.3f} |"
                  for b in base.itertuples()]
        lines += ["", ("Best heads per group (accuracy: Wilson 95% CI; gain over the best baseline: paired bootstrap "
                       "95% CI over mentions):"), "",
                  "| group | n | head | accuracy | 95% CI | best baseline | gain | gain 95% CI |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r.group} | {r.n} | {r.head_name} | {r.accuracy:.3f} | {r.ci_low:.3f}-{r.ci_high:.3f} | "
                  f"{r.best_baseline} {r.baseline_accuracy:.3f} | {r.gain:+.3f} | {r.gain_ci_low:+.3f} to "
                  f"{r.gain_ci_high:+.3f} |" for r in best_heads(heads).itertuples()]
        beat = heads[heads.gain_ci_low > 0]
        lines += ["", f"Heads whose paired gain interval lies above 0 (of {heads[['layer', 'head']].drop_duplicates().shape[0]}"
                  " heads per group, no correction for multiple comparisons): "
                  + (", ".join(f"L{r.layer}H{r.head} ({r.group}, {r.gain:+.3f})" for r in beat.itertuples()) or "none"),
                  ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm-l6", help="a zoo name or checkpoint path (default minilm-l6)")
    ap.add_argument("--out", type=Path, required=True, help="results folder (resumable: datasets already there "
                                                             "are kept unless --fresh)")
    ap.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=["gap", "gum"])
    ap.add_argument("--gap", type=Path, default=DATASETS["gap"], help="GAP TSV (default: GAP development)")
    ap.add_argument("--gum", type=Path, default=DATASETS["gum"], help="CorefUD CoNLL-U (default: GUM dev CC-BY)")
    ap.add_argument("--max-items", type=int, default=None, help="only the first GAP rows / GUM documents")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--fresh", action="store_true", help="recompute datasets already written")
    args = ap.parse_args(argv)
    paths = {"gap": args.gap, "gum": args.gum}
    for d in args.datasets:
        if not paths[d].is_file():
            raise SystemExit(f"{d} data not found: {paths[d]}")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = load(args.model)
    results = {d: run_dataset(model, d, paths[d], out, args) for d in args.datasets}
    text = summary(args.model, results)
    (out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
