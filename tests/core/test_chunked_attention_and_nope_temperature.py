"""The core mechanisms Llama 4 added (issue 34): chunked local attention, temperature tuning of the NoPE layers'
queries and input-weighted experts, against naive references, and their config checks."""

import math

import pytest
import torch

from interp import AttnMask, ModelConfig, Transformer

BASE = dict(n_layers=2, d_model=16, n_heads=2, d_vocab=11, n_ctx=32, positional="rotary", normalization="rms",
            activation="swiglu", attn_bias=False, out_bias=False, mlp_bias=False)


@pytest.mark.parametrize("start,T,S,chunk", [(0, 10, 10, 4), (5, 3, 8, 4), (9, 1, 10, 3), (0, 3, 3, 4)])
def test_chunked_mask_is_the_naive_rule(start, T, S, chunk):
    mask = AttnMask(T=T, S=S, start=start, causal=True).for_keys(None, S, chunk)
    add = mask.additive(torch.float32, torch.device("cpu"))
    want = torch.tensor([[k <= q and k // chunk == q // chunk for k in range(S)]
                         for q in range(start, start + T)])  # [T, S]
    got = torch.ones(T, S, dtype=torch.bool) if add is None else add[0, 0] == 0
    assert torch.equal(got, want)


def test_chunked_layers_equal_a_model_fed_each_chunk_alone():
    """With every layer chunked and no positions (NoPE), position p's output depends only on its own chunk: the
    full pass equals running each chunk on its own."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**BASE, attention_chunk=4, nope_layers=[0, 1])).eval()
    ids = torch.randint(0, 11, (1, 12))
    with torch.no_grad():
        full = model(ids)
        alone = torch.cat([model(ids[:, i:i + 4]) for i in range(0, 12, 4)], dim=1)
        _, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
    torch.testing.assert_close(full, alone, rtol=0, atol=1e-5)
    assert trace.pattern(0)[0, :, 5, :4].abs().max() == 0  # position 5 sees nothing of the first chunk


@pytest.mark.parametrize("prompt_len,pieces", [(5, [1] * 12), (2, [3, 1, 4, 2, 1, 5]), (8, [7, 1, 1])])
def test_a_chunked_layers_cache_holds_its_chunk_only_and_decodes_as_the_full_pass(prompt_len, pieces):
    """A chunked layer's KV cache keeps at most C - 1 positions (its current chunk's), whatever the length; fed in
    pieces of any size across chunk boundaries, every position's logits equal one pass over the whole sequence."""
    torch.manual_seed(1)
    model = Transformer(ModelConfig(**BASE, attention_chunk=[4, None], nope_layers=[1],
                                    nope_temperature=[0.5, 3.0])).eval()
    n = prompt_len + sum(pieces)
    ids = torch.randint(0, 11, (2, n))
    cache = model.make_cache(2)
    assert cache.layers[0].buffers[0].shape[2] == 3 and cache.layers[1].buffers[0].shape[2] == 32  # C - 1; all
    with torch.no_grad():
        want = model(ids)  # [B, n, V]
        got, at = [model(ids[:, :prompt_len], kv_cache=cache)], prompt_len
        for size in pieces:
            got.append(model(ids[:, at:at + size], kv_cache=cache))
            at += size
    torch.testing.assert_close(torch.cat(got, dim=1), want, rtol=0, atol=1e-5)
    assert cache.length == n
    cache.rewind(n - 1)  # the dropped chunk cannot come back: refused, not attended wrongly
    with pytest.raises(RuntimeError, match="chunk layer's KV cache was rewound"):
        model(ids[:, -1:], kv_cache=cache)


def test_nope_temperature_scales_the_queries_by_position():
    """On a NoPE layer the query at absolute position p is multiplied by 1 + s log1p(floor((p + 1) / f)), also
    when it is decoded from a cache: hook the scores and compare with the unscaled model's times the factor."""
    torch.manual_seed(1)
    cfg = ModelConfig(**BASE, nope_layers=[1], nope_temperature=[0.5, 3.0])
    model = Transformer(cfg).eval()
    plain = Transformer(ModelConfig(**BASE, nope_layers=[1])).eval()
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(0, 11, (1, 9))
    with torch.no_grad():
        _, got = model.run_with_cache(ids, names_filter="*hook_attn_scores")
        _, ref = plain.run_with_cache(ids, names_filter="*hook_attn_scores")
        factor = torch.tensor([1 + 0.5 * math.log1p(math.floor((p + 1) / 3.0)) for p in range(9)])
        s_got, s_ref = got["blocks.1.attn.hook_attn_scores"], ref["blocks.1.attn.hook_attn_scores"]  # [B, H, T, S]
        real = torch.tril(torch.ones(9, 9, dtype=torch.bool))
        torch.testing.assert_close(s_got[..., real], (s_ref * factor[:, None])[..., real], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["blocks.0.attn.hook_attn_scores"], ref["blocks.0.attn.hook_attn_scores"])
        cache = model.make_cache(1, 9)
        steps = [model(ids[:, :4], kv_cache=cache)] + [model(ids[:, t:t + 1], kv_cache=cache) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), model(ids), rtol=0, atol=1e-5)


def test_input_weighted_experts_are_expert_of_weighted_input():
    torch.manual_seed(2)
    cfg = ModelConfig(**BASE, n_experts=4, n_experts_per_token=2, router_score="sigmoid",
                      expert_input_weighting=True)
    mlp = Transformer(cfg).eval().blocks[0].mlp
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        logits = x @ mlp.W_router.T  # [1, 5, E]
        ids = logits.topk(2, dim=-1).indices  # [1, 5, 2]
        want = torch.zeros_like(x)
        for t in range(5):
            for e in ids[0, t].tolist():
                xin = x[0, t] * torch.sigmoid(logits[0, t, e])
                h = torch.nn.functional.silu(mlp.W_gate[e] @ xin) * (mlp.W_in[e] @ xin)
                want[0, t] += mlp.W_out[e] @ h
        torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change,message", [
    ({"attention_chunk": 0}, r"attention_chunk=0 must be a positive int or 2 entries"),
    ({"attention_chunk": [4]}, r"attention_chunk=\[4\] must be a positive int or 2 entries"),
    ({"attention_chunk": [4, None], "sliding_window": [4, None]}, r"both apply to layers \[0\]"),
    ({"nope_temperature": [0.1, 8192.0]}, r"nope_temperature=\[0.1, 8192.0\] needs nope_layers"),
    ({"nope_temperature": [0.1], "nope_layers": [1]}, r"must be \[scale, floor\], two finite numbers > 0"),
    ({"nope_temperature": [0.1, -1.0], "nope_layers": [1]}, r"nope_temperature=\[0.1, -1.0\] must be"),
    ({"expert_input_weighting": True}, r"expert_input_weighting=True only apply to a mixture of experts"),
])
def test_config_is_checked(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**BASE, **change})
    assert ModelConfig(**BASE, attention_chunk=[4, None]).chunk(1) is None
