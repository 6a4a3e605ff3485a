"""Before/after a change to generation: bench_smollm2's forward and greedy-decoding rows for an old copy of the
package and this checkout, interleaved in one process (shuffled order every repetition, medians).

The old code is a second copy of the package imported under another name, so both run side by side on the same
weights (both load SmolLM2-135M from the same converted cache):

    git archive <old-commit> interp | tar -x -C /tmp/old && mv /tmp/old/interp /tmp/old/interp_old
    python experiments/benchmarks/bench_generate_ab.py --old /tmp/old [--reps 3] [--new-tokens 32]

Rows: forward 4 x 128 tokens (old / new / HF sdpa), and per batch (1, 8) tokens per second of one ``generate``
call, of ``generate`` inside ``model.decoding(B)`` (the layout built once, on a copy of the model held in the
block), and of HF ``generate`` with the static cache; every output is checked equal to HF's. Needs a checkout.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import warnings

import torch
from benchutil import fix_threads, machine_info, time_interleaved

PROMPT = "The capital of France is Paris. The capital of Germany is"


def run(old_dir: str, reps: int, new_tokens: int, batches: tuple[int, ...] = (1, 8)) -> str:
    threads = fix_threads()
    sys.path.insert(0, old_dir)
    old_pkg = importlib.import_module("interp_old")
    from bench_smollm2 import load_hf

    import interp
    from interp.zoo import smollm2

    new, old = interp.load("smollm2-135m"), old_pkg.load("smollm2-135m")
    hf = load_hf(smollm2.find_gguf())
    hf.set_attn_implementation("sdpa")
    lines = [f"## bench_generate_ab: old package ({old_pkg.__file__}) against this checkout, interleaved "
             f"(torch threads {threads}; shared machine: numbers are noisy)\n", machine_info(), ""]
    ids = torch.randint(0, new.cfg.d_vocab, (4, 128), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(new(ids), old(ids))
        med = time_interleaved({"old": lambda: old(ids), "new": lambda: new(ids), "hf": lambda: hf(ids)},
                               reps=reps, warmup=1)
    print("\n".join(lines), flush=True)
    lines = ["### forward 4 x 128 (ms; ratio to HF sdpa)", "",
              "| old | new | HF sdpa | old / HF | new / HF | new / old |", "|---:|---:|---:|---:|---:|---:|",
              f"| {med['old'] * 1e3:.0f} | {med['new'] * 1e3:.0f} | {med['hf'] * 1e3:.0f} | "
              f"{med['old'] / med['hf']:.3f} | {med['new'] / med['hf']:.3f} | {med['new'] / med['old']:.3f} |", ""]
    print("\n".join(lines), flush=True)
    prompt = new.to_tokens(PROMPT)
    new_held, old_held = copy.deepcopy(new), copy.deepcopy(old)
    lines = [f"### greedy decoding, prompt {prompt.shape[1]} + {new_tokens} new (tokens/s; ratio to HF generate, "
              "static cache; target >= 1.2)", "",
              "| batch | old `generate` | new `generate` | old in `decoding()` | new in `decoding()` | HF | "
              "old / HF | new / HF | old `decoding()` / HF | new `decoding()` / HF | outputs equal |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for batch in batches:
        x = prompt.repeat(batch, 1)
        mask = torch.ones_like(x)
        fns = {
            "old": lambda: old.generate(x, new_tokens),
            "new": lambda: new.generate(x, new_tokens),
            "old_held": lambda: old_held.generate(x, new_tokens),
            "new_held": lambda: new_held.generate(x, new_tokens),
            "hf": lambda: hf.generate(x, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      do_sample=False, cache_implementation="static", pad_token_id=2),
        }
        with torch.inference_mode(), warnings.catch_warnings(), old_held.decoding(batch), new_held.decoding(batch):
            warnings.simplefilter("ignore")
            outs = {k: f().tolist() for k, f in fns.items()}
            same = all(o == outs["hf"] for o in outs.values())
            med = time_interleaved(fns, reps=reps, warmup=0)
        tok = {k: batch * new_tokens / v for k, v in med.items()}
        r = {k: tok[k] / tok["hf"] for k in tok}
        lines.append(f"| {batch} | {tok['old']:.1f} | {tok['new']:.1f} | {tok['old_held']:.1f} | "
                     f"{tok['new_held']:.1f} | {tok['hf']:.1f} | {r['old']:.2f} | {r['new']:.2f} | "
                     f"{r['old_held']:.2f} | {r['new_held']:.2f} | {same} |")
        print("\n".join(lines), flush=True)
        lines = []
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="folder holding the old package as interp_old/")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=32)
    a = p.parse_args(argv)
    run(a.old, a.reps, a.new_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
