"""Coreference heads and activation patching on SmolLM2-135M, each against what it must cost, side by side.

- ``coreference_scores(GAP dev)`` vs one recorded pass (every attention pattern, ``run_with_cache``) over the
  same windows, batched as ``coreference_scores`` batches them; target <= 1.3.
- ``activation_patching(by="head")`` on a 14-token and a 64-token prompt pair vs the implementation before
  patched runs resumed at the patched layer (``patching_before.py``, from the package's history); target >= 2x
  faster, results equal within 1e-5. nnsight's loop of traces and TransformerLens' ``run_with_hooks`` loop
  (TransformerBridge on the same weights) patch the same heads one at a time, for the ratio.
- ``activation_patching(by="head_pos")`` on the 64-token pair, and the old code on a slice of its passes (every
  old pass costs the same, so the slice is scaled to the whole).

Each comparison runs its variants interleaved (a new shuffled order per repetition, after one untimed run
each) and gives the median with the min-max range over repetitions.

Usage:
    python experiments/benchmarks/bench_patching.py [--reps 3] [--gap-rows N] [--only coref,patch14,patch64,head_pos]
        [--loop-every K] [--before-runs N] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import torch
from benchutil import fix_threads, machine_info
from patching_before import activation_patching_before, n_passes

HERE = os.path.dirname(os.path.abspath(__file__))
GAP_DEV = os.path.join(HERE, "..", "..", "..", "shared", "data", "gap", "gap-development.tsv")
PARTS = ("coref", "patch14", "patch64", "head_pos")


def timed(fns: dict[str, Callable[[], object]], reps: int, warmup: int = 1,
          results: dict[str, object] | None = None) -> dict[str, list[float]]:
    """Seconds of every repetition of each function, interleaved in a new seeded shuffled order each time
    (``results``, when given, receives what each function returned in its warm-up run)."""
    for _ in range(warmup):
        for n, f in fns.items():
            value = f()
            if results is not None:
                results[n] = value
    out: dict[str, list[float]] = {n: [] for n in fns}
    rng = random.Random(0)
    for _ in range(reps):
        for n in rng.sample(list(fns), len(fns)):
            t0 = time.perf_counter()
            fns[n]()
            out[n].append(time.perf_counter() - t0)
    return out


def table(times: dict[str, list[float]], baseline: str, targets: dict[str, str] | None = None) -> str:
    """Markdown: variant, median s, min-max s, ratio of medians to ``baseline``, target."""
    targets = targets or {}
    med = {n: statistics.median(v) for n, v in times.items()}
    rows = [f"| variant | median s | min-max s | ratio vs {baseline} | target |", "|---|---:|---:|---:|---|"]
    for n, v in times.items():
        rows.append(f"| {n} | {med[n]:.2f} | {min(v):.2f}-{max(v):.2f} | {med[n] / med[baseline]:.3f} | "
                    f"{targets.get(n, '')} |")
    return "\n".join(rows)


def prompt_pair(model, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n``-token clean / corrupted ids (the two names swapped in an IOI-style story) and the answer pair."""
    story = ("When Mary and John went to the store, John gave a drink to" if n <= 14 else
             "It was a quiet morning in the village. The baker opened his shop early, the children walked to "
             "school and the old dog slept by the fountain. When Mary and John went to the store after lunch, "
             "they met their neighbour, who talked about the weather for a long time. Later, John gave a drink to")
    ids = model.to_tokens(story)[0]
    ids = torch.cat([ids[:1], ids[len(ids) - (n - 1):]]) if len(ids) > n else ids  # [n]
    clean = ids[None]  # [1, n]
    mary, john = int(model.to_tokens(" Mary")[0, -1]), int(model.to_tokens(" John")[0, -1])
    corrupted = clean.clone()
    corrupted[clean == john], corrupted[clean == mary] = mary, john
    return clean, corrupted, torch.tensor([[mary, john]])


# --- coreference ----------------------------------------------------------------------------------------
def bench_coref(model, rows: int | None, reps: int) -> str:
    from interp.analysis import coreference as coref_mod
    from interp.analysis import coreference_scores

    seen: list = []
    real_stream = coref_mod.stream

    def capture(model_, batches, reducers, **kw):  # the windows exactly as coreference_scores batches them
        seen.extend(batches)
        return real_stream(model_, batches, reducers, **kw)

    coref_mod.stream = capture
    try:
        df = coreference_scores(model, GAP_DEV, max_items=rows, progress=False, n_boot=0)
    finally:
        coref_mod.stream = real_stream
    run_tokens = sum(int(b.real.sum()) for b in seen)

    def recorded() -> None:
        for b in seen:
            model.run_with_cache(b.tokens, attention_mask=b.mask, names_filter="*hook_pattern")

    def forward() -> None:
        for b in seen:
            model(b.tokens, attention_mask=b.mask)

    with torch.inference_mode():
        times = timed({"one recorded pass (every pattern)": recorded, "plain forward passes": forward,
                       "coreference_scores": lambda: coreference_scores(model, GAP_DEV, max_items=rows,
                                                                        progress=False)}, reps)
    return (f"### coreference_scores(GAP dev, {rows or 2000} rows: {df.attrs['n_windows']} windows scored, "
            f"{len(seen)} batches, {run_tokens} tokens run)\n\n"
            + table(times, "one recorded pass (every pattern)", {"coreference_scores": "<= 1.3"}))


