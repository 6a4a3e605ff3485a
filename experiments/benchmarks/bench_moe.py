"""Mixture-of-experts and DeepSeek MLA, side by side in one process, on mid-size random configs.

0. Mixtral-shaped forward: interp (no hooks) vs transformers' ``MixtralForCausalLM`` (sdpa) on the same
   weights. Target: ratio <= 1.0.
1. DeepSeek-V3-shaped forward (MLA with a query latent, sigmoid router with 4 groups, shared expert, a dense
   first layer): interp vs ``DeepseekV3ForCausalLM`` (sdpa). Target: ratio <= 1.0.
2. MLA greedy decoding tokens/s, the absorbed path (W_UK / W_UV folded, attention over the cached latent) vs
   the expanded path (K and V re-expanded from the latent every step). Reported.
3. MoE forward with expert statistics recorded (:class:`interp.analysis.experts.RoutingStats` through
   ``interp.streaming.stream``) vs the plain forward. Target: ratio <= 1.2.
4. The experts without gradients: one grouped GEMM per projection (``F.grouped_mm``, no host sync) vs one
   expert at a time (the path with gradients, which reads the expert counts on the host), Mixtral-shaped
   forward at batch x seq tokens and at 1 token. Target on CPU: ratio <= 1.0 (not slower).

Usage:
    python experiments/benchmarks/bench_moe.py [--batch 4] [--seq 128] [--reps 7] [--quick] [--parts 0,1,2,3,4]
"""

from __future__ import annotations

import argparse
import sys

import torch
from benchutil import fix_threads, machine_info, ratio_table, time_interleaved

VOCAB = 4096


def _hf(kind: str):
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                  max_position_embeddings=2048)
    if kind == "mixtral":
        cfg = tf.MixtralConfig(**common, intermediate_size=1024, num_key_value_heads=2, num_local_experts=8,
                               num_experts_per_tok=2)
    else:
        cfg = tf.DeepseekV3Config(**common, num_key_value_heads=8, intermediate_size=1024, moe_intermediate_size=256,
                                  n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                                  n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=192, kv_lora_rank=128,
                                  qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__.endswith("Router"):
                torch.nn.init.normal_(mod.weight, std=0.3)  # a decisive router, routing varies by token
    return model


def bench_vs_hf(kind: str, batch: int, seq: int, reps: int) -> str:
    from interp.zoo.hf import from_hf

    hf = _hf(kind)
    ours = from_hf(hf)
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        diff = (ours(tokens) - hf(tokens).logits).abs().max().item()
        med = time_interleaved({"HF (sdpa)": lambda: hf(tokens), "interp (no hooks)": lambda: ours(tokens)},
                               reps=reps)
    c = ours.cfg
    shape = (f"{c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads, {c.n_experts} experts top-"
             f"{c.n_experts_per_token}, d_expert {c.d_expert}")
    title = "Mixtral" if kind == "mixtral" else "DeepSeek-V3"
    return (f"### {0 if kind == 'mixtral' else 1}. {title}-shaped forward vs transformers ({shape}; batch {batch} x "
            f"{seq} tokens)\n\nmax |logit diff| = {diff:.2e}\n\n"
            + ratio_table(med, "HF (sdpa)", targets={"interp (no hooks)": "<= 1.0"}))


def bench_mla_decode(prompt_len: int, new: int, reps: int) -> str:
    from interp.zoo.hf import from_hf

    model = from_hf(_hf("deepseek_v3"))
    prompt = torch.randint(0, VOCAB, (1, prompt_len), generator=torch.Generator().manual_seed(2))

    def run(path: str):
        def go():
            for block in model.blocks:
                block.attn.decode_path = path
            return model.generate(prompt, new)
        return go

    with torch.inference_mode():
        same = torch.equal(run("absorbed")(), run("expanded")())
        med = time_interleaved({"expanded": run("expanded"), "absorbed": run("absorbed")}, reps=reps, warmup=1)
    rows = ["| path | median s | tokens/s | ratio vs expanded (tokens/s) |", "|---|---:|---:|---:|"]
    for name, t in med.items():
        rows.append(f"| {name} | {t:.3f} | {new / t:.1f} | {med['expanded'] / t:.3f} |")
    return (f"### 2. MLA greedy decoding, absorbed vs expanded path (DeepSeek-V3-shaped model above; prompt "
            f"{prompt_len} tokens + {new} new, batch 1; prefill included in the time)\n\nsame tokens: {same}\n\n"
            + "\n".join(rows))


def bench_stats(batch: int, seq: int, reps: int) -> str:
    from interp.analysis.experts import RoutingStats
    from interp.streaming import stream
    from interp.zoo.hf import from_hf

    model = from_hf(_hf("mixtral"))
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(3))
    stats = RoutingStats(model)

    def with_stats():
        stream(model, tokens, [stats], batch_size=batch)

    with torch.inference_mode():
        med = time_interleaved({"forward": lambda: model(tokens), "forward + RoutingStats": with_stats}, reps=reps)
    share = stats.result().share
    return (f"### 3. MoE forward with expert statistics recorded vs without (Mixtral-shaped model; batch {batch} x "
            f"{seq} tokens)\n\nlargest token share of an expert: {float(share.max()):.3f} (uniform "
            f"{1 / share.shape[1]:.3f})\n\n"
            + ratio_table(med, "forward", targets={"forward + RoutingStats": "<= 1.2"}))


