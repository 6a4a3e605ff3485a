"""Decoding's fast paths equal the plain ones: MKL-packed weights, the shared rotary angles, the in-place MLP,
and the static KV cache (written in place, no buffer reallocated per step)."""

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
def test_packed_linears_equal_f_linear_for_every_row_count(bias):
    model = make("gqa-rotary", attn_bias=bias, mlp_bias=bias, out_bias=bias)
    lin = model.blocks[0].mlp.W_in
    with torch.no_grad(), decode_mod._packed_linears(model, rows=5) as layout:
        assert len(layout) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
        for rows in (5, 1, 7):  # the packed row count, and two that MKL multiplies by the plain weight
            x = torch.randn(rows, 1, lin.in_features)
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-6, rtol=1e-5)
    assert _patched(model) == []


@needs_mkl
@pytest.mark.parametrize("bias", [False, True])
def test_transposed_linears_below_pack_min_rows_equal_f_linear(bias):
    model = make("gqa-rotary", attn_bias=bias, mlp_bias=bias, out_bias=bias)
    lin = model.blocks[1].attn.W_qkv
    rows = decode_mod.PACK_MIN_ROWS - 1
    with torch.no_grad(), decode_mod._packed_linears(model, rows=rows):
        assert lin.forward.func is decode_mod._layout_forward and lin.forward.args[1].multiply is decode_mod._transposed_mm
        x = torch.randn(rows, 1, lin.in_features)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-6, rtol=1e-5)
        prompt = torch.randn(rows, 5, lin.in_features)  # another row count: exactly the plain product
        assert torch.equal(lin(prompt), F.linear(prompt, lin.weight, lin.bias))
        lin.weight.mul_(2)  # an edit makes the copy stale: the layer must see it
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-6, rtol=1e-5)
    assert _patched(model) == []


@needs_mkl
@pytest.mark.parametrize("variant", ["gqa-rotary", "mla"])
def test_decoding_block_builds_the_layout_once_and_generates_the_same_tokens(variant):
    model = make(variant)
    one = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(6))
    five = torch.randint(0, 37, (5, 4), generator=torch.Generator().manual_seed(7))
    plain_one, plain_five = model.generate(one, 7, pack_weights=False), model.generate(five, 7, pack_weights=False)
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    with model.decoding(batch_size=1) as m:
        assert m is model and len(_patched(model)) == n_linear
        copies = {name: mod.forward.args[1].copy for name, mod in model.named_modules() if "forward" in mod.__dict__}
        assert torch.equal(model.generate(one, 7), plain_one)
        assert torch.equal(model.generate(one, 7), model.generate(one, 7, use_cache=False))
        assert torch.equal(model.generate(five, 7), plain_five)  # another batch size: the plain weights
        # the same copies serve every call of the block
        assert all(mod.forward.args[1].copy is copies[name] for name, mod in model.named_modules() if name in copies)
    assert _patched(model) == []
    with pytest.raises(RuntimeError, match="inside"), model.decoding(batch_size=1):
        raise RuntimeError("inside")
    assert _patched(model) == [] and not model.lock._is_owned()


def test_decoding_rejects_a_bad_batch_size():
    model = make("gqa-rotary")
    with pytest.raises(ValueError, match="batch_size=0"), model.decoding(batch_size=0):
        pass
    with pytest.raises(TypeError, match="batch_size=1.5"), model.decoding(batch_size=1.5):
        pass
    assert _patched(model) == []


@needs_mkl
def test_packed_linears_fall_back_under_autograd_and_after_an_edit():
    model = make("gqa-rotary")
    lin = model.blocks[1].attn.W_qkv
    x = torch.randn(4, lin.in_features, requires_grad=True)
    with decode_mod._packed_linears(model, rows=4):
        y = lin(x)  # grad mode: the plain path, so gradients flow
        y.sum().backward()
        torch.testing.assert_close(x.grad, lin.weight.sum(0).expand_as(x))
        with torch.no_grad():
            lin.weight.mul_(2)  # the packed copy is now stale: the layer must see the edit
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight), atol=1e-6, rtol=1e-5)


@needs_mkl
@pytest.mark.parametrize("variant", ["gqa-rotary", "mha", "mla"])
def test_packed_generate_equals_unpacked_and_full_recompute(variant):
    model = make(variant)
    prompt = torch.randint(0, 37, (decode_mod.PACK_MIN_ROWS + 1, 4), generator=torch.Generator().manual_seed(3))
    seen = []
    model.blocks[0].attn.hook_z.add_hook(lambda z, hook: seen.append(bool(_patched(model))) or z)
    packed = model.generate(prompt, decode_mod.PACK_MIN_STEPS + 2)
    model.blocks[0].attn.hook_z.remove_hooks()
    assert any(seen) and _patched(model) == []  # packing was on during the run, and undone after it
    assert torch.equal(packed, model.generate(prompt, decode_mod.PACK_MIN_STEPS + 2, pack_weights=False))
    assert torch.equal(packed, model.generate(prompt, decode_mod.PACK_MIN_STEPS + 2, use_cache=False))
    assert torch.equal(packed[:1, :7], model.generate(prompt[:1], 3, pack_weights=True))  # forced, one row


@needs_mkl
def test_generate_packs_only_when_it_pays_or_is_asked(monkeypatch):
    model = make("gqa-rotary")
    seen = []
    model.blocks[0].attn.hook_z.add_hook(lambda z, hook: seen.append(bool(_patched(model))) or z)

    def packed_during(n_seq, steps, **kw):
        seen.clear()
        model.generate(torch.zeros(n_seq, 2, dtype=torch.long), steps, **kw)
        return any(seen)

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
    model.blocks[1].hook_resid_post.remove_hooks()
    assert _patched(model) == []
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
    assert torch.equal(rotary_mod._LAST[0], pos)
    with torch.inference_mode():  # inference tensors (no version counter) edited in place, too
        ipos = torch.arange(5)
        a(x, ipos)
        ipos.add_(2)
        torch.testing.assert_close(a(x, ipos)[0, :, 1], naive_rotary(x[0, :, 1], ipos, 8, 10000.0), atol=1e-5,
                                   rtol=0)


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
