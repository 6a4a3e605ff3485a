"""Run the side-by-side benchmarks one after another and print their markdown tables (``interp bench``).

Each benchmark runs in its own interpreter (so one's memory does not colour the next), and compares its
variants inside that one process (interleaved repetitions, medians, warm-up, fixed torch threads).

    forward       bench_forward.py       interp vs plain PyTorch SDPA (same weights); minilm-l6 vs HF BertModel (sdpa)
    recording     bench_recording.py     recording patterns + per-head writes vs not; vs TransformerLens and HF eager
    long_context  bench_long_context.py  peak memory of head scores at 4k/8k/16k tokens, streaming vs materialising
    remove_heads  bench_remove_heads.py  half the heads removed vs the unpruned model (written by the pruning work)
    concurrency   bench_concurrency.py   the per-model lock: one pass with vs without; 8 threads vs one
    smollm2       bench_smollm2.py       SmolLM2-135M (GGUF) vs HF LlamaForCausalLM: forward, recording, greedy decoding
    analysis      bench_analysis.py      classify_heads on UD EWT dev vs one recorded forward pass over the same batches
    distributed   bench_distributed.py   classify_heads over UD EWT dev: 1 process x 2 threads vs 2 x 1 vs 8 x 1 (torchrun)
    moe            bench_moe.py           Mixtral / DeepSeek-V3-shaped forward vs HF; MLA absorbed vs expanded decode; routing stats
    attention_view bench_attention_view.py viz.attention_view of SmolLM2 at 2,000 tokens: build, page size, open/hover in Chromium
    load_memory    bench_load_memory.py   peak memory of loading a 1B-shaped random model in bf16 vs float32-then-cast
    families       bench_families.py      Llama 3, Qwen3, Gemma 2, Pythia (~100M random) vs transformers: forward, recording
    dashboard      bench_dashboard.py     SmolLM2 in the dashboard, driven by Chromium: first and second views, a pruning run
    patching       bench_patching.py      SmolLM2: coreference_scores vs a recorded pass; activation_patching vs the old code, nnsight, TL

Usage:
    python experiments/benchmarks/run_all.py [NAME ...] [--quick] [--out FILE.md]   (NAME: the first column above)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {
    "forward": "bench_forward.py",
    "recording": "bench_recording.py",
    "long_context": "bench_long_context.py",
    "remove_heads": "bench_remove_heads.py",
    "concurrency": "bench_concurrency.py",
    "smollm2": "bench_smollm2.py",
    "analysis": "bench_analysis.py",
    "distributed": "bench_distributed.py",
    "moe": "bench_moe.py",
    "attention_view": "bench_attention_view.py",
    "load_memory": "bench_load_memory.py",
    "families": "bench_families.py",
    "dashboard": "bench_dashboard.py",
    "patching": "bench_patching.py",
}
TAKES_QUICK = {"forward", "recording", "long_context", "concurrency", "smollm2", "analysis", "distributed", "moe",
               "attention_view", "families", "patching"}


def run_one(name: str, quick: bool) -> str:
    script = HERE / SCRIPTS[name]
    if not script.is_file():
        return f"## {name}\n\nskipped: {script.name} does not exist yet"
    cmd = [sys.executable, str(script)] + (["--quick"] if quick and name in TAKES_QUICK else [])
    t0 = time.perf_counter()
    # stderr (progress bars, library warnings) goes straight to the terminal; the tables come on stdout.
    res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=HERE)
    body = res.stdout.strip()
    if res.returncode != 0:
        body += f"\n\n{name} failed with exit status {res.returncode}"
    return body + f"\n\n({name}: {time.perf_counter() - t0:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {', '.join(SCRIPTS)}")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter inputs")
    p.add_argument("--out", type=Path, help="also write the markdown to this file")
    a = p.parse_args(argv)
    unknown = [n for n in a.names if n not in SCRIPTS]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {list(SCRIPTS)}")
    sections = []
    for name in a.names or list(SCRIPTS):
        text = run_one(name, a.quick)
        print(text + "\n", flush=True)
        sections.append(text)
    if a.out:
        a.out.write_text("\n\n".join(sections) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
