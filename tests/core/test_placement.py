"""interp.placement: models built on their device and dtype, and layer splits that compute what one device does.

The planner is checked on the meta device against declared capacities; the split itself runs on
``devices=["cpu", "cpu", ...]`` here (real cross-device hops are in the ``cuda`` tests).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import interp
from interp import ModelConfig
from interp.placement import block_bytes, build, is_split, layer_devices, place, plan_layers, unplace

ROOT = Path(__file__).resolve().parents[2]

# Llama-3.2-1B's published dimensions (tied embeddings, 32 query / 8 K/V heads).
LLAMA_1B = dict(d_model=2048, n_heads=32, n_kv_heads=8, d_head=64, d_mlp=8192, activation="swiglu",
                d_vocab=128256, n_ctx=2048, normalization="rms", positional="rotary", rotary_base=500000.0,
                causal=True, tie_embeddings=True)


def tiny(n_layers=4, **kw):
    base = dict(n_layers=n_layers, d_model=32, n_heads=3, n_kv_heads=1, d_head=8, d_mlp=48, d_vocab=61, n_ctx=40,
                positional="rotary", normalization="rms", activation="swiglu", causal=True)
    base.update(kw)
    return ModelConfig(**base)


def test_build_allocates_in_the_requested_dtype_and_is_reproducible():
    a = build(tiny(), dtype=torch.bfloat16, seed=3)
    b = build(tiny(), dtype=torch.bfloat16, seed=3)
    assert {p.dtype for p in a.parameters()} == {torch.bfloat16}
    # Precision-critical buffers keep their own dtype: rotary frequencies stay float32.
    assert a.blocks[0].attn.rotary.inv_freq.dtype == torch.float32
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    assert torch.get_default_dtype() == torch.float32  # the default is restored


def test_build_on_meta_allocates_nothing():
    m = build(ModelConfig(n_layers=2, **LLAMA_1B), device="meta", dtype=torch.bfloat16)
    assert {p.device.type for p in m.parameters()} == {"meta"}


def test_build_refuses_an_integer_dtype():
    with pytest.raises(TypeError, match="int64"):
        build(tiny(), dtype=torch.int64)


def test_block_bytes_count_every_parameter_once():
    cfg = tiny(tie_embeddings=True)
    emb, blocks, head = block_bytes(cfg, torch.bfloat16)
    m = build(cfg)
    total = sum(p.numel() for p in m.parameters()) * 2  # parameters() yields a tied weight once
    assert emb + sum(blocks) + head == total
    assert len(blocks) == cfg.n_layers and len(set(blocks)) == 1


def test_planner_fills_devices_in_order_with_declared_capacities():
    cfg = tiny(n_layers=6)
    emb, blocks, head = block_bytes(cfg, torch.float32)
    per = blocks[0]
    caps = {"cuda:0": emb + 2 * per, "cuda:1": 3 * per, "cuda:2": per + head}
    plan = plan_layers(cfg, caps, reserve=0.0)
    assert [str(d) for d in plan] == ["cuda:0"] * 2 + ["cuda:1"] * 3 + ["cuda:2"]
    # One byte less on the last device: the unembedding no longer fits beside the last block.
    caps["cuda:2"] -= 1
    with pytest.raises(ValueError, match="do not fit"):
        plan_layers(cfg, caps, reserve=0.0)


def test_planner_keeps_tied_unembedding_with_the_embeddings():
    cfg = tiny(n_layers=2, tie_embeddings=True)
    emb, blocks, head = block_bytes(cfg, torch.float32)
    # Exactly room for the (shared) embedding and one block on device 0, one block on device 1.
    plan = plan_layers(cfg, {"cuda:0": emb + head + blocks[0], "cuda:1": blocks[1]}, reserve=0.0)
    assert [str(d) for d in plan] == ["cuda:0", "cuda:1"]


def test_planner_reserve_and_bad_capacities_are_refused():
    cfg = tiny(n_layers=2)
    with pytest.raises(ValueError, match="reserve"):
        plan_layers(cfg, {"cpu": 10**9}, reserve=1.0)
    with pytest.raises(ValueError, match="capacity of 'cpu'"):
        plan_layers(cfg, {"cpu": -5})
    with pytest.raises(ValueError, match="at least one device"):
        plan_layers(cfg, {})


def test_a_1b_shaped_model_plans_over_two_80gb_gpus_in_bf16():
    cfg = ModelConfig(n_layers=16, **LLAMA_1B)
    plan = plan_layers(cfg, {"cuda:0": 1_500_000_000, "cuda:1": 80 * 2**30}, dtype=torch.bfloat16)
    n0 = sum(d.index == 0 for d in plan)
    assert 0 < n0 < 16 and plan == sorted(plan, key=lambda d: d.index)


@pytest.fixture
def pair():
    torch.manual_seed(0)
    one = build(tiny(n_layers=4), seed=0)
    split = build(tiny(n_layers=4), seed=0)
    place(split, ["cpu", "cpu", "cpu", "cpu"])
    return one, split


def test_split_forward_recording_and_decoding_equal_one_device(pair):
    one, split = pair
    assert is_split(split) and layer_devices(split) == [torch.device("cpu")] * 4
    tokens = torch.randint(0, 61, (2, 12))
    torch.testing.assert_close(split(tokens), one(tokens), rtol=0, atol=0)
    _, t1 = one.run_with_cache(tokens, names_filter=["*hook_pattern", "*hook_result"])
    _, t2 = split.run_with_cache(tokens, names_filter=["*hook_pattern", "*hook_result"])
    for name in t1:
        torch.testing.assert_close(t2[name], t1[name], rtol=0, atol=0)
    torch.testing.assert_close(t2.head_out(3), t1.head_out(3), rtol=0, atol=0)
    assert torch.equal(split.generate(tokens[:, :5], 8), one.generate(tokens[:, :5], 8))
    assert torch.equal(split.generate(tokens[:, :5], 8), split.generate(tokens[:, :5], 8, use_cache=False))
    # The split model decodes through the hooked path: the hook-free step does not hop devices.
    from interp.decode import LeanDecoder

    assert LeanDecoder.unsupported(split) == "layers placed on several devices"
    unplace(split)
    assert not is_split(split) and LeanDecoder.unsupported(split) is None


def test_split_hooks_see_their_block_and_the_cache_follows_the_blocks(pair):
    _, split = pair
    seen = {}
    split.hooks([("blocks.*.hook_resid_pre", lambda t, hook: seen.__setitem__(hook.name, t.device))])
    with split.hooks([("blocks.*.hook_resid_pre", lambda t, hook: seen.__setitem__(hook.name, t.device))]):
        split(torch.tensor([[1, 2, 3]]))
    assert len(seen) == 4
    cache = split.make_cache(batch_size=1)
    assert [b.device for layer in cache.layers for b in layer.buffers] == [torch.device("cpu")] * 8


def test_place_with_a_shorter_device_list_uses_the_planner():
    m = build(tiny(n_layers=4), seed=1)
    emb, blocks, head = block_bytes(m.cfg)
    place(m, ["cpu"], capacities={"cpu": emb + sum(blocks) + head}, reserve=0.0)
    assert is_split(m)
    with pytest.raises(ValueError, match="do not fit"):
        place(build(tiny(n_layers=4)), ["cpu"], capacities={"cpu": emb}, reserve=0.0)
    with pytest.raises(ValueError, match="'everywhere'"):
        place(m, "everywhere")


def test_kv_cache_refuses_a_device_list_of_the_wrong_length():
    with pytest.raises(ValueError, match="2 devices for a model with 4 layers"):
        interp.KVCache(tiny(n_layers=4), batch_size=1, device=["cpu", "cpu"])


def test_load_takes_dtype_devices_and_configs():
    m = interp.load("induction-2l", dtype=torch.bfloat16)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16} and m.tokenizer is not None
    r = interp.load(tiny(), dtype=torch.bfloat16, seed=0, devices=["cpu"] * 4)
    assert is_split(r) and r.W_E.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="floating-point"):
        interp.load("induction-2l", dtype=torch.int32)


@pytest.mark.slow
def test_loading_a_1b_shaped_bf16_config_peaks_near_its_weights():
    # Real Llama-3.2-1B widths with 2 layers (the embedding alone is 263M parameters): about 0.77 GB in bf16.
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "benchmarks" / "bench_load_memory.py"),
                          "--layers", "2", "--json"], capture_output=True, text=True, cwd=ROOT, check=True)
    res = json.loads(out.stdout)
    assert res["interp.load"]["ratio"] <= 1.3, res
    assert res["float32 then cast"]["ratio"] > 2.0, res  # the check has teeth: the old route peaks far above
