"""Peak memory of ``load_checkpoint(path, dtype=torch.bfloat16)`` and ``remove_heads`` on a ~110M-parameter
Llama-shaped model: built in the target dtype through ``placement.build`` (now) against a float32 model built
and then cast (the policy before: emulated by a ``build`` that allocates float32 weights and casts them).

Each variant runs in a fresh interpreter; the figure is the peak RSS the operation adds (rusage, after the
set-up: the bf16 checkpoint written, or the bf16 model built), in MB and over the result's weight bytes. The
two variants' weights and logits are compared bit for bit: the weights are the same; the logits of this rotary
model are not, because casting the float32 model also rounded its rotary frequencies (a non-persistent buffer)
to bf16, where a model built in bf16 keeps them in float32 as transformers does.

Usage:
    python experiments/benchmarks/bench_dtype_policy_memory.py [--layers N] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

# d_model 768, GQA 12 / 4, SwiGLU 2048, 32k vocabulary: 12 layers are 110M parameters.
SHAPE = dict(d_model=768, n_heads=12, n_kv_heads=4, d_mlp=2048, activation="swiglu", d_vocab=32000, n_ctx=512,
             normalization="rms", positional="rotary", causal=True)

CHILD = r"""
import json, resource, sys, torch
import interp.placement, interp.pruning.surgery as surgery, interp.zoo.checkpoint as ckpt
from interp import ModelConfig
from interp.placement import build
from interp.pruning import remove_heads
from interp.zoo import load_checkpoint

cfg = ModelConfig(**json.loads(sys.argv[1])); op, variant, path = sys.argv[2], sys.argv[3], sys.argv[4]
real = interp.placement.build

def float32_then_cast(c, **kw):  # the old policy: a float32 model, initialised, then cast to the target dtype
    dtype = kw.pop("dtype", None)
    if kw.get("device") == "meta" or dtype in (None, torch.float32):
        return real(c, dtype=dtype, **kw)
    kw.pop("meta_weights", None)
    return real(c, dtype=torch.float32, **kw).to(dtype)

if variant == "float32 then cast":
    ckpt.build = surgery.build = float32_then_cast
tokens = torch.arange(1, 33)[None]
if op == "load_checkpoint":
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    m = load_checkpoint(path, dtype=torch.bfloat16)
else:
    model = build(cfg, dtype=torch.bfloat16, seed=0)
    off = torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.bool); off[:, :3] = True  # one K/V group each
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    m = remove_heads(model, off)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
weights = sum(p.numel() * p.element_size() for p in m.parameters())
with torch.no_grad():
    logits = m(tokens)
digest = [float(logits.float().sum()), float(sum(v.float().sum() for v in m.state_dict().values()))]
torch.save({"logits": logits, "state": m.state_dict()}, path + f".{op}.{variant.replace(' ', '_')}.pt")
print(json.dumps({"peak_added": peak - before, "weights": weights, "params": sum(p.numel() for p in m.parameters()),
                  "dtypes": sorted({str(p.dtype) for p in m.parameters()}), "digest": digest}))
"""
VARIANTS = ("placement.build", "float32 then cast")
OPS = ("load_checkpoint", "remove_heads")


def _identical(path: str, op: str) -> dict[str, bool]:
    """Whether both variants hold the same weights (state dict) and give the same logits, bit for bit."""
    import torch

    a, b = (torch.load(f"{path}.{op}.{v.replace(' ', '_')}.pt") for v in VARIANTS)
    weights = a["state"].keys() == b["state"].keys() and all(torch.equal(a["state"][k], b["state"][k])
                                                             for k in a["state"])
    return {"weights": weights, "logits": torch.equal(a["logits"], b["logits"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args(argv)
    cfg = {**SHAPE, "n_layers": a.layers}
    import torch

    from interp import ModelConfig
    from interp.placement import build
    from interp.zoo import save_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = str(save_checkpoint(build(ModelConfig(**cfg), dtype=torch.bfloat16, seed=0), f"{tmp}/m.safetensors"))
        res = {op: {v: json.loads(subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg), op, v, path],
                                                 capture_output=True, text=True, check=True).stdout)
                    for v in VARIANTS} for op in OPS}
        same = {op: _identical(path, op) for op in OPS}
    if a.json:
        print(json.dumps({"results": res, "bit_identical": same}))
        return 0
    n = res["load_checkpoint"]["placement.build"]["params"]
    print(f"### dtype policy: bf16, Llama-shaped, {a.layers} layers, {n / 1e6:.0f}M parameters\n")
    print("| operation | variant | peak RSS added (MB) | / result's weight bytes | same weights | same logits |")
    print("|---|---|---:|---:|---|---|")
    for op in OPS:
        for v in VARIANTS:
            r = res[op][v]
            print(f"| {op} | {v} | {r['peak_added'] / 1e6:.0f} | {r['peak_added'] / r['weights']:.2f} | "
                  f"{'yes' if same[op]['weights'] else 'NO'} | {'yes' if same[op]['logits'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
