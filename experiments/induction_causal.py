"""Are the top induction heads causal? Mean- and resample-ablate the top-k heads by induction score and compare
the in-context gain left with ablating k random heads (>= 20 random k-sets), on repeated random tokens and on
natural text with repeats (UD EWT dev sentences, a run of tokens repeated once).

The in-context gain is the mean next-token loss on the first half minus the loss on the repeated half. The
reference distribution for mean / resample ablation is other sequences of the same kind (another seed, other
text), never the evaluated sequences themselves. Zero-ablation is run too, for comparison: it is
off-distribution (see interp.analysis.ablate).

Writes under ``--out``: ``scores.csv`` (induction scores of every head), ``<data>_<method>.csv`` (one row per
ablated set: none, target, random i), ``summary.json`` / ``summary.md`` and ``ablation_vs_random.html`` (+ ``.png``
when kaleido works: the gain left per ablated set, target heads against the random sets). Resumable: finished
``<data>_<method>.csv`` files are read back, not recomputed (``--fresh`` starts over).

Usage (from the repository root)::

    python experiments/induction_causal.py --model induction-2l --out experiments/results/induction_causal_induction-2l
    python experiments/induction_causal.py --model smollm2-135m --k 4 --out experiments/results/smollm2/induction_causal
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd
import torch

# The shared data folder sits beside the repository (../shared/data); a default here, never in the library.
from expt_common import UD_DEV as UD  # noqa: E402 - the scripts' folder is on sys.path

from interp.analysis import induction_scores, repeated_tokens_for
from interp.analysis.ablate import (
    compare_with_random,
    head_z_means,
    head_z_samples,
    in_context_gain,
    repeated_text_sequences,
)


def datasets(model, n_seqs: int, half_len: int, seed: int, conllu: Path) -> dict[str, tuple]:
    """``{name: (tokens, reference, bos)}``: evaluated sequences and reference sequences of the same kind."""
    x = repeated_tokens_for(model, n_seqs, half_len, seed=seed)
    ref = repeated_tokens_for(model, n_seqs, half_len, seed=seed + 1)
    bos = x.shape[1] == 2 * half_len + 1
    out = {"random": (x, ref, bos)}
    if getattr(model.tokenizer, "special_ids", None) is not None and conllu.exists():
        from interp.pruning import ud_sentences

        both = repeated_text_sequences(model, ud_sentences(conllu, 4000), 2 * n_seqs, half_len,
                                       bos_id=int(x[0, 0]) if bos else None)
        if both.shape[1] == x.shape[1]:
            out["text"] = (both[:n_seqs], both[n_seqs:], bos)
    else:
        text_tok = getattr(model.tokenizer, "special_ids", None) is not None
        reason = (f"its tokenizer ({type(model.tokenizer).__name__}) is not a text tokenizer" if not text_tok
                  else f"no treebank file at {str(conllu)!r}")
        print(f"no natural-text check for {model.name}: {reason}")
    return out


def parse_head(name: str) -> tuple[int, int]:
    """``"L16H0"`` -> ``(16, 0)``."""
    m = re.fullmatch(r"L(\d+)H(\d+)", name.strip())
    if m is None:
        raise SystemExit(f"--also: {name!r} is not a head name like L16H0")
    return int(m.group(1)), int(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="induction-2l")
    ap.add_argument("--k", type=int, default=4, help="how many top induction heads to ablate")
    ap.add_argument("--n-draws", type=int, default=20, help="random k-head sets (>= 20)")
    ap.add_argument("--n-seqs", type=int, default=64)
    ap.add_argument("--half-len", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--methods", nargs="+", default=["mean", "resample", "zero"])
    ap.add_argument("--data", nargs="+", default=["random", "text"], choices=["random", "text"],
                    help="which evaluated data sets to run (scores always come from the random reference)")
    ap.add_argument("--conllu", type=Path, default=UD)
    ap.add_argument("--also", nargs="+", default=[], metavar="HEADS",
                    help="more head sets to ablate beside the target, each 'L16H0' or 'L16H0,L18H6' (written to "
                    "also.csv / also.md: e.g. a previous-token head that feeds the induction heads)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    if args.n_draws < 20:
        print(f"warning: --n-draws {args.n_draws} < 20 is too few random sets for a claim")
    if args.threads:
        torch.set_num_threads(args.threads)
    from interp import load as load_model  # checkpoints get their stored tokenizer

    model = load_model(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    data = datasets(model, args.n_seqs, args.half_len, args.seed, args.conllu)
    scores = induction_scores(model, data["random"][1], copying=False)  # scored on reference, not evaluated, data
    scores.to_csv(args.out / "scores.csv", index=False)
    top = scores.sort_values("induction", ascending=False).head(args.k)
    target = [(int(a), int(b)) for a, b in zip(top.layer, top["head"])]
    summary = {"model": args.model, "k": args.k, "n_draws": args.n_draws, "n_seqs": args.n_seqs,
               "half_len": args.half_len, "seed": args.seed,
               "top_induction_heads": [{"head": f"L{a}H{b}", "induction": float(s)}
                                       for a, b, s in zip(top.layer, top["head"], top.induction)],
               "results": {}}
    lines = [f"# {args.model}: top-{args.k} induction heads vs {args.n_draws} random {args.k}-head sets", "",
             "top heads: " + ", ".join(f"{h['head']} ({h['induction']:.2f})" for h in summary["top_induction_heads"]),
             "", "| data | ablation | gain unablated | gain, top-k ablated | random k-sets: min / mean / max "
             "| random sets with less gain left |", "|---|---|---|---|---|---|"]
    tables = {}
    cache: dict[tuple[str, str], object] = {}

    def reference_values(dname: str, method: str):
        """What mean / resample ablation writes in place of a head (from the reference set), computed once."""
        if method not in ("mean", "resample"):
            return None
        if (dname, method) not in cache:
            ref = data[dname][1]
            cache[dname, method] = head_z_means(model, ref) if method == "mean" else head_z_samples(model, ref)
        return cache[dname, method]

    for dname, (x, ref, bos) in data.items():
        for method in args.methods:
            f = args.out / f"{dname}_{method}.csv"
            if dname not in args.data and (args.fresh or not f.exists()):
                continue  # not asked for now; a finished earlier run of it still goes into the summary
            if f.exists() and not args.fresh:
                df = pd.read_csv(f)
            else:
                values = reference_values(dname, method)

                def measure(hs, method=method, values=values, x=x, bos=bos):
                    return in_context_gain(model, x, args.half_len, bos=bos, ablate=hs, method=method,
                                           values=values)["gain"]

                df = compare_with_random(measure, target, model, n_draws=args.n_draws, seed=args.seed)
                df.to_csv(f, index=False)
            tables[f"{dname}/{method}"] = df
            base, tv, rand = float(df.value[0]), float(df.value[1]), df.value[2:]
            res = {"gain_unablated": base, "gain_target_ablated": tv, "gain_kept_target": tv / base,
                   "random_min": float(rand.min()), "random_mean": float(rand.mean()),
                   "random_max": float(rand.max()), "random_sd": float(rand.std(ddof=1)),
                   "n_random": len(rand), "n_random_with_less_gain": int((rand <= tv).sum()),
                   "target_removes_more_than_every_random_set": bool((rand > tv).all())}
            summary["results"][f"{dname}/{method}"] = res
            lines.append(f"| {dname} | {method} | {base:.3f} | {tv:.3f} ({tv / base:.0%} kept) | "
                         f"{res['random_min']:.3f} / {res['random_mean']:.3f} / {res['random_max']:.3f} | "
                         f"{res['n_random_with_less_gain']} of {res['n_random']} |")
            print(lines[-1], flush=True)
    if args.also:
        also_sets = {name: [parse_head(h) for h in name.split(",")] for name in args.also}
        rows = []
        for dname, (x, ref, bos) in data.items():
            if dname not in args.data:
                continue
            for method in (m for m in args.methods if m != "zero"):
                values = reference_values(dname, method)
                for name, hs in also_sets.items():
                    g = in_context_gain(model, x, args.half_len, bos=bos, ablate=hs, method=method,
                                        values=values)["gain"]
                    rows.append({"data": dname, "ablation": method, "heads": name, "gain_left": float(g),
                                 "gain_unablated": summary["results"][f"{dname}/{method}"]["gain_unablated"]})
                    print(rows[-1], flush=True)
        also = pd.DataFrame(rows)
        also.to_csv(args.out / "also.csv", index=False)
        (args.out / "also.md").write_text("| data | ablation | heads ablated | gain left | unablated |\n|---|---|---|---|---|\n"
                                          + "".join(f"| {r.data} | {r.ablation} | {r.heads} | {r.gain_left:.3f} | "
                                                    f"{r.gain_unablated:.3f} |\n" for r in also.itertuples()))
    from interp.viz.ablation import ablation_vs_random_figure

    fig = ablation_vs_random_figure(tables, title=f"{args.model}: top-{args.k} induction heads vs "
                                    f"{args.n_draws} random {args.k}-head sets")
    fig.write_html(args.out / "ablation_vs_random.html", include_plotlyjs="cdn")
    try:
        fig.write_image(args.out / "ablation_vs_random.png", width=900, height=500)
    except Exception as err:  # kaleido / Chrome missing: the HTML is still there
        print(f"no PNG: {type(err).__name__}: {err}"[:200])
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
