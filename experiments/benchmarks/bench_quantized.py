"""Quantised weights that stay quantised (``load_gguf(path, keep_quantized=True)``): memory, exactness and speed.

Three cases, each measured in fresh interpreters (a thread samples ``/proc/self/status`` every 2 ms; the peak
is the process's whole resident set, imports included):

- ``medium``: a random Llama-shaped GGUF in Q4_0 (~110M parameters, written here with ``gguf.GGUFWriter``),
  loaded twice in one process, kept quantised and dequantised to float32: the largest logit difference and
  the forward time of each, side by side.
- ``smollm2``: SmolLM2-135M's real Q4_1 file (``~/.cache/interp/smollm2-135m``): the same comparison, then
  the peak RSS of a kept-quantised load + ``run_with_cache`` + ``classify_heads`` against the file's size.
- ``8b`` (``--big``): a Llama-3.1-8B-shaped GGUF (32 layers, d_model 4096, 32 / 8 heads, d_mlp 14336,
  vocabulary 128256, untied output) of random Q4_0 blocks (~4.5 GB), written tensor by tensor to ``--dir``
  (default /tmp) and deleted afterwards. Loaded with keep_quantized, it runs ``run_with_cache`` and
  ``classify_heads`` on a short text; the peak RSS is compared with 1.3 x the file + the trace, and with the
  float32 model's 8.03e9 x 4 bytes = 32.1 GB.

Random Q4_0 blocks are written directly (random nibbles, float16 scales of 0.002-0.004): the ``gguf``
package's numpy quantiser would take minutes for 8B values, and the weights' values do not matter here.

Usage:
    python experiments/benchmarks/bench_quantized.py [--big | --only-big] [--dir /tmp] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MEDIUM = dict(layers=4, d_model=1024, n_heads=16, n_kv_heads=4, d_mlp=2816, vocab=32000)
LLAMA_8B = dict(layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_mlp=14336, vocab=128256)
SMOLLM2 = Path("~/.cache/interp/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()
TEXT = ("The quick brown fox jumps over the lazy dog. When Mary and John went to the store, John gave a drink "
        "to Mary. The cat sat on the mat, and the dog sat on the rug.")

_SAMPLER = r"""
import json, sys, threading, time
def status():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("RssAnon", "VmRSS")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) * 1024
    return out
peak = status()
done = False
def sample():
    while not done:
        for k, v in status().items():
            peak[k] = max(peak[k], v)
        time.sleep(0.002)
threading.Thread(target=sample, daemon=True).start()
"""

# argv: file, "quantized" | "float", tokenizer source (a .gguf whose tokenizer reads TEXT)
CHILD_MEMORY = _SAMPLER + r"""
import torch
import torch._dynamo  # noqa: F401  (torch imports it on a process's first meta-tensor cat: a one-time import)
import gguf  # noqa: F401  (imported by the first GGUF load: its dequantisers)
from interp.analysis import classify_heads
from interp.quantized import quantized_weights
from interp.zoo.gguf import load_gguf, read_metadata, tokenizer_from_gguf
path, mode, tok_path, text = sys.argv[1:5]
torch.set_num_threads(1)
base = status()["VmRSS"]  # the interpreter with torch, torch._dynamo, gguf and interp imported
t0 = time.perf_counter()
model = load_gguf(path, keep_quantized=mode == "quantized", tokenizer=False)
load_s = time.perf_counter() - t0
after_load = status()["VmRSS"]
tok = tokenizer_from_gguf(read_metadata(tok_path))
tokens = tok.to_tokens(text)[:, : model.cfg.n_ctx]
t0 = time.perf_counter()
with torch.no_grad():
    logits, trace = model.run_with_cache(tokens)
