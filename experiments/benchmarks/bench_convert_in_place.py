"""Converting a sharded bf16 Hugging Face folder: peak RSS and seconds per GB, and the refusal of configs far
bigger than their weights (issue 37 "Convert straight into place", issue 38 items 2-3).

``write`` makes a random Llama-shaped bf16 folder in safetensors shards, one tensor at a time (never the whole
model in memory): ``--shape mid`` (8 layers of Llama-3.2-1B's width, about 1.2 GB) or ``--shape 8b``
(Llama-3.1-8B: 32 layers, 16 GB). ``measure`` loads it with ``interp.load`` in a fresh interpreter and reports
the child's peak RSS (kernel rusage) against the weights' bytes, the seconds per GB, and optionally a
``run_with_cache`` over a few tokens. ``--code`` points the child at another checkout (the code before the
change) for the "before" figure. ``bombs`` times the refusal of a 10^6-layer Llama folder and a Mixtral folder
declaring 10^6 experts over 4, with the peak memory each adds.

Targets: peak RSS <= 1.1x the weights (+ the trace); a config bigger than its weights refused in < 1 s with
< 200 MB. "cold" processes pay torch's one-time import of ``torch._dynamo`` (the first ``torch.cat`` of meta
tensors in a process triggers it; any first model load pays it too), "warm" ones have it imported.

Usage:
    python experiments/benchmarks/bench_convert_in_place.py write /tmp/llama-mid --shape mid
    python experiments/benchmarks/bench_convert_in_place.py measure /tmp/llama-mid [--trace 16] [--code DIR]
    python experiments/benchmarks/bench_convert_in_place.py bombs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES = {
    # Llama-3.2-1B's width (32 query / 8 K/V heads), 8 layers, untied: about 1.2 GB in bf16.
    "mid": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                num_hidden_layers=8, vocab_size=32000),
    # Llama-3.1-8B's published dimensions: 16.1 GB in bf16.
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
               num_hidden_layers=32, vocab_size=128256),
}


def _tensors(c: dict):
    """(name, shape) of every tensor of a Llama checkpoint of config ``c``, in file order."""
    M, F, H, K, V = (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"],
                     c["vocab_size"])
    D = M // H
    yield "model.embed_tokens.weight", (V, M)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (M,)
        yield p + "self_attn.q_proj.weight", (H * D, M)
        yield p + "self_attn.k_proj.weight", (K * D, M)
        yield p + "self_attn.v_proj.weight", (K * D, M)
        yield p + "self_attn.o_proj.weight", (M, H * D)
        yield p + "post_attention_layernorm.weight", (M,)
        yield p + "mlp.gate_proj.weight", (F, M)
        yield p + "mlp.up_proj.weight", (F, M)
        yield p + "mlp.down_proj.weight", (M, F)
    yield "model.norm.weight", (M,)
    yield "lm_head.weight", (V, M)


def write(folder: Path, shape: str, shard_bytes: int, layers: int | None = None) -> None:
    import torch
    from safetensors.torch import save_file

    c = {**SHAPES[shape], **({"num_hidden_layers": layers} if layers else {})}
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
              "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, **c}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator().manual_seed(0)
    shards: list[dict] = [{}]
    sizes = [0]
    for name, shp in _tensors(c):
        if sizes[-1] >= shard_bytes:
            shards.append({})
            sizes.append(0)
        t = (torch.randn(shp, generator=gen) * 0.02).to(torch.bfloat16) if len(shp) == 2 else \
            (1 + 0.1 * torch.randn(shp, generator=gen)).to(torch.bfloat16)
        shards[-1][name] = t
        sizes[-1] += t.numel() * 2
        if sizes[-1] >= shard_bytes:  # write the shard now: only one shard is ever held
            _flush(folder, shards, len(shards) - 1, save_file)
    _flush(folder, shards, len(shards) - 1, save_file)
    n = len(shards)
    weight_map = {}
    for i, names in enumerate(shards):
        old = folder / f"model-{i + 1:05d}.safetensors"
        new = folder / f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        old.rename(new)
        weight_map.update({k: new.name for k in names})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}))
    print(f"wrote {folder}: {sum(sizes) / 1e9:.2f} GB in {n} shards")


def _flush(folder: Path, shards: list[dict], i: int, save_file) -> None:
    names = shards[i]
    if names and any(v is not None for v in names.values()):
        save_file({k: v for k, v in names.items()}, str(folder / f"model-{i + 1:05d}.safetensors"),
                  metadata={"format": "pt"})
        shards[i] = {k: None for k in names}  # keep the names for the index, drop the tensors


CHILD = r"""
import json, resource, sys, time, torch
torch.set_num_threads(1)
import interp
folder, trace_tokens = sys.argv[1], int(sys.argv[2])
import transformers
transformers.AutoConfig.from_pretrained(folder)  # transformers' config classes imported: an import, not the load
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
before = rss()
start = time.perf_counter()
model = interp.load(folder)
seconds = time.perf_counter() - start
peak_load = rss()
weights = sum(p.numel() * p.element_size() for p in model.parameters())
out = {"weights": weights, "seconds": seconds, "peak_load": peak_load, "before": before,
       "dtype": str(next(model.parameters()).dtype)}
