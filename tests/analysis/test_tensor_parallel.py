"""Heads across ranks (interp.tensor_parallel) against one process.

Two real processes (gloo on localhost, one thread each) each hold half of every layer's heads and half of each
dense MLP; the reference is the whole model here. Logits, padded and head-ablated passes, greedy decoding with the
KV cache and the joined trace (patterns, q / k / v, z, per-head writes, MLP activations) must agree within float32
rounding of the reordered sums, for grouped-query, multi-query, latent attention with experts and a parallel block.
"""

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp import ModelConfig
from interp.analysis import activation_patching
from interp.placement import build
from interp.tensor_parallel import HeadParallel, head_split, shard_heads

sys.path.insert(0, str(Path(__file__).parent))
import tp_worker  # noqa: E402 - the ranks' models and data, shared with the reference computed here
from test_distributed import launch, read  # noqa: E402 - the one launcher of local ranks

WORKER = Path(tp_worker.__file__)
CASES = list(tp_worker.CONFIGS)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tp")
    launch(2, [*CASES, "classify", "patching", "sliced"], out, worker=WORKER)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_two_ranks_equal_one_process(case, ranks):
    got = read(ranks, case, 2)
    model = tp_worker.model(case)
    tokens = tp_worker.tokens()
    with torch.no_grad():
        ref = model(tokens)
        padded = model(tokens, attention_mask=tp_worker.padding_mask())
        model.set_head_gates(tp_worker.gates(model))
        ablated = model(tokens)
        model.set_head_gates(None)
        generated = model.generate(tokens[:1], 6)
    _, trace = model.run_with_cache(tokens, names_filter=tp_worker.NAMES)
    gate_grad, embed_grad = tp_worker.gradients(model, model)
    H = model.cfg.n_heads
    assert [got[0]["heads"], got[1]["heads"]] == [[len(head_split(H, 2)[r])] * 2 for r in range(2)]
    for r in range(2):  # every rank ends with the whole residual stream: the same logits everywhere
        torch.testing.assert_close(got[r]["logits"], ref, rtol=0, atol=1e-5)
        torch.testing.assert_close(got[r]["padded"], padded, rtol=0, atol=1e-5)
        torch.testing.assert_close(got[r]["ablated"], ablated, rtol=0, atol=1e-5)
        assert torch.equal(got[r]["generated"], generated)
    for r in range(2):  # each rank's own heads get one process's gradient; replicated weights get all of it
        owned = got[r]["owned"]
        for layer in range(model.cfg.n_layers):
            torch.testing.assert_close(got[r]["gate_grad"][layer, owned[layer]], gate_grad[layer, owned[layer]],
                                       rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got[r]["embed_grad"], embed_grad, rtol=1e-4, atol=1e-5)
    assert gate_grad.abs().min() > 0  # every head's gate matters to the loss
    assert (ablated - ref).abs().max() > 1e-2 and (padded - ref).abs().max() > 1e-2  # both change the answer
    assert got[1]["trace"] is None
    assert set(got[0]["trace"]) == set(trace.keys())
    for name in trace.keys():
        torch.testing.assert_close(got[0]["trace"][name], trace[name], rtol=0, atol=1e-5, msg=name)
    assert got[0]["meta"]["n_heads"] == H


