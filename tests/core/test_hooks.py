"""Hooks: replacement, removal also on error, names filters, hook_result on demand, query-chunk masks."""

from __future__ import annotations

import pytest
import torch
from core_helpers import VARIANTS, make, naive_attention, naive_rotary  # noqa: F401

import interp


# --- hooks ------------------------------------------------------------------------------------------------
def test_replacing_hook_changes_output_and_is_removed():
    model = make("mha")
    tokens = torch.randint(0, 37, (1, 6))
    base = model(tokens)
    hooked = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x * 0)])
    assert not torch.allclose(base, hooked)
    torch.testing.assert_close(model(tokens), base, atol=0, rtol=0)
    assert all(not hp.active for hp in model.hook_dict.values())


def test_hook_that_raises_leaves_model_clean():
    model = make("gqa")
    tokens = torch.randint(0, 37, (1, 6))
    base = model(tokens)

    def boom(x, hook):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_pattern", boom), ("*hook_z", lambda z, h: None)])
    assert all(not hp.active for hp in model.hook_dict.values())
    with pytest.raises(RuntimeError):
        model.run_with_cache(tokens, names_filter="*hook_pattern", reducers=[_Raising()])
    assert all(not hp.active for hp in model.hook_dict.values())
    torch.testing.assert_close(model(tokens), base, atol=0, rtol=0)


class _Raising(interp.Reducer):
    names = "blocks.0.attn.hook_z"

    def update(self, name, tensor, *, q_start):
        raise RuntimeError("reducer failed")

    def result(self):
        return None


def test_names_filter_forms():
    model = make("mha")
    tokens = torch.randint(0, 37, (1, 6))
    _, t1 = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern")
    assert list(t1) == ["blocks.1.attn.hook_pattern"]
    _, t2 = model.run_with_cache(tokens, names_filter=["hook_embed", "blocks.0.attn.hook_q"])
    assert list(t2) == ["hook_embed", "blocks.0.attn.hook_q"]
    _, t3 = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))
    assert list(t3) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    _, t4 = model.run_with_cache(tokens, names_filter="*hook_pattern", layers=[1], dtype=torch.float16)
    assert list(t4) == ["blocks.1.attn.hook_pattern"] and t4.pattern(1).dtype == torch.float16
    with pytest.raises(ValueError, match="'blocks.0.attn.hook_patern' matches no hook point"):
        model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_patern"])
    with pytest.raises(ValueError, match="matches no hook point"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.9.attn.hook_z", lambda z, h: None)])
    with pytest.raises(TypeError, match="names_filter"):
        model.run_with_cache(tokens, names_filter=3)
    with pytest.raises(ValueError, match=r"layers \[5\] out of range"):
        model.run_with_cache(tokens, layers=[5])


def test_hook_result_only_computed_when_asked():
    model = make("mha")
    calls = []
    einsum = torch.einsum

    def spy(*a, **k):
        calls.append(a[0])
        return einsum(*a, **k)

    torch.einsum = spy
    try:
        model(torch.randint(0, 37, (1, 5)))
        assert calls == []
        model.run_with_hooks(torch.randint(0, 37, (1, 5)), fwd_hooks=[("blocks.0.attn.hook_result", lambda r, h: None)])
        assert len(calls) == 1
        # Recording keeps z and W_O; the writes are multiplied out when read.
        _, trace = model.run_with_cache(torch.randint(0, 37, (1, 5)), names_filter="blocks.0.attn.hook_result")
        assert len(calls) == 1
        trace.head_out(0)
        assert len(calls) == 2
    finally:
        torch.einsum = einsum


@pytest.mark.parametrize("variant", ["gqa", "mla"])
def test_recorded_head_writes_equal_the_hooked_ones_with_gates(variant):
    model = make(variant)
    tokens = torch.randint(0, 37, (2, 7))
    gates = torch.rand(2, 8)
    model.set_head_gates(gates)
    seen = {}
    model.run_with_hooks(tokens, fwd_hooks=[("*hook_result", lambda r, h: seen.__setitem__(h.name, r))])
    _, trace = model.run_with_cache(tokens, names_filter=["*hook_result"], dtype=torch.float64)
    assert set(trace) == set(seen) and "blocks.0.attn.hook_z" not in trace
    for name, eager in seen.items():
        assert trace[name].dtype == torch.float64
        torch.testing.assert_close(trace[name].float(), eager, atol=1e-6, rtol=0)
    # Changing the gates after recording does not change what was recorded.
    model.set_head_gates(torch.zeros(2, 8))
    torch.testing.assert_close(trace.head_out(1).float(), seen["blocks.1.attn.hook_result"], atol=1e-6, rtol=0)


def test_query_chunk_masks_are_not_cached():
    mask = interp.AttnMask(T=8, S=8, start=0, causal=True)
    for i in range(0, 8, 2):
        assert mask.additive(torch.float32, torch.device("cpu"), slice(i, i + 2)).shape == (1, 1, 2, 8)
    assert mask._cache == {}  # chunk masks are rebuilt, so a chunked pass never holds a [T, S] mask
    full = mask.additive(torch.float32, torch.device("cpu"))
    assert full.shape == (1, 1, 8, 8) and len(mask._cache) == 1
