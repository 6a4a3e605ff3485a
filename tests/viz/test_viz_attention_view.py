"""viz.attention_view without a browser: the keys it sends against the recorded patterns (top-k by hand)."""

import re

import pytest
import torch

from interp import viz
from interp.config import ModelConfig
from interp.model import Transformer


def _gqa_model():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=50, n_ctx=64, positional="rotary")
    return Transformer(cfg).eval()


def _expected(pattern_row, top_k, min_weight):
    vals, idx = pattern_row.topk(top_k)
    keep = vals >= min_weight
    keep[0] = True
    return idx[keep].tolist(), vals[keep].tolist()


def test_keys_sent_are_the_top_keys_of_the_pattern():
    model = _gqa_model()
    ids = torch.randint(0, 50, (1, 40), generator=torch.Generator().manual_seed(1))
    _, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
    view = viz.attention_view(model, ids, top_k=5, min_weight=0.03)
    for layer in range(2):
        for head in range(4):
            for q in (0, 7, 39):
                keys, weights = zip(*view.keys_of(layer, head, q))
                want_keys, want_w = _expected(trace.pattern(layer)[0, head, q], 5, 0.03)
                assert list(keys) == want_keys
                assert max(abs(a - b) for a, b in zip(weights, want_w)) <= 0.5 / 255 + 1e-6
    assert view.layers[0].kv_map == (0, 0, 1, 1)
    # The trace route sends the same data as the model route.
    again = viz.attention_view(trace, top_k=5, min_weight=0.03, n_kv_heads=2)
    for a, b in zip(view.layers, again.layers):
        assert (a.counts == b.counts).all() and (a.keys == b.keys).all() and (a.weights == b.weights).all()
        assert a.kv_map == b.kv_map


def test_query_chunked_model_gives_the_same_view():
    model = _gqa_model()
    ids = torch.randint(0, 50, (1, 33), generator=torch.Generator().manual_seed(2))
    whole = viz.attention_view(model, ids, top_k=4)
    model.set_query_chunk(8)
    try:
        chunked = viz.attention_view(model, ids, top_k=4)
    finally:
        model.set_query_chunk(None)
    for a, b in zip(whole.layers, chunked.layers):
        assert (a.counts == b.counts).all() and (a.keys == b.keys).all()


def test_html_is_self_contained_and_escapes_tokens():
    pattern = torch.softmax(torch.randn(2, 3, 3), -1)  # [H, T, S]
    view = viz.attention_view(pattern, ["a", "</script><b>x", "c"], title="t")
    page = view.to_html(full_page=True)
    assert view._repr_html_() in page
    assert "</script><b>x" not in page  # escaped inside the JSON payload
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)  # no CDN, no remote resource
    assert page.count("<script") == 2  # the data and the code, both inline


def test_bad_input_is_refused_by_name():
    pattern = torch.softmax(torch.randn(4, 3, 3), -1)
    with pytest.raises(ValueError, match="top_k=0"):
        viz.attention_view(pattern, top_k=0)
    with pytest.raises(ValueError, match="min_weight=1.5"):
        viz.attention_view(pattern, min_weight=1.5)
    with pytest.raises(ValueError, match="n_kv_heads=3 must be a positive int dividing the 4 heads of layer 0"):
        viz.attention_view(pattern, n_kv_heads=3)
    with pytest.raises(ValueError, match="tokens has 2 entries but the pattern has 3 positions"):
        viz.attention_view(pattern, ["a", "b"])
    with pytest.raises(ValueError, match=r"layers \[5\] are not in the patterns"):
        viz.attention_view(pattern, layers=[5])
    with pytest.raises(ValueError, match="pass the text or token ids"):
        viz.attention_view(_gqa_model())
