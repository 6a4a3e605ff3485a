"""Pipeline across processes (interp.pipeline): throughput of 4 ranks against 1 at a fixed batch, and the bubble.

One checkpoint (a random 8-layer decoder, float32) is written once; then ``torchrun --standalone
--nproc_per_node N`` runs it with N = 1 and N = 4 (one thread per rank), each rank loading only its slice
(:func:`interp.zoo.checkpoint.load_checkpoint_stage`). Every rank times the same pipelined forward of one fixed
batch cut into micro-batches (GPipe fill-drain); rank 0 reports the median wall time per batch (tokens per
second), and each rank's busy time (inside its own blocks, measured by forward hooks on its stage). The measured
bubble is ``1 - sum(busy) / (N x wall)``: the share of rank-time spent waiting, beside GPipe's ideal
``(N - 1) / (m + N - 1)`` for m micro-batches of equal stages (rank 0 and the last rank also embed / unembed, so
stages are not quite equal). The 4-rank logits are compared with the 1-rank ones (bit for bit).

Ranks share this machine's cores: 4 ranks on 2 cores can at best run 2 at a time, so the speed-up is bounded by
min(N, cores); the figure that transfers to one core (or GPU) per rank is the bubble.

Memory cap (``--cap-demo``): a 512 MB model (8 layers, d_model 1024) under a per-rank cap of 300 MB above what
each rank holds once torch and the process group are up runs across 4 ranks, and fails in 1. The cap is
``RLIMIT_DATA`` (private writable memory: every tensor), not ``RLIMIT_AS``: safetensors maps the whole checkpoint
file read-only into every rank's address space, which counts in ``RLIMIT_AS`` although a rank never touches the
pages of the other ranks' layers.

Analyses (``--analyses``): ``classify_heads`` (positional, previous-token, duplicate-token, induction with its
copying score, sink) and ``activation_patching`` (per head z) of the same checkpoint over 1 and N ranks: rank 0's
wall time of each and whether the N-rank tables equal the 1-rank ones bit for bit.

Usage:
    python experiments/benchmarks/bench_pipeline.py [--reps 3] [--batch 16] [--seq 64] [--micro 8] [--ranks 4]
    python experiments/benchmarks/bench_pipeline.py --cap-demo [--cap-mb 300]
    python experiments/benchmarks/bench_pipeline.py --analyses [--ranks 4] [--micro 8]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def config():
    from interp import ModelConfig

    return ModelConfig(n_layers=8, d_model=256, n_heads=8, d_mlp=1024, d_vocab=1000, n_ctx=128,
                       positional="rotary", normalization="rms", activation="swiglu")


def big_config():
    from interp import ModelConfig

    return ModelConfig(n_layers=8, d_model=1024, n_heads=16, d_mlp=4096, d_vocab=1000, n_ctx=64,
                       positional="rotary", normalization="rms", activation="swiglu")


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1])


def cap_worker(a: argparse.Namespace) -> None:
    """One rank under RLIMIT_DATA = its data now + ``cap_mb``: load the slice, run one batch."""
    import resource

    import torch

    torch.set_num_threads(1)
    from interp import distributed
    from interp.pipeline import Pipeline
    from interp.zoo.checkpoint import load_checkpoint_stage

    distributed.init_from_env()
    limit = _status_kb("VmData") * 1024 + a.cap_mb * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    result: dict = {"rank": distributed.rank()}
    try:
        stage = load_checkpoint_stage(a.checkpoint)
        result["held_mb"] = sum(p.numel() * p.element_size() for p in stage.parameters() if not p.is_meta) / 2**20
        tokens = torch.randint(0, stage.cfg.d_vocab, (4, 32), generator=torch.Generator().manual_seed(0))
        logits = Pipeline(stage, micro_batches=2)(tokens)
        result["ok"] = True
        result["logits_shape"] = None if logits is None else list(logits.shape)
    except (MemoryError, RuntimeError) as e:
        result["ok"] = False
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    result["peak_rss_mb"] = _status_kb("VmHWM") / 1024
    Path(a.out, f"cap{result['rank']}.json").write_text(json.dumps(result))  # ranks share stdout: one file each
    if distributed.active():
        distributed.exit_after_failure(0) if not result["ok"] else distributed.shutdown()


def cap_demo(a: argparse.Namespace) -> int:
    from interp.placement import build
    from interp.zoo.checkpoint import save_checkpoint

    with tempfile.TemporaryDirectory() as d:
        model = build(big_config(), seed=0)
        weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        ckpt = save_checkpoint(model, Path(d) / "big.safetensors")
        del model
        print(f"# a {weights_mb:.0f} MB model (float32) under RLIMIT_DATA = start-up + {a.cap_mb} MB per rank")
        for n in (1, a.ranks):
            out = Path(d) / f"cap{n}"
            out.mkdir()
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), __file__,
                   "--cap-worker", "--checkpoint", str(ckpt), "--cap-mb", str(a.cap_mb), "--out", str(out)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
                   "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            rows = sorted((json.loads(f.read_text()) for f in out.glob("cap*.json")), key=lambda r: r["rank"])
            for r in rows:
                print(f"{n} rank(s), rank {r['rank']}: " + ("ran" if r["ok"] else "failed") +
                      f", held {r.get('held_mb', 0):.0f} MB, peak RSS {r['peak_rss_mb']:.0f} MB" +
                      ("" if r["ok"] else f" ({r['error']})"))
            if not rows:
                print(f"{n} rank(s): no report (exit {done.returncode}): {done.stderr[-500:]}")
    return 0


def worker(a: argparse.Namespace) -> None:
    """One rank: load its slice, time the pipelined forward; rank 0 writes the figures."""
    import torch

    torch.set_num_threads(1)
    from interp import distributed
    from interp.pipeline import Pipeline
    from interp.zoo.checkpoint import load_checkpoint_stage

    distributed.init_from_env()
    stage = load_checkpoint_stage(a.checkpoint)
    busy = [0.0]
    started = [0.0]
    stage.register_forward_pre_hook(lambda m, args: started.__setitem__(0, time.perf_counter()))
    stage.register_forward_hook(lambda m, args, out: busy.__setitem__(0, busy[0] + time.perf_counter() - started[0]))
    pipe = Pipeline(stage, micro_batches=a.micro)
    tokens = torch.randint(0, stage.cfg.d_vocab, (a.batch, a.seq), generator=torch.Generator().manual_seed(0))
    logits = pipe(tokens)  # warm-up
    walls, busies = [], []
    for _ in range(a.reps):
        if distributed.active():
            torch.distributed.barrier()
        busy[0] = 0.0
        t0 = time.perf_counter()
        logits = pipe(tokens)
        if distributed.active():
            torch.distributed.barrier()  # the batch is done when the last rank is
        walls.append(time.perf_counter() - t0)
        busies.append(busy[0])
    every = distributed._all_gather(busies, "gather of busy times") if distributed.active() else [busies]
    if distributed.rank() == 0:
        with open(a.out, "wb") as f:
            pickle.dump({"walls": walls, "busy": every, "logits": logits}, f)
    distributed.shutdown()


def analyses_worker(a: argparse.Namespace) -> None:
    """One rank: classify_heads and activation_patching over the pipeline; rank 0 writes the tables and times."""
    import torch

    torch.set_num_threads(1)
    from interp import distributed
    from interp.analysis import activation_patching, classify_heads
    from interp.pipeline import Pipeline
    from interp.zoo.checkpoint import load_checkpoint_stage

    distributed.init_from_env()
    pipe = Pipeline(load_checkpoint_stage(a.checkpoint), micro_batches=a.micro)
    gen = torch.Generator().manual_seed(0)
    V = pipe.model.cfg.d_vocab
    clean, corrupted = torch.randint(0, V, (8, 32), generator=gen), torch.randint(0, V, (8, 32), generator=gen)
    answers = torch.randint(0, V, (8, 2), generator=gen)
    kinds = ["positional", "previous-token", "duplicate-token", "induction", "sink"]
    times = {}
    if distributed.active():
        torch.distributed.barrier()
    t0 = time.perf_counter()
    report = classify_heads(pipe, kinds=kinds, n_seqs=32, batch_size=16, progress=False)
    times["classify_heads_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    table = activation_patching(pipe, clean, corrupted, act="z", answer_tokens=answers, batch_size=64, progress=False)
    times["activation_patching_s"] = time.perf_counter() - t0
    if distributed.rank() == 0:
        with open(a.out, "wb") as f:
            pickle.dump({"times": times, "df": report.df, "details": report.details, "patching": table}, f)
    distributed.shutdown()


def analyses(a: argparse.Namespace) -> int:
    import pandas as pd

    from interp.placement import build
    from interp.zoo.checkpoint import save_checkpoint

    with tempfile.TemporaryDirectory() as d:
        ckpt = save_checkpoint(build(config(), seed=0), Path(d) / "model.safetensors")
        results = {n: run(n, a, ckpt, Path(d) / f"analyses{n}.pkl", mode="--analyses-worker") for n in (1, a.ranks)}
    one, many = results[1], results[a.ranks]

    def same(x: pd.DataFrame, y: pd.DataFrame) -> bool:
        try:
            pd.testing.assert_frame_equal(x, y, check_exact=True)
            return True
        except AssertionError:
            return False

    equal = {"classify_heads": same(one["df"], many["df"]) and all(same(one["details"][k], many["details"][k])
                                                                    for k in one["details"]),
             "activation_patching": same(one["patching"], many["patching"])}
    cfg = config()
    print(f"# analyses over the pipeline: {cfg.n_layers} layers d_model={cfg.d_model}, {a.micro} micro-batches, "
          f"{os.cpu_count()} cores, 1 thread per rank (classify_heads: 32 repeated and 32 random sequences, "
          f"batches of 16; activation_patching: z per head, 8 x 32 tokens)")
    print("| analysis | 1 rank (s) | " + f"{a.ranks} ranks (s) | equal bit for bit |")
    print("|---|---|---|---|")
    for name in ("classify_heads", "activation_patching"):
        print(f"| {name} | {one['times'][name + '_s']:.2f} | {many['times'][name + '_s']:.2f} | {equal[name]} |")
    print(json.dumps({"1": one["times"], str(a.ranks): many["times"], "equal": equal}))
    return 0


def run(n: int, a: argparse.Namespace, ckpt: Path, out: Path, mode: str = "--worker") -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), __file__,
           mode, "--checkpoint", str(ckpt), "--out", str(out), "--reps", str(a.reps), "--batch", str(a.batch),
           "--seq", str(a.seq), "--micro", str(a.micro)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out, "rb") as f:
        return pickle.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--cap-demo", action="store_true", help="a model over one rank's memory cap, on 1 and N ranks")
    p.add_argument("--cap-mb", type=int, default=300, help="per-rank cap above start-up (MB)")
    p.add_argument("--analyses", action="store_true", help="classify_heads and activation_patching on 1 and N ranks")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--analyses-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cap-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    if a.cap_worker:
        cap_worker(a)
        return 0
    if a.analyses_worker:
        analyses_worker(a)
        return 0
    if a.cap_demo:
        return cap_demo(a)
    if a.analyses:
        return analyses(a)
    import torch

    from interp.pipeline import bubble_fraction
    from interp.placement import build
    from interp.zoo.checkpoint import save_checkpoint

    with tempfile.TemporaryDirectory() as d:
        ckpt = save_checkpoint(build(config(), seed=0), Path(d) / "model.safetensors")
        results = {n: run(n, a, ckpt, Path(d) / f"out{n}.pkl") for n in (1, a.ranks)}
    tokens = a.batch * a.seq
    one, many = results[1], results[a.ranks]
    rows = {}
    for n, r in results.items():
        wall = statistics.median(r["walls"])
        busy = [statistics.median(b) for b in r["busy"]]
        rows[n] = {"wall_s": wall, "tokens_per_s": tokens / wall, "busy_s": busy,
                   "bubble_measured": 1 - sum(busy) / (n * wall),
                   "bubble_ideal": bubble_fraction(n, min(a.micro, a.batch // 2))}
    cfg = config()
    print(f"# pipeline: {cfg.n_layers} layers d_model={cfg.d_model}, batch {a.batch} x {a.seq} tokens, "
          f"{a.micro} micro-batches, {os.cpu_count()} cores, 1 thread per rank, median of {a.reps}")
    print("| ranks | wall / batch (s) | tokens/s | busy per rank (s) | bubble measured | GPipe ideal |")
    print("|---|---|---|---|---|---|")
    for n, row in rows.items():
        print(f"| {n} | {row['wall_s']:.3f} | {row['tokens_per_s']:.0f} | "
              f"{', '.join(f'{b:.3f}' for b in row['busy_s'])} | {row['bubble_measured']:.2f} | "
              f"{row['bubble_ideal']:.2f} |")
    print(f"speed-up {a.ranks} ranks / 1: {rows[1]['wall_s'] / rows[a.ranks]['wall_s']:.2f}x; "
          f"logits equal bit for bit: {torch.equal(one['logits'], many['logits'])}")
    print(json.dumps({str(n): {k: v for k, v in row.items()} for n, row in rows.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