cache_s = time.perf_counter() - t0
trace_bytes = trace.nbytes()
head_write_bytes = sum(w.numel() * w.element_size() for _, w in trace._head_writes.values())  # W_O per layer
peak_cache = dict(peak)
del logits, trace
peak.update(status())  # the classify_heads phase is measured on its own, without the trace
t0 = time.perf_counter()
report = classify_heads(model, tokens=tokens, n_seqs=2, half_len=16, batch_size=2, progress=False)
classify_s = time.perf_counter() - t0
done = True
stored = sum(w.nbytes for _, w in quantized_weights(model))
floats = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"load_s": load_s, "run_with_cache_s": cache_s, "classify_s": classify_s,
                  "tokens": tokens.shape[1], "trace_bytes": trace_bytes, "after_load": after_load, "base": base,
                  "peak_rss_cache": peak_cache["VmRSS"], "head_write_bytes": head_write_bytes,
                  "peak_rss": peak["VmRSS"], "peak_anon": peak["RssAnon"], "stored_bytes": stored,
                  "float_param_bytes": floats, "kinds": int(report.df["kind"].nunique())}))
"""

# argv: file; both models in one process, the same tokens
CHILD_COMPARE = r"""
import json, statistics, sys, time
import torch
from interp.zoo.gguf import load_gguf
torch.set_num_threads(1)
path = sys.argv[1]
q = load_gguf(path, keep_quantized=True, tokenizer=False)
f = load_gguf(path, tokenizer=False)
tokens = torch.randint(0, q.cfg.d_vocab, (1, 64), generator=torch.Generator().manual_seed(0))
def timed(m):
    times = []
    with torch.no_grad():
        for _ in range(4):
            t0 = time.perf_counter(); out = m(tokens); times.append(time.perf_counter() - t0)
    return out, statistics.median(times[1:])
lq, tq = timed(q)
lf, tf = timed(f)
print(json.dumps({"max_abs_diff": float((lq - lf).abs().max()), "max_abs_logit": float(lf.abs().max()),
                  "quantized_s": tq, "float_s": tf, "tokens": 64}))
