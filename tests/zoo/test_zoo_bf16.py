"""bf16 models against transformers in bf16, on the random tiny Llama-family configs (no download).

The SDPA path runs the same kernels in the same order as transformers' ``sdpa`` attention, RMSNorm included
(normalised in float32, rounded, then scaled by the weight in bf16, as ``LlamaRMSNorm``): measured bit-equal
logits. The recording path computes scores and softmax in float32 (transformers' eager attention rounds its
scores to bf16 first), so it differs from eager by bf16 rounding: measured logits within 1.6 % (relative
Frobenius norm) and patterns within 0.064; both tolerances below leave room for other CPUs' kernels.

Nemotron, Granite-MoE, GLM-4-MoE, Phi-MoE and Llama 4's fast path is bit-equal to transformers' sdpa as well;
the recording path of the first four against eager is a known miss (see the note above its test).
"""

import pytest
import torch

from interp.zoo.compat import SEQ, V, hf_test_model
from interp.zoo.hf import from_hf

transformers = pytest.importorskip("transformers")


def hf_bf16(name: str, attn: str):
    """The family's tiny test model built in bf16 as ``from_pretrained(dtype=torch.bfloat16)`` builds one (rotary
    frequencies stay float32), with the float32 model's weights."""
    hf32 = hf_test_model(name, attn)
    hf = transformers.AutoModelForCausalLM.from_config(hf32.config, dtype=torch.bfloat16)
    hf.load_state_dict(hf32.state_dict())
    hf.config._attn_implementation = attn
    return hf.eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _run(name: str):
    """``(model, fast logits, transformers' sdpa logits, recording-path logits and trace, transformers' eager
    output with its patterns)`` of one family's tiny model in bf16."""
    eager, sdpa = hf_bf16(name, "eager"), hf_bf16(name, "sdpa")
    model = from_hf(eager)
    assert model.W_E.dtype == torch.bfloat16
    torch.manual_seed(4)
    ids = torch.randint(1, V, (2, SEQ))
    with torch.no_grad():
        ref_sdpa = sdpa(ids).logits
        ref = eager(ids, output_attentions=True)
        logits, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
        fast = model(ids)
    return model, fast, ref_sdpa, logits, trace, ref


def _check_recording(logits, trace, ref) -> None:
    # Before scores and softmax ran in float32: 2.1e-2 .. 2.8e-2, patterns within 0.03 .. 0.094.
    assert _rel(logits, ref.logits) <= 0.02
    for layer, pattern in enumerate(ref.attentions):
        got = trace.pattern(layer)
        assert got.dtype == torch.float32  # the pattern as softmax computed it, before rounding for z
        assert (got - pattern.float()).abs().max().item() <= 0.1


# OLMo 2 multiplies its norm weight and rotates its queries and keys in float32 before rounding
# (the "olmo2" precision policy, interp.precision); before the rotary order followed it: 9.5e-3 from transformers' sdpa.
# Llama 4 rotates in float32 too (the "cohere" policy; before: 3.6e-2 from sdpa). DeepSeek-V2 / V3 keep their router
# in float32 (the "deepseek_v2" / "deepseek_v3" policies; V2 rotates in float32 too): before, 1.9e-2 / 3.6e-3.
@pytest.mark.parametrize("name", ["llama3", "qwen2", "qwen3", "mistral", "phi3", "olmo2", "llama4_text", "deepseek_v2",
                                  "deepseek_v3"])
def test_bf16_matches_transformers_bf16(name):
    model, fast, ref_sdpa, logits, trace, ref = _run(name)
    # Before RMSNorm followed Llama's rounding order: 2.0e-2 .. 2.4e-2 on these three.
    assert _rel(fast, ref_sdpa) <= 1e-3
    _check_recording(logits, trace, ref)


