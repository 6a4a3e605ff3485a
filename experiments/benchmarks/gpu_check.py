"""One GPU check: correctness tests, speed against transformers, and an 8B-shaped model in bf16, in one table.

Run on a machine with one CUDA GPU (an H200-class GPU finishes in under 8 minutes)::

    python experiments/benchmarks/gpu_check.py --out gpu_check.json

Steps (each one's figures go in the table and the JSON; a failed correctness check makes the exit status 1):

1. ``pytest -m cuda``: forward, recording and decoding vs HF on CUDA, classify_heads CUDA vs CPU, reducers' state
   on the device, the layer split vs one device.
2. SmolLM2-135M on CUDA (the GGUF's real weights when ``interp.load("smollm2-135m")`` finds them in the cache,
   else a random model of SmolLM2's exact shape, converted from transformers): forward / HF sdpa (target
   <= 1.0) and recording every pattern + per-head write / HF eager ``output_attentions`` (target <= 1.0), float32
   with TF32 off, logits checked within 1e-4.
3. Greedy decoding tokens/s, interp ``generate`` / HF ``generate`` (static cache), batch 1 and 32 (target >= 1.2),
   outputs checked equal. Neither side uses CUDA graphs or ``torch.compile`` (transformers' own automatic
   compilation of a static-cache step on CUDA is turned off with ``disable_compile=True``).
4. A random Llama-3-8B-shaped model in bf16 (no download; both sides from the same random weights): forward /
   HF sdpa on 4 x 2048 tokens, recording every pattern of 4 x 2048 tokens (peak
   ``torch.cuda.max_memory_allocated``), streaming per-head scores over 32k tokens by query chunks (no
   ``[T, T]`` pattern; peak memory), and classify_heads' induction part in tokens/s.
5. A DeepSeek-V3-shaped MLA stack (4 layers): absorbed vs expanded decode, when the model zoo has MLA converters.
6. Edge attribution on the SmolLM2-shaped model (4 x 128 tokens): EAP / one forward (target <= 4) and EAP-IG with
   5 points in one batched pass / one forward (target <= 7), beside the forward + backward floor; EAP's peak memory.

``--quick`` shrinks every shape (for a smoke run; ``--device cpu`` runs the same code on the CPU).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

RECORD = ["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_result"]
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                 rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
QUICK = {"smollm2": dict(num_hidden_layers=4, vocab_size=4096), "llama8b": dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
    vocab_size=4096)}


class Report:
    """Rows of (check, figure, target, ok) and a JSON record; ``failed`` is set by a failed correctness check."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.data: dict[str, object] = {}
        self.failed: list[str] = []

    def add(self, check: str, figure: object, target: str = "", ok: bool | None = None, *,
            correctness: bool = False) -> None:
        verdict = "" if ok is None else ("ok" if ok else "MISS")
        if ok is False and correctness:
            verdict = "FAIL"
            self.failed.append(check)
        text = f"{figure:.3g}" if isinstance(figure, float) else str(figure)
        self.rows.append((check, text, target, verdict))
        self.data[check] = figure

    def table(self) -> str:
        lines = ["| check | figure | target | |", "|---|---:|---|---|"]
        lines += [f"| {c} | {f} | {t} | {v} |" for c, f, t, v in self.rows]
        return "\n".join(lines)


def timed(fn, device: torch.device, reps: int, warmup: int = 1) -> float:
    """Median seconds of ``fn`` with the device synchronised around every call."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def interleaved(fns: dict, device: torch.device, reps: int) -> dict[str, float]:
    """Median seconds of each function, the variants alternating within every repetition."""
    for fn in fns.values():
        fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            out[k].append(timed(fn, device, 1, warmup=0))
    return {k: sorted(v)[len(v) // 2] for k, v in out.items()}


def peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def hf_pair(shape: dict, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A transformers LlamaForCausalLM of ``shape`` with random weights and interp's conversion of it."""
    import transformers

    from interp.zoo.hf import from_hf

    cfg = transformers.LlamaConfig(**shape, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        hf = transformers.LlamaForCausalLM._from_config(cfg, dtype=dtype).eval()
    with torch.no_grad():  # wider than HF's 0.02 init, so greedy decoding does not repeat one token
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.06)
    return hf, from_hf(hf)


