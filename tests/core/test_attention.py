"""The attention core against independent references: a naive per-head formula, SDPA, gates, cross-attention."""

from __future__ import annotations

import math

import pytest
import torch
from core_helpers import VARIANTS, make, naive_attention, naive_rotary  # noqa: F401

import interp


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_matches_naive_formula_and_sdpa(variant, causal, padded):
    model = make(variant, causal=causal)
    attn = model.blocks[0].attn
    B, T = 2, 7
    x = torch.randn(B, T, 32)
    keep = torch.ones(B, T, dtype=torch.bool)
    if padded:
        keep[1, 5:] = False  # right padding on the second sequence
    mask = interp.AttnMask(T=T, S=T, start=0, causal=causal, key_keep=keep if padded else None)
    fast = attn(x, mask=mask)
    pats = []
    with model.hooks([("blocks.0.attn.hook_pattern", lambda p, hook: pats.append(p))]):
        explicit = attn(x, mask=mask)
    assert pats[0].shape == (B, 8, T, T)
    for i in range(B):
        allowed = keep[i][None, :].expand(T, T).clone()
        if causal:
            allowed &= torch.ones(T, T, dtype=torch.bool).tril()
        ref_out, ref_pat = naive_attention(attn, x[i], allowed, torch.arange(T))
        rows = keep[i] if padded else torch.ones(T, dtype=torch.bool)  # padded queries are don't-care
        torch.testing.assert_close(explicit[i][rows], ref_out[rows], atol=1e-5, rtol=0)
        torch.testing.assert_close(fast[i][rows], ref_out[rows], atol=1e-5, rtol=0)
        torch.testing.assert_close(pats[0][i][:, rows], ref_pat[:, rows], atol=1e-5, rtol=0)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=0)


def test_use_sdpa_false_equals_sdpa_model():
    fast = make("gqa")
    slow = make("gqa", use_sdpa=False)
    slow.load_state_dict(fast.state_dict())
    tokens = torch.randint(0, 37, (3, 11))
    torch.testing.assert_close(fast(tokens), slow(tokens), atol=1e-5, rtol=0)


def test_n_kv_heads_equal_n_heads_is_mha():
    a = make("mha")
    b = make("mha", n_kv_heads=8)
    assert b.cfg.kind == "mha"
    b.load_state_dict(a.state_dict())
    tokens = torch.randint(0, 37, (2, 9))
    torch.testing.assert_close(a(tokens), b(tokens), atol=0, rtol=0)


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_gqa_equals_mha_with_kv_weights_repeated_per_group(n_kv):
    gqa = make("mha", n_kv_heads=n_kv)
    mha = make("mha", seed=1)
    H, D, K = 8, 6, n_kv
    G = H // K
    sd = gqa.state_dict()
    new = dict(sd)
    for layer in range(2):
        key = f"blocks.{layer}.attn.W_qkv"
        w, b = sd[key + ".weight"], sd[key + ".bias"]

        def expand(t):
            q, k, v = t.split([H * D, K * D, K * D])
            k = k.view(K, D, *t.shape[1:]).repeat_interleave(G, 0).reshape(H * D, *t.shape[1:])  # [H*D, ...]
            v = v.view(K, D, *t.shape[1:]).repeat_interleave(G, 0).reshape(H * D, *t.shape[1:])  # [H*D, ...]
            return torch.cat([q, k, v])

        new[key + ".weight"], new[key + ".bias"] = expand(w), expand(b)
    mha.load_state_dict(new)
    tokens = torch.randint(0, 37, (2, 10))
    _, tg = gqa.run_with_cache(tokens, names_filter="*hook_pattern")
    _, tm = mha.run_with_cache(tokens, names_filter="*hook_pattern")
    torch.testing.assert_close(gqa(tokens), mha(tokens), atol=1e-5, rtol=0)
    torch.testing.assert_close(tg.patterns(), tm.patterns(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", ["mha", "gqa", "mla"])
def test_patterns_causal_rows_sum_to_one_and_padding_has_no_nan(variant):
    model = make(variant)
    tokens = torch.randint(0, 37, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0  # left padding: the first rows see only padding keys
    out, trace = model.run_with_cache(tokens, attention_mask=mask, names_filter="*hook_pattern")
    assert not torch.isnan(out).any()
    for layer in range(2):
        p = trace.pattern(layer)
        assert not torch.isnan(p).any()
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]), atol=1e-5, rtol=0)
        assert p.triu(1).abs().max() == 0  # nothing above the diagonal
        # Real queries never attend to padding.
        assert p[0, :, 3:, :3].abs().max() == 0


@pytest.mark.parametrize("variant", ["mha", "gqa", "mqa", "mla"])
def test_per_head_writes_sum_to_attention_output(variant):
    model = make(variant)
    tokens = torch.randint(0, 37, (2, 9))
    _, trace = model.run_with_cache(tokens, names_filter=["*hook_result", "*hook_attn_out", "*hook_z"])
    post = model.cfg.normalization == "post"
    assert not post
    for layer in range(2):
        writes = trace.head_out(layer)
        assert writes.shape == (2, 9, 8, 32)
        bias = model.blocks[layer].attn.W_O.bias
        torch.testing.assert_close(writes.sum(2) + bias, trace[f"blocks.{layer}.hook_attn_out"], atol=1e-5, rtol=0)
        # Each write is z_h @ W_O[h], computed by hand.
        w_o = model.blocks[layer].attn.W_O.weight  # [M, H*D]
        h = 3
        manual = trace.z(layer)[:, :, h] @ w_o[:, h * 6:(h + 1) * 6].T
        torch.testing.assert_close(writes[:, :, h], manual, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["mha", "gqa", "mla"])
