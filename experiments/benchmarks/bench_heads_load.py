"""Heads across ranks: per-rank peak memory of a head-parallel shard read straight from a checkpoint, against
building the whole model and cutting it (interp.tensor_parallel).

A Llama-shaped decoder (8 layers, d_model 1024, 16 query heads over 4 K/V heads, SwiGLU d_mlp 4096, vocabulary
32,000, untied, float32: ~730 MB) is written once. Each measurement runs in a fresh process (one thread) that
imports torch and interp (and the modules both routes import), records its resident set, then either

- **build-then-cut**: ``shard_heads(load_checkpoint(path), rank, 2)`` (the whole model is held, then cut), or
- **sliced**: ``load_checkpoint_heads(path, rank=rank, world=2)`` (the shard built on the meta device, only this
  rank's rows and columns read),

and reports its peak resident set (``VmHWM``) above the start, beside the bytes of the shard's weights. The
shard of either route is compared with the other's (bit for bit).

Usage:
    python experiments/benchmarks/bench_heads_load.py [--world 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def config():
    from interp import ModelConfig

    return ModelConfig(n_layers=8, d_model=1024, n_heads=16, n_kv_heads=4, d_mlp=4096, d_vocab=32000, n_ctx=256,
                       positional="rotary", normalization="rms", activation="swiglu", tie_embeddings=False)


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1]) / 1024


def measure(a: argparse.Namespace) -> None:
    """One process: load one shard by one route; print its figures as JSON."""
    import torch

    torch.set_num_threads(1)
    import interp.pruning.surgery  # noqa: F401 - both routes import it (~275 MB of modules): not a weight cost
    from interp.tensor_parallel import shard_heads
    from interp.zoo.checkpoint import load_checkpoint, load_checkpoint_heads

    start = _status_mb("VmRSS")
    t0 = time.perf_counter()
    if a.route == "cut":
        whole = load_checkpoint(a.checkpoint)
        shard = shard_heads(whole, a.rank, a.world)
        del whole
    else:
        shard = load_checkpoint_heads(a.checkpoint, rank=a.rank, world=a.world)
    seconds = time.perf_counter() - t0
    peak = _status_mb("VmHWM") - start  # before the shard is saved for the comparison
    weights = sum(p.numel() * p.element_size() for p in shard.parameters()) / 2**20
    torch.save(shard.state_dict(), a.out)
    print(json.dumps({"route": a.route, "rank": a.rank, "seconds": seconds, "shard_mb": weights,
                      "peak_above_start_mb": peak}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--route", choices=("cut", "sliced"), help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.measure:
        measure(a)
        return 0
    import torch

    from interp.placement import build
    from interp.zoo.checkpoint import save_checkpoint

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        model = build(config(), seed=0)
        whole_mb = sum(t.numel() * t.element_size() for t in model.parameters()) / 2**20
        ckpt = save_checkpoint(model, Path(d) / "model.safetensors")
        del model
        equal = True
        for rank in range(a.world):
            states = {}
            for route in ("cut", "sliced"):
                out = Path(d) / f"{route}{rank}.pt"
                done = subprocess.run([sys.executable, __file__, "--measure", "--route", route, "--rank", str(rank),
                                       "--world", str(a.world), "--checkpoint", str(ckpt), "--out", str(out)],
                                      env=env, capture_output=True, text=True, check=True)
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                states[route] = torch.load(out)
            equal &= states["cut"].keys() == states["sliced"].keys() and all(
                torch.equal(states["cut"][k], states["sliced"][k]) for k in states["cut"])
    cfg = config()
    print(f"# heads across {a.world} ranks: {cfg.n_layers} layers d_model {cfg.d_model}, {cfg.n_heads} heads / "
          f"{cfg.n_kv_heads} K/V, d_mlp {cfg.d_mlp}, vocab {cfg.d_vocab}, float32: whole model {whole_mb:.0f} MB")
    print("| route | rank | shard weights (MB) | peak RSS above start (MB) | peak / shard | load (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['route']} | {r['rank']} | {r['shard_mb']:.0f} | {r['peak_above_start_mb']:.0f} | "
              f"{r['peak_above_start_mb'] / r['shard_mb']:.2f} | {r['seconds']:.2f} |")
    print(f"shards of both routes equal bit for bit: {equal}")
    print(json.dumps({"whole_mb": whole_mb, "rows": rows, "equal": equal}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
