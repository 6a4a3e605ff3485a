"""One dtype policy: load_checkpoint and remove_heads build the model in its target dtype through
placement.build (never a float32 model cast afterwards), so their models are the models build gives."""

from __future__ import annotations

import pytest
import torch

import interp.pruning.surgery as surgery_mod
import interp.zoo.checkpoint as checkpoint_mod
from interp import ModelConfig
from interp.placement import build
from interp.pruning import remove_heads
from interp.zoo import load_checkpoint, save_checkpoint

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=40, n_ctx=16, positional="rotary",
                  normalization="rms", activation="swiglu")
TOKENS = torch.tensor([[1, 7, 3, 9, 2, 5]])


def _spy(monkeypatch, module) -> list[tuple]:
    calls = []
    real = module.build

    def spy(cfg, **kw):
        calls.append((kw.get("dtype"), kw.get("device")))
        return real(cfg, **kw)

    monkeypatch.setattr(module, "build", spy)
    return calls


def _no_cast(monkeypatch):
    real = torch.nn.Module.to

    def to(self, *a, **k):
        if any(isinstance(x, torch.dtype) for x in (*a, *k.values())):
            raise AssertionError("a model was cast after it was built")
        return real(self, *a, **k)

    monkeypatch.setattr(torch.nn.Module, "to", to)


@pytest.mark.parametrize("stored, asked, want", [
    (torch.bfloat16, None, torch.bfloat16),  # as stored
    (torch.float32, torch.float16, torch.float16),  # the dtype asked for
    (torch.bfloat16, torch.float32, torch.float32),
])
def test_load_checkpoint_builds_in_the_target_dtype(tmp_path, monkeypatch, stored, asked, want):
    model = build(CFG, dtype=stored, seed=0)
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    calls = _spy(monkeypatch, checkpoint_mod)
    _no_cast(monkeypatch)
    loaded = load_checkpoint(path, dtype=asked)
    monkeypatch.undo()
    # One build in the target dtype on the target device (a weightless one on the meta device first checks the
    # file's shapes against the config before anything is allocated).
    assert [c for c in calls if str(c[1]) != "meta"] == [(want, torch.device("cpu"))]
    assert {p.dtype for p in loaded.parameters()} == {want}
    # The same model build gives in that dtype, with the stored weights: buffers (rotary) included.
    ref = build(CFG, dtype=want, seed=1)
    ref.load_state_dict({k: v.to(want) for k, v in model.state_dict().items()})
    assert {k: (v.dtype, v.shape) for k, v in loaded.state_dict().items()} == \
        {k: (v.dtype, v.shape) for k, v in ref.state_dict().items()}
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS), ref(TOKENS))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_remove_heads_builds_in_the_models_dtype(monkeypatch, dtype):
    model = build(CFG, dtype=dtype, seed=0)
    off = torch.zeros(2, 4, dtype=torch.bool)
    off[0, :2] = True  # one whole K/V group of layer 0
    calls = _spy(monkeypatch, surgery_mod)
    _no_cast(monkeypatch)
    small = remove_heads(model, off)
    monkeypatch.undo()
    assert calls == [(dtype, model.W_E.device)]
    assert {p.dtype for p in small.parameters()} == {dtype}
    gates = (~off).to(dtype)
    with torch.no_grad():
        model.set_head_gates(gates)
        gated = model(TOKENS)
        model.set_head_gates(None)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(small(TOKENS), gated, atol=tol, rtol=tol)


# Learned positions: no rotary buffer, so the model cast from float32 (the policy before) and the model built in
# bf16 must agree bit for bit in weights and logits. (With rotary, the cast also rounded the non-persistent
# frequencies to bf16; a bf16 build keeps them float32 as transformers does: same weights, other logits.)
LEARNED = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=40, n_ctx=16, normalization="rms",
                      activation="swiglu")


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    with torch.no_grad():
        assert torch.equal(a(TOKENS), b(TOKENS))


def test_load_checkpoint_in_bf16_equals_a_float32_model_cast(tmp_path):
    model = build(LEARNED, dtype=torch.float32, seed=0)
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    old = build(LEARNED, dtype=torch.float32, seed=3)  # what loading did before: float32, the weights, a cast
    old.load_state_dict(model.state_dict())
    _same(load_checkpoint(path, dtype=torch.bfloat16), old.to(torch.bfloat16).eval())


def test_remove_heads_equals_the_float32_build_then_cast_and_leaves_the_model_as_it_was(monkeypatch):
    model = build(LEARNED, dtype=torch.bfloat16, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    off = torch.zeros(2, 4, dtype=torch.bool)
    off[0, :2] = True
    off[1, 3] = True
    new = remove_heads(model, off)
    # the original is read, never written (remove_heads does not copy it first)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    real = surgery_mod.build
    monkeypatch.setattr(surgery_mod, "build",
                        lambda cfg, **kw: real(cfg, **{**kw, "dtype": torch.float32}).to(kw["dtype"]))
    _same(new, remove_heads(model, off))


@pytest.mark.parametrize("name", ["induction-2l", "random-tiny"])
def test_load_builds_built_ins_in_the_target_dtype(monkeypatch, name):
    import interp

    ref = interp.load(name)
    _no_cast(monkeypatch)
    model = interp.load(name, dtype=torch.bfloat16)
    monkeypatch.undo()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and model.tokenizer is not None
    # the same weights, rounded once; buffers (rotary frequencies) stay as a bf16 build keeps them
    assert all(torch.equal(v, ref.state_dict()[k].to(torch.bfloat16)) for k, v in model.state_dict().items())
    built = build(ref.cfg, dtype=torch.bfloat16)
    assert {n: b.dtype for n, b in model.named_buffers()} == {n: b.dtype for n, b in built.named_buffers()}


def test_load_of_a_checkpoint_equals_load_checkpoint_in_bf16(tmp_path):
    import interp

    path = save_checkpoint(build(CFG, dtype=torch.float32, seed=0), tmp_path / "m.safetensors")
    a, b = interp.load(path, dtype=torch.bfloat16), load_checkpoint(path, dtype=torch.bfloat16)
    assert a.blocks[0].attn.rotary.inv_freq.dtype == torch.float32  # not rounded by a cast after the build
    with torch.no_grad():
        assert torch.equal(a(TOKENS), b(TOKENS))
