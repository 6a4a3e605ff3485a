"""Is importance pruning better than random on induction-2l? One trained model is one sample: train it from
several seeds and report the importance-vs-random pruning AUC as mean +- sd over seeds.

Per seed: train with ``interp.zoo.induction.train_induction_model`` (same recipe as the shipped checkpoint, maybe
fewer steps), then on the pruning data of ``experiments/prune_induction.json`` (repeated random sequences,
next-token accuracy on the repeated half, held-out sequences for the metric) run

* importance pruning, Michel's per-example I_h (iterative, one head per step),
* the same with the batch-mean gradient (the Hugging Face bertology recipe),
* one-shot per-example importance (scores computed once, Michel et al. section 4),
* random pruning orders (10 seeds),

and the AUC of each curve on [0, 1). Resumable: each seed's checkpoint and result JSON are kept under ``--out``
and skipped when present (``--fresh`` starts over).

Usage (from the repository root)::

    python experiments/induction_seeds_auc.py --seeds 0 1 2 3 4 --steps 1500 --out experiments/results/induction_seeds
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from interp.pruning import auc_table, build_task, importance_curve, random_curve
from interp.training import train_induction_model
from interp.zoo.induction import load_induction_2l, save_induction_model

ROOT = Path(__file__).resolve().parent
DATA = {"kind": "repeated", "n_seqs": 64, "half_len": 25, "batch_size": 16, "seed": 1, "eval_seed": 2,
        "bos_id": 0, "metric": "accuracy"}


def run_seed(seed: int, steps: int, out: Path) -> dict:
    ckpt = out / f"induction-2l_seed{seed}.safetensors"
    if ckpt.exists():
        model = load_induction_2l(ckpt)
        hist_last = json.loads((out / f"seed{seed}_training.json").read_text())
    else:
        model, hist = train_induction_model(steps=steps, seed=seed, eval_every=max(1, steps // 6), progress=False)
        save_induction_model(model, ckpt, metadata={"steps": steps, "seed": seed})
        hist_last = hist.iloc[-1].to_dict()
        (out / f"seed{seed}_training.json").write_text(json.dumps(hist_last, default=float))
    model.eval()
    train, held, obj = build_task(model, data=DATA)
    curves = {
        "importance (per-example, iterative)": importance_curve(model, train, obj, eval_batches=held, step=1),
        "importance (batch-mean, iterative)": importance_curve(model, train, obj, eval_batches=held, step=1,
                                                               per_example=False),
        "importance (per-example, one-shot)": importance_curve(model, train, obj, eval_batches=held, step=1,
                                                               recompute=False),
        "random (10 orders)": random_curve(model, held, obj, seeds=range(10), step=1),
    }
    for name, c in curves.items():
        c.method = name
    aucs = auc_table(list(curves.values()), upto=0.875)  # the last point (all heads gone) is the same for all
    return {"seed": seed, "steps": steps, "training_end": hist_last,
            "auc": {r["method"]: r["auc"] for r in aucs.to_dict("records")},
            "upto": 0.875,
            "curves": {name: [p.metric for p in c.points] for name, c in curves.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=1500, help="training steps per seed (the shipped model: 3000)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        f = args.out / f"seed{seed}.json"
        if f.exists() and not args.fresh:
            results.append(json.loads(f.read_text()))
            continue
        res = run_seed(seed, args.steps, args.out)
        f.write_text(json.dumps(res, indent=1, default=float))
        results.append(res)
        print(f"seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in res["auc"].items()), flush=True)
    methods = list(results[0]["auc"])
    summary = {"seeds": [r["seed"] for r in results], "steps": args.steps, "upto": results[0]["upto"]}
    lines = ["| method | AUC mean | sd | per seed |", "|---|---|---|---|"]
    for m in methods:
        vals = [r["auc"][m] for r in results]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        summary[m] = {"mean": statistics.mean(vals), "sd": sd, "per_seed": vals}
        lines.append(f"| {m} | {statistics.mean(vals):.3f} | {sd:.3f} | {' '.join(f'{v:.3f}' for v in vals)} |")
    rand = [r["auc"]["random (10 orders)"] for r in results]
    for m in methods[:3]:
        wins = sum(r["auc"][m] > x for r, x in zip(results, rand))
        summary[m]["seeds_above_random"] = wins
        lines.append(f"\n{m}: above random on {wins} of {len(results)} seeds")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