def step_tests(rep: Report) -> None:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
                          "tests/gpu"], cwd=ROOT, capture_output=True, text=True)
    tail = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-300:]
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", tail)) else 0
    failed = int(m.group(1)) if (m := re.search(r"(\d+) (?:failed|error)", tail)) else 0
    rep.add("pytest -m cuda", f"{passed} passed, {failed} failed ({time.perf_counter() - t0:.0f} s)",
            "all pass", res.returncode == 0, correctness=True)
    if res.returncode != 0:
        print(res.stdout[-4000:], file=sys.stderr)


def smollm2_pair(device: torch.device, quick: bool):
    """SmolLM2-135M's real weights (GGUF through interp and through transformers) when cached, else its shape."""
    if not quick:
        try:
            import interp
            from interp.zoo import smollm2

            ours = interp.load("smollm2-135m", device=device)
            from bench_smollm2 import load_hf

            hf = load_hf(Path(smollm2.gguf_path())).to(device)
            return hf, ours, "SmolLM2-135M (GGUF weights)"
        except Exception as e:  # noqa: BLE001 - no cached weights: fall back to the shape, and say so
            print(f"SmolLM2 weights not available ({type(e).__name__}: {str(e)[:120]}); using its shape with "
                  "random weights", file=sys.stderr)
    shape = {**SMOLLM2, **(QUICK["smollm2"] if quick else {})}
    hf, ours = hf_pair(shape, device, torch.float32)
    return hf, ours, "SmolLM2-135M-shaped (random weights)"


def step_smollm2(rep: Report, device: torch.device, quick: bool, reps: int) -> None:
    hf, ours, label = smollm2_pair(device, quick)
    rep.data["smollm2 weights"] = label
    B, T = 4, 128
    ids = torch.randint(0, ours.cfg.d_vocab, (B, T), device=device, generator=torch.Generator().manual_seed(0)
                        if device.type == "cpu" else None)
    with torch.inference_mode():
        hf.set_attn_implementation("sdpa")
        diff = (ours(ids) - hf(ids).logits).abs().max().item()
        rep.add(f"{label}: max |logit diff| vs HF", diff, "<= 1e-4", diff <= 1e-4, correctness=True)
        med = interleaved({"hf": lambda: hf(ids), "ours": lambda: ours(ids)}, device, reps)
        rep.add("SmolLM2 forward / HF sdpa (4 x 128)", med["ours"] / med["hf"], "<= 1.0", med["ours"] <= med["hf"])
        hf.set_attn_implementation("eager")
        _, trace = ours.run_with_cache(ids, names_filter=RECORD)
        att = hf(ids, output_attentions=True).attentions
        # Layer 0 sees the same inputs on both sides: its patterns test the attention itself. Deeper layers see
        # residual streams that differ by float32 rounding of earlier layers (as the logits do), so all layers
        # are held to the logits' tolerance, beside transformers' own eager-vs-SDPA difference for scale.
        per_layer = [(trace.pattern(i) - a).abs().max().item() for i, a in enumerate(att)]
        rep.add("SmolLM2 patterns, layer 0: max |diff| vs HF eager", per_layer[0], "<= 1e-5", per_layer[0] <= 1e-5,
                correctness=True)
        pd = max(per_layer)
        rep.add(f"SmolLM2 patterns, all {len(per_layer)} layers: max |diff| vs HF eager", pd, "<= 1e-4", pd <= 1e-4,
                correctness=True)
        eager_logits = hf(ids).logits
        hf.set_attn_implementation("sdpa")
        hf_floor = (hf(ids).logits - eager_logits).abs().max().item()
        rep.add("HF eager vs HF sdpa: max |logit diff| (rounding floor, for scale)", hf_floor, "reported")
        hf.set_attn_implementation("eager")
        med = interleaved({"hf": lambda: hf(ids, output_attentions=True),
                           "ours": lambda: ours.run_with_cache(ids, names_filter=RECORD)}, device, reps)
        rep.add("SmolLM2 recording (patterns + per-head writes) / HF eager", med["ours"] / med["hf"], "<= 1.0",
                med["ours"] <= med["hf"])


