"""Peak memory of loading a randomly initialised 1B-shaped model in bf16: ``interp.load(cfg, dtype=bf16)``
against building float32 weights on the CPU and casting them (what loading did before).

Each variant runs in a fresh interpreter; the figure is (peak RSS after - peak RSS before) / the weights' bytes,
from the kernel's rusage. Target: ``interp.load`` <= 1.3.

Usage:
    python experiments/benchmarks/bench_load_memory.py [--layers N] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

# Llama-3.2-1B's published dimensions (tied embeddings, 32 query / 8 K/V heads).
LLAMA_1B = dict(n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, d_head=64, d_mlp=8192, activation="swiglu",
                d_vocab=128256, n_ctx=2048, normalization="rms", positional="rotary", rotary_base=500000.0,
                causal=True, tie_embeddings=True)

CHILD = r"""
import json, resource, sys, torch, interp
cfg = interp.ModelConfig(**json.loads(sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if sys.argv[2] == "interp.load":
    m = interp.load(cfg, dtype=torch.bfloat16, seed=0)
else:
    m = interp.Transformer(cfg).to(torch.bfloat16)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
weights = sum(p.numel() * p.element_size() for p in m.parameters())
print(json.dumps({"ratio": (peak - before) / weights, "weights": weights, "peak_added": peak - before}))
"""
VARIANTS = ("interp.load", "float32 then cast")


def measure(variant: str, layers: int) -> dict:
    cfg = json.dumps({**LLAMA_1B, "n_layers": layers})
    out = subprocess.run([sys.executable, "-c", CHILD, cfg, variant], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=16, help="blocks of the 1B shape to build (16 = the real model)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args(argv)
    res = {v: measure(v, a.layers) for v in VARIANTS}
    if a.json:
        print(json.dumps(res))
        return 0
    w = res["interp.load"]["weights"]
    print(f"### loading a Llama-3.2-1B-shaped random model ({a.layers} layers, {w / 1e9:.2f} GB of bf16 weights)\n")
    print("| variant | peak RSS added (GB) | / weights' bytes | target |\n|---|---:|---:|---|")
    for v in VARIANTS:
        r = res[v]
        print(f"| {v} | {r['peak_added'] / 1e9:.2f} | {r['ratio']:.2f} | {'<= 1.3' if v == 'interp.load' else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
