"""Building and loading models changes no process-wide torch state (issue 38, item 5).

``placement.build`` used to call ``torch.set_default_dtype`` for the time a model was built: two threads (two
dashboard sessions) loading a bf16 and a float32 model at once saw each other's default, and the process could
be left with bf16 as its default.
"""

import threading

import pytest
import torch

import interp
from interp import ModelConfig
from interp.placement import build
from interp.pruning import remove_heads
from interp.zoo import save_checkpoint

CFG = ModelConfig(n_layers=2, d_model=16, n_heads=4, n_kv_heads=2, d_vocab=23, n_ctx=16, positional="rotary")
LOADS = 50  # per thread, as in the issue


@pytest.fixture
def no_default_dtype_changes(monkeypatch):
    def refuse(dtype):
        raise AssertionError(f"torch.set_default_dtype({dtype}) was called: process-wide state")

    monkeypatch.setattr(torch, "set_default_dtype", refuse)


def test_build_load_and_remove_heads_never_set_the_default_dtype(tmp_path, no_default_dtype_changes):
    model = build(CFG, dtype=torch.bfloat16, seed=0)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.blocks[0].attn.rotary.inv_freq.dtype == torch.float32  # precise buffers keep their dtype
    assert {p.dtype for p in interp.load(CFG, dtype=torch.float16).parameters()} == {torch.float16}
    path = save_checkpoint(model, tmp_path / "bf16.safetensors")
    assert {p.dtype for p in interp.load(str(path)).parameters()} == {torch.bfloat16}
    assert {p.dtype for p in interp.load(str(path), dtype=torch.float32).parameters()} == {torch.float32}
    small = remove_heads(model, {0: [1]})
    assert {p.dtype for p in small.parameters()} == {torch.bfloat16}


def test_build_in_a_dtype_draws_the_same_weights_as_building_under_that_default():
    """The thread-local dtype gives exactly what the old process-wide default gave (initialised in that dtype,
    not rounded from float32)."""
    model = build(CFG, dtype=torch.bfloat16, seed=3)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        torch.manual_seed(3)
        reference = interp.Transformer(CFG)
    finally:
        torch.set_default_dtype(before)
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert p.dtype == q.dtype and torch.equal(p, q), name


def test_two_threads_loading_bf16_and_float32_each_get_their_own_dtype(tmp_path):
    paths = {dt: save_checkpoint(build(CFG, dtype=dt, seed=1), tmp_path / f"{dt}.safetensors".replace("torch.", ""))
             for dt in (torch.bfloat16, torch.float32)}
    wrong: list[str] = []
    start = threading.Barrier(2)

    def loads(dtype):
        start.wait()
        for i in range(LOADS):
            model = interp.load(CFG, dtype=dtype) if i % 5 else interp.load(str(paths[dtype]))
            got = {p.dtype for p in model.parameters()}
            if got != {dtype}:
                wrong.append(f"load {i} in {dtype}: {got}")

    threads = [threading.Thread(target=loads, args=(dt,)) for dt in (torch.bfloat16, torch.float32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert torch.get_default_dtype() == torch.float32


def test_a_seeded_build_leaves_the_callers_rng_where_it_was():
    """seed= draws from a forked generator: the caller's stream continues as if no model had been built,
    and the same seed still gives the same weights."""
    torch.manual_seed(123)
    expected = torch.rand(5)  # what the caller's next draw is without a build in between
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = build(CFG, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(torch.rand(5), expected)
    b = interp.load(CFG, seed=7)  # interp.load(cfg, seed=) goes through the same build
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    torch.manual_seed(7)  # and the seed means what it meant before: the weights a global seed of 7 gives
    with torch.device("cpu"):
        c = interp.Transformer(CFG)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values(), strict=True))
