"""The dense families against transformers on mid-size random configs (~100M parameters), side by side.

For Llama 3 (llama3 RoPE scaling, GQA), Qwen3 (QK-norm, GQA), Gemma 2 (sandwich norms, soft-caps, alternating
sliding windows, MQA-free GQA), OLMo 3 (QK-norm, output norms, 3:1 sliding / full layers) and Pythia (GPT-NeoX:
parallel block, partial rotary), each a random HF model
converted with ``from_hf`` (same weights), on a 4 x 256-token batch:

1. forward: interp ``model(ids)`` / HF with ``attn_implementation="sdpa"`` (Gemma 2 has no SDPA path in
   transformers: its eager path, the fastest it has). Target <= 1.0.
2. recording every attention pattern and every per-head residual write (``hook_pattern`` + ``hook_result``):
   interp ``run_with_cache`` / HF eager ``output_attentions=True`` (patterns only, which favours HF).
   Target <= 1.0.

Each family's four variants run interleaved, in a new seeded shuffled order every repetition; the tables give
the median and the range of each variant and, for each ratio, the range of the per-repetition ratios (interp
and HF timed in the same repetition), so a loaded machine's noise is visible beside the median, and the same
in process CPU time (which counts less of the time other jobs hold the cores).

Usage:
    python experiments/benchmarks/bench_families.py [--families llama3 qwen3 gemma2 olmo3 pythia] [--batch 4] [--seq 256]
        [--reps 7] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch
from benchutil import fix_threads, load_average, machine_info, paired_ratio, spread_tables, time_reps

RECORD = ["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_result"]
_GATED = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=10, num_attention_heads=12,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)
CONFIGS = {
    "llama3": ("llama", dict(_GATED, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 128})),
    "qwen3": ("qwen3", dict(_GATED, head_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "gemma2": ("gemma2", dict(_GATED, head_dim=64, sliding_window=128, query_pre_attn_scalar=64,
                              attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    # OLMo 3: QK-norm over all heads, output-only sublayer norms, three sliding (window 128) layers to one full.
    "olmo3": ("olmo3", dict(_GATED, sliding_window=128,
                            layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                                         "full_attention"] * 2 + ["sliding_attention", "full_attention"])),
    "pythia": ("gpt_neox", dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=10, num_attention_heads=12,
                                vocab_size=32000, max_position_embeddings=2048,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.25})),
}


def build(name: str, attn: str):
    import transformers

    model_type, kw = CONFIGS[name]
    cfg = transformers.AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def bench(name: str, batch: int, seq: int, reps: int) -> tuple[str, str]:
    from interp.zoo.hf import from_hf

    eager = build(name, "eager")
    try:
        fast, fast_kind = build(name, "sdpa"), "sdpa"
        fast.load_state_dict(eager.state_dict())
    except ValueError:
        fast, fast_kind = eager, "eager (no SDPA path in transformers)"
    ours = from_hf(eager)
    n_params = sum(p.numel() for p in eager.parameters()) / 1e6
    ids = torch.randint(0, ours.cfg.d_vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        diff = float((ours(ids) - fast(ids).logits).abs().max())
        fwd_name, hf_name = "interp forward", f"HF {fast_kind} forward"
        rec_name, hf_rec_name = ("interp run_with_cache (patterns + per-head writes)",
                                 "HF eager output_attentions (patterns only)")
        cpu: dict[str, list[float]] = {}
        times = time_reps({
            fwd_name: lambda: ours(ids),
            hf_name: lambda: fast(ids),
            rec_name: lambda: ours.run_with_cache(ids, names_filter=RECORD),
            hf_rec_name: lambda: eager(ids, output_attentions=True),
        }, reps=reps, warmup=1, cpu=cpu)
    text = (f"#### {name} ({CONFIGS[name][0]}, {n_params:.0f}M parameters, {ours.cfg.n_layers} layers, "
            f"{ours.cfg.n_heads} heads / {ours.cfg.n_kv_heads} K/V; batch {batch} x {seq}; {reps} repetitions; "
            f"max |logit diff| vs HF {diff:.1e})\n\n"
            + spread_tables(times, [(fwd_name, hf_name, "<= 1.0"), (rec_name, hf_rec_name, "<= 1.0")], cpu) + "\n")
    cells = []
    for ours_name, base in ((fwd_name, hf_name), (rec_name, hf_rec_name)):
        med, lo, hi = paired_ratio(times[ours_name], times[base])
        cpu_med = paired_ratio(cpu[ours_name], cpu[base])[0]
        cells.append(f"{med:.3f} | {lo:.3f}-{hi:.3f} | {cpu_med:.3f}")
    return text, f"| {name} | {' | '.join(cells)} |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="3 repetitions, 2 x 128 tokens")
    a = p.parse_args(argv)
    if a.quick:
        a.reps, a.batch, a.seq = 3, 2, 128
    threads = fix_threads()
    print(f"## families: interp vs transformers on ~100M random configs\n\n{machine_info()} | torch threads "
          f"{threads}\n")
    summary = ["| family | forward / HF sdpa | per-repetition | CPU time | recording / HF eager output_attentions | "
               "per-repetition | CPU time |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in a.families:
        text, row = bench(name, a.batch, a.seq, a.reps)
        print(text)
        summary.append(row)
        sys.stdout.flush()
    print("\n".join(summary))
    print(f"\n(load average at the end: {load_average()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
