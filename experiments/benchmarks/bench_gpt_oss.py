"""Native gpt-oss against transformers, side by side in one process.

A ~100M-parameter random gpt-oss (6 layers: sinks with large logits, alternating 128-token banded and full
layers, YaRN, 8 experts top-2 with biases and the clamped SwiGLU; every parameter re-drawn), batch 4 x 256 tokens:

* HF eager (transformers has no SDPA path for gpt-oss's sinks) -- the baseline of the forward;
* interp with nothing recorded (the fused path: SDPA with the sink as one more key);
* HF eager with ``output_attentions=True`` (every pattern; a row's missing mass is the sink's) -- the baseline
  of recording;
* interp recording every pattern and sink mass, and every pattern + per-head write.

Targets (issue 34): forward / HF <= 1.0; recording every pattern + per-head write / HF eager output_attentions
<= 1.0 (and pattern + sink mass, the same information as HF's output, against the same baseline).
Each repetition runs all five once, in a new seeded shuffled order; the tables give medians, ranges and the
per-repetition range of each ratio (both variants timed in the same repetition), in wall-clock and in
process CPU time (which counts less of the time other jobs hold the cores on a shared machine).

Usage:
    python experiments/benchmarks/bench_gpt_oss.py [--batch 4] [--seq 256] [--reps 11] [--layers 6]
        [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import torch
from benchutil import fix_threads, hf_side_by_side_args, load_average, machine_info, spread_tables, time_reps


def build(layers: int, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The HF eager model and its interp conversion (the same random weights)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    from interp.zoo.hf import from_hf

    cfg = GptOssConfig(vocab_size=8192, hidden_size=768, intermediate_size=768, num_hidden_layers=layers,
                       num_attention_heads=12, num_key_value_heads=4, head_dim=64, num_local_experts=8,
                       num_experts_per_tok=2, sliding_window=128, max_position_embeddings=4096, bos_token_id=0,
                       eos_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = GptOssForCausalLM(cfg)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0, 3.0)
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.02)
    hf = hf.to(device).eval()
    return hf, from_hf(hf)


def main() -> None:
    args = hf_side_by_side_args(__doc__.splitlines()[0], layers=6, reps=11)
    threads = fix_threads()
    hf, model = build(args.layers, args.device)
    n_params = sum(p.numel() for p in hf.parameters())
    tokens = torch.randint(1, 8192, (args.batch, args.seq), device=args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    record = ["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_sink_mass"]

    def timed(fn):
        def run():
            fn()
            sync()
        return run

    with torch.inference_mode():
        ref = hf(tokens, output_attentions=True)
        logits, trace = model.run_with_cache(tokens, names_filter=record)
        diff = float((model(tokens) - ref.logits).abs().max())
        pattern_diff = max(float((trace.pattern(i) - a).abs().max()) for i, a in enumerate(ref.attentions))
        sink_diff = max(float((trace.sink_mass(i) - (1 - a.sum(-1))).abs().max()) for i, a in enumerate(ref.attentions))
        sink = torch.stack([trace.sink_mass(i).mean() for i in range(args.layers)])
        del ref, logits, trace
        cpu: dict[str, list[float]] = {}
        times = time_reps({
            HF: timed(lambda: hf(tokens)),
            FWD: timed(lambda: model(tokens)),
            HF_REC: timed(lambda: hf(tokens, output_attentions=True)),
            SINK: timed(lambda: model.run_with_cache(tokens, names_filter=record)),
            WRITE: timed(lambda: model.run_with_cache(
                tokens, names_filter=["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_result"])),
        }, reps=args.reps, warmup=1, cpu=cpu)
    print(f"## native gpt-oss vs transformers ({machine_info()}, {threads} threads, {args.device})\n")
    print(f"random gpt-oss, {args.layers} layers, d_model 768, 12 heads / 4 K/V, 8 experts top-2, window 128; "
          f"{n_params / 1e6:.0f}M parameters; batch {args.batch} x {args.seq} tokens; {args.reps} repetitions; "
          f"max |logit diff| = {diff:.1e}, max |pattern - HF eager| = {pattern_diff:.1e}, max |sink mass - (1 - HF "
          f"eager row sum)| = {sink_diff:.1e}, mean sink mass {float(sink.mean()):.2f}\n")
    print(spread_tables(times, [(FWD, HF, "<= 1.0"), (WRITE, HF_REC, "<= 1.0"), (SINK, HF_REC, "<= 1.0")], cpu))
    print(f"\n(load average at the end: {load_average()})")


HF, FWD = "HF eager", "interp, nothing recorded (SDPA + sink key)"
HF_REC = "HF eager, output_attentions=True"
SINK, WRITE = "interp, every pattern + sink mass", "interp, every pattern + per-head write"


if __name__ == "__main__":
    main()
