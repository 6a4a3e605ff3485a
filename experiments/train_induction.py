"""Train the "induction-2l" model and write its checkpoint, training curve and summary.

A thin wrapper over :func:`interp.training.train_induction_model`: fixed seed, 2 CPU threads, a few
minutes on a laptop. It prints loss on first vs repeated occurrences (the in-context gain) and the attention
checks (best layer-0 previous-token head, best layer-1 induction head) on fresh repeated sequences, and
writes into the folder ``--out`` (required):

* ``induction-2l.safetensors`` (the checkpoint),
* ``induction_training.csv`` (one row per evaluation), ``induction_training.json`` (settings + final
  evaluation), ``induction_training.html`` (plotly figure of the curve) and ``.png`` when kaleido is installed.

Only ``--replace-shipped`` also copies the checkpoint over the packaged one
(``interp/zoo/checkpoints/induction-2l.safetensors``); tests of the shipped model never depend on a retrain.

Usage:
    python experiments/train_induction.py --out runs/induction                 # the shipped recipe
    python experiments/train_induction.py --steps 200 --out /tmp/ind
    python experiments/train_induction.py --out runs/induction --replace-shipped   # rebuild the shipped file
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from interp.training import evaluate_induction, train_induction_model
from interp.zoo.induction import INDUCTION_2L_CONFIG, INDUCTION_2L_PATH, save_induction_model

# The settings that produced the shipped checkpoint; the command line overrides them.
# The shipped checkpoint's settings; lr and p_repeat are also train_induction_model's defaults, so
# `interp train-induction` reproduces the same run.
DEFAULTS = dict(steps=3000, seed=0, batch_size=64, lr=3e-3, p_repeat=0.75, min_span=4, eval_every=100)
EVAL_SEED = 2024  # fresh evaluation data, never used in training (training uses seed, seed+1, seed+2)


def curve_figure(history) -> go.Figure:
    """Training curve: losses (first vs repeated half, train) and the two attention scores, by step."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss (nats/token)", "attention score of the best head"))
    fig.add_trace(go.Scatter(x=history.step, y=history.train_loss, name="train (mixture)", mode="lines"), 1, 1)
    fig.add_trace(go.Scatter(x=history.step, y=history.first_loss, name="first occurrence", mode="lines"), 1, 1)
    fig.add_trace(go.Scatter(x=history.step, y=history.repeated_loss, name="repeated occurrence", mode="lines"),
                  1, 1)
    fig.add_trace(go.Scatter(x=history.step, y=history.prev_token_score, name="L0 previous-token", mode="lines"),
                  1, 2)
    fig.add_trace(go.Scatter(x=history.step, y=history.induction_score, name="L1 induction", mode="lines"), 1, 2)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(title="induction-2l training", width=1000, height=420, template="plotly_white")
    return fig


def write_figures(history: pd.DataFrame, prefix: Path) -> list[Path]:
    """Write the curve as ``prefix.html`` and, when kaleido (with a Chrome/Chromium) is available, ``prefix.png``."""
    fig = curve_figure(history)
    written = [prefix.with_suffix(".html")]
    fig.write_html(written[0], include_plotlyjs=True)  # embedded plotly.js: the figure opens offline
    try:
        fig.write_image(prefix.with_suffix(".png"), scale=2)
        written.append(prefix.with_suffix(".png"))
    except Exception as e:  # kaleido (static export) is optional; the HTML figure is always written
        print(f"(no PNG: {type(e).__name__}: {str(e).strip().splitlines()[0]})", file=sys.stderr)
    return written


def main(argv: list[str] | None = None) -> dict | None:
    """Train, save and report. Returns the summary written to the JSON file (``None`` with ``--replot``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    ap.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    ap.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    ap.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    ap.add_argument("--p-repeat", type=float, default=DEFAULTS["p_repeat"])
    ap.add_argument("--eval-every", type=int, default=DEFAULTS["eval_every"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True, help="folder for the checkpoint, curve and summary")
    ap.add_argument("--replace-shipped", action="store_true",
                    help=f"also overwrite the packaged checkpoint {INDUCTION_2L_PATH}")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--replot", action="store_true", help="only redraw the figures from the existing CSV")
    args = ap.parse_args(argv)
    results = args.out / "induction_training"
    checkpoint = args.out / "induction-2l.safetensors"
    if args.replot:
        print("wrote", *write_figures(pd.read_csv(results.with_suffix(".csv")), results))
        return None
    args.out.mkdir(parents=True, exist_ok=True)

    settings = dict(steps=args.steps, seed=args.seed, batch_size=args.batch_size, lr=args.lr,
                    p_repeat=args.p_repeat, min_span=DEFAULTS["min_span"], eval_every=args.eval_every)
    model, history = train_induction_model(**settings, threads=args.threads, progress=not args.no_progress)
    torch.set_num_threads(args.threads)
    ev = evaluate_induction(model, n_seqs=128, half_len=25, seed=EVAL_SEED)
    summary = {
        "settings": {**settings, "threads": args.threads, "config": INDUCTION_2L_CONFIG.to_dict()},
        "eval": {"seed": EVAL_SEED, "n_seqs": 128, "half_len": 25, "first_loss": ev["first"],
                 "repeated_loss": ev["repeated"], "gain": ev["gain"],
                 "best_prev_token_head_L0": list(ev["best_prev_token"]),
                 "best_induction_head_L1": list(ev["best_induction"]),
                 "prev_token_scores": ev["prev_token"].tolist(), "induction_scores": ev["induction"].tolist()},
        "train_seconds": float(history.elapsed_s.iloc[-1]),
    }
    meta = {"training": summary["settings"], "eval": summary["eval"]}
    save_induction_model(model, checkpoint, metadata=meta)
    if args.replace_shipped:
        save_induction_model(model, INDUCTION_2L_PATH, metadata=meta)
        print(f"replaced the shipped checkpoint {INDUCTION_2L_PATH}")

    history.to_csv(results.with_suffix(".csv"), index=False)
    results.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    write_figures(history, results)

    print(f"checkpoint: {checkpoint} ({checkpoint.stat().st_size / 1024:.0f} KiB), trained in "
          f"{summary['train_seconds']:.0f} s")
    print(f"loss on first occurrences:    {ev['first']:.3f} nats/token (uniform guess: "
          f"{torch.log(torch.tensor(float(INDUCTION_2L_CONFIG.d_vocab - 1))):.3f})")
    print(f"loss on repeated occurrences: {ev['repeated']:.3f} nats/token (in-context gain {ev['gain']:.3f})")
    h, s = ev["best_prev_token"]
    print(f"layer 0: best previous-token head L0H{h}, mean attention to the previous token {s:.3f}")
    h, s = ev["best_induction"]
    print(f"layer 1: best induction head L1H{h}, mean attention to the token after the earlier occurrence {s:.3f}")
    return summary


if __name__ == "__main__":
    main()
