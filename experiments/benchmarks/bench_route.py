"""The attention-level route (interp.zoo.hf_route) against transformers, side by side in one process.

A ~100M-parameter random OLMo (a family with no native converter: it runs on the route), batch 4 x 256 tokens:

* HF eager with ``output_attentions=True`` (every pattern) -- the baseline;
* the route recording every pattern (``run_with_cache(names_filter="*hook_pattern")``), and every pattern plus
  every per-head write (``hook_result``);
* HF sdpa and the route with nothing hooked (the route then calls transformers' sdpa itself).

Target (issue 34): route recording / HF eager output_attentions <= 1.1. Each repetition runs all five once, in a
new seeded shuffled order; the tables give medians, ranges and the per-repetition range of each ratio, in wall-clock and process CPU time.

Usage:
    python experiments/benchmarks/bench_route.py [--batch 4] [--seq 256] [--reps 11] [--device cpu|cuda]
        [--layers 10] [--quick]
"""

from __future__ import annotations

import copy
import warnings

import torch
from benchutil import fix_threads, hf_side_by_side_args, load_average, machine_info, spread_tables, time_reps


def build(layers: int, device: str) -> tuple[torch.nn.Module, torch.nn.Module, object]:
    """HF eager model, HF sdpa model, route model: the same random weights (every parameter re-drawn)."""
    from transformers import OlmoConfig, OlmoForCausalLM

    from interp.zoo import hf_route

    cfg = OlmoConfig(vocab_size=8192, hidden_size=768, intermediate_size=3072, num_hidden_layers=layers,
                     num_attention_heads=12, max_position_embeddings=1024, bos_token_id=0, eos_token_id=0,
                     pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    sdpa = OlmoForCausalLM(cfg)
    with torch.no_grad():
        for p in sdpa.parameters():
            p.normal_(0, 0.02)
    sdpa = sdpa.to(device).eval()
    eager = copy.deepcopy(sdpa)
    eager.set_attn_implementation("eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        route = hf_route.wrap(copy.deepcopy(sdpa))
    return eager, sdpa, route


def main() -> None:
    args = hf_side_by_side_args(__doc__.splitlines()[0], layers=10, reps=11)
    threads = fix_threads()
    eager, sdpa, route = build(args.layers, args.device)
    n_params = sum(p.numel() for p in sdpa.parameters())
    tokens = torch.randint(1, 8192, (args.batch, args.seq), device=args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def timed(fn):
        def run():
            fn()
            sync()
        return run

    with torch.inference_mode():
        _, trace = route.run_with_cache(tokens, names_filter="*hook_pattern")
        ref = eager(tokens, output_attentions=True)
        diff = max(float((trace.pattern(i) - a).abs().max()) for i, a in enumerate(ref.attentions))
        del ref, trace
        cpu: dict[str, list[float]] = {}
        times = time_reps({
            HF_REC: timed(lambda: eager(tokens, output_attentions=True)),
            PATTERN: timed(lambda: route.run_with_cache(tokens, names_filter="*hook_pattern")),
            WRITE: timed(lambda: route.run_with_cache(
                tokens, names_filter=["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_result"])),
            SDPA: timed(lambda: sdpa(tokens)),
            BARE: timed(lambda: route(tokens)),
        }, reps=args.reps, warmup=1, cpu=cpu)
    print(f"## the attention-level route vs transformers ({machine_info()}, {threads} threads, {args.device})\n")
    print(f"random OLMo, {args.layers} layers, d_model 768, 12 heads, {n_params / 1e6:.0f}M parameters; "
          f"batch {args.batch} x {args.seq} tokens; {args.reps} repetitions; max |pattern - HF eager| = {diff:.1e}\n")
    print(spread_tables(times, [(PATTERN, HF_REC, "<= 1.1"), (WRITE, HF_REC, "<= 1.1"), (BARE, SDPA, "")], cpu))
    print(f"\n(load average at the end: {load_average()})")


HF_REC, SDPA = "HF eager, output_attentions=True", "HF sdpa, nothing recorded"
PATTERN, WRITE = "route, every pattern recorded", "route, every pattern + per-head write recorded"
BARE = "route, nothing hooked"


if __name__ == "__main__":
    main()