if trace_tokens:
    tokens = torch.randint(3, 1000, (1, trace_tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, trace = model.run_with_cache(tokens)
    out["trace_bytes"] = trace.nbytes()
    out["peak_trace"] = rss()
    out["finite"] = bool(torch.isfinite(logits).all())
print(json.dumps(out))
"""


def measure(folder: Path, trace: int, code: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if code:
        env["PYTHONPATH"] = code
    # cwd elsewhere: ``python -c`` puts the working directory first on sys.path, which would shadow --code.
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(trace)], capture_output=True, text=True,
                          env=env, cwd=tempfile.gettempdir())
    if done.returncode:
        raise SystemExit(done.stderr[-4000:])
    r = json.loads(done.stdout.strip().splitlines()[-1])
    gb = r["weights"] / 1e9
    print(f"weights {gb:.2f} GB ({r['dtype']}), load {r['seconds']:.1f} s = {r['seconds'] / gb:.2f} s/GB; "
          f"peak RSS {r['peak_load'] / 1e9:.2f} GB = {r['peak_load'] / r['weights']:.3f}x the weights "
          f"(imports alone {r['before'] / 1e9:.2f} GB; added {(r['peak_load'] - r['before']) / r['weights']:.3f}x)")
    if trace:
        print(f"run_with_cache over {trace} tokens: trace {r['trace_bytes'] / 1e6:.1f} MB, peak RSS "
              f"{r['peak_trace'] / 1e9:.2f} GB = {r['peak_trace'] / (r['weights'] + r['trace_bytes']):.3f}x "
              f"(weights + trace); logits finite: {r['finite']}")
    return r


BOMBS = r"""
import json, resource, sys, time
import interp
WARM = sys.argv[1] == "warm"
for folder in sys.argv[2:]:
    interp.zoo.hf.read_hf_config(folder)  # transformers' config classes imported: not the refusal's cost
    if WARM:
        import torch._dynamo  # torch imports it on the first torch.cat of meta tensors: once per process
    before = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
    start = time.perf_counter()
    try:
        interp.load(folder)
        message = "LOADED"
    except ValueError as e:
        message = str(e)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"folder": folder, "seconds": seconds, "added_mb": (peak - before) / 2**20,
                      "message": message[:200]}))
"""


def bombs() -> None:
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        folders = []
        for name, cfg, key in (
            ("llama-1e6-layers", transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48,
                                                          num_hidden_layers=2, num_attention_heads=4),
             "num_hidden_layers"),
            ("mixtral-1e6-experts", transformers.MixtralConfig(vocab_size=97, hidden_size=32, intermediate_size=48,
                                                               num_hidden_layers=2, num_attention_heads=4,
                                                               num_key_value_heads=2, num_local_experts=4),
             "num_local_experts")):
            torch.manual_seed(0)
            folder = Path(tmp) / name
            transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
            c = json.loads((folder / "config.json").read_text())
            c[key] = 10**6
            (folder / "config.json").write_text(json.dumps(c))
            folders.append(str(folder))
        print("| folder | process | refused in (s) | peak memory added (MB) | message |\n|---|---|---:|---:|---|")
        for warm in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-c", BOMBS, warm, *folders], capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
            if done.returncode:
                raise SystemExit(done.stderr[-4000:])
            for line in done.stdout.strip().splitlines():
                r = json.loads(line)
                print(f"| {Path(r['folder']).name} | {warm} | {r['seconds']:.3f} | {r['added_mb']:.0f} | "
                      f"{r['message'][:110]} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("folder", type=Path)
    w.add_argument("--shape", choices=sorted(SHAPES), default="mid")
    w.add_argument("--shard-gb", type=float, default=0.5)
    w.add_argument("--layers", type=int, help="fewer layers of the shape (a machine without room for all)")
    m = sub.add_parser("measure")
    m.add_argument("folder", type=Path)
    m.add_argument("--trace", type=int, default=0, help="tokens of a run_with_cache after loading (0: none)")
    m.add_argument("--code", help="PYTHONPATH of another checkout to measure (the code before the change)")
    sub.add_parser("bombs")
    a = p.parse_args(argv)
    if a.cmd == "write":
        write(a.folder, a.shape, int(a.shard_gb * 1e9), a.layers)
    elif a.cmd == "measure":
        measure(a.folder, a.trace, a.code)
    else:
        bombs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
