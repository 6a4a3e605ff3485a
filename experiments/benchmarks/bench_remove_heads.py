"""Speed and size of a model with 50% of its heads removed (remove_heads) against the unpruned model and the
gated model (same heads switched off with gates), measured side by side in one run.

Usage:
    python experiments/benchmarks/bench_remove_heads.py [--batch 8] [--seq 128] [--repeats 7] [--threads 1]

Models: MiniLM-L6 (interp.zoo "minilm-l6", when available) and random-weight decoders (MHA and GQA). The
removed heads are every other head of each layer (in GQA: whole K/V groups, so the KV cache shrinks too).
Timings interleave the models repeat by repeat and report the median, so load on a shared machine affects all
of them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch

from interp import ModelConfig, Transformer
from interp.pruning import kv_cache_savings, n_parameters, remove_heads


def half_mask(model: Transformer) -> torch.Tensor:
    """Remove half of each layer's heads: whole K/V groups for GQA (the first half), every other head for MHA."""
    L, H, K = model.cfg.n_layers, model.cfg.n_heads, model.cfg.n_kv_heads
    mask = torch.zeros(L, H, dtype=torch.bool)
    if K < H:
        mask[:, : H // 2] = True  # the first K/2 groups, whole
    else:
        mask[:, ::2] = True
    return mask


def time_forward(fns: dict, tokens: torch.Tensor, repeats: int) -> dict[str, float]:
    for fn in fns.values():  # warm-up
        fn(tokens)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(tokens)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench(name: str, model: Transformer, tokens: torch.Tensor, repeats: int) -> list[dict]:
    mask = half_mask(model)
    small = remove_heads(model, mask)
    gated_gates = (~mask).float()

    def run_full(t):
        model.set_head_gates(None)
        return model(t)

    def run_gated(t):
        model.set_head_gates(gated_gates)
        return model(t)

    with torch.no_grad():
        model.set_head_gates(gated_gates)
        err = float((model(tokens) - small(tokens)).abs().max())
        model.set_head_gates(None)
        t = time_forward({"unpruned": run_full, "gated 50%": run_gated, "removed 50%": small}, tokens, repeats)
    model.set_head_gates(None)
    kv = kv_cache_savings(model, mask)
    rows = []
    for variant, m in (("unpruned", model), ("gated 50%", model), ("removed 50%", small)):
        rows.append({"model": name, "variant": variant, "params": n_parameters(m),
                     "attn params": sum(p.numel() for b in m.blocks for p in b.attn.parameters()),
                     "forward ms": 1000 * t[variant], "speed-up": t["unpruned"] / t[variant],
                     "KV bytes/token (fp16)": kv["bytes_per_token_after"] if variant == "removed 50%"
                     else kv["bytes_per_token_before"],
                     "max |removed - gated|": err if variant == "removed 50%" else None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = {}
    try:
        from interp.zoo import load

        models["minilm-l6 (MHA 6x12)"] = load("minilm-l6").eval()
    except Exception as err:  # the zoo or the weights package is missing: keep the synthetic models
        print(f"minilm-l6 unavailable ({err}); synthetic models only")
    base = dict(n_layers=6, d_model=512, n_heads=16, d_vocab=1000, n_ctx=512)
    models["decoder MHA 6x16, d=512"] = Transformer(ModelConfig(**base)).eval()
    models["decoder GQA 6x16/4kv, d=512"] = Transformer(ModelConfig(**base, n_kv_heads=4)).eval()
    rows = []
    for name, model in models.items():
        vocab = model.cfg.d_vocab
        tokens = torch.randint(1000, min(vocab, 20000), (args.batch, args.seq)) if vocab > 20000 else \
            torch.randint(0, vocab, (args.batch, args.seq))
        rows += bench(name, model, tokens, args.repeats)
    frame = pd.DataFrame(rows)
    print(f"batch {args.batch} x {args.seq} tokens, {args.threads} thread(s), median of {args.repeats}, "
          f"torch {torch.__version__}")
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.3g}" if abs(v) < 1e-3 else f"{v:.2f}"))


if __name__ == "__main__":
    main()
