"""Head-parallel shards read straight from a checkpoint (load_checkpoint_heads) against build-then-cut.

Every shard of 2 ranks must equal ``shard_heads(load_checkpoint(path), rank, world)`` exactly, for the
head-parallel tests' model variants (grouped-query with every bias, multi-query, latent attention with experts, a
parallel block); a rank must not read the other ranks' slices (their bytes are spoiled and the shard is still
right).
"""

import json
import sys
from pathlib import Path

import pytest
import torch

from interp import ModelConfig
from interp.placement import build
from interp.tensor_parallel import HeadParallel, shard_heads
from interp.zoo.checkpoint import load_checkpoint, load_checkpoint_heads, save_checkpoint

sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
import tp_worker  # noqa: E402 - the head-parallel tests' model variants


def _same_shard(got, ref) -> None:
    assert got.cfg == ref.cfg
    assert got.tp_heads == ref.tp_heads and got.tp_layout == ref.tp_layout
    assert (got.tp_rank, got.tp_world) == (ref.tp_rank, ref.tp_world)
    ref_state = ref.state_dict()
    assert set(got.state_dict()) == set(ref_state)
    for name, t in got.state_dict().items():
        assert not t.is_meta, name
        assert t.dtype == ref_state[name].dtype and torch.equal(t, ref_state[name]), name
    ref_buffers = dict(ref.named_buffers())  # rotary tables, K/V maps: built for the shard, not read
    for name, b in got.named_buffers():
        assert not b.is_meta and torch.equal(b, ref_buffers[name]), name


@pytest.mark.parametrize("case", sorted(tp_worker.CONFIGS))
def test_sliced_shards_equal_build_then_cut(case, tmp_path):
    path = save_checkpoint(tp_worker.model(case), tmp_path / f"{case}.safetensors")
    full = load_checkpoint(path)
    for rank in range(2):  # mqa: 6 heads split 3 / 3, the one K/V head read by both ranks
        shard = load_checkpoint_heads(path, rank=rank, world=2)
        _same_shard(shard, shard_heads(full, rank, 2))
        assert shard.name == full.name


def test_sliced_shards_sum_to_the_model(tmp_path):
    # The two ranks' partial attention and MLP writes (W_O's and W_out's biases on rank 0 only) add up to the
    # whole model's, layer by layer, without a process group.
    from interp.attention import AttnMask

    model = tp_worker.model("gqa")
    path = save_checkpoint(model, tmp_path / "gqa.safetensors")
    shards = [load_checkpoint_heads(path, rank=r, world=2) for r in range(2)]
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    mask, pos = AttnMask(T=5, S=5, start=0, causal=True), torch.arange(5)
    with torch.no_grad():
        for layer in range(2):
            whole = model.blocks[layer].attn(x, mask=mask, positions=pos)
            parts = sum(s.blocks[layer].attn(x, mask=mask, positions=pos) for s in shards)
            torch.testing.assert_close(parts, whole, rtol=0, atol=1e-5)
            torch.testing.assert_close(sum(s.blocks[layer].mlp(x) for s in shards), model.blocks[layer].mlp(x),
                                       rtol=0, atol=1e-5)
    assert torch.allclose(HeadParallel(load_checkpoint_heads(path, rank=0, world=1))(tp_worker.tokens()),
                          model(tp_worker.tokens()), atol=1e-5)


def test_a_rank_never_reads_the_other_ranks_slices(tmp_path):
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=4, d_vocab=20, n_ctx=8, normalization="rms",
                      activation="gelu")
    model = build(cfg, seed=0)
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    clean0 = load_checkpoint_heads(path, rank=0, world=2)
    # Spoil the bytes of rank 1's query rows (heads 2 and 3) in W_qkv: rank 0 never reads them.
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    index = json.loads(path.read_bytes()[8:8 + header_len])
    begin, _ = index["blocks.0.attn.W_qkv.weight"]["data_offsets"]
    row = 4 * cfg.d_model
    data = bytearray(path.read_bytes())
    first = 8 + header_len + begin + 2 * cfg.d_head * row  # query rows of head 2 onwards
    data[first:first + 2 * cfg.d_head * row] = b"\xff" * (2 * cfg.d_head * row)  # NaN floats
    spoiled = tmp_path / "spoiled.safetensors"
    spoiled.write_bytes(bytes(data))
    _same_shard(load_checkpoint_heads(spoiled, rank=0, world=2), clean0)
    assert torch.isnan(load_checkpoint_heads(spoiled, rank=1, world=2).blocks[0].attn.W_qkv.weight).any()


def test_bad_ranks_and_splits_are_refused_by_name(tmp_path):
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=4, d_vocab=20, n_ctx=8, d_mlp=30)
    path = save_checkpoint(build(cfg, seed=0), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match=r"rank=2 is not in 0..1 \(world=2\)"):
        load_checkpoint_heads(path, rank=2, world=2)
    with pytest.raises(ValueError, match="d_mlp=30 does not divide over world=4 ranks"):
        load_checkpoint_heads(path, rank=0, world=4)
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        load_checkpoint_heads(tmp_path / "absent.safetensors", rank=0, world=2)
