"""Learned attention sinks (``cfg.attn_sinks``, gpt-oss) against a naive formula: softmax over the keys and the
head's sink logit, the sink's column dropped. Both attention paths, query chunks, windows, padding, GQA, the KV
cache, the traced decode step, head removal and the config's refusals."""

import math

import pytest
import torch

from interp import ModelConfig, Transformer
from interp.attention import AttnMask
from interp.decode import DecodeLayout, LeanDecoder
from interp.pruning import remove_heads


def _cfg(**kw):
    base = dict(n_layers=2, d_model=40, n_heads=5, n_kv_heads=1, d_head=8, d_vocab=31, n_ctx=64,
                positional="rotary", normalization="rms", activation="swiglu", d_mlp=24, attn_sinks=True)
    return ModelConfig(**{**base, **kw})


def _redrawn(cfg, seed=0, sink_std=3.0):
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, sink_std if name.endswith("sinks") else 0.3)
    return model


def _naive(attn, x, window=None, key_keep=None):
    """softmax([q.k / sqrt(D) + mask | sink]) without its last column, @ v, W_O; and the sink's column."""
    B, T, _ = x.shape
    H, K, D = attn.n_heads, attn.n_kv_heads, attn.d_head
    q, k, v = attn.W_qkv(x).split([H * D, K * D, K * D], dim=-1)
    q, k, v = q.view(B, T, H, D), k.view(B, T, K, D), v.view(B, T, K, D)
    pos = torch.arange(T)
    q, k = attn.rotary(q, pos), attn.rotary(k, pos)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H|K, T, D]
    k, v = k.repeat_interleave(H // K, 1), v.repeat_interleave(H // K, 1)  # [B, H, T, D]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)  # [B, H, T, T]
    allowed = pos[None, :] <= pos[:, None]
    if window is not None:
        allowed &= pos[None, :] > pos[:, None] - window
    allowed = allowed[None, None].expand(B, 1, T, T)
    if key_keep is not None:
        allowed = allowed & key_keep[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = attn.sinks.view(1, H, 1, 1).expand(B, H, T, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)  # [B, H, T, T+1]
    z = probs[..., :-1] @ v  # [B, H, T, D]
    return attn.W_O(z.transpose(1, 2).reshape(B, T, H * D)), probs[..., :-1], probs[..., -1]


@pytest.mark.parametrize("n_kv, window", [(1, None), (5, 3)])
def test_both_paths_and_query_chunks_match_the_naive_softmax(n_kv, window):
    cfg = _cfg(n_kv_heads=n_kv, sliding_window=None if window is None else [window, None])
    model = _redrawn(cfg)
    attn = model.blocks[0].attn
    x = torch.randn(2, 9, 40, generator=torch.Generator().manual_seed(1))
    key_keep = torch.ones(2, 9, dtype=torch.bool)
    key_keep[1, :2] = False  # left padding in the second sequence
    want, want_pattern, want_sink = _naive(attn, x, window, key_keep)
    mask = AttnMask(T=9, S=9, start=0, causal=True, key_keep=key_keep)
    seen = {}
    with torch.no_grad():
        fused = attn(x, mask=mask, positions=torch.arange(9))  # SDPA with one more key
        removers = [attn.hook_pattern.add_hook(lambda t, hook: seen.__setitem__("pattern", t)),
                    attn.hook_sink_mass.add_hook(lambda t, hook: seen.__setitem__("sink", t))]
        explicit = attn(x, mask=mask, positions=torch.arange(9))
        for remove in removers:
            remove()
        attn.query_chunk = 4
        attn.hook_sink_mass.add_hook(lambda t, hook: None)  # chunks of the explicit path
        chunked = attn(x, mask=mask, positions=torch.arange(9))
    real = key_keep[:, :, None].expand(2, 9, 40)  # a padding query's output is meaningless either way
    for got in (fused, explicit, chunked):
        torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
    rows = key_keep[:, None, :, None].expand_as(want_pattern)
    torch.testing.assert_close(seen["pattern"][rows], want_pattern[rows], rtol=0, atol=1e-6)
    torch.testing.assert_close(seen["sink"][rows[..., 0]], want_sink[rows[..., 0]], rtol=0, atol=1e-6)
    # pattern row + sink mass = 1, and the sinks take real mass (they were drawn large)
    torch.testing.assert_close(seen["pattern"].sum(-1) + seen["sink"], torch.ones(2, 5, 9), rtol=0, atol=1e-6)
    assert 0.05 < float(seen["sink"].mean()) < 0.95


def test_a_huge_sink_takes_every_row_and_writes_nothing():
    model = _redrawn(_cfg())
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.sinks.fill_(60.0)
        x = torch.randn(1, 6, 40)
        _, trace = model.run_with_cache(torch.randint(0, 31, (1, 6)), names_filter="*hook_sink_mass")
        out = attn(x, mask=AttnMask(T=6, S=6, start=0, causal=True), positions=torch.arange(6))
    assert float(trace["blocks.0.attn.hook_sink_mass"].min()) > 1 - 1e-6
    torch.testing.assert_close(out, attn.W_O.bias.expand_as(out), rtol=0, atol=1e-5)  # only W_O's bias is left


def test_sinks_change_the_model_and_the_cache_holds_only_real_keys():
    model = _redrawn(_cfg(sliding_window=[4, None]))
    ids = torch.randint(0, 31, (2, 20), generator=torch.Generator().manual_seed(2))
    plain = Transformer(_cfg(sliding_window=[4, None], attn_sinks=False)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.endswith("sinks")})
    with torch.no_grad():
        full = model(ids)
        assert (plain(ids) - full).abs().max() > 1e-2  # the sinks bite
        cache = model.make_cache(2, 20)
        steps = [model(ids[:, :7], kv_cache=cache)[:, -1]]
        for t in range(7, 20):  # one token at a time, well past the window
            steps.append(model(ids[:, t:t + 1], kv_cache=cache)[:, -1])
    torch.testing.assert_close(torch.stack(steps[1:], 1), full[:, 7:], rtol=0, atol=1e-5)
    torch.testing.assert_close(steps[0], full[:, 6], rtol=0, atol=1e-5)
    assert cache.layers[0].buffers[0].shape[2] == 3  # the windowed layer keeps window - 1 positions, no sink


def test_traced_decode_step_keeps_the_sinks():
    model = _redrawn(_cfg())
    decoder = LeanDecoder.build(model, DecodeLayout.plain(model, 1))
    assert decoder is not None, LeanDecoder.unsupported(model)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        a, b = model.make_cache(1), model.make_cache(1)
        model(ids, kv_cache=a)
        model(ids, kv_cache=b)
        for tok in (9, 2, 6):
            torch.testing.assert_close(decoder.step(torch.tensor([tok]), a),
                                       model(torch.tensor([[tok]]), kv_cache=b)[:, -1], rtol=0, atol=1e-5)
    prompt = ids[:, :3]
    assert torch.equal(model.generate(prompt, max_new_tokens=12), model.generate(prompt, 12, use_cache=False))


def test_removing_heads_removes_their_sinks():
    model = _redrawn(_cfg(n_kv_heads=5))
    ids = torch.randint(0, 31, (2, 10), generator=torch.Generator().manual_seed(4))
    gates = [torch.ones(5), torch.ones(5)]
    gates[0][[1, 3]] = 0.0
    model.set_head_gates(gates)
    with torch.no_grad():
        gated = model(ids)
    model.set_head_gates(None)
    pruned = remove_heads(model, {0: [1, 3]})
    assert torch.equal(pruned.blocks[0].attn.sinks, model.blocks[0].attn.sinks[[0, 2, 4]])
    with torch.no_grad():
        torch.testing.assert_close(pruned(ids), gated, rtol=0, atol=1e-5)
        _, trace = pruned.run_with_cache(ids, names_filter="*hook_sink_mass")
    assert trace["blocks.0.attn.hook_sink_mass"].shape == (2, 3, 10)


@pytest.mark.parametrize("kw, words", [
    (dict(attention="latent", kv_latent_dim=8, n_kv_heads=None, rope_dim=4), ["attn_sinks=True", "latent"]),
    (dict(attn_sinks="yes"), ["attn_sinks='yes'"]),
    (dict(attn_sinks=False, swiglu_limit=3.0), ["swiglu_limit=3.0", "swiglu_clamped", "activation='swiglu'"]),
    (dict(activation="swiglu_clamped", swiglu_alpha=-1.0), ["swiglu_alpha=-1.0"]),
    (dict(attn_sinks=False, expert_bias=True), ["expert_bias=True", "n_experts"]),
])
def test_bad_settings_are_refused_by_name(kw, words):
    with pytest.raises((ValueError, TypeError)) as err:
        _cfg(**kw)
    for word in words:
        assert word in str(err.value)


def test_clamped_swiglu_matches_its_formula_in_a_dense_mlp():
    cfg = _cfg(attn_sinks=False, activation="swiglu_clamped", swiglu_alpha=1.5, swiglu_limit=0.5)
    mlp = _redrawn(cfg).blocks[0].mlp
    x = torch.randn(3, 40)
    gate, up = mlp.W_gate(x), mlp.W_in(x)
    assert gate.abs().max() > 0.5 and up.abs().max() > 0.5  # the clamp bites
    g = gate.clamp(max=0.5)
    want = mlp.W_out((up.clamp(-0.5, 0.5) + 1) * g * torch.sigmoid(1.5 * g))
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), want, rtol=0, atol=1e-6)


