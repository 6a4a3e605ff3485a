"""SmolLM2-135M (a real GQA decoder from GGUF), side by side with transformers on the same weights.

The reference is transformers' own GGUF loading of the same file (``LlamaForCausalLM``), switched between its
``sdpa`` and ``eager`` attention. Everything runs in this one process, interleaved in shuffled order and
medians after warm-up (benchutil.time_interleaved); the machine is shared, so treat every number as noisy.

1. forward, 4 x 128 tokens: interp (nothing hooked) / HF sdpa. Target <= 1.0.
2. recording every pattern + every per-head write (interp ``run_with_cache``) / HF eager
   ``output_attentions=True`` (patterns only, which favours HF). Target <= 1.0. TransformerLens
   ``TransformerBridge.run_with_cache`` (patterns + z, per-head writes formed from z and W_O) / interp.
3. greedy decoding, tokens per second, interp ``generate`` (static KV cache, one output buffer, each step past
   the prompt as ``LeanDecoder``'s hook-free operations, weights packed for MKL once per call from 4 sequences
   on) and ``generate`` inside ``model.decoding(B)`` (the decode layout built once; its build time shown) / HF
   ``generate`` (static cache), batch 1 and 8. Target >= 1.2. Outputs are checked equal; interp without weight
   copies, and with the hooked forward pass at every step, are timed beside them.
4. load time of ``interp.load("smollm2-135m")`` from the converted cache; peak memory of a full Trace (every
   hook) of 512 tokens, in a fresh subprocess (kernel rusage).

Usage:
    python experiments/benchmarks/bench_smollm2.py [--quick] [--reps N] [--new-tokens N]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings

import torch
from benchutil import fix_threads, machine_info, ratio_table, time_interleaved

RECORD = ["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_result"]
PROMPT = "The capital of France is Paris. The capital of Germany is"


def load_hf(gguf_path):
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name).eval()
    return hf


def set_attn(hf, kind: str) -> None:
    hf.set_attn_implementation(kind)


def bench_forward(ours, hf, reps: int, batch: int = 4, seq: int = 128) -> tuple[str, float]:
    ids = torch.randint(0, ours.cfg.d_vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    set_attn(hf, "sdpa")
    with torch.inference_mode():
        diff = (ours(ids) - hf(ids).logits).abs().max().item()
        med = time_interleaved({"HF LlamaForCausalLM (sdpa)": lambda: hf(ids),
                                "interp, nothing hooked": lambda: ours(ids)}, reps=reps)
    r = med["interp, nothing hooked"] / med["HF LlamaForCausalLM (sdpa)"]
    return (f"### 1. forward, {batch} x {seq} tokens (max |logit diff| {diff:.1e})\n\n"
            + ratio_table(med, "HF LlamaForCausalLM (sdpa)", targets={"interp, nothing hooked": "<= 1.0"}), r)


def bench_recording(ours, hf, gguf_path, reps: int, batch: int = 4, seq: int = 128) -> tuple[str, float, float | None]:
    ids = torch.randint(0, ours.cfg.d_vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    set_attn(hf, "eager")
    L, H, D = ours.cfg.n_layers, ours.cfg.n_heads, ours.cfg.d_head
    fns = {"HF eager, output_attentions (patterns only)": lambda: hf(ids, output_attentions=True),
           "interp run_with_cache (patterns + per-head writes)":
               lambda: ours.run_with_cache(ids, names_filter=RECORD)}
    note = ""
    try:
        from transformer_lens.model_bridge import TransformerBridge

        tmp = tempfile.mkdtemp()
        cfg = hf.config.to_dict()
        cfg.pop("quantization_config", None)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            # The bridge rewires the HF model it is given: hand it a copy, keep `hf` plain for the HF rows.
            bridge = TransformerBridge.boot_transformers(tmp, hf_model=copy.deepcopy(hf), tokenizer=tok)
        bridge.eval()
        W_O = [b.attn.W_O_heads.detach().clone() for b in ours.blocks]

        def tl():
            _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n.endswith(("attn.hook_pattern", "attn.hook_z")))
            return [torch.einsum("bthd,hdm->bthm", cache[f"blocks.{l}.attn.hook_z"].view(batch, seq, H, D), W_O[l])
                    for l in range(L)]  # [B, T, H, M] per layer

        fns["TransformerLens bridge run_with_cache (patterns + z -> per-head writes)"] = tl
    except Exception as e:  # noqa: BLE001 - the bridge is optional; say why it is missing
        note = f"\n\nTransformerLens bridge skipped: {type(e).__name__}: {str(e)[:200]}"
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, trace = ours.run_with_cache(ids, names_filter=RECORD)
        att = hf(ids, output_attentions=True).attentions
        d = max((trace.pattern(l) - att[l]).abs().max().item() for l in range(L))
        med = time_interleaved(fns, reps=reps)
    base = "HF eager, output_attentions (patterns only)"
    r = med["interp run_with_cache (patterns + per-head writes)"] / med[base]
    tl_key = "TransformerLens bridge run_with_cache (patterns + z -> per-head writes)"
    tl_ratio = med[tl_key] / med["interp run_with_cache (patterns + per-head writes)"] if tl_key in med else None
    set_attn(hf, "sdpa")
    text = (f"### 2. recording every pattern + per-head write, {batch} x {seq} tokens (max |pattern diff| vs HF "
            f"eager {d:.1e})\n\n" + ratio_table(med, base, targets={
                "interp run_with_cache (patterns + per-head writes)": "<= 1.0"}) + note)
    if tl_ratio is not None:
        text += f"\n\nTransformerLens bridge / interp, same recording: **{tl_ratio:.2f}x**"
    return text, r, tl_ratio


def bench_decode(ours, hf, reps: int, new_tokens: int) -> tuple[str, dict[int, tuple[float, float]]]:
    """tokens/s of interp and HF greedy decoding, batch 1 and 8, side by side.

    Past the prompt, interp's ``generate`` runs each step as ``LeanDecoder``'s hook-free tensor operations
    while no hook is attached. It is timed four ways: ``generate`` as a user calls it once (from
    ``PACK_MIN_ROWS`` sequences it packs the weights for MKL inside every call; below, at 32 new tokens, it
    multiplies the weights themselves), ``generate`` inside ``model.decoding(batch_size=B)`` (the decode layout
    of the weights built once, before the timed calls, as for a run of many generations; its build time is
    reported beside it), ``generate(pack_weights=False)`` (no copies at all), and the hooked forward pass at
    every step (a no-op hook attached, no copies: what every step cost before ``LeanDecoder``). The
    ``decoding()`` variant runs on a copy of the model held inside the block, so that all five are timed
    interleaved.
    """
    prompt = ours.to_tokens(PROMPT)
    held = copy.deepcopy(ours)
    set_attn(hf, "sdpa")
    rows = ["| batch | interp `generate` tokens/s | interp in `decoding()` tokens/s | HF generate (static cache) "
            "tokens/s | ratio `generate` / HF | ratio `decoding()` / HF | outputs equal | target | interp, no "
            "weight copies, tokens/s | interp, hooked pass every step, tokens/s | `decoding()` layout built once "
            "in (s) |",
            "|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|"]
    ratios = {}
    for batch in (1, 8):
        ids = prompt.repeat(batch, 1)
        mask = torch.ones_like(ids)

        def ours_gen():
            return ours.generate(ids, new_tokens)

        def ours_plain():
            return ours.generate(ids, new_tokens, pack_weights=False)

        def held_gen():
            return held.generate(ids, new_tokens)

        def ours_hooked():  # a hook that changes nothing: every step takes the hooked forward pass
            with ours.hooks([("blocks.0.hook_resid_pre", lambda x, hook: None)]):
                return ours.generate(ids, new_tokens, pack_weights=False)

        def hf_gen():
            return hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               do_sample=False, cache_implementation="static", pad_token_id=2)

        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = hf_gen().tolist()
            same = ours_gen().tolist() == ref and ours_plain().tolist() == ref and ours_hooked().tolist() == ref
            t0 = time.perf_counter()
            with held.decoding(batch_size=batch):
                build_s = time.perf_counter() - t0
                same = same and held_gen().tolist() == ref
                med = time_interleaved({"interp": ours_gen, "held": held_gen, "hf": hf_gen, "plain": ours_plain,
                                        "hooked": ours_hooked}, reps=reps, warmup=1)
        tok = {k: batch * new_tokens / v for k, v in med.items()}
        t_in = tok["held"]
        ratios[batch] = (tok["interp"] / tok["hf"], t_in / tok["hf"])
        rows.append(f"| {batch} | {tok['interp']:.1f} | {t_in:.1f} | {tok['hf']:.1f} | {ratios[batch][0]:.2f} | "
                    f"{ratios[batch][1]:.2f} | {same} | >= 1.2 | {tok['plain']:.1f} | {tok['hooked']:.1f} | "
                    f"{build_s:.2f} |")
    return (f"### 3. greedy decoding, prompt {prompt.shape[1]} tokens + {new_tokens} new\n\n" + "\n".join(rows)
            + "\n\nPast the prompt every interp variant but the hooked one runs `LeanDecoder`'s hook-free step. "
              "`generate` packs its float32 weights for MKL inside every call from 4 sequences on "
              "(`pack_weights=None`); that time is inside its tokens/s. Inside `model.decoding(batch_size=B)` the "
              "weights are laid out for B rows once (transposed below 4 rows, the MLP's gate and input fused; "
              "MKL-packed from 4) and reused by every call, as in a run of many generations (timed on a copy of "
              "the model held in the block); the build time is in the last column, not in the tokens/s.", ratios)


def peak_rss() -> int:
    """This process's peak resident memory in bytes: VmHWM, the high-water mark of its own address space.

    Not ``ru_maxrss``: Linux carries it across ``execve``, so a child started by this (large) benchmark
    process would report the parent's footprint at fork time as its own peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux (bytes on macOS)


