"""The induction circuit of induction-2l, seen with the circuit tools, over several seeds.

For each seed (fresh repeated random sequences and a fresh corruption of their repeated half):
- activation patching of every head's z (noising and denoising), and of the induction heads together;
- attribution patching of the same, and its Spearman rank correlation with activation patching
  (per head; per head and position over the repeated half);
- direct logit attribution at the repeated positions (correct next token vs a random wrong one).
Plus Q/K/V composition scores (seed-free) against their random-reader baseline.

Usage:
    python experiments/circuits_induction.py --seeds 0 1 2 3 4 --out /tmp/circuits   # prints tables; writes CSV/JSON
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

import interp
from interp.analysis import (
    activation_patching,
    attribution_patching,
    composition_table,
    corrupt_repeats,
    direct_logit_attribution,
    in_context_metric,
    patch_heads_together,
)
from interp.data import repeated_sequences


def spearman(a: pd.Series, b: pd.Series) -> float:
    return float(a.reset_index(drop=True).corr(b.reset_index(drop=True), method="spearman"))


def run_seed(model, seed: int, n_seqs: int, half: int) -> dict:
    V = model.cfg.d_vocab
    clean = repeated_sequences(n_seqs, half, V, seed=seed, bos_id=0)
    corrupted = corrupt_repeats(clean, half, V, bos_id=0, seed=10_000 + seed)
    metric = in_context_metric(clean, half, bos=True)
    row: dict = {"seed": seed}
    induction = [(1, h) for h in range(model.cfg.n_heads)]
    row["induction_heads_kept"] = patch_heads_together(model, clean, corrupted, induction, metric=metric)["normalized"]
    for direction in ("noising", "denoising"):
        for by in ("head", "head_pos"):
            act = activation_patching(model, clean, corrupted, act="z", by=by, metric=metric, direction=direction)
            est = attribution_patching(model, clean, corrupted, act="z", by=by, metric=metric, direction=direction)
            keep = act.index if by == "head" else act.index[act["pos"] > 1 + half]
            row[f"spearman_{direction}_{by}"] = spearman(act.loc[keep, "normalized"], est.loc[keep, "normalized"])
            if by == "head":
                for (layer, head), v in act.set_index(["layer", "head"])["normalized"].items():
                    row[f"{direction}_L{layer}H{head}"] = float(v)
    # DLA at every repeated position (one call per position; wrong answer = a random token).
    g = torch.Generator().manual_seed(seed)
    parts = []
    for pos in range(2 + half, 2 * half):
        wrong = torch.randint(0, V, (n_seqs,), generator=g)
        answers = torch.stack([clean[:, pos + 1], wrong], dim=1)
        parts.append(direct_logit_attribution(model, clean, answers, pos=pos).set_index("component")["attribution"])
    dla = pd.concat(parts, axis=1).mean(axis=1)
    row.update({f"dla_{k}": float(v) for k, v in dla.items()})
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--n-seqs", type=int, default=16)
    p.add_argument("--half-len", type=int, default=25)
    p.add_argument("--out", type=Path, default=None, help="folder for circuits_seeds.csv, composition.csv, summary.json")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = interp.load("induction-2l")
    comp = composition_table(model)
    rows = pd.DataFrame([run_seed(model, s, args.n_seqs, args.half_len) for s in args.seeds])
    summary = rows.drop(columns="seed").agg(["mean", "std", "min", "max"]).T
    pd.set_option("display.width", 200)
    print(comp.groupby("mode").head(4).to_string(index=False))
    print(summary.to_string(float_format=lambda v: f"{v:.3f}"))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        rows.to_csv(args.out / "circuits_seeds.csv", index=False)
        comp.to_csv(args.out / "composition.csv", index=False)
        (args.out / "summary.json").write_text(json.dumps(summary.to_dict(orient="index"), indent=1))


if __name__ == "__main__":
    main()