# The fast path is bit-equal to transformers' sdpa here too (measured 0.0). Before the experts' outputs were
# weighted and rounded one by one, then summed in float32 (transformers' experts kernels): Granite-MoE and
# Phi-MoE 3.3e-2; before GLM-4-MoE's router stayed float32 (the "deepseek_v3" policy): 2.9e-3; before Mixtral's
# mixing weights stayed float32 (the "mixtral" policy): 1.9e-2. (The recording path of Mixtral, Qwen2-MoE, Qwen3-MoE
# and OLMoE against eager: 7.3e-2, 2.0e-2, 3.5e-2, 1.2e-2, patterns within 0.043; not asserted here.)
NEWER = ["nemotron", "granitemoe", "glm4_moe", "phimoe"]


@pytest.mark.parametrize("name", NEWER + ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"])
def test_bf16_fast_path_matches_transformers_sdpa(name):
    _, fast, ref_sdpa, _, _, _ = _run(name)
    assert _rel(fast, ref_sdpa) <= 1e-3


# Known misses of the recording path against transformers' eager (same tolerances). Eager rounds its attention
# scores to bf16 before the softmax, which the recording path does not (it keeps them in float32, as the fused
# kernels and interp's fast path do); these configs amplify that rounding: the MoE routers choose other experts
# for 1-3 of 80 tokens under eager than under sdpa (interp's recording path routes every token as sdpa does for
# Granite-MoE and GLM-4-MoE; Phi-MoE's sparsemixer moves a token under each of the three), and Nemotron's
# squared-ReLU sharpens its second layer's attention. Measured: logits 1.6e-2 / 6.2e-2 / 2.6e-2 / 0.10,
# patterns 0.41 / 0.092 / 0.009 / 0.54; eager itself is that far from transformers' float32 model (logits 3.1e-2 /
# 6.3e-2 / 2.2e-2 / 9.1e-2, patterns 0.39 / 0.047 / 0.014 / 0.54). strict: a fix that makes one pass shows here.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=(
    "transformers' eager rounds scores to bf16; its routing differs from sdpa's"))) for n in NEWER])
def test_bf16_recording_path_matches_transformers_eager(name):
    _, _, _, logits, trace, ref = _run(name)
    _check_recording(logits, trace, ref)


@pytest.mark.parametrize("name", ["granitemoe", "glm4_moe"])
def test_bf16_recording_path_routes_as_transformers_sdpa_not_eager(name):
    """The cause of two of the misses above: the recording path chooses every token's experts as transformers'
    sdpa model does, and transformers' eager model (scores rounded to bf16) chooses others for some tokens.
    (Phi-MoE's sparsemixer, whose second choice hangs on a threshold, moves a token under each of the three.)"""
    eager, sdpa = hf_bf16(name, "eager"), hf_bf16(name, "sdpa")
    model = from_hf(eager)
    chosen: dict[str, dict[int, torch.Tensor]] = {"eager": {}, "sdpa": {}}
    for kind, hf in (("eager", eager), ("sdpa", sdpa)):
        for i, layer in enumerate(hf.model.layers):
            moe = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
            if hasattr(moe, "experts"):  # experts(hidden_states, top-k ids, top-k weights)
                moe.experts.register_forward_hook(
                    lambda m, args, out, i=i, kind=kind: chosen[kind].__setitem__(i, args[1].sort(-1)[0]))
    torch.manual_seed(4)
    ids = torch.randint(1, V, (2, SEQ))
    with torch.no_grad():
        eager(ids), sdpa(ids)
        _, trace = model.run_with_cache(ids, names_filter=lambda h: h.endswith(("hook_pattern", "hook_expert_ids")))
    differ = 0
    for i, want in chosen["sdpa"].items():
        ours = trace[f"blocks.{i}.mlp.hook_expert_ids"].reshape(want.shape).sort(-1)[0]
        assert torch.equal(ours, want), f"layer {i}"
        differ += int((chosen["eager"][i] != want).any(-1).sum())
    assert differ > 0  # eager's rounding moves some tokens to other experts
