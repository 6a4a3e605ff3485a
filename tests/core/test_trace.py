"""Trace: save/load round trip; query chunks and reducers stream patterns."""

from __future__ import annotations

import pytest
import torch
from core_helpers import VARIANTS, make, naive_attention, naive_rotary  # noqa: F401

import interp
from interp import Trace


# --- trace --------------------------------------------------------------------------------------------------
def test_trace_save_load_roundtrip(tmp_path):
    model = make("mla")
    tokens = torch.randint(0, 37, (2, 6))
    _, trace = model.run_with_cache(tokens, names_filter=["*hook_pattern", "*hook_result"])
    path = trace.save(tmp_path / "t.safetensors")
    back = Trace.load(path)
    assert set(back) == set(trace)
    torch.testing.assert_close(back.patterns(), trace.patterns(), atol=0, rtol=0)
    torch.testing.assert_close(back.head_outs(), trace.head_outs(), atol=0, rtol=0)
    assert torch.equal(back.tokens, tokens)
    assert back.meta["n_heads"] == 8
    assert "Trace" in repr(back) and "<table>" in back._repr_html_()
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors trace"):
        Trace.load(tmp_path / "bad.safetensors")
    with pytest.raises(KeyError, match="was not recorded"):
        back["blocks.0.attn.hook_q"]


def test_query_chunks_and_reducers_stream_patterns():
    model = make("gqa-rotary", n_ctx=40)
    tokens = torch.randint(0, 37, (3, 33))
    full_out, full = model.run_with_cache(tokens, names_filter="*hook_pattern")
    model.set_query_chunk(8)
    red = interp.MeanReducer("*hook_pattern")
    out, chunked = model.run_with_cache(tokens, names_filter="*hook_pattern", reducers=[red])
    model.set_query_chunk(None)
    torch.testing.assert_close(out, full_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked.patterns(), full.patterns(), atol=1e-6, rtol=0)
    # The reducer saw chunks, not whole patterns; a chunk-aware reducer can still rebuild the mean.
    _, only_red = model.run_with_cache(tokens, names_filter=[], reducers=[interp.MeanReducer("*hook_pattern")])
    assert len(only_red) == 0
    mean = only_red.stats[0]["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(mean, full.pattern(0).mean(0), atol=1e-6, rtol=0)
