"""Mixed precision in attention and the norms: float32 is the plain formula, bit for bit and with no cast;
bf16 / fp16 compute scores and softmax in float32; RMSNorm rounds in the order of the family it came from."""

import math

import pytest
import torch
from helpers import tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from interp.attention import AttnMask
from interp.norms import RMSNorm


class _Casts(TorchDispatchMode):
    """Counts the dtype conversions that run inside the context."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.to):
            self.n += 1
        return func(*args, **(kwargs or {}))


def _qkv(B, H, K, T, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Scores of a few units, as trained models have: there bf16 rounding of a score moves its weight visibly.
    q, k, v = (torch.randn(B, n, T, D, generator=g) * 1.5 for n in (H, K, K))
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("variant", ["mha", "gqa"])
def test_float32_explicit_attention_is_the_naive_formula_bit_for_bit(variant):
    """The float32 path is untouched by the half-precision rules: pattern and z are the textbook formula's (to the
    bit with one query head per K/V head), on a padded causal mask, and no dtype conversion runs inside it."""
    model = tiny_model(0, variant=variant)
    attn = model.blocks[0].attn
    H, K, D, T = attn.n_heads, model.cfg.n_kv_heads, model.cfg.d_head, 7
    q, k, v = _qkv(2, H, K, T, D, torch.float32)
    keep = torch.ones(2, T, dtype=torch.bool)
    keep[1, :2] = False  # left padding on the second row
    mask = AttnMask(T=T, S=T, start=0, causal=True, key_keep=keep, padded_queries_see_all=True)
    seen = {}
    attn.hook_pattern.add_hook(lambda x, hook: seen.__setitem__("p", x))
    with _Casts() as casts:
        z = attn._attend(q, k, v, mask)
    assert casts.n == 0
    G = H // K
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # [B, H, T, D]: one K/V copy per query head
    allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None] & keep[:, None, None, :]  # [B, 1, T, S]
    allowed = allowed | ~keep[:, None, :, None]  # a padding query sees every key up to itself
    allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    add = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    scores = (q @ kr.transpose(-1, -2)) * (1 / math.sqrt(D)) + add
    pattern = torch.softmax(scores, dim=-1)
    assert seen["p"].dtype == torch.float32
    if G == 1:
        assert torch.equal(seen["p"], pattern)
        assert torch.equal(z, pattern @ vr)
    else:  # grouped heads share one GEMM of G * T rows: the same sums, blocked differently than T-row GEMMs
        torch.testing.assert_close(seen["p"], pattern, rtol=0, atol=1e-6)
        torch.testing.assert_close(z, pattern @ vr, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scores_and_softmax_run_in_float32(dtype):
    """In bf16 / fp16 the pattern is the float32 softmax of the exact scores of the half-precision q and k (as the
    fused kernels compute them); rounding the scores first, as a plain half-precision matmul does, is ~100x
    further from the float64 truth. z is that pattern rounded to the model's dtype, times v."""
    model = tiny_model(0, variant="gqa").to(dtype)
    attn = model.blocks[0].attn
    H, K, D, T = attn.n_heads, model.cfg.n_kv_heads, model.cfg.d_head, 24
    q, k, v = _qkv(1, H, K, T, D, dtype, seed=1)
    mask = AttnMask(T=T, S=T, start=0, causal=True)
    seen = {}
    attn.hook_attn_scores.add_hook(lambda x, hook: seen.__setitem__("s", x))
    attn.hook_pattern.add_hook(lambda x, hook: seen.__setitem__("p", x))
    z = attn._attend(q, k, v, mask)
    assert seen["s"].dtype == seen["p"].dtype == torch.float32 and z.dtype == dtype
    G, scale = H // K, 1 / math.sqrt(D)
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # [B, H, T, D]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    truth = torch.softmax(((q.double() @ kr.double().transpose(-1, -2)) * scale).masked_fill(~causal, -math.inf), -1)
    rounded = ((q @ kr.transpose(-1, -2)) * scale).float().masked_fill(~causal, -math.inf).softmax(-1)
    err, err_rounded = ((seen["p"] - truth).abs().max().item(), (rounded - truth).abs().max().item())
    assert err <= 1e-6, err
    assert err_rounded >= 100 * err, (err, err_rounded)
    assert torch.equal(z, seen["p"].to(dtype) @ vr)


def test_a_hook_replacing_a_half_precision_pattern_returns_float32():
    """Hooks on a bf16 model's pattern see, and must return, float32 (the replacement still drives the pass)."""
    model = tiny_model(0).to(torch.bfloat16)
    tokens = torch.randint(0, 20, (1, 6))
    uniform = lambda p, hook: torch.ones_like(p) / p.shape[-1]  # noqa: E731
    with model.hooks([("blocks.0.attn.hook_pattern", uniform)]):
        out = model(tokens)
    assert not torch.equal(out, model(tokens))
    with pytest.raises(TypeError, match="float32"):
        with model.hooks([("blocks.0.attn.hook_pattern", lambda p, hook: p.bfloat16())]):
            model(tokens)


def test_rmsnorm_float32_is_torchs_kernel():
    norm = RMSNorm(16, eps=1e-6)
    ref = torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
        ref.weight.copy_(norm.weight)
    x = torch.randn(3, 5, 16)
    with _Casts() as casts:
        y = norm(x)
    assert casts.n == 0
    assert torch.equal(y, ref(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_rounds_like_each_family_in_transformers(dtype):
    """Llama's RMSNorm rounds the normalised input before its weight; OLMo 2's (and Gemma's, with its 1 + w
    weight) multiplies in float32 and rounds once. Both are reproduced to the bit."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    olmo2 = pytest.importorskip("transformers.models.olmo2.modeling_olmo2")
    torch.manual_seed(0)
    x = (torch.randn(4, 9, 48) * 3).to(dtype)
    w = (1 + 0.5 * torch.randn(48)).to(dtype)
    for hf_cls, float32_weight in ((llama.LlamaRMSNorm, False), (olmo2.Olmo2RMSNorm, True)):
        hf = hf_cls(48, eps=1e-6).to(dtype)
        ours = RMSNorm(48, eps=1e-6, weight_float32=float32_weight).to(dtype)
        with torch.no_grad():
            hf.weight.copy_(w)
            ours.weight.copy_(w)
            assert torch.equal(ours(x), hf(x)), hf_cls.__name__
            other = RMSNorm(48, eps=1e-6, weight_float32=not float32_weight).to(dtype)
            other.weight.copy_(w)
            assert not torch.equal(other(x), hf(x))  # the two orders do differ: the choice matters