def trace_memory_child() -> None:
    import interp

    base = peak_rss()
    model = interp.load("smollm2-135m")
    loaded = peak_rss()
    ids = torch.randint(0, model.cfg.d_vocab, (1, 512), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        model(ids[:, :8])
        setup = peak_rss()
        t0 = time.perf_counter()
        _, trace = model.run_with_cache(ids)  # every hook point
        secs = time.perf_counter() - t0
    print(json.dumps({"base": base, "loaded": loaded, "setup_maxrss": setup, "peak_maxrss": peak_rss(),
                      "trace_bytes": trace.nbytes(), "seconds": secs}))


def bench_trace_memory() -> str:
    res_ = subprocess.run([sys.executable, os.path.abspath(__file__), "--trace-child"], stdout=subprocess.PIPE,
                          text=True, check=False)
    if res_.returncode != 0 or not res_.stdout.strip():
        return f"### 4b. full Trace of 512 tokens: child failed (exit {res_.returncode})"
    res = json.loads(res_.stdout.strip().splitlines()[-1])
    mib = {k: f"{res[k] / 2**20:,.0f}" for k in ("base", "loaded", "setup_maxrss", "peak_maxrss", "trace_bytes")}
    return (f"### 4b. peak memory of a full Trace (every hook) of 512 tokens, fresh process (VmHWM)\n\n"
            f"| peak RSS (MiB) | after imports | after `interp.load` | + 8-token warm-up | trace tensors (MiB) "
            f"| seconds |\n|---:|---:|---:|---:|---:|---:|\n| {mib['peak_maxrss']} | {mib['base']} | "
            f"{mib['loaded']} | {mib['setup_maxrss']} | {mib['trace_bytes']} | {res['seconds']:.1f} |")


def bench_load(reps: int) -> tuple[str, float]:
    import interp

    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        interp.load("smollm2-135m")
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    return (f"### 4a. `interp.load(\"smollm2-135m\")` from the converted cache: median {med:.1f} s over {reps} "
            f"(min {times[0]:.1f} s)", med)


def run(quick: bool = False, reps: int | None = None, new_tokens: int = 32) -> str:
    reps = reps or (3 if quick else 7)
    threads = fix_threads()
    import interp
    from interp.zoo import smollm2

    ours = interp.load("smollm2-135m")
    path = smollm2.find_gguf()
    if path is None:
        return "## bench_smollm2\n\nskipped: no SmolLM2 GGUF file in the cache (run interp.zoo.smollm2.fetch_gguf())"
    hf = load_hf(path)
    fwd, r_fwd = bench_forward(ours, hf, reps)
    rec, r_rec, r_tl = bench_recording(ours, hf, path, reps)
    dec, r_dec = bench_decode(ours, hf, max(2, reps // 2), new_tokens)
    del hf
    load, t_load = bench_load(3 if quick else 5)
    mem = bench_trace_memory()
    summary = ["| comparison | target | measured |", "|---|---|---|",
               f"| forward 4x128 / HF sdpa | <= 1.0 | {r_fwd:.3f} |",
               f"| recording patterns + per-head writes / HF eager output_attentions | <= 1.0 | {r_rec:.3f} |",
               f"| greedy decoding tokens/s, interp / HF generate, batch 1: one `generate` call; inside "
               f"`decoding()` | >= 1.2 | {r_dec[1][0]:.2f}; {r_dec[1][1]:.2f} |",
               f"| greedy decoding tokens/s, interp / HF generate, batch 8: one `generate` call; inside "
               f"`decoding()` | >= 1.2 | {r_dec[8][0]:.2f}; {r_dec[8][1]:.2f} |",
               f"| TransformerLens bridge run_with_cache / interp | | "
               f"{'n/a' if r_tl is None else f'{r_tl:.2f}x'} |",
               f"| load from cache | a few s | {t_load:.1f} s |"]
    return "\n\n".join([f"## bench_smollm2 (torch threads {threads}; shared machine: numbers are noisy)\n\n"
                        f"{machine_info()}", "\n".join(summary), fwd, rec, dec, load, mem])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--trace-child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.trace_child:
        fix_threads()
        trace_memory_child()
        return 0
    print(run(a.quick, a.reps, a.new_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
