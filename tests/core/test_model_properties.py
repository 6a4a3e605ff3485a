"""Property tests: invariants of the forward pass over random small configs."""

from __future__ import annotations

import os

import torch
from core_helpers import VARIANTS, make, naive_attention, naive_rotary  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

from interp import ModelConfig, Transformer


# --- property tests -----------------------------------------------------------------------------------------
@st.composite
def small_configs(draw):
    n_kv = draw(st.sampled_from([1, 2, 4]))
    n_heads = n_kv * draw(st.sampled_from([1, 2]))
    latent = draw(st.booleans())
    positional = draw(st.sampled_from(["learned", "rotary", "none"]))
    kw = dict(n_layers=draw(st.integers(1, 2)), d_model=16, n_heads=n_heads, d_head=draw(st.sampled_from([2, 4])),
              d_vocab=11, n_ctx=12, causal=draw(st.booleans()), positional=positional,
              normalization=draw(st.sampled_from(["pre", "post", "rms", "none"])), attn_only=draw(st.booleans()))
    if latent:
        kw.update(attention="latent", kv_latent_dim=draw(st.integers(2, 8)),
                  rope_dim=2 if positional == "rotary" else 0)
    else:
        kw.update(n_kv_heads=n_kv)
    return ModelConfig(**kw)


@settings(max_examples=int(os.environ.get("INTERP_HYPOTHESIS_EXAMPLES", 25)), deadline=None)
@given(cfg=small_configs(), seed=st.integers(0, 1000), T=st.integers(1, 12), pad=st.integers(0, 3))
def test_invariants_hold_for_random_configs(cfg, seed, T, pad):
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 11, (2, T))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, T - min(pad, T - 1):] = 0 if T > 1 else 1
    fast = model(tokens, attention_mask=mask)
    out, trace = model.run_with_cache(tokens, attention_mask=mask, names_filter=["*hook_pattern", "*hook_result"])
    assert not torch.isnan(out).any()
    torch.testing.assert_close(fast, out, atol=1e-5, rtol=0)
    for layer in range(cfg.n_layers):
        p = trace.pattern(layer)
        assert p.shape == (2, cfg.n_heads, T, T)
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]), atol=1e-5, rtol=0)
        if cfg.causal:
            assert p.triu(1).abs().max() == 0
    if cfg.causal:  # cached decoding of the unpadded first sequence, one token at a time
        cache = model.make_cache(1)
        steps = torch.cat([model(tokens[:1, i:i + 1], kv_cache=cache) for i in range(T)], dim=1)
        torch.testing.assert_close(steps, model(tokens[:1]), atol=1e-5, rtol=0)