def bench_grouped(batch: int, seq: int, reps: int) -> str:
    import interp.moe
    from interp.zoo.hf import from_hf

    model = from_hf(_hf("mixtral"))
    fits = interp.moe._grouped_mm_fits
    if not fits(torch.zeros(1, 512), torch.zeros(8, 1024, 512)):
        return "### 4. Experts: grouped GEMM vs one by one\n\nskipped: grouped_mm does not run here (torch < 2.10?)"

    def forward(tokens: torch.Tensor, grouped: bool):
        def go():
            interp.moe._grouped_mm_fits = fits if grouped else (lambda *a: False)
            try:
                return model(tokens)
            finally:
                interp.moe._grouped_mm_fits = fits
        return go

    gen = torch.Generator().manual_seed(4)
    parts = []
    for b, t in ((batch, seq), (1, 1)):
        tokens = torch.randint(0, VOCAB, (b, t), generator=gen)
        with torch.inference_mode():
            diff = (forward(tokens, True)() - forward(tokens, False)()).abs().max().item()
            med = time_interleaved({"one by one": forward(tokens, False), "grouped GEMM": forward(tokens, True)},
                                   reps=reps if t > 1 else 10 * reps)
        parts.append(f"batch {b} x {t} tokens; max |logit diff| = {diff:.2e}\n\n"
                     + ratio_table(med, "one by one", targets={"grouped GEMM": "<= 1.0"}))
    return "### 4. Experts without gradients: grouped GEMM vs one by one (Mixtral-shaped model)\n\n" + "\n\n".join(parts)


PARTS = (0, 1, 2, 3, 4)


def run(quick: bool = False, batch: int = 4, seq: int = 128, reps: int | None = None,
        parts_wanted: tuple[int, ...] = PARTS) -> str:
    reps = reps or (3 if quick else 7)
    threads = fix_threads()
    parts = [f"## bench_moe (torch threads {threads})\n\n{machine_info()}"]
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        return parts[0] + f"\n\nskipped: {e}"
    benches = {0: lambda: bench_vs_hf("mixtral", batch, seq, reps), 1: lambda: bench_vs_hf("deepseek_v3", batch, seq, reps),
               2: lambda: bench_mla_decode(64 if quick else 256, 16 if quick else 32, max(2, reps // 2)),
               3: lambda: bench_stats(batch, seq, reps), 4: lambda: bench_grouped(batch, seq, reps)}
    parts += [benches[i]() for i in parts_wanted]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--parts", default=",".join(map(str, PARTS)), help="which sections to run, e.g. 0,4")
    a = p.parse_args(argv)
    print(run(a.quick, a.batch, a.seq, a.reps, tuple(int(i) for i in a.parts.split(","))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