# --- patching loops of other libraries --------------------------------------------------------------------
def logit_diff(logits: torch.Tensor, answers: torch.Tensor) -> float:
    last = logits[:, -1]  # [B, V]
    return float((last[:, answers[0, 0]] - last[:, answers[0, 1]]).mean())


def hf_model():
    from transformers import AutoModelForCausalLM

    from interp.zoo import smollm2

    path = smollm2.find_gguf()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    return hf, path


def nnsight_loop(hf, heads, clean, corrupted, answers, H: int, D: int) -> Callable[[], list[float]]:
    """Patch each head's z (the input of o_proj) from the corrupted run, one nnsight trace per head."""
    from nnsight import NNsight

    nn = NNsight(hf)
    layers = sorted({layer for layer, _ in heads})
    saved: dict = {}
    with torch.no_grad(), nn.trace(corrupted):  # nnsight runs the block's code itself: a plain loop, no comprehension
        for layer in layers:
            saved[layer] = nn.model.layers[layer].self_attn.o_proj.input.save()
    src = {layer: t.detach().clone() for layer, t in saved.items()}  # [B, T, H*D] each

    def run() -> list[float]:
        out = []
        with torch.no_grad():
            for layer, h in heads:
                with nn.trace(clean):
                    nn.model.layers[layer].self_attn.o_proj.input[:, :, h * D:(h + 1) * D] = \
                        src[layer][:, :, h * D:(h + 1) * D]
                    logits = nn.lm_head.output.save()
                out.append(logit_diff(logits, answers))
        return out

    return run