def test_gate_zero_equals_zero_ablating_z(variant):
    model = make(variant)
    tokens = torch.randint(0, 37, (2, 9))
    layer, head = 1, 5
    gates = torch.ones(2, 8)
    gates[layer, head] = 0
    model.set_head_gates(gates)
    gated, trace = model.run_with_cache(tokens, names_filter="*hook_result")
    assert trace.head_out(layer)[:, :, head].abs().max() == 0
    assert trace.head_out(layer)[:, :, head - 1].abs().max() > 0
    gated_fast = model(tokens)  # gates also work on the SDPA path
    model.set_head_gates(None)

    def ablate(z, hook):
        z = z.clone()
        z[:, :, head] = 0
        return z

    ablated = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate)])
    torch.testing.assert_close(gated, ablated, atol=1e-6, rtol=0)
    torch.testing.assert_close(gated_fast, ablated, atol=1e-5, rtol=0)
    assert not torch.allclose(model(tokens), ablated, atol=1e-4)


def test_gates_are_differentiable():
    model = make("gqa")
    gates = torch.ones(2, 8, requires_grad=True)
    model.set_head_gates(gates)
    model(torch.randint(0, 37, (2, 6))).logsumexp(-1).mean().backward()
    assert gates.grad is not None and gates.grad.abs().sum() > 0


def test_cross_attention_matches_naive():
    model = make("gqa", cross_attention=True)
    tokens = torch.randint(0, 37, (2, 5))
    context = torch.randn(2, 7, 32)
    ctx_mask = torch.ones(2, 7, dtype=torch.long)
    ctx_mask[1, 4:] = 0
    got = []
    with model.hooks([("blocks.0.cross_attn.hook_result", lambda r, hook: got.append(r.sum(2)))]):
        model(tokens, context=context, context_mask=ctx_mask)
    cross = model.blocks[0].cross_attn
    # Recompute the cross-attention input (the normed residual after self-attention) via hooks.
    _, tr = model.run_with_cache(tokens, context=context, context_mask=ctx_mask,
                                 names_filter=["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out"])
    resid = tr["blocks.0.hook_resid_pre"] + tr["blocks.0.hook_attn_out"]
    x = model.blocks[0].ln_cross(resid)
    for i in range(2):
        cfg = cross.cfg
        H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        W, b = cross.W_qkv.weight, cross.W_qkv.bias
        q_all = x[i] @ W[:H * D].T + b[:H * D]
        kv = context[i] @ W[H * D:].T + b[H * D:]
        writes = 0
        for h in range(H):
            g = h // (H // K)
            q = q_all[:, h * D:(h + 1) * D]
            k, v = kv[:, g * D:(g + 1) * D], kv[:, K * D + g * D:K * D + (g + 1) * D]
            s = (q @ k.T / math.sqrt(D)).masked_fill(~ctx_mask[i].bool(), float("-inf"))
            writes = writes + torch.softmax(s, -1) @ v @ cross.W_O.weight[:, h * D:(h + 1) * D].T
        torch.testing.assert_close(got[0][i], writes, atol=1e-5, rtol=0)


@pytest.mark.parametrize("start", [0, 3])
@pytest.mark.parametrize("extra", [{}, {"window": 4}, {"chunk": 4}, {"key_keep": "pad"}, {"key_start": 2}])
def test_a_chunks_triangle_is_its_additive_mask_or_not_offered(start, extra):
    """Where chunk_triangle offers the [c, c] block, the chunk's whole additive mask (cut after its last query's
    key) is zero before that block and the block itself; a mask with a window, attention chunks or padding gets
    no block."""
    from interp.attention import AttnMask

    T, S = 12, 12 + start
    kw = dict(extra)
    if kw.get("key_keep") == "pad":
        kw["key_keep"] = torch.ones(1, S, dtype=torch.bool).index_fill_(1, torch.tensor([1]), False)
    mask = AttnMask(T=T, S=S, start=start, causal=True, **kw)
    offered = 0
    for q0 in range(0, T, 5):
        q = slice(q0, min(q0 + 5, T))
        n_keys = start + q.stop - mask.key_start
        tri = mask.chunk_triangle(q, n_keys, torch.float32, torch.device("cpu"))
        if tri is None:
            continue
        offered += 1
        whole = mask.additive(torch.float32, torch.device("cpu"), q)[0, 0, :, :n_keys]  # [c, n]
        c = q.stop - q.start
        assert torch.equal(whole[:, :n_keys - c], torch.zeros(c, n_keys - c))
        assert torch.equal(whole[:, n_keys - c:], tri)
    assert (offered > 0) == (not extra or "key_start" in extra)  # keys the cache dropped only shift the block
