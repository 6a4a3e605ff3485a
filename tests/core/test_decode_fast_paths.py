"""Decoding's fast paths equal the plain ones: MKL-packed and transposed weight layouts (no layer patched), the
shared rotary angles, the in-place MLP, and the static KV cache (written in place, no buffer reallocated per step)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from core_helpers import VARIANTS, make, naive_rotary

import interp.decode as decode_mod
import interp.rotary as rotary_mod
from interp.rotary import Rotary

needs_mkl = pytest.mark.skipif(not decode_mod._mkl_packing_available(), reason="this torch build has no MKL packed sgemm")


def _patched(model) -> list[str]:
    return [name for name, mod in model.named_modules() if "forward" in mod.__dict__]


@needs_mkl
@pytest.mark.parametrize("bias", [False, True])
def test_packed_products_equal_f_linear_and_other_row_counts_get_the_plain_one(bias):
    model = make("gqa-rotary", attn_bias=bias, mlp_bias=bias, out_bias=bias)
    lin = model.blocks[0].mlp.W_in
    layout = decode_mod.DecodeLayout.build(model, 5)
    assert len(layout.packed) == len(decode_mod._linears(model)) and _patched(model) == []  # nothing patched
    with torch.no_grad():
        for rows in (5, 1, 7):  # the packed row count, and two that multiply by the plain weight
            x = torch.randn(rows, 1, lin.in_features)
            torch.testing.assert_close(layout.product(lin, rows)(x), F.linear(x, lin.weight, lin.bias),
                                       atol=1e-6, rtol=1e-5)
    assert layout.product(lin, 7).func is F.linear and layout.product(lin, 5).func is decode_mod._packed_mm


@needs_mkl
@pytest.mark.parametrize("bias", [False, True])
def test_transposed_copies_below_pack_min_rows_equal_f_linear_until_the_weight_is_edited(bias):
    model = make("gqa-rotary", attn_bias=bias, mlp_bias=bias, out_bias=bias)
    lin = model.blocks[1].attn.W_qkv
    rows = decode_mod.PACK_MIN_ROWS - 1
    layout = decode_mod.DecodeLayout.build(model, rows)
    assert lin in layout.transposed and layout.transposed[lin][3].is_contiguous()  # [in, out] storage
    with torch.no_grad():
        x = torch.randn(rows, 1, lin.in_features)
        torch.testing.assert_close(layout.product(lin, rows)(x), F.linear(x, lin.weight, lin.bias), atol=1e-6,
                                   rtol=1e-5)
        lin.weight.mul_(2)  # an edit makes the copy stale: the product must read the weight
        assert layout.stale(lin)
        torch.testing.assert_close(layout.product(lin, rows)(x), F.linear(x, lin.weight, lin.bias), atol=1e-6,
                                   rtol=1e-5)


@needs_mkl
@pytest.mark.parametrize("variant", ["gqa-rotary", "mla"])
def test_decoding_block_lays_the_weights_out_once_and_generates_the_same_tokens(variant):
    model = make(variant)
    one = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(6))
    five = torch.randint(0, 37, (5, 4), generator=torch.Generator().manual_seed(7))
    plain_one, plain_five = model.generate(one, 7, pack_weights=False), model.generate(five, 7, pack_weights=False)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    lin = model.blocks[0].attn.W_O
    with model.decoding(batch_size=1) as m:
        layout = model._decode_layout
        # the parameters themselves, stored [in, out]: the same values, no copy held
        assert m is model and lin.weight.stride() == (1, lin.out_features) and len(layout.relaid) > 0
        assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
        assert torch.equal(model.generate(one, 7), plain_one)
        assert torch.equal(model.generate(one, 7), model.generate(one, 7, use_cache=False))
        assert torch.equal(model.generate(five, 7), plain_five)  # another batch size: the plain products
        assert model._decode_layout is layout  # the same layout serves every call of the block
    assert all(p.is_contiguous() and torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert _patched(model) == []
    with pytest.raises(RuntimeError, match="inside"), model.decoding(batch_size=1):
        raise RuntimeError("inside")
    assert all(p.is_contiguous() for p in model.parameters()) and not model.lock._is_owned()


def test_decoding_rejects_a_bad_batch_size():
    model = make("gqa-rotary")
    with pytest.raises(ValueError, match="batch_size=0"), model.decoding(batch_size=0):
        pass
    with pytest.raises(TypeError, match="batch_size=1.5"), model.decoding(batch_size=1.5):
        pass
    assert _patched(model) == [] and getattr(model, "_decode_layout", None) is None


@needs_mkl
def test_lean_steps_are_not_used_under_autograd_and_stale_copies_not_after_an_edit():
    model = make("gqa-rotary")
    lin = model.blocks[1].attn.W_qkv
    layout = decode_mod.DecodeLayout.build(model, 4, held=True)
    decoder = decode_mod.LeanDecoder.build(model, layout)
    assert not decoder.usable(4)  # grad mode: the hooked pass, so gradients flow
    with torch.no_grad():
        assert decoder.usable(4) and not decoder.usable(3)
        assert not layout.stale(lin)
        lin.weight.data.mul_(2)  # behind the version counter: the fingerprint sees it
        assert layout.stale(lin)
        x = torch.randn(4, lin.in_features)
        torch.testing.assert_close(layout.product(lin, 4)(x), F.linear(x, lin.weight), atol=1e-6, rtol=1e-5)


def _layouts_built(monkeypatch) -> list[int]:
    """The size of every layout generate() builds for itself (0: plain, no copies)."""
    import interp.generate as gen_mod

    sizes = []
    real = gen_mod.layout_for_generate

    def spy(*a, **kw):
        layout = real(*a, **kw)
        sizes.append(len(layout))
        return layout

    monkeypatch.setattr(gen_mod, "layout_for_generate", spy)
    return sizes


@needs_mkl
@pytest.mark.parametrize("variant", ["gqa-rotary", "mha", "mla"])
def test_packed_generate_equals_unpacked_and_full_recompute(variant, monkeypatch):
    model = make(variant)
    prompt = torch.randint(0, 37, (decode_mod.PACK_MIN_ROWS + 1, 4), generator=torch.Generator().manual_seed(3))
    sizes = _layouts_built(monkeypatch)
    packed = model.generate(prompt, decode_mod.PACK_MIN_STEPS + 2)
    assert sizes[-1] > 0 and _patched(model) == []  # packing was on during the run, and nothing patched
    assert torch.equal(packed, model.generate(prompt, decode_mod.PACK_MIN_STEPS + 2, pack_weights=False))
    assert torch.equal(packed, model.generate(prompt, decode_mod.PACK_MIN_STEPS + 2, use_cache=False))
    assert torch.equal(packed[:1, :7], model.generate(prompt[:1], 3, pack_weights=True))  # forced, one row
    assert sizes[-1] > 0


@needs_mkl
def test_generate_lays_weights_out_only_when_it_pays_or_is_asked(monkeypatch):
    model = make("gqa-rotary")
    sizes = _layouts_built(monkeypatch)

    def packed_during(n_seq, steps, **kw):
        model.generate(torch.zeros(n_seq, 2, dtype=torch.long), steps, **kw)
        return sizes[-1] > 0

    rows, steps = decode_mod.PACK_MIN_ROWS, decode_mod.PACK_MIN_STEPS
    assert packed_during(rows, steps)
    assert not packed_during(rows - 1, steps) and not packed_during(rows, steps - 1)
    assert not packed_during(rows, steps, use_cache=False) and not packed_during(rows, steps, pack_weights=False)
    assert packed_during(1, 2, pack_weights=True)
    monkeypatch.setattr(decode_mod, "TRANSPOSE_MIN_STEPS", steps + 2)  # the tiny model's n_ctx is 24
    assert packed_during(1, steps + 2) and not packed_during(1, steps + 1)
    monkeypatch.setattr(decode_mod, "PACK_MAX_BYTES", 0)  # weights "too large" to copy
    assert not packed_during(rows, steps)
    with pytest.raises(TypeError, match="pack_weights='yes'"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, pack_weights="yes")


def test_generate_restores_every_layer_when_a_hook_raises():
    model = make("gqa-rotary")

    def boom(x, hook):
        raise ValueError("stop here")

    model.blocks[1].hook_resid_post.add_hook(boom)
    with pytest.raises(ValueError, match="stop here"):
        model.generate(torch.zeros(decode_mod.PACK_MIN_ROWS, 3, dtype=torch.long), decode_mod.PACK_MIN_STEPS)
    with model.decoding(batch_size=1), pytest.raises(ValueError, match="stop here"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 4)
    model.blocks[1].hook_resid_post.remove_hooks()
    assert _patched(model) == [] and all(p.is_contiguous() for p in model.parameters())
    assert not model.lock._is_owned()  # the run's lock was released too


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_generate_equals_a_loop_of_full_forward_passes(variant):
    model = make(variant)
    prompt = torch.randint(0, 37, (2, 3), generator=torch.Generator().manual_seed(4))
    ids = prompt
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)  # [B, T + 1]
    assert torch.equal(model.generate(prompt, 6), ids)


def test_static_cache_is_written_in_place_and_equals_full_recompute():
    model = make("gqa-rotary")
    tokens = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(5))
    cache = model.make_cache(batch_size=2, max_len=9)
    ptrs = [b.data_ptr() for layer in cache.layers for b in layer.buffers]
    with torch.no_grad():
        full = model(tokens)
        steps = [model(tokens[:, :4], kv_cache=cache)] + [model(tokens[:, t:t + 1], kv_cache=cache)
                                                          for t in range(4, 9)]
    assert [b.data_ptr() for layer in cache.layers for b in layer.buffers] == ptrs
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_rotary_angles_are_shared_only_for_the_same_positions_and_base():
    x = torch.randn(1, 5, 2, 8)
    pos = torch.arange(3, 8)
    a, b = Rotary(8, base=10000.0), Rotary(8, base=500.0)
    ya, yb = a(x, pos), b(x, pos)  # same positions object, different bases: b must not reuse a's angles
    for h in range(2):
        torch.testing.assert_close(ya[0, :, h], naive_rotary(x[0, :, h], pos, 8, 10000.0), atol=1e-5, rtol=0)
        torch.testing.assert_close(yb[0, :, h], naive_rotary(x[0, :, h], pos, 8, 500.0), atol=1e-5, rtol=0)
    pos.add_(1)  # edited in place: the memoised angles are stale
    torch.testing.assert_close(a(x, pos)[0, :, 0], naive_rotary(x[0, :, 0], pos, 8, 10000.0), atol=1e-5, rtol=0)
    assert rotary_mod._LAST[0][0] is pos
    with torch.inference_mode():  # inference tensors (no version counter) edited in place, too
        ipos = torch.arange(5)
        a(x, ipos)
        ipos.add_(2)
        torch.testing.assert_close(a(x, ipos)[0, :, 1], naive_rotary(x[0, :, 1], ipos, 8, 10000.0), atol=1e-5,
                                   rtol=0)


def test_rotary_angles_are_shared_across_layers_without_reading_values_but_not_after_an_edit():
    x = torch.randn(1, 5, 2, 8)
    pos = torch.arange(5)
    a, b, c = Rotary(8), Rotary(8), Rotary(8)
    a(x, pos)
    kept = rotary_mod._LAST
    b(x, pos)  # another layer, same settings and positions: the same angles, not recomputed
    assert rotary_mod._LAST is kept
    with torch.no_grad():
        c.inv_freq.mul_(2.0)  # a researcher's edit of one layer's frequencies
    edited = c(x, pos)
    assert rotary_mod._LAST is not kept
    for h in range(2):  # doubled frequencies rotate as doubled positions do
        torch.testing.assert_close(edited[0, :, h], naive_rotary(x[0, :, h], 2 * pos, 8, 10000.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(a(x, pos)[0, :, 0], naive_rotary(x[0, :, 0], pos, 8, 10000.0), atol=1e-5, rtol=0)


def test_rotary_angles_from_inference_mode_are_not_reused_under_autograd():
    rot = Rotary(8)
    pos = torch.arange(4)
    with torch.inference_mode():
        rot(torch.randn(1, 4, 1, 8), pos)
    x = torch.randn(1, 4, 1, 8, requires_grad=True)
    rot(x, pos).pow(2).sum().backward()  # would raise if inference tensors were saved for backward
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "gelu"])
def test_mlp_in_place_without_autograd_equals_the_autograd_path(activation):
    model = make("gqa-rotary", activation=activation)
    mlp = model.blocks[0].mlp
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        fast = mlp(x)
    assert torch.equal(fast, mlp(x).detach())