@pytest.mark.slow
def test_shards_read_from_a_checkpoint_run_as_the_cut_ones(ranks):
    # load_checkpoint_heads reads each rank's slices straight from the file: on 2 real ranks its logits (plain
    # and padded) are those of the shards cut from the whole model, bit for bit, and one process's.
    ref = tp_worker.model("gqa")(tp_worker.tokens())
    for got in read(ranks, "sliced", 2):
        for sliced, cut in zip(got["sliced"], got["cut"]):
            assert torch.equal(sliced, cut)
        torch.testing.assert_close(got["sliced"][0], ref, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_classify_heads_across_ranks_equals_one_process(ranks):
    """Each rank classifies its own heads over every batch; the joined report is one process's, on both ranks."""
    got = read(ranks, "classify", 2)
    ref = tp_worker.classify(tp_worker.model("gqa"))
    assert len(ref.df) > 8 and ref.df.uncertain.any() and set(ref.df["head"]) == {0, 1, 2, 3}  # the test bites
    for r in range(2):
        pd.testing.assert_frame_equal(got[r]["df"], ref.df, check_exact=False, rtol=0, atol=1e-5)
        assert set(got[r]["details"]) == set(ref.details)
        for name, table in ref.details.items():
            pd.testing.assert_frame_equal(got[r]["details"][name], table.reset_index(drop=True),
                                          check_exact=False, rtol=0, atol=1e-5, check_dtype=False)
        assert got[r]["layer_heads"] == [4, 4] and got[r]["n_heads"] == 4


@pytest.mark.slow
def test_a_dead_rank_stops_the_other_with_its_name(tmp_path):
    codes = launch(2, ["die"], tmp_path, worker=WORKER, timeout=90)
    assert codes[1] == 7
    got = read(tmp_path, "die", 1)[0]  # only rank 0 wrote its result
    assert got["error"] is not None and "rank 0 of 2: all_reduce of a head-parallel write failed" in got["error"]
    assert got["seconds"] < 30


def test_head_split_is_contiguous_and_even():
    for n, world in [(4, 2), (6, 4), (3, 4), (8, 3)]:
        shares = head_split(n, world)
        assert sum(shares, []) == list(range(n))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(ValueError, match="world=0"):
        head_split(4, 0)


def test_one_rank_shard_is_the_model():
    """world = 1 needs no process group: the shard is the whole model."""
    model = tp_worker.model("gqa")
    tp = HeadParallel(shard_heads(model, 0, 1))
    tokens = tp_worker.tokens()
    with torch.no_grad():
        torch.testing.assert_close(tp(tokens), model(tokens), rtol=0, atol=1e-6)


def test_shards_sum_to_the_model_without_a_process_group():
    """The shards' attention and MLP writes add up to the whole model's, layer by layer (checked in one process
    by summing the two shards' partial outputs on the same input)."""
    model = tp_worker.model("gqa")
    shards = [shard_heads(model, r, 2) for r in range(2)]
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    from interp.attention import AttnMask

    mask = AttnMask(T=5, S=5, start=0, causal=True)
    pos = torch.arange(5)
    with torch.no_grad():
        for layer in range(2):
            whole = model.blocks[layer].attn(x, mask=mask, positions=pos)
            parts = sum(s.blocks[layer].attn(x, mask=mask, positions=pos) for s in shards)
            torch.testing.assert_close(parts, whole, rtol=0, atol=1e-5)
            whole_mlp = model.blocks[layer].mlp(x)
            torch.testing.assert_close(sum(s.blocks[layer].mlp(x) for s in shards), whole_mlp, rtol=0, atol=1e-5)


def test_bad_input_is_refused_by_name():
    model = tp_worker.model("gqa")
    with pytest.raises(ValueError, match="rank=2 is outside"):
        shard_heads(model, 2, 2)
    odd = build(ModelConfig(n_layers=1, d_model=16, n_heads=4, d_mlp=30, d_vocab=8, n_ctx=8), seed=0)
    with pytest.raises(ValueError, match="d_mlp=30 does not divide over world=4"):
        shard_heads(odd, 0, 4)
    with pytest.raises(ValueError, match="whole model"):
        HeadParallel(model)
    with pytest.raises(RuntimeError, match="not initialised"):
        HeadParallel(shard_heads(model, 0, 2))
    tp = HeadParallel(shard_heads(model, 0, 1))
    with pytest.raises(ValueError, match=r"expected \[2, 4\]"):
        tp.set_head_gates(torch.ones(2, 3))


@pytest.mark.slow
def test_patching_tables_across_two_ranks_equal_one_process(ranks):
    """Per-layer activation patching on both ranks returns the table one process computes (issue 37)."""
    got = read(ranks, "patching", 2)
    model = tp_worker.model("gqa")
    for act, by in tp_worker.PATCH_SITES:
        ref = tp_worker.patch(model, act, by)
        assert ref["normalized"].abs().max() > 0.05 and ref["metric"].std() > 1e-3  # the patches move the metric
        for r in range(2):
            pd.testing.assert_frame_equal(got[r][act + by], ref, check_exact=False, rtol=0, atol=1e-5)
            attrs = got[r][act + by].attrs
            assert {k: v for k, v in attrs.items() if not isinstance(v, float)} == \
                {k: v for k, v in ref.attrs.items() if not isinstance(v, float)}
            for k in ("metric_clean", "metric_corrupted"):
                assert attrs[k] == pytest.approx(ref.attrs[k], abs=1e-5), k


def test_per_head_patching_over_ranks_is_refused_by_name():
    tp = HeadParallel(shard_heads(tp_worker.model("gqa"), 0, 1))  # one rank: no process group needed
    clean = tp_worker.tokens()
    with pytest.raises(ValueError, match=r"act='z' is per head; over a HeadParallel's ranks patch a per-layer"):
        activation_patching(tp, clean, (clean + 1) % 40, act="z", answer_tokens=clean[:, :2])