def _textbook_softmax_with_sink(scores, sink):
    """The naive formula: softmax over [keys | sink] (one widened row), split into the keys' part and the sink's."""
    B, H, c, _ = scores.shape
    probs = torch.softmax(torch.cat([scores, sink.expand(B, H, c, 1)], dim=-1), dim=-1)  # [B, H, c, n+1]
    return probs[..., :-1], probs[..., -1]


@pytest.mark.parametrize("sink_value", [None, 60.0, -60.0])
def test_softmax_with_sink_equals_the_widened_softmax(sink_value):
    # The explicit path's one-softmax-and-rescale (no exp of masked scores) against softmax over [keys | sink]:
    # random and extreme sinks (all mass / none), masked keys (finfo.min, as the mask writes them), and gradients.
    from interp.attention import _softmax_with_sink

    g = torch.Generator().manual_seed(5)
    scores = torch.randn(2, 3, 7, 7, generator=g, dtype=torch.float64) * 4
    scores = scores + torch.full((7, 7), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)
    sink = torch.randn(1, 3, 1, 1, generator=g, dtype=torch.float64) * 3
    if sink_value is not None:
        sink[0, 1] = sink_value
    pattern, mass = _softmax_with_sink(scores.clone(), sink)
    want_pattern, want_mass = _textbook_softmax_with_sink(scores, sink)
    torch.testing.assert_close(pattern, want_pattern, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(mass, want_mass, rtol=1e-12, atol=1e-15)
    assert bool((pattern[..., torch.ones(7, 7, dtype=torch.bool).triu(1)] == 0).all())  # masked keys: exactly 0
    # autograd through the rescaled softmax equals autograd through the widened one
    weights = torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64)
    grads = []
    for fn in (_softmax_with_sink, _textbook_softmax_with_sink):
        s, k = scores.clone().requires_grad_(), sink.clone().requires_grad_()
        p, m = fn(s, k)
        (torch.cat([p, m[..., None]], -1) * weights).sum().backward()
        grads.append((s.grad, k.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-10, atol=1e-12)


def test_recorded_sink_mass_is_unchanged_in_float32():
    # A gpt-oss-like layer in float32 on a 64-token pass: the recorded pattern and sink mass against the
    # widened softmax of the recorded scores (the values the earlier exp / sum formula gave, to float rounding).
    model = _redrawn(_cfg(n_kv_heads=5, n_ctx=64, sliding_window=[16, None]))
    ids = torch.randint(0, 31, (2, 64), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        _, trace = model.run_with_cache(ids, names_filter=["*hook_attn_scores", "*hook_pattern", "*hook_sink_mass"])
    for layer in range(2):
        sink = model.blocks[layer].attn.sinks.view(1, 5, 1, 1)
        want_pattern, want_mass = _textbook_softmax_with_sink(trace[f"blocks.{layer}.attn.hook_attn_scores"], sink)
        torch.testing.assert_close(trace.sink_mass(layer), want_mass, rtol=0, atol=1e-6)
        torch.testing.assert_close(trace.pattern(layer), want_pattern, rtol=0, atol=1e-6)


def test_the_fused_sink_path_runs_on_a_fused_kernel():
    # The sink key's padding gives q, k and v one head size, so SDPA's fused CPU kernel takes the pass; with
    # unequal sizes it fell back to the unfused math path (~1.4x the attention time), which this refuses.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = _redrawn(_cfg(n_kv_heads=1, d_head=8, sliding_window=[4, None]))
    ids = torch.randint(0, 31, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(ids)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            fused = model(ids)
        _, trace = model.run_with_cache(ids, names_filter="*hook_sink_mass")  # the explicit path, for reference
    torch.testing.assert_close(fused, want, rtol=0, atol=0)
    assert float(trace.sink_mass(0).mean()) > 0.05  # the sinks take mass, so the sink key matters
