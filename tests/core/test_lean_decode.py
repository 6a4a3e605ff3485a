"""LeanDecoder, the hook-free decode step: each step's logits and cache writes equal the hooked forward pass
with a KV cache (an independent path through the modules), for every llama-family shape it accepts; generate
uses it only while nothing could observe the difference, and falls back for hooks, gates and weight edits."""

from __future__ import annotations

import pytest
import torch
from core_helpers import make

import interp.decode as decode_mod
from interp.decode import LeanDecoder

needs_mkl = pytest.mark.skipif(not decode_mod._mkl_packing_available(), reason="this torch build has no MKL packed sgemm")

LLAMA = dict(n_kv_heads=4, positional="rotary", normalization="rms", activation="swiglu", attn_bias=False,
             out_bias=False, mlp_bias=False)
SHAPES = {
    "gqa": {},
    "mqa": dict(n_kv_heads=1),
    "mha-biases": dict(n_kv_heads=8, attn_bias=True, out_bias=True, mlp_bias=True),  # Qwen-style biases too
    "partial-rotary": dict(rotary_dim=4),
    "ungated-mlp": dict(activation="gelu"),
    "attn-only": dict(attn_only=True),
    "per-layer-heads": dict(n_heads=8, n_kv_heads=4, layer_n_heads=[6, 2], layer_n_kv_heads=[3, 1]),
    "untied-geglu": dict(activation="geglu", tie_embeddings=False),
}


def llama(shape: str, **over):
    return make("mha", **{**LLAMA, **SHAPES[shape], **over})


def _count_lean_steps(monkeypatch) -> list[int]:
    calls = []
    real = LeanDecoder.step
    monkeypatch.setattr(LeanDecoder, "step", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


@pytest.mark.parametrize(("layout", "rows"), [
    ("copies", 1),  # transposed, the gated MLP's gate and input fused
    ("copies", decode_mod.PACK_MIN_ROWS + 1),  # MKL-packed
    ("plain", 1), ("plain", 3),  # the weights themselves, as generate() runs without copies
])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_step_equals_the_hooked_cached_forward(shape, layout, rows):
    if layout == "copies" and not decode_mod._mkl_packing_available():
        pytest.skip("this torch build has no MKL packed sgemm")
    model = llama(shape)
    tokens = torch.randint(0, 37, (rows, 9), generator=torch.Generator().manual_seed(1))
    hooked, lean_cache = model.make_cache(rows, 9), model.make_cache(rows, 9)
    copies = decode_mod._packed_linears(model, rows=rows, enabled=layout == "copies")
    with torch.no_grad(), copies as laid_out:
        laid_out = laid_out if layout == "copies" else decode_mod.DecodeLayout.plain(model, rows)
        decoder = LeanDecoder.build(model, laid_out)
        assert decoder is not None and decoder.usable(rows)
        mlp = model.blocks[0].mlp
        fused = layout == "copies" and rows < decode_mod.PACK_MIN_ROWS and mlp is not None and mlp.gated
        assert (mlp in laid_out.fused_mlp) == fused
        model(tokens[:, :4], kv_cache=hooked)
        model(tokens[:, :4], kv_cache=lean_cache)
        for t in range(4, 9):
            want = model(tokens[:, t:t + 1], kv_cache=hooked)[:, -1]  # [rows, V]
            got = decoder.step(tokens[:, t], t, lean_cache)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            assert lean_cache.length == hooked.length == t + 1
        for a, b in zip(lean_cache.layers, hooked.layers):
            for x, y in zip(a.buffers, b.buffers):
                torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


@needs_mkl
@pytest.mark.parametrize("rows", [1, 5])
def test_generate_inside_decoding_runs_lean_steps_and_equals_the_hooked_and_full_paths(rows, monkeypatch):
    model = llama("gqa")
    prompt = torch.randint(0, 37, (rows, 4), generator=torch.Generator().manual_seed(2))
    plain = model.generate(prompt, 8, pack_weights=False)
    full = model.generate(prompt, 8, use_cache=False)
    calls = _count_lean_steps(monkeypatch)
    with model.decoding(batch_size=rows):
        assert torch.equal(model.generate(prompt, 8), plain)
        assert len(calls) == 7  # every step past the prompt
        with model.decoding(batch_size=rows):  # nested: the outer copies serve, nothing is rebuilt
            assert torch.equal(model.generate(prompt, 8), plain)
    assert torch.equal(plain, full)
    assert model._decode_layout is None and not any("forward" in m.__dict__ for m in model.modules())


@needs_mkl
def test_hooks_gates_and_edits_make_every_step_the_hooked_pass(monkeypatch):
    model = llama("gqa")
    prompt = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(3))
    gates = torch.ones(2, 8)
    gates[1, 3] = 0.0
    plain = model.generate(prompt, 6, pack_weights=False)
    model.set_head_gates(gates)
    plain_gated = model.generate(prompt, 6, pack_weights=False)
    model.set_head_gates(None)
    calls = _count_lean_steps(monkeypatch)
    fired = []
    with model.decoding(batch_size=1):
        with model.hooks([("blocks.1.hook_resid_post", lambda x, hook: fired.append(x.shape[1]))]):
            assert torch.equal(model.generate(prompt, 6), plain)
        assert fired == [4, 1, 1, 1, 1, 1] and calls == []  # the hook saw the prompt and every step
        model.set_head_gates(gates)
        assert torch.equal(model.generate(prompt, 6), plain_gated) and calls == []
        model.set_head_gates(None)
        with torch.no_grad():
            model.blocks[1].mlp.W_out.weight.mul_(-4.0)  # edited in place: every copy of it is now stale
        edited = model.generate(prompt, 6)
        assert calls == []
    assert torch.equal(edited, model.generate(prompt, 6, pack_weights=False))
    assert not torch.equal(edited, plain)  # the edit changed the generation, so the check above has teeth