"""


def write_q4_0(path: Path, shape: dict, seed: int = 0) -> Path:
    """A random Llama-shaped GGUF, 2-D weights as random Q4_0 blocks, written one tensor at a time (the writer
    never holds more than one tensor)."""
    import gguf
    import numpy as np

    q4 = gguf.GGMLQuantizationType.Q4_0
    block, size = gguf.GGML_QUANT_SIZES[q4]
    L, d, h, k, f, v = (shape[x] for x in ("layers", "d_model", "n_heads", "n_kv_heads", "d_mlp", "vocab"))
    dh = d // h
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, L), (w.add_context_length, 2048), (w.add_embedding_length, d),
                       (w.add_feed_forward_length, f), (w.add_head_count, h), (w.add_head_count_kv, k),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_freq_base, 500000.0), (w.add_vocab_size, v),
                       (w.add_rope_dimension_count, dh)):
        add(value)
    tensors: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (v, d)), ("output_norm.weight", (d,)),
                                                  ("output.weight", (v, d))]
    for i in range(L):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", (d,)), (b + "ffn_norm.weight", (d,)),
                    (b + "attn_q.weight", (h * dh, d)), (b + "attn_k.weight", (k * dh, d)),
                    (b + "attn_v.weight", (k * dh, d)), (b + "attn_output.weight", (d, h * dh)),
                    (b + "ffn_gate.weight", (f, d)), (b + "ffn_up.weight", (f, d)), (b + "ffn_down.weight", (d, f))]
    for name, shp in tensors:
        if len(shp) == 1:
            w.add_tensor_info(name, shp, np.dtype(np.float32), shp[0] * 4)
        else:
            rows, cols = shp
            w.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), rows * cols // block * size,
                              raw_dtype=q4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shp in tensors:
        if len(shp) == 1:
            w.write_tensor_data(np.ones(shp, dtype=np.float32))
            continue
        rows, cols = shp
        blocks = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)  # [N, 18]
        blocks[:, :2] = rng.uniform(0.002, 0.004, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
        w.write_tensor_data(blocks.reshape(rows, -1))
        del blocks
    w.close()
    return path


def n_params(shape: dict) -> int:
    L, d, h, k, f, v = (shape[x] for x in ("layers", "d_model", "n_heads", "n_kv_heads", "d_mlp", "vocab"))
    dh = d // h
    per_layer = d * h * dh * 2 + d * k * dh * 2 + 3 * d * f + 2 * d
    return L * per_layer + 2 * v * d + d


def _child(code: str, *args: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _small_cases(res: dict[str, dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        medium = write_q4_0(Path(tmp) / "medium-q4_0.gguf", MEDIUM)
        res["medium"] = {"file_bytes": medium.stat().st_size, "params": n_params(MEDIUM),
                         **_child(CHILD_COMPARE, str(medium))}
    if SMOLLM2.exists():
        res["smollm2"] = {"file_bytes": SMOLLM2.stat().st_size, **_child(CHILD_COMPARE, str(SMOLLM2))}
        for mode in ("quantized", "float"):
            res[f"smollm2 {mode}"] = _child(CHILD_MEMORY, str(SMOLLM2), mode, str(SMOLLM2), TEXT)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--big", action="store_true", help="also the Llama-3.1-8B-shaped Q4_0 file (~4.5 GB on disk)")
    p.add_argument("--dir", type=Path, default=Path("/tmp"), help="where to write the big file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--only-big", action="store_true", help="skip the medium and SmolLM2 cases")
    a = p.parse_args(argv)
    res: dict[str, dict] = {}
    a.big = a.big or a.only_big
    if not a.only_big:
        _small_cases(res)
    if a.big:
        a.dir.mkdir(parents=True, exist_ok=True)
        big = a.dir / "bench-llama-8b-shaped-q4_0.gguf"
        try:
            write_q4_0(big, LLAMA_8B)
            print(f"wrote {big} ({big.stat().st_size / 1e9:.2f} GB)", file=sys.stderr, flush=True)
            res["8b"] = {"file_bytes": big.stat().st_size, "params": n_params(LLAMA_8B),
                         **_child(CHILD_MEMORY, str(big), "quantized", str(SMOLLM2), TEXT)}
        finally:
            big.unlink(missing_ok=True)
    if a.json:
        print(json.dumps(res))
        return 0
    print("### keep_quantized: logits and forward time against the dequantised float32 model (one process)\n")
    print("| model | file (MB) | max |logit diff| | max |logit| | forward quantised (s) | float32 (s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ("medium", "smollm2"):
        if name in res:
            r = res[name]
            print(f"| {name} | {r['file_bytes'] / 1e6:.0f} | {r['max_abs_diff']:.1e} | {r['max_abs_logit']:.1f} | "
                  f"{r['quantized_s']:.3f} | {r['float_s']:.3f} | {r['quantized_s'] / r['float_s']:.1f}x |")
    print("\n### keep_quantized: peak RSS of load + run_with_cache, then of classify_heads (trace deleted)\n")
    print("RSS figures are added to the interpreter's after importing torch, torch._dynamo, gguf and interp (the 'imports' column).\n")
    print("| case | file (GB) | imports (GB) | load (GB) | trace (GB; of it per-head W_O) | "
          "peak load + cache (GB) | budget 1.3 x file + trace | peak classify (GB) | budget 1.3 x file | "
          "float32 weights (GB) | load / cache / classify (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("smollm2 quantized", "smollm2 float", "8b"):
        if name not in res:
            continue
        r = res[name]
        file_bytes = res[name]["file_bytes"] if name == "8b" else res["smollm2"]["file_bytes"]
        f32 = n_params(LLAMA_8B) * 4 if name == "8b" else res["smollm2 float"]["float_param_bytes"]
        base = r["base"]
        print(f"| {name} | {file_bytes / 1e9:.2f} | {base / 1e9:.2f} | {(r['after_load'] - base) / 1e9:.2f} | "
              f"{r['trace_bytes'] / 1e9:.2f} ({r['head_write_bytes'] / 1e9:.2f}) | "
              f"{(r['peak_rss_cache'] - base) / 1e9:.2f} | {(1.3 * file_bytes + r['trace_bytes']) / 1e9:.2f} | "
              f"{(r['peak_rss'] - base) / 1e9:.2f} | "
              f"{1.3 * file_bytes / 1e9:.2f} | {f32 / 1e9:.2f} | "
              f"{r['load_s']:.0f} / {r['run_with_cache_s']:.1f} / {r['classify_s']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
