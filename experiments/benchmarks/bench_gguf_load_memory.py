"""Peak memory of ``load_gguf`` on a random Llama-shaped GGUF file stored in F16 or BF16, loaded as float32,
bfloat16 or float16, against the weights' own bytes in the loaded dtype.

The file (about 140M parameters) is written once with ``gguf.GGUFWriter`` from random numpy arrays. Each load
runs in a fresh interpreter; a thread samples ``/proc/self/status`` every 2 ms, and the figures are the peak
anonymous memory (``RssAnon``: the process's own allocations) and the peak total RSS (anonymous + the
memory-mapped file's pages, which are page cache) above the level after the imports, divided by the loaded
weights' bytes. The floor is 1.0 (the model itself).

Usage:
    python experiments/benchmarks/bench_gguf_load_memory.py [--layers N] [--json] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPE = dict(d_model=768, n_heads=12, n_kv_heads=4, d_mlp=3072, vocab=32000)

CHILD = r"""
import json, sys, threading, time
import torch
from interp.zoo.gguf import load_gguf

def status():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("RssAnon", "VmRSS")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) * 1024
    return out

base = status()
peak = dict(base)
done = False
def sample():
    while not done:
        for k, v in status().items():
            peak[k] = max(peak[k], v)
        time.sleep(0.002)
thread = threading.Thread(target=sample, daemon=True)
thread.start()
t0 = time.perf_counter()
model = load_gguf(sys.argv[1], dtype=getattr(torch, sys.argv[2]), tokenizer=False)
seconds = time.perf_counter() - t0
done = True
thread.join()
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"weights": weights, "seconds": seconds,
                  "anon_added": peak["RssAnon"] - base["RssAnon"], "rss_added": peak["VmRSS"] - base["VmRSS"]}))
"""


def write_file(path: Path, layers: int, stored: str) -> Path:
    """A random llama GGUF of :data:`SHAPE` with ``layers`` blocks, 2-D weights in ``stored`` (f16 / bf16)."""
    import gguf
    import numpy as np

    d, h, k, f, v = (SHAPE[x] for x in ("d_model", "n_heads", "n_kv_heads", "d_mlp", "vocab"))
    dh = d // h
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, layers), (w.add_context_length, 2048), (w.add_embedding_length, d),
                       (w.add_feed_forward_length, f), (w.add_head_count, h), (w.add_head_count_kv, k),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_freq_base, 10000.0), (w.add_vocab_size, v),
                       (w.add_rope_dimension_count, dh)):
        add(value)
    qtype = gguf.GGMLQuantizationType.BF16 if stored == "bf16" else None

    def add(name: str, *shape: int) -> None:
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
        if len(shape) == 1:
            w.add_tensor(name, a + 1)
        elif qtype is None:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    add("token_embd.weight", v, d)
    add("output_norm.weight", d)
    for i in range(layers):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", d)
        add(b + "ffn_norm.weight", d)
        add(b + "attn_q.weight", h * dh, d)
        add(b + "attn_k.weight", k * dh, d)
        add(b + "attn_v.weight", k * dh, d)
        add(b + "attn_output.weight", d, h * dh)
        add(b + "ffn_gate.weight", f, d)
        add(b + "ffn_up.weight", f, d)
        add(b + "ffn_down.weight", d, f)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


CASES = (("f16", "float32"), ("f16", "float16"), ("bf16", "bfloat16"), ("bf16", "float32"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temp folder)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    folder = a.dir or Path(tempfile.mkdtemp())
    files = {}
    for stored in ("f16", "bf16"):
        files[stored] = folder / f"random-{a.layers}l-{stored}.gguf"
        if not files[stored].exists():
            write_file(files[stored], a.layers, stored)
    res = {}
    for stored, dtype in CASES:
        out = subprocess.run([sys.executable, "-c", CHILD, str(files[stored]), dtype], capture_output=True,
                             text=True, check=True)
        res[f"{stored} -> {dtype}"] = json.loads(out.stdout.strip().splitlines()[-1])
    if a.json:
        print(json.dumps(res))
        return 0
    print(f"### load_gguf peak memory, random Llama-shaped GGUF ({a.layers} layers)\n")
    print("| file -> dtype | weights (MB) | peak anon added (MB) | / weights | peak RSS added (MB) | / weights | s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case, r in res.items():
        wb = r["weights"]
        print(f"| {case} | {wb / 1e6:.0f} | {r['anon_added'] / 1e6:.0f} | {r['anon_added'] / wb:.2f} | "
              f"{r['rss_added'] / 1e6:.0f} | {r['rss_added'] / wb:.2f} | {r['seconds']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