@pytest.mark.parametrize(("variant", "over", "reason"), [
    ("mla", {}, "attention='latent'"),
    ("gqa", {}, "normalization='pre'"),
    ("gqa-rotary", dict(causal=False, unembed=True), "not a causal decoder"),
    ("gqa-rotary", dict(use_sdpa=False), "use_sdpa=False"),
])
def test_models_it_does_not_cover_are_named_and_take_the_hooked_path(variant, over, reason):
    model = make(variant, **over)
    assert reason in LeanDecoder.unsupported(model)
    assert LeanDecoder.build(model, decode_mod.DecodeLayout(rows=1, linears={}, fused_mlp={})) is None


def test_without_copies_generate_runs_lean_steps_on_the_weights_themselves(monkeypatch):
    model = llama("gqa")
    prompt = torch.randint(0, 37, (2, 4), generator=torch.Generator().manual_seed(4))
    with decode_mod._packed_linears(model, rows=1, enabled=False) as layout:
        assert len(layout) == 0 and LeanDecoder.build(model, layout) is None  # no copies: nothing to run on
    with torch.no_grad():
        hooked = model.hooks([("blocks.0.hook_resid_pre", lambda x, hook: None)])  # forces the hooked pass
        with hooked:
            want = model.generate(prompt, 7, pack_weights=False)
    calls = _count_lean_steps(monkeypatch)
    assert torch.equal(model.generate(prompt, 7, pack_weights=False), want) and len(calls) == 6
    assert torch.equal(want, model.generate(prompt, 7, use_cache=False))


def test_bfloat16_models_decode_lean_on_their_own_weights(monkeypatch):
    model = llama("gqa").to(torch.bfloat16)
    prompt = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(5))
    hooked, lean_cache = model.make_cache(1, 8), model.make_cache(1, 8)
    with torch.no_grad():
        decoder = LeanDecoder.build(model, decode_mod.DecodeLayout.plain(model, 1))
        model(prompt, kv_cache=hooked)
        model(prompt, kv_cache=lean_cache)
        nxt = torch.tensor([5])
        want = model(nxt[:, None], kv_cache=hooked)[:, -1]
        got = decoder.step(nxt, 4, lean_cache)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_a_model_built_under_inference_mode_decodes_on_its_own_weights():
    # Inference tensors have no version counter: no copy is made of them (it could not see an edit), and the
    # lean step reads the weights themselves.
    with torch.inference_mode():
        model = llama("gqa")
        prompt = torch.randint(0, 37, (decode_mod.PACK_MIN_ROWS + 1, 3), generator=torch.Generator().manual_seed(6))
        full = model.generate(prompt, decode_mod.PACK_MIN_STEPS, use_cache=False)
        assert torch.equal(model.generate(prompt, decode_mod.PACK_MIN_STEPS), full)
        with model.decoding(batch_size=1) as m:
            assert len(m._decode_layout) == 0
            assert torch.equal(model.generate(prompt[:1], 5), full[:1, :8])