def step_decode(rep: Report, device: torch.device, quick: bool, reps: int) -> None:
    """Step 3: greedy decoding, interp against transformers' uncompiled static-cache decode, batch 1 and 32."""
    hf, ours, _ = smollm2_pair(device, quick)
    hf.set_attn_implementation("sdpa")
    with torch.inference_mode():
        new = 8 if quick else 64
        prompt = torch.randint(3, ours.cfg.d_vocab, (1, 16), device=device)
        for batch in (1, 32):
            ids_b = prompt.repeat(batch, 1)
            mask = torch.ones_like(ids_b)

            def hf_gen(ids_b=ids_b, mask=mask):
                # disable_compile: on CUDA, transformers otherwise compiles a static-cache decode step by itself
                # (inductor with CUDA graphs); interp's side is not compiled either.
                return hf.generate(ids_b, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                   do_sample=False, cache_implementation="static", pad_token_id=0,
                                   disable_compile=True)

            def ours_gen(ids_b=ids_b):
                return ours.generate(ids_b, new)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                same = torch.equal(hf_gen(), ours_gen())
                med = interleaved({"hf": hf_gen, "ours": ours_gen}, device, max(2, reps // 2))
            rep.add(f"SmolLM2 greedy {new} tokens, batch {batch}: equal to HF", same, "True", same,
                    correctness=True)
            rep.add(f"SmolLM2 decoding tokens/s / HF static cache, batch {batch}", med["hf"] / med["ours"],
                    ">= 1.2", med["hf"] / med["ours"] >= 1.2)
            rep.data[f"decode tokens/s batch {batch}"] = {"interp": batch * new / med["ours"],
                                                          "hf": batch * new / med["hf"]}


def step_llama8b(rep: Report, device: torch.device, quick: bool, reps: int) -> None:
    from bench_long_context import LongContextScores

    import interp
    from interp.streaming import stream

    shape = {**LLAMA3_8B, **(QUICK["llama8b"] if quick else {})}
    dtype = torch.bfloat16
    reset_peak(device)
    hf, ours = hf_pair(shape, device, dtype, seed=1)
    weights = sum(p.numel() * p.element_size() for p in ours.parameters())
    rep.add("8B-shaped bf16: interp weights (GB)", weights / 1e9)
    B, T = (2, 64) if quick else (4, 2048)
    ids = torch.randint(0, shape["vocab_size"], (B, T), device=device)
    with torch.inference_mode():
        a, b = ours(ids).argmax(-1), hf(ids).logits.argmax(-1)  # [B, T] each
        # Random weights give near-flat logits, where any two bf16 summation orders disagree on some argmaxes: the
        # test is which side stays closer to the float32 model (HF's own weights cast up exactly, then back).
        hf.float()
        ref = hf(ids).logits.argmax(-1)  # [B, T]
        hf.to(dtype)
        agree, ours_ref, hf_ref = ((x == y).float().mean().item() for x, y in ((a, b), (a, ref), (b, ref)))
        rep.add("8B-shaped bf16: top-1 agreement with HF bf16", agree, "reported")
        rep.add("8B-shaped bf16: top-1 agreement with float32, interp / HF", f"{ours_ref:.3f} / {hf_ref:.3f}",
                ">= HF's - 0.02", ours_ref >= hf_ref - 0.02, correctness=True)
        rep.data["8B-shaped bf16: top-1 agreement with float32"] = {"interp": ours_ref, "hf": hf_ref}
        del a, b, ref
        med = interleaved({"hf": lambda: hf(ids), "ours": lambda: ours(ids)}, device, reps)
        rep.add(f"8B-shaped bf16 forward / HF sdpa ({B} x {T})", med["ours"] / med["hf"], "<= 1.0",
                med["ours"] <= med["hf"])
        hf = None  # free its 16 GB before the memory measurements
        reset_peak(device)
        t0 = time.perf_counter()
        # Patterns come out of the float32 softmax; stored in the model's bf16 (4 x 2048 tokens: 34 GB, not 69).
        _, trace = ours.run_with_cache(ids, names_filter="blocks.*.attn.hook_pattern", dtype=dtype)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rep.add(f"8B-shaped: record every pattern of {B} x {T} (s)", time.perf_counter() - t0)
        rep.add("8B-shaped: recording peak memory (GB)", peak(device) / 1e9,
                f"patterns alone {trace.nbytes() / 1e9:.1f} GB")
        del trace
        T_long = 1024 if quick else 32768
        half = T_long // 2
        r = torch.randint(0, shape["vocab_size"], (1, half), device=device)
        long_ids = torch.cat([r, r], dim=1)  # [1, T_long]: the second half repeats the first (induction)
        reset_peak(device)
        ours.set_query_chunk(256 if quick else 1024)
        scores = LongContextScores(ours.cfg.n_layers, ours.cfg.n_heads, half)
        t0 = time.perf_counter()
        stream(ours, long_ids, [scores], batch_size=1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ours.set_query_chunk(None)
        dense = ours.cfg.n_heads * T_long * T_long * 2
        rep.add(f"8B-shaped: streamed head scores over {T_long} tokens (s)", time.perf_counter() - t0)
        rep.add(f"8B-shaped: streaming peak memory at {T_long} tokens (GB)", peak(device) / 1e9,
                f"one layer's [H, T, T] pattern alone: {dense / 1e9:.0f} GB")
        t0 = time.perf_counter()
        n_seqs, half_len = (4, 32) if quick else (64, 256)
        interp.analysis.induction_scores(ours, n_seqs=n_seqs, half_len=half_len, copying=False, batch_size=16)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rep.add("8B-shaped: induction scores, tokens/s", n_seqs * 2 * half_len / (time.perf_counter() - t0))


def step_mla(rep: Report, device: torch.device, quick: bool) -> None:
    """Absorbed vs expanded MLA decode on a DeepSeek-V3-shaped stack, when the zoo converts DeepSeek-V3."""
    try:
        import transformers

        from interp.zoo.hf import CONVERTERS, from_hf
    except ImportError as e:
        rep.add("MLA absorbed vs expanded", f"skipped: {e}")
        return
    if "deepseek_v3" not in CONVERTERS:
        rep.add("MLA absorbed vs expanded", "skipped: no deepseek_v3 converter in this build")
        return
    dims = dict(vocab_size=4096, hidden_size=7168, intermediate_size=2048, moe_intermediate_size=256,
                num_hidden_layers=4, num_attention_heads=128, num_key_value_heads=128, n_routed_experts=8,
                num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
                q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                max_position_embeddings=4096)
    if quick:
        dims.update(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**dims)).eval()
    ours = from_hf(hf)

    def decode(path: str) -> None:
        for block in ours.blocks:  # the MLA attention's switch between its two single-token decode paths
            block.attn.decode_path = path

    prompt = torch.randint(0, dims["vocab_size"], (1, 16), device=device)
    new = 8 if quick else 64
    out = {}
    with torch.inference_mode():
        for mode in ("expanded", "absorbed"):
            decode(mode)
            out[mode] = ours.generate(prompt, new)
            out[mode + "_s"] = timed(lambda: ours.generate(prompt, new), device, 3)
    same = torch.equal(out["expanded"], out["absorbed"])
    rep.add("MLA absorbed == expanded greedy tokens", same, "True", same, correctness=True)
    rep.add("MLA decode tokens/s, absorbed / expanded", out["expanded_s"] / out["absorbed_s"], "reported")


def step_circuits(rep: Report, device: torch.device, quick: bool, reps: int, m: int = 5, batch: int = 4) -> None:
    """Step 6: edge attribution on the SmolLM2-shaped model, ``batch`` x 128 tokens of repeated random halves: EAP
    (target <= 4x one forward) and EAP-IG with m points in one batched pass (target <= (m + 2)x), beside the floor
    of one forward + backward and EAP-IG with one pass per point; EAP's peak memory above the model's. At a small
    batch a GPU waits on the host's kernel launches, so ``--circuits-batch`` can add larger ones."""
    from interp.circuits import build_graph, eap, eap_ig
    from interp.circuits.tasks import circuit_task

    _, ours, _ = smollm2_pair(device, quick)
    task = circuit_task(ours, "induction", n=batch, half_len=16 if quick else 64)
    c, x, metric = task.clean.to(device), task.corrupted.to(device), task.metric
    graph = build_graph(ours)

    def forward():
        with torch.no_grad():
            ours(c)

    def forward_backward(copies: int = 1):  # the floor of one gradient step over copies of the batch
        e = torch.zeros((), requires_grad=True, device=device)
        with torch.enable_grad(), ours.hooks([("blocks.0.hook_resid_pre", lambda t, hook: t + e)]):
            logits = ours(c.repeat(copies, 1))  # [copies*B, T, V]
            B = c.shape[0]
            value = sum(metric(logits[k * B:(k + 1) * B]) for k in range(copies))
        torch.autograd.backward(value, inputs=[e])

    fns = {"forward": forward, "forward+backward": forward_backward,
           f"forward+backward of {m} copies": lambda: forward_backward(m),
           "EAP": lambda: eap(ours, c, x, metric, graph=graph),
           f"EAP-IG (m = {m}, one pass)": lambda: eap_ig(ours, c, x, metric, steps=m, graph=graph, progress=False),
           f"EAP-IG (m = {m}, a pass per point)": lambda: eap_ig(ours, c, x, metric, steps=m, graph=graph,
                                                                 steps_per_pass=1, progress=False)}
    med = interleaved(fns, device, reps)
    base = med["forward"]
    rep.data[f"circuits seconds, batch {batch}"] = med
    rep.data["circuits edges"] = graph.n_edges
    for name, target in (("forward+backward", "floor"), (f"forward+backward of {m} copies", "floor"),
                         ("EAP", "<= 4"), (f"EAP-IG (m = {m}, one pass)", f"<= {m + 2}"),
                         (f"EAP-IG (m = {m}, a pass per point)", "reported")):
        ratio = med[name] / base
        ok = None if not target.startswith("<=") else ratio <= float(target[3:])
        rep.add(f"SmolLM2 {name} / one forward ({graph.n_edges} edges, {batch} x {c.shape[1]})", ratio, target, ok)
    if device.type == "cuda":
        reset_peak(device)
        before = torch.cuda.memory_allocated(device)
        eap(ours, c, x, metric, graph=graph)
        rep.add(f"SmolLM2 EAP peak memory above the model (GB, {batch} x {c.shape[1]})", (peak(device) - before) / 1e9)


def step_decode_profile(device: torch.device, quick: bool, batch: int = 32) -> None:
    """Not in the default steps: where one greedy ``generate`` of interp spends its device and host time, as
    torch.profiler's table (printed), to find what a decode step costs beyond transformers'."""
    from torch.profiler import ProfilerActivity, profile

    _, ours, _ = smollm2_pair(device, quick)
    new = 8 if quick else 64
    ids = torch.randint(3, ours.cfg.d_vocab, (batch, 16), device=device)
    with torch.inference_mode():
        ours.generate(ids, new)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            ours.generate(ids, new)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15))


