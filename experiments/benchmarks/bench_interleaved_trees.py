"""Forward, recording and decode timings of two source trees of interp, interleaved in one run.

Each round runs the same measurement in a fresh process for tree A, then tree B (``PYTHONPATH`` picks the tree),
so that a change of machine load affects both alike; the figures are the medians over rounds. Use it to check
that a refactor left the hot paths where they were::

    git archive c48bf70 | tar -x -C /tmp/before
    OMP_NUM_THREADS=1 python experiments/benchmarks/bench_interleaved_trees.py --a /tmp/before --b . --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

MEASURE = r"""
import json, time, statistics, torch
import interp
from interp import ModelConfig
from interp.placement import build
torch.set_num_threads(1)
cfg = ModelConfig(n_layers=8, d_model=256, n_heads=8, n_kv_heads=4, d_vocab=4096, n_ctx=512, positional="rotary",
                  normalization="rms", activation="swiglu", attn_bias=False, out_bias=False, mlp_bias=False)
model = build(cfg, seed=0)
tokens = torch.randint(0, 4096, (4, 128), generator=torch.Generator().manual_seed(0))
prompt = tokens[:1, :16]

def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)

with torch.no_grad():
    out = {"forward_ms": median_ms(lambda: model(tokens), REPS),
           "recording_ms": median_ms(lambda: model.run_with_cache(tokens, names_filter="*hook_resid_post"), REPS),
           "decode_ms_per_token": median_ms(lambda: model.generate(prompt, 32), max(3, REPS // 4)) / 32}
print(json.dumps({"file": interp.__file__, **out}))
"""


def run(tree: str, reps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", MEASURE.replace("REPS", str(reps))], env=env, capture_output=True,
                         text=True, check=True, cwd=os.path.abspath(tree))
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="first source tree (the one holding interp/)")
    ap.add_argument("--b", required=True, help="second source tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=12, help="repetitions per timing inside one process")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for _ in range(args.rounds):
        for name in ("a", "b"):
            runs[name].append(run(getattr(args, name), args.reps))
    keys = ("forward_ms", "recording_ms", "decode_ms_per_token")
    print(f"{'':22s} {'A':>10s} {'B':>10s} {'B/A':>7s}   (medians of {args.rounds} interleaved rounds, 1 thread)")
    for k in keys:
        a = statistics.median(r[k] for r in runs["a"])
        b = statistics.median(r[k] for r in runs["b"])
        print(f"{k:22s} {a:10.2f} {b:10.2f} {b / a:7.3f}")
    print(f"A: {runs['a'][0]['file']}\nB: {runs['b'][0]['file']}")


if __name__ == "__main__":
    main()
