"""Head kinds over the pipeline (interp.pipeline) that read several stages: copy suppression, successor and name
movers (the weight circuits), and function vectors (patched decoding steps).

One checkpoint (bench_pipeline.py's random 8-layer decoder, d_model 256, 1000 tokens, float32) is written once;
``torchrun --standalone --nproc_per_node N`` then runs ``classify_heads(pipe, kinds=[...])`` with N = 1 and N
ranks (one thread each), once for the weight-circuit kinds and once for function vectors. Every rank scores its
own layers' heads; for the weight circuits rank 0 computes the effective embeddings of the scored tokens and
broadcasts them, and the last rank lends the final norm and unembedding; for function vectors every patched
decoding step runs through every rank and the last one computes the answer's probability. Rank 0 reports the
wall times, the bytes a rank receives for what the weight circuits lend (effective embeddings and output head),
and whether the N-rank tables equal the 1-rank ones bit for bit.

Ranks share this machine's cores (4 ranks on 2 cores run at most 2 at a time), and every rank repeats the work
that is not per layer (gathering the compared tokens' unembedding rows, the IOI and ordinal data), so the
speed-up is bounded well below N here.

Usage:
    python experiments/benchmarks/bench_pipeline_weight_kinds.py [--ranks 4] [--tokens 512]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from bench_pipeline import config  # noqa: E402 - the pipeline benchmark's model

KINDS = ["copy-suppression", "successor", "name-mover"]
FV = ["function-vector"]


def settings(tokens: int) -> dict:
    """classify_heads' keywords: the default copy-suppression sizes, two ordinal runs, 32 random IOI prompts."""
    import torch

    from interp.data.circuit_tasks import TaskPrompts

    gen = torch.Generator().manual_seed(0)
    V = config().d_vocab
    clean = torch.stack([torch.randperm(V, generator=gen)[:24] for _ in range(32)])  # [32, 24]: distinct ids a row
    ioi = TaskPrompts("ioi", clean, clean.flip(1), answers=clean[:, [4, 9]])
    return dict(kinds=KINDS, batch_size=16, progress=False,
                options={"copy_suppression_tokens": tokens,
                         "ordinal_tokens": {"a": list(range(10, 40)), "b": list(range(500, 530))},
                         "ioi_prompts": ioi})


def fv_settings() -> dict:
    """classify_heads' keywords of the function-vector kind: two tasks, 8 prompts each, 5 shots (12 tokens)."""
    from interp.data.icl import icl_prompts

    prompts = icl_prompts({"succ": [(i, i + 1) for i in range(100, 140)], "shift": [(i, i + 300) for i in
                                                                                   range(200, 240)]}, 8, 5, bos_id=0)
    return dict(kinds=FV, progress=False, options={"icl_prompts": prompts})


def worker(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    from interp import distributed
    from interp.analysis import classify_heads
    from interp.pipeline import Pipeline
    from interp.zoo.checkpoint import load_checkpoint_stage

    distributed.init_from_env()
    pipe = Pipeline(load_checkpoint_stage(a.checkpoint), micro_batches=4)
    kw = settings(a.tokens)
    if distributed.active():
        torch.distributed.barrier()
    t0 = time.perf_counter()
    report = classify_heads(pipe, **kw)
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    fv = classify_heads(pipe, **fv_settings())
    fv_seconds = time.perf_counter() - t0
    if distributed.rank() == 0:
        with open(a.out, "wb") as f:
            pickle.dump({"seconds": seconds, "df": report.df, "details": report.details, "fv_seconds": fv_seconds,
                         "fv_df": fv.df, "fv_details": fv.details}, f)
    distributed.shutdown()


def run(n: int, ckpt: Path, out: Path, tokens: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), __file__,
           "--worker", "--checkpoint", str(ckpt), "--out", str(out), "--tokens", str(tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out, "rb") as f:
        return pickle.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tokens", type=int, default=512, help="copy-suppression tokens scored")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    import pandas as pd

    from interp.placement import build
    from interp.zoo.checkpoint import save_checkpoint

    cfg = config()
    with tempfile.TemporaryDirectory() as d:
        ckpt = save_checkpoint(build(cfg, seed=0), Path(d) / "model.safetensors")
        res = {n: run(n, ckpt, Path(d) / f"w{n}.pkl", a.tokens) for n in (1, a.ranks)}
    one, many = res[1], res[a.ranks]
    def same(df: str, details: str) -> bool:
        try:
            pd.testing.assert_frame_equal(one[df], many[df], check_exact=True)
            for k in one[details]:
                pd.testing.assert_frame_equal(one[details][k], many[details][k], check_exact=True)
            return True
        except AssertionError:
            return False

    equal, fv_equal = same("df", "details"), same("fv_df", "fv_details")
    # What one rank receives: the effective embeddings (pre and post block 0) of each scorer's attended tokens,
    # and the output head (final norm and unembedding) once per classify_heads call.
    names = len({int(t) for t in settings(a.tokens)["options"]["ioi_prompts"].answers.flatten()})
    items = 29 + 29  # the two ordinal runs' items with a successor
    embed_mb = 2 * (min(a.tokens, cfg.d_vocab) + items + names) * cfg.d_model * 4 / 1e6
    head_mb = (cfg.d_vocab + 1) * cfg.d_model * 4 / 1e6
    print(f"# head kinds that read several stages, over the pipeline: {cfg.n_layers} layers d_model={cfg.d_model} "
          f"d_vocab={cfg.d_vocab}, {os.cpu_count()} cores, 1 thread per rank")
    print("| kinds | 1 rank (s) | " + f"{a.ranks} ranks (s) | equal bit for bit | received per rank (MB) |")
    print("|---|---|---|---|---|")
    print(f"| {', '.join(KINDS)} | {one['seconds']:.2f} | {many['seconds']:.2f} | {equal} | effective embeddings "
          f"{embed_mb:.2f} + output head {head_mb:.2f} |")
    print(f"| {', '.join(FV)} | {one['fv_seconds']:.2f} | {many['fv_seconds']:.2f} | {fv_equal} | - |")
    print(json.dumps({"1": [one["seconds"], one["fv_seconds"]], str(a.ranks): [many["seconds"], many["fv_seconds"]],
                      "equal": [equal, fv_equal], "embeddings_mb": embed_mb, "output_head_mb": head_mb}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