def step_eap_profile(device: torch.device, quick: bool) -> None:
    """Not in the default steps: torch.profiler's table of one EAP call on the SmolLM2-shaped model (printed)."""
    from torch.profiler import ProfilerActivity, profile

    from interp.circuits import build_graph, eap
    from interp.circuits.tasks import circuit_task

    _, ours, _ = smollm2_pair(device, quick)
    task = circuit_task(ours, "induction", n=4, half_len=16 if quick else 64)
    c, x, metric = task.clean.to(device), task.corrupted.to(device), task.metric
    graph = build_graph(ours)
    eap(ours, c, x, metric, graph=graph)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts, with_stack=False, record_shapes=True) as prof:
        eap(ours, c, x, metric, graph=graph)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=30, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    p.add_argument("--steps", default="smollm2,decode,llama8b,mla,circuits", help="which steps after the tests, comma-separated")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--circuits-batch", type=lambda v: [int(b) for b in v.split(",")], default=[4],
                   help="sequences per batch of the circuits step, comma-separated (default 4)")
    p.add_argument("--skip-tests", action="store_true", help="skip step 1 (pytest -m cuda)")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 comparisons at float32 precision
    torch.backends.cudnn.allow_tf32 = False
    rep = Report()
    rep.data["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    t_all = time.perf_counter()
    steps = [("tests", lambda: step_tests(rep))] if not a.skip_tests else []
    steps += [("smollm2", lambda: step_smollm2(rep, device, a.quick, a.reps)),
              ("decode", lambda: step_decode(rep, device, a.quick, a.reps)),
              ("llama8b", lambda: step_llama8b(rep, device, a.quick, a.reps)),
              ("mla", lambda: step_mla(rep, device, a.quick)),
              *[("circuits", lambda b=b: step_circuits(rep, device, a.quick, a.reps, batch=b))
                for b in a.circuits_batch],
              ("decode_profile", lambda: step_decode_profile(device, a.quick)),
              ("eap_profile", lambda: step_eap_profile(device, a.quick))]
    steps = [(n, f) for n, f in steps if n == "tests" or n in a.steps.split(",")]
    for name, fn in steps:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one step's failure is reported, the others still run
            traceback.print_exc()
            rep.add(f"step {name}", f"error: {type(e).__name__}: {str(e)[:160]}", "runs", False, correctness=True)
        rep.data[f"step {name} seconds"] = round(time.perf_counter() - t0, 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rep.data["total seconds"] = round(time.perf_counter() - t_all, 1)
    print(f"## gpu_check on {rep.data['device']} ({rep.data['total seconds']} s)\n")
    print(rep.table())
    if a.out:
        a.out.write_text(json.dumps(rep.data, indent=2, default=str))
    if rep.failed:
        print(f"\ncorrectness checks failed: {rep.failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
