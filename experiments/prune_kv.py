"""Head pruning curves with the KV cache they free, head-level and K/V-group-level, for any model.

Methods: importance (Michel et al.'s per-example I_h, iterative), importance over K/V groups, L0 gates
(Hard-Concrete, Lagrangian target), L0 over K/V groups, random orders (seeds). Every point carries the KV-cache
bytes per token it frees (``interp.pruning.kv_cache_savings``), drawn on a second axis. In an MHA model a group is
one head, so the group-level curves repeat the head-level ones.

Data: decoders with a text tokenizer get next-token loss on UD EWT dev sentences (``--n-train`` for importance /
L0, the next ``--n-eval`` held out, metric = minus the mean loss); induction-2l gets the repeated-token data of
experiments/prune_induction.json; encoders get the sentence-similarity objective (``interp.pruning.build_task``).

Writes under ``--out``: ``<method>.json`` / ``.csv`` per curve, ``curves_kv.html`` (+ ``.png`` when kaleido
works), ``summary.json`` (AUCs, and for every group-level L0 run its target, the groups it pruned, the KV bytes
saved). Resumable: finished curves in ``--out`` are read back, not recomputed (``--fresh`` starts over).

Usage (from the repository root)::

    python experiments/prune_kv.py --model induction-2l --out experiments/results/prune_kv_induction-2l
    python experiments/prune_kv.py --model smollm2-135m --out experiments/results/smollm2/prune_kv \\
        --step 0.05 --targets 0.1 0.2 0.3 0.4 0.5
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

# The shared data folder sits beside the repository (../shared/data); a default here, never in the library.
from expt_common import UD_DEV  # noqa: E402 - the scripts' folder is on sys.path

from interp.pruning import (
    LanguageModelObjective,
    PruningCurve,
    auc_table,
    build_task,
    importance_curve,
    l0_curve,
    random_curve,
    sentence_batches,
    ud_sentences,
)
from interp.viz.pruning_kv import pruning_kv_figure

ALL = ["importance", "importance-group", "l0", "l0-group", "random"]


def data_for(model, args):
    if model.cfg.unembed and getattr(model.tokenizer, "special_ids", None) is not None:
        sents = ud_sentences(args.conllu, args.n_train + args.n_eval)
        train = sentence_batches(model, sents[:args.n_train], batch_size=args.batch_size, max_length=args.max_length)
        held = sentence_batches(model, sents[args.n_train:], batch_size=args.batch_size, max_length=args.max_length)
        return train, held, LanguageModelObjective("neg_loss")
    if model.cfg.unembed:  # token-id models (induction-2l): the repeated-token task
        return build_task(model, data={"kind": "repeated", "n_seqs": 64, "half_len": 25, "batch_size": 16, "seed": 1,
                                  "eval_seed": 2, "bos_id": getattr(model.tokenizer, "bos_id", None),
                                  "metric": "accuracy"})
    return build_task(model, data={"kind": "ud", "n_train": args.n_train, "n_eval": args.n_eval,
                              "batch_size": args.batch_size, "max_length": args.max_length, "path": str(args.conllu)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="induction-2l")
    ap.add_argument("--methods", nargs="+", default=ALL, choices=ALL)
    ap.add_argument("--step", type=float, default=None, help="fraction (or count if >= 1) per importance step; "
                    "default one unit")
    ap.add_argument("--targets", type=float, nargs="+", default=[0.125, 0.25, 0.375, 0.5, 0.625, 0.75])
    ap.add_argument("--l0-steps", type=int, default=300)
    ap.add_argument("--l0-average", action="store_true", help="test the L0 gates' log_alpha averaged over the "
                    "post-warmup steps (train_l0_gates average=True: for long runs whose sparsity cycles)")
    ap.add_argument("--seeds", type=int, default=10, help="random orders")
    ap.add_argument("--conllu", type=Path, default=UD_DEV)
    ap.add_argument("--n-train", type=int, default=64)
    ap.add_argument("--n-eval", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from interp import load as load_model  # checkpoints get their stored tokenizer

    model = load_model(args.model)
    train, held, obj = data_for(model, args)
    args.out.mkdir(parents=True, exist_ok=True)
    step = 1 if args.step is None else (int(args.step) if args.step >= 1 else args.step)
    curves: dict[str, PruningCurve] = {}
    for method in args.methods:
        f = args.out / f"{method}.json"
        if f.exists() and not args.fresh:
            curves[method] = PruningCurve.load(f)
            continue
        level = "group" if method.endswith("-group") else "head"
        if method.startswith("importance"):
            c = importance_curve(model, train, obj, eval_batches=held, step=step, level=level, progress=True)
        elif method.startswith("l0"):
            c = l0_curve(model, train, obj, targets=args.targets, eval_batches=held, steps=args.l0_steps,
                         level=level, progress=True, average=args.l0_average)
        else:
            c = random_curve(model, held, obj, seeds=range(args.seeds), step=step, progress=True)
        c.method = method
        c.save(f)
        c.save(args.out / f"{method}.csv")
        curves[method] = c
        print(f"{method}: done", flush=True)
    fig = pruning_kv_figure(list(curves.values()))
    fig.write_html(args.out / "curves_kv.html", include_plotlyjs="cdn")
    try:
        fig.write_image(args.out / "curves_kv.png", width=900, height=500)
    except Exception as err:  # kaleido / Chrome missing: the HTML is still there
        print(f"no PNG: {type(err).__name__}: {err}"[:200])
    K = model.cfg.n_kv_heads
    l0_runs = []
    for m in ("l0", "l0-group"):
        for p in (curves[m].points[1:] if m in curves else []):
            units = p.extra.get("units_total")
            l0_runs.append({"method": m, "target": p.extra.get("target"), "units_pruned": p.extra.get("units_pruned"),
                            "units_total": units, "target_units": None if units is None else p.extra["target"] * units,
                            "heads_pruned": p.n_pruned, "kv_bytes_saved_per_token": p.kv_bytes_saved,
                            "metric": p.metric})
    summary = {"model": args.model, "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads, "n_kv_heads": K,
               "metric": obj.metric_name, "auc": auc_table(list(curves.values())).to_dict("records"),
               "l0_runs": l0_runs,
               "kv_bytes_per_token_unpruned": model.cfg.kv_cache_bytes_per_token(2)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    print(json.dumps(summary, indent=1, default=float))


if __name__ == "__main__":
    main()
