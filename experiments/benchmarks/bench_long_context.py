"""Long context: peak memory of positional and induction head scores over one 4k / 8k / 16k-token sequence.

A randomly initialised rotary decoder reads one sequence of random tokens repeated once (second half = first
half). Per head it computes: attention mass on the previous token and how often it is the argmax
(previous-token / positional:-1), mass on the first token, and the induction (prefix-matching) mass: from a
query in the second half to the key right after the query token's first occurrence.

Three variants, each in a fresh subprocess so that its peak resident memory is its own:

* streaming: ``model.set_query_chunk(chunk)`` + a :class:`interp.Reducer` that folds each query chunk's
  pattern ``[B, H, chunk, S]`` as it is computed (the reducer's ``q_start`` argument locates the chunk); nothing is stored.
* library: ``interp.analysis.positional_scores`` + ``induction_scores`` under the same query chunking (their
  reducers build boolean target masks for each chunk of query rows only, so they stay linear too; they run
  the model twice, once per scorer, and score more categories).
* materialising: ``run_with_cache(names_filter="*hook_pattern")`` stores every ``[B, H, T, S]`` pattern and
  the same scores are computed from them afterwards. Runs whose estimated peak exceeds ``--mem-cap-gib`` are
  not started (reported as skipped, with the estimate).

Peak memory is the child's maximum resident set size as the kernel reports it to the parent
(``os.wait4`` rusage, ru_maxrss), minus nothing; the "after setup" column is the child's RSS after importing
torch and building the model, so the difference is what the scoring pass added. Both variants' scores are
compared at the lengths where both ran.

The score reducer below touches only O(T) entries per chunk (gathers along the key axis), never a [T, S]
target mask; interp.analysis' TargetReducer builds [B, chunk, S] target masks per category and chunk.

``--smollm2``: ``classify_heads`` with its pattern scorers (``--kinds``) on SmolLM2-135M at ``--lengths``
(default 1k, 2k, 4k, 8k), batch 1, one thread, each length in its own subprocess: peak RSS above the weights,
each streamed pass's seconds against one SDPA forward of the same length (``--reps`` repetitions interleaved in
one process, medians, the load average printed), and (up to ``--check-upto`` tokens)
the largest score difference against the same scorers fed whole materialised patterns.

Usage:
    python experiments/benchmarks/bench_long_context.py [--lengths 4096 8192 16384] [--chunk 256] [--quick]
    python experiments/benchmarks/bench_long_context.py --smollm2 [--lengths 1024 2048] [--kinds positional sink]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
from benchutil import fix_threads, machine_info, time_reps

from interp.streaming import Reducer

GiB = 2**30
VARIANTS = ("streaming", "library", "materialise")


def make_model(T: int, seed: int = 0):
    import interp

    torch.manual_seed(seed)
    cfg = interp.ModelConfig(n_layers=2, d_model=256, n_heads=4, d_vocab=1000, n_ctx=T, positional="rotary",
                             normalization="pre", d_mlp=512)
    return interp.Transformer(cfg).eval()


def repeated_tokens(T: int, d_vocab: int, seed: int = 0) -> torch.Tensor:
    half = T // 2
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, d_vocab, (1, half), generator=g)
    return torch.cat([r, r], dim=1)  # [1, T]


class LongContextScores(Reducer):
    """Streaming per-head scores: previous-token mass and argmax share, first-token mass, induction mass.

    Works on any slice of queries (a query chunk, or the whole pattern): ``fold(layer, p, q0)`` with
    ``p`` ``[B, H, t, S]`` holding queries ``q0 .. q0 + t - 1``. Memory per call is O(B H t).
    """

    names = "blocks.*.attn.hook_pattern"

    def __init__(self, n_layers: int, n_heads: int, half: int) -> None:
        super().__init__()
        self.half = half
        z = lambda: torch.zeros(n_layers, n_heads, dtype=torch.float64)  # noqa: E731
        self.prev, self.prev_hit, self.first, self.induction = z(), z(), z(), z()
        self.n_prev, self.n_first, self.n_ind = 0, 0, 0

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        self.fold(int(name.split(".")[1]), tensor, q_start)

    def fold(self, layer: int, p: torch.Tensor, q0: int) -> None:
        B, H, t, S = p.shape
        if self.prev.device != p.device:  # the sums live where the patterns are: no copy back per chunk
            self.prev, self.prev_hit, self.first, self.induction = (
                x.to(p.device) for x in (self.prev, self.prev_hit, self.first, self.induction))
        q = torch.arange(q0, q0 + t, device=p.device)  # absolute query positions [t]
        rows = q >= 1  # queries that have a previous token (and a first token other than themselves)
        prev_idx = (q - 1).clamp(min=0).view(1, 1, t, 1).expand(B, H, t, 1)  # [B, H, t, 1]
        prev = p.gather(-1, prev_idx).squeeze(-1)  # [B, H, t]
        hit = p.argmax(-1) == (q - 1).view(1, 1, t)  # [B, H, t]
        self.prev[layer] += (prev * rows).sum((0, 2)).double()
        self.prev_hit[layer] += (hit & rows).sum((0, 2)).double()
        self.first[layer] += (p[..., 0] * rows).sum((0, 2)).double()
        ind_rows = q >= self.half  # second-half queries: token q first appeared at q - half
        ind_idx = (q - self.half + 1).clamp(min=0, max=S - 1).view(1, 1, t, 1).expand(B, H, t, 1)  # [B, H, t, 1]
        self.induction[layer] += (p.gather(-1, ind_idx).squeeze(-1) * ind_rows).sum((0, 2)).double()
        if layer == 0:  # counted on the host: reading the masks back would wait for the device
            n_rows = q0 + t - max(q0, 1)
            self.n_prev += n_rows * B
            self.n_first += n_rows * B
            self.n_ind += max(0, q0 + t - max(q0, self.half)) * B

    def result(self) -> dict[str, list]:
        return {"previous_token": (self.prev / self.n_prev).tolist(),
                "previous_token_argmax": (self.prev_hit / self.n_prev).tolist(),
                "first_token": (self.first / self.n_first).tolist(),
                "induction": (self.induction / max(self.n_ind, 1)).tolist()}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(variant: str, T: int, chunk: int) -> None:
    """Run one variant at one length and print a JSON line (scores, setup RSS, seconds)."""
    fix_threads()
    model = make_model(T)
    tokens = repeated_tokens(T, model.cfg.d_vocab)
    red = LongContextScores(model.cfg.n_layers, model.cfg.n_heads, T // 2)
    setup = rss_bytes()
    t0 = time.perf_counter()
    with torch.inference_mode():
        if variant == "streaming":
            model.set_query_chunk(chunk)
            model.run_with_cache(tokens, names_filter=[], reducers=[red])
        elif variant == "library":
            # interp.analysis' own streaming scorers, under the same query chunking.
            from interp.analysis import induction_scores, positional_scores

            model.set_query_chunk(chunk)
            pos = positional_scores(model, tokens, window=1)
            ind = induction_scores(model, tokens, copying=False)
            L, H = model.cfg.n_layers, model.cfg.n_heads
            red.library = {  # [L, H] lists, same layout as LongContextScores.result()
                "previous_token": ind["previous_token"].to_numpy().reshape(L, H).tolist(),
                "previous_token_argmax": pos["argmax_-1"].to_numpy().reshape(L, H).tolist(),
                "first_token": pos["mass_first"].to_numpy().reshape(L, H).tolist(),
                "induction": ind["induction"].to_numpy().reshape(L, H).tolist(),
            }
        else:
            _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
            for layer in range(model.cfg.n_layers):
                red.fold(layer, trace.pattern(layer), 0)
    secs = time.perf_counter() - t0
    print(json.dumps({"scores": getattr(red, "library", None) or red.result(), "setup_rss": setup, "seconds": secs,
                      "self_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def estimate_library(T: int, chunk: int = 256, n_heads: int = 4) -> int:
    """Generous bound for interp.analysis' scorers: per query chunk, a few [H, chunk, S] float temporaries
    and [chunk, S] bool target masks per category."""
    return 16 * n_heads * chunk * T * 4


def estimate_materialise(T: int, n_layers: int = 2, n_heads: int = 4) -> int:
    """Bytes the materialising variant needs beyond setup: every stored fp32 pattern [H, T, T] plus, while a
    layer runs, its scores, masked scores and softmax (3 [H, T, T]) and the additive causal mask [T, T]."""
    return (n_layers * n_heads + 3 * n_heads + 1) * T * T * 4


def run_child(variant: str, T: int, chunk: int) -> dict:
    """Run :func:`child` in a fresh interpreter; its peak RSS comes from the kernel via ``os.wait4``."""
    import tempfile

    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, str(T), "--chunk", str(chunk)]
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)  # this child's own rusage (ru_maxrss in KiB on Linux)
        p.returncode = os.waitstatus_to_exitcode(status)
        p.stdout.close()
        if p.returncode != 0:
            err.seek(0)
            return {"error": (err.read().strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_rss"] = usage.ru_maxrss * 1024
    return res


def run(quick: bool = False, lengths: list[int] | None = None, chunk: int = 256, cap_gib: float = 6.0) -> str:
    lengths = lengths or ([2048, 4096, 8192] if quick else [4096, 8192, 16384])
    threads = fix_threads()
    rows = ["| tokens | variant | peak RSS (MiB) | after setup (MiB) | added by scoring (MiB) | seconds |",
            "|---:|---|---:|---:|---:|---:|"]
    results: dict[tuple[str, int], dict] = {}
    for T in lengths:
        for variant in VARIANTS:
            est = {"materialise": estimate_materialise(T), "library": estimate_library(T)}.get(variant, 0)
            if est > cap_gib * GiB:
                rows.append(f"| {T} | {variant} | skipped: estimated > {est / 2**20:,.0f} MiB above setup "
                            f"(cap {cap_gib} GiB) | | | |")
                continue
            r = run_child(variant, T, chunk)
            results[(variant, T)] = r
            if "error" in r:
                rows.append(f"| {T} | {variant} | failed: {r['error']} | | | |")
                continue
            rows.append(f"| {T} | {variant}{f' (chunk {chunk})' if variant != 'materialise' else ''} | "
                        f"{r['peak_rss'] / 2**20:,.0f} | {r['setup_rss'] / 2**20:,.0f} | "
                        f"{(r['peak_rss'] - r['setup_rss']) / 2**20:,.0f} | {r['seconds']:.1f} |")
    notes = []
    for T in lengths:
        for other in ("materialise", "library"):
            a, b = results.get(("streaming", T)), results.get((other, T))
            if a and b and "error" not in a and "error" not in b:
                diff = max(abs(x - y) for k in a["scores"] for ra, rb in zip(a["scores"][k], b["scores"][k])
                           for x, y in zip(ra, rb))
                notes.append(f"{T} tokens: max |score difference| streaming vs {other} = {diff:.1e}")
    stream = [(T, results[("streaming", T)]) for T in lengths
              if ("streaming", T) in results and "error" not in results[("streaming", T)]]
    if len(stream) >= 2:
        (t0, r0), (t1, r1) = stream[0], stream[-1]
        a0, a1 = r0["peak_rss"] - r0["setup_rss"], r1["peak_rss"] - r1["setup_rss"]
        notes.append(f"streaming growth: added memory x{a1 / max(a0, 1):.2f} for tokens x{t1 / t0:.0f} "
                     f"(linear: x{t1 / t0:.0f}, quadratic: x{(t1 / t0) ** 2:.0f})")
        notes.append(f"streaming peak at {t1} tokens: {r1['peak_rss'] / GiB:.2f} GiB (target <= 2 GiB)")
    if stream:
        s = stream[-1][1]["scores"]
        notes.append("scores at the longest length (layer x head), previous-token mass: "
                     + json.dumps([[round(v, 4) for v in row] for row in s["previous_token"]])
                     + ", induction mass: " + json.dumps([[round(v, 4) for v in row] for row in s["induction"]]))
    return (f"## bench_long_context (torch threads {threads})\n\n{machine_info()}\n\n"
            f"### 3. long context: streaming reducers vs materialising every pattern (2-layer rotary decoder, "
            f"d_model 256, 4 heads, fp32, one repeated random sequence)\n\n" + "\n".join(rows) + "\n\n"
            + "\n".join(f"- {n}" for n in notes))


# --- SmolLM2-135M: classify_heads' pattern scorers at 1k..8k tokens -----------------------------------------
SMOL_KINDS = ["positional", "previous-token", "duplicate-token", "induction", "sink", "retrieval"]


def smol_child(T: int, kinds: list[str], check: bool, reps: int, max_chunks: int | None = None) -> None:
    """classify_heads on SmolLM2 at ``T`` tokens (batch 1, one thread) against one plain SDPA forward of ``T``
    tokens; prints a JSON line.

    The first classify_heads run is the warm-up and the memory measurement (peak RSS); then ``reps`` repetitions
    each run classify_heads (every streamed pass timed on its own) and one SDPA forward, in an order shuffled anew
    every repetition (:func:`benchutil.time_reps`), so that load from other processes hits both
    alike. The figure per pass is its median over the repetitions, over the median SDPA forward. ``check``: also
    run the same scorers with every pattern materialised whole (``set_query_chunk(T)``) and report the largest
    score difference."""
    import statistics

    import interp
    import interp.analysis.taxonomy as taxonomy
    from interp.analysis import classify_heads

    torch.set_num_threads(1)
    if max_chunks is not None:  # the automatic chunks' count rule, for a before / after comparison
        interp.streaming.AUTO_MAX_CHUNKS = max_chunks
    model = interp.load("smollm2-135m").eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, model.cfg.d_vocab, (1, T), generator=g)
    half = torch.randint(0, model.cfg.d_vocab, (1, T // 2), generator=g)
    repeats = torch.cat([half, half], dim=1)  # [1, T]
    passes: list[float] = []
    plain_stream = taxonomy.stream

    def timed(*a, **k):  # each of classify_heads' streamed passes, timed on its own
        t0 = time.perf_counter()
        n = plain_stream(*a, **k)
        passes.append(time.perf_counter() - t0)
        return n

    taxonomy.stream = timed
    setup = rss_bytes()

    def classify():
        return classify_heads(model, tokens=text, induction_tokens=repeats, kinds=kinds, batch_size=1, n_seqs=1,
                              options={"needle_context": T} if "retrieval" in kinds else None, progress=False)

    load = [os.getloadavg()]
    with torch.inference_mode():
        report = classify()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        diff = None
        if check:
            model.set_query_chunk(T)  # one chunk: every [1, H, T, T] pattern whole, as before chunking existed
            whole = classify()
            model.set_query_chunk(None)
            diff = max(float((a.select_dtypes("number") - b.select_dtypes("number")).abs().max().max())
                       for k, a in report.details.items() if isinstance(a, __import__("pandas").DataFrame)
                       for b in [whole.details[k]])
        model(text)  # warm the fast path too
        pass_runs: list[list[float]] = []  # each repetition's passes

        def classify_passes() -> None:
            passes.clear()
            classify()
            pass_runs.append(list(passes))
            load.append(os.getloadavg())

        sdpa_runs = time_reps({"classify": classify_passes, "sdpa": lambda: model(text)},  # SDPA: no hooks
                              reps=reps, warmup=0)["sdpa"]
    per_pass = [statistics.median(r[i] for r in pass_runs) for i in range(len(pass_runs[0]))]
    print(json.dumps({"T": T, "weights": weights, "setup_rss": setup, "peak_rss": peak, "passes": per_pass,
                      "sdpa": statistics.median(sdpa_runs), "sdpa_runs": sdpa_runs,
                      "pass_runs": pass_runs, "diff": diff, "rows": len(report.df),
                      "load": [round(x[0], 2) for x in load]}))


def run_smol(lengths: list[int], kinds: list[str], check_upto: int, reps: int, max_chunks: int | None = None) -> str:
    rows = ["| tokens | peak RSS - weights (MiB) | added by classify_heads (MiB) | passes (s, median) | SDPA forward "
            "(s, median) | slowest pass / SDPA | max score diff vs whole patterns | load avg (1 min) over the reps |",
            "|---:|---:|---:|---|---:|---:|---:|---|"]
    for T in lengths:
        cmd = [sys.executable, os.path.abspath(__file__), "--smol-child", str(T), "--kinds", *kinds, "--reps",
               str(reps)]
        if T <= check_upto:
            cmd.append("--check")
        if max_chunks is not None:
            cmd += ["--max-chunks", str(max_chunks)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            rows.append(f"| {T} | failed: {(p.stderr.strip().splitlines() or ['?'])[-1]} | | | | | | |")
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        ratio = max(r["passes"]) / r["sdpa"]
        rows.append(f"| {T} | {(r['peak_rss'] - r['weights']) / 2**20:,.0f} | {(r['peak_rss'] - r['setup_rss']) / 2**20:,.0f}"
                    f" | {', '.join(f'{x:.1f}' for x in r['passes'])} | {r['sdpa']:.1f} | {ratio:.2f} | "
                    f"{'' if r['diff'] is None else format(r['diff'], '.1e')} | {r['load']} |")
        print(rows[-1], flush=True)
    return (f"## bench_long_context --smollm2 (1 torch thread, batch 1)\n\n{machine_info()}\n\nclassify_heads(kinds="
            f"{kinds}) on SmolLM2-135M (fp32), one sequence per pass; {reps} repetitions, classify_heads and one SDPA "
            f"forward interleaved in a shuffled order; pass / SDPA is the slowest pass's median over the median SDPA "
            f"forward of the same length.\n\n" + "\n".join(rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--mem-cap-gib", type=float, default=float(os.environ.get("BENCH_MEM_CAP_GIB", 6.0)))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("VARIANT", "T"), help=argparse.SUPPRESS)
    p.add_argument("--smollm2", action="store_true", help="classify_heads on SmolLM2-135M (--lengths, --kinds)")
    p.add_argument("--kinds", nargs="+", default=SMOL_KINDS)
    p.add_argument("--check-upto", type=int, default=2048, help="compare with whole patterns up to this length")
    p.add_argument("--reps", type=int, default=3, help="--smollm2: interleaved timed repetitions per length")
    p.add_argument("--max-chunks", type=int, help="--smollm2: set interp.streaming.AUTO_MAX_CHUNKS (a huge value: "
                   "the byte budget alone, as before the count rule)")
    p.add_argument("--smol-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.smol_child:
        smol_child(a.smol_child, a.kinds, a.check, a.reps, a.max_chunks)
        return 0
    if a.smollm2:
        print(run_smol(a.lengths or [1024, 2048, 4096, 8192], a.kinds, a.check_upto, a.reps, a.max_chunks))
        return 0
    if a.child:
        child(a.child[0], int(a.child[1]), a.chunk)
        return 0
    print(run(a.quick, a.lengths, a.chunk, a.mem_cap_gib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
