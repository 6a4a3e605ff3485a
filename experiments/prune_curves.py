"""Head-pruning curves (importance / L0 / random) for one model, from a config file.

Usage:
    python experiments/prune_curves.py --config experiments/prune_induction.json --out DIR
    python experiments/prune_curves.py --config experiments/prune_minilm.json --out DIR [--fresh] [--methods importance random]

Results go to ``--out``: ``<method>.json`` / ``.csv``,
``curves.html``, ``summary.json``; finished points are kept in ``partial/``, so an interrupted run picks up where
it stopped (``--fresh`` starts over). For induction-2l it also writes ``circuit.json``: when the previous-token
and induction heads were pruned by each method.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from interp.pruning import load_config, run_experiment
from interp.pruning.experiment import write_results


def circuit_report(model, curves: dict, out: Path, threshold: float = 0.5) -> dict:
    """When each method breaks the induction circuit.

    The circuit's heads are the layer-0 heads whose previous-token score and the last layer's heads whose
    induction score exceed ``threshold`` (interp.training.evaluate_induction). A model may have redundant
    copies, so the circuit breaks when the *last* head of either group is pruned; this reports that fraction for
    each method (for random order, its expectation over 20,000 random orders on the same step grid), and the
    fraction at which each circuit head went.
    """
    from interp.training import evaluate_induction

    stats = evaluate_induction(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    groups = {
        "prev_token": [(0, h) for h in range(H) if float(stats["prev_token"][0, h]) > threshold],
        "induction": [(L - 1, h) for h in range(H) if float(stats["induction"][-1, h]) > threshold],
    }
    report = {"groups": {k: [f"L{l}H{h}" for l, h in v] for k, v in groups.items()},
              "scores": {"prev_token": stats["prev_token"].tolist(), "induction": stats["induction"].tolist(),
                         "repeated_loss": stats["repeated"], "first_loss": stats["first"]},
              "circuit_breaks_at_fraction": {}, "head_pruned_at_fraction": {}}
    for method, curve in curves.items():
        points = curve.sorted().points
        if method == "random":
            counts = [p.n_pruned for p in points]
            gen = torch.Generator().manual_seed(0)
            breaks = []
            for _ in range(20000):
                order = torch.randperm(L * H, generator=gen).tolist()
                pos = {divmod(i, H): order.index(i) + 1 for i in range(L * H)}  # head -> how many pruned with it
                last = min(max(pos[h] for h in g) for g in groups.values() if g)
                breaks.append(next(c for c in counts if c >= last) / (L * H))
            report["circuit_breaks_at_fraction"]["random"] = sum(breaks) / len(breaks)
            continue
        first = {}
        for name, heads in groups.items():
            for layer, head in heads:
                fr = [p.fraction for p in points if p.mask is not None and p.mask[layer][head]]
                first[f"L{layer}H{head}"] = fr[0] if fr else None
        report["head_pruned_at_fraction"][method] = first
        if method == "importance":  # nested masks: the circuit breaks when a whole group is gone
            br = [p.fraction for p in points
                  if any(g and all(p.mask[l][h] for l, h in g) for g in groups.values())]
            report["circuit_breaks_at_fraction"][method] = br[0] if br else None
        else:  # L0: independent runs; the smallest sparsity whose mask breaks the circuit
            br = [p.fraction for p in points if p.mask is not None
                  and any(g and all(p.mask[l][h] for l, h in g) for g in groups.values())]
            report["circuit_breaks_at_fraction"][method] = br[0] if br else None
    (out / "circuit.json").write_text(json.dumps(report, indent=1))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="JSON or YAML config (see interp.pruning.experiment)")
    ap.add_argument("--out", required=True, help="results folder (the configs' out_dir is where the tracked results "
                                                "came from)")
    ap.add_argument("--methods", nargs="+", default=None, help="subset of importance random l0")
    ap.add_argument("--fresh", action="store_true", help="ignore partial results of an earlier run")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    if args.methods:
        config["methods"] = args.methods
    out = Path(args.out)
    from interp.zoo import load

    model = load(config["model"]).eval()
    t0 = time.time()
    curves = run_experiment(config, model=model, out_dir=out, fresh=args.fresh, progress=True)
    elapsed = time.time() - t0
    print(f"\n{config['name']}: {elapsed:.0f} s")
    for method, c in curves.items():
        print(f"  {c!r}")
        print(c.to_frame()[["fraction_pruned", "n_pruned", "metric", "metric_std", "kv_bytes_saved"]]
              .to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    summary = write_results(curves, out, config)
    summary["seconds_this_invocation"] = elapsed  # a resumed run only counts what it recomputed
    if "induction" in str(config["model"]) and "importance" in curves:
        summary["circuit"] = circuit_report(model, curves, out)
        print(json.dumps(summary["circuit"], indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary["auc"], indent=1))


if __name__ == "__main__":
    main()