def tl_loop(hf, path, heads, clean, corrupted, answers, H: int, D: int) -> Callable[[], list[float]]:
    """Patch each head's z from the corrupted run, one ``run_with_hooks`` per head (TransformerBridge)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    tmp = tempfile.mkdtemp()
    cfg = hf.config.to_dict()
    cfg.pop("quantization_config", None)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        bridge = TransformerBridge.boot_transformers(tmp, hf_model=copy.deepcopy(hf), tokenizer=tok)
    bridge.eval()
    names = {layer: f"blocks.{layer}.attn.hook_z" for layer, _ in heads}
    with torch.no_grad():
        _, cache = bridge.run_with_cache(corrupted, names_filter=lambda n: n in names.values())
    src = {layer: cache[n].detach().clone() for layer, n in names.items()}

    def run() -> list[float]:
        out = []
        with torch.no_grad():
            for layer, h in heads:
                def hook(z, hook, layer=layer, h=h):
                    z = z.clone()
                    view = z.view(*z.shape[:2], H, D)  # [B, T, H, D] whether the hook sees [B, T, H*D] or not
                    view[:, :, h] = src[layer].reshape(view.shape)[:, :, h]
                    return z

                logits = bridge.run_with_hooks(clean, fwd_hooks=[(names[layer], hook)])
                out.append(logit_diff(logits, answers))
        return out

    return run


def bench_patch(model, n: int, reps: int, loop_every: int) -> str:
    from interp.analysis import activation_patching

    clean, corrupted, answers = prompt_pair(model, n)
    T = clean.shape[1]
    new = activation_patching(model, clean, corrupted, answer_tokens=answers, progress=False)  # the heads
    fns: dict[str, Callable[[], object]] = {
        "before (every patched run from the embedding)": lambda: activation_patching_before(
            model, clean, corrupted, answer_tokens=answers),
        "activation_patching": lambda: activation_patching(model, clean, corrupted, answer_tokens=answers,
                                                           progress=False)}
    heads = [(int(r.layer), int(r.head)) for r in new.itertuples()][::loop_every]
    ours = dict(zip([(int(r.layer), int(r.head)) for r in new.itertuples()], new["metric"]))
    notes, loops = [], {}
    H, D = model.cfg.n_heads, model.cfg.d_head
    try:
        hf, path = hf_model()
        for label, make in (("nnsight loop of traces", lambda: nnsight_loop(hf, heads, clean, corrupted, answers,
                                                                            H, D)),
                            ("TransformerLens run_with_hooks loop", lambda: tl_loop(hf, path, heads, clean,
                                                                                    corrupted, answers, H, D))):
            try:
                loops[label] = make()
            except Exception as e:  # noqa: BLE001 - an optional library; say why it is missing
                notes.append(f"{label} skipped: {type(e).__name__}: {str(e)[:200]}")
    except Exception as e:  # noqa: BLE001
        notes.append(f"HF SmolLM2 from the GGUF unavailable: {type(e).__name__}: {str(e)[:200]}")
    fns.update(loops)
    results: dict = {}
    with torch.inference_mode():
        times = timed(fns, reps, results=results)
    diff = float((results["activation_patching"]["metric"]
                  - results["before (every patched run from the embedding)"]["metric"]).abs().max())
    for label in loops:
        d = max(abs(v - ours[hd]) for v, hd in zip(results[label], heads))
        notes.append(f"{label}: largest metric difference to activation_patching on its {len(heads)} heads "
                     f"{d:.1e}")
    med = {k: statistics.median(v) for k, v in times.items()}
    text = (f"### activation_patching(by='head') on a {T}-token pair ({len(new)} heads; largest metric difference "
            f"to the old code {diff:.1e})\n\n"
            + table(times, "before (every patched run from the embedding)", {"activation_patching": "<= 0.5"}))
    text += (f"\n\nspeed-up over the old code: **{med['before (every patched run from the embedding)'] / med['activation_patching']:.2f}x**")
    for label in loops:
        scale = len(new) / len(heads)  # the loops cost the same per head: scaled to every head
        text += (f"\n\n{label}: {len(heads)} heads (every {loop_every}th) in {med[label]:.2f} s, "
                 f"{med[label] * scale:.1f} s for all {len(new)} scaled; "
                 f"**{med[label] * scale / med['activation_patching']:.1f}x** activation_patching's time")
    return text + ("\n\n" + "\n\n".join(notes) if notes else "")


def bench_head_pos(model, before_runs: int) -> str:
    from interp.analysis import activation_patching

    clean, corrupted, answers = prompt_pair(model, 64)
    T = clean.shape[1]
    with torch.inference_mode():
        t0 = time.perf_counter()
        new = activation_patching(model, clean, corrupted, by="head_pos", answer_tokens=answers, progress=False)
        t_new = time.perf_counter() - t0
        t0 = time.perf_counter()
        old = activation_patching_before(model, clean, corrupted, by="head_pos", answer_tokens=answers,
                                         max_runs=before_runs)
        t_slice = time.perf_counter() - t0
    passes = n_passes(len(new), clean.shape[0])
    done = old["metric"].notna()
    diff = float((new["metric"][done] - old["metric"][done]).abs().max())
    t_old = t_slice * passes / before_runs
    return (f"### activation_patching(by='head_pos') on a {T}-token pair ({len(new)} sites)\n\n"
            f"| variant | seconds |\n|---|---:|\n| activation_patching (one run) | {t_new:.1f} |\n"
            f"| before: {before_runs} of its {passes} equal passes, measured | {t_slice:.1f} |\n"
            f"| before: scaled to all {passes} passes | {t_old:.0f} |\n\n"
            f"speed-up over the old code: **{t_old / t_new:.1f}x** (estimated from the slice); largest metric "
            f"difference on the {int(done.sum())} sites the slice computed {diff:.1e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gap-rows", type=int, default=None, help="only the first GAP dev rows (default: all 2000)")
    p.add_argument("--loop-every", type=int, default=1, help="nnsight / TL loops patch every K-th head (scaled)")
    p.add_argument("--before-runs", type=int, default=4, help="passes of the old code timed for head_pos")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    p.add_argument("--quick", action="store_true", help="200 GAP rows, one repetition, loops over every 10th head")
    a = p.parse_args(argv)
    if a.quick:
        a.reps, a.gap_rows, a.loop_every, a.before_runs = 1, a.gap_rows or 200, max(a.loop_every, 10), 2
    parts = a.only.split(",")
    threads = fix_threads()
    print("## coreference and activation patching on SmolLM2-135M\n")
    print(machine_info() + f"; {a.reps} interleaved repetitions after one untimed run each\n", flush=True)
    import interp

    model = interp.load("smollm2-135m").eval()
    if "coref" in parts and os.path.isfile(GAP_DEV):
        print(bench_coref(model, a.gap_rows, a.reps) + "\n", flush=True)
    for n in (14, 64):
        if f"patch{n}" in parts:
            print(bench_patch(model, n, a.reps, a.loop_every) + "\n", flush=True)
    if "head_pos" in parts:
        print(bench_head_pos(model, a.before_runs) + "\n", flush=True)
    print(f"({threads} torch threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
