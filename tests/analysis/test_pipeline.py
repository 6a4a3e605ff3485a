"""The pipeline across processes (interp.pipeline) against one process, bit for bit in float32.

Each launch starts 2 or 4 real processes (gloo on localhost, one thread each, a free port) that load their slice
of one checkpoint and run tests/analysis/pipeline_worker.py's cases; the reference is the whole checkpoint run
here in one process. Logits, a hooked (ablated) pass, the trace and the reducers must be equal, not close.
"""

import pickle
import sys
from pathlib import Path

import pytest
import torch

from interp import ModelConfig
from interp.pipeline import Pipeline, bubble_fraction, gpipe_schedule, stage_bounds, stage_prefixes
from interp.placement import build
from interp.streaming import stream
from interp.zoo.checkpoint import load_checkpoint, load_checkpoint_stage, save_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
import pipeline_worker  # noqa: E402 - the ranks' data and hooks, shared with the reference computed here
from test_distributed import launch  # noqa: E402 - the one launcher of local ranks

WORKER = Path(pipeline_worker.__file__)
# 4 layers (one per rank at 4 ranks), grouped-query attention, tied embeddings (the last rank holds W_E too).
CFG = ModelConfig(n_layers=4, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=50, n_ctx=16, positional="rotary",
                  normalization="rms", activation="swiglu", tie_embeddings=True)


def write_checkpoint(folder: Path) -> Path:
    """The pipeline tests' model (CFG, every parameter redrawn: the default init leaves norms at 1), saved."""
    model = build(CFG, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return save_checkpoint(model, folder / "model.safetensors")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("pipe"))


def _read(out: Path, case: str, world: int) -> list[dict]:
    results = []
    for r in range(world):
        with open(out / f"{case}.rank{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_equal_one_process_bit_for_bit(world, checkpoint, tmp_path):
    launch(world, ["equal"], tmp_path, conllu=str(checkpoint), worker=WORKER)
    got = _read(tmp_path, "equal", world)
    model = load_checkpoint(checkpoint)
    tokens = pipeline_worker.tokens()
    with torch.no_grad():
        ref = model(tokens)
        padded = model(tokens, attention_mask=pipeline_worker.padding_mask())
        ablated = model.run_with_hooks(tokens, fwd_hooks=[("blocks.2.attn.hook_z", pipeline_worker.ablate_head)])
    ref_out, ref_trace = model.run_with_cache(tokens, reducers=pipeline_worker.reducers())
    zero = got[0]
    # Recording patterns runs the explicit attention path: its logits are one process's run_with_cache's.
    assert torch.equal(zero["logits"], ref) and torch.equal(zero["trace_logits"], ref_out)
    assert torch.equal(zero["ablated"], ablated) and not torch.equal(ablated, ref)
    assert torch.equal(zero["padded"], padded) and not torch.equal(padded, ref)
    assert set(zero["trace"]) == set(ref_trace.keys())
    for name in ref_trace.keys():
        assert torch.equal(zero["trace"][name], ref_trace[name]), name
    assert zero["meta"] == ref_trace.meta
    for got_stats, ref_stats in zip(zero["stats"], ref_trace.stats):
        assert set(got_stats) == set(ref_stats)
        for k in ref_stats:
            assert torch.equal(got_stats[k], ref_stats[k]), k
    streamed = pipeline_worker.reducers()  # a dataset of two batches, the second padded, through stream
    assert stream(model, [(tokens[:4], None), (tokens[4:], pipeline_worker.padding_mask()[4:])], streamed) == 7
    assert zero["streamed_n"] == 7
    for got_result, ref_reducer in zip(zero["streamed"], streamed):
        ref_result = ref_reducer.result()
        assert set(got_result) == set(ref_result)
        for k in ref_result:
            assert torch.equal(got_result[k], ref_result[k]), k
    bounds = stage_bounds(CFG.n_layers, world)
    for r, res in enumerate(got):
        first, stop = bounds[r]
        assert res["held"] == list(range(first, stop))  # the other ranks' blocks were never materialised
        assert res["fired"] == [f"blocks.{i}.hook_resid_pre" for _ in range(pipeline_worker.MICRO_BATCHES)
                                for i in range(first, stop)]  # hooks ran on the owner, micro-batch by micro-batch
        assert res["embed_meta"] == (r not in (0, world - 1))  # W_E: rank 0, and the last (tied unembedding)
        if r:
            assert res["logits"] is None and res["trace"] is None


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_killed_mid_run_is_named(world, checkpoint, tmp_path):
    codes = launch(world, ["die"], tmp_path, conllu=str(checkpoint), worker=WORKER, timeout=120)
    assert codes[-1] == 7 and codes[:-1] == [0] * (world - 1)
    with open(tmp_path / "die.rank0.pkl", "rb") as f:
        got = pickle.load(f)
    victim = world - 1
    assert got["error"] is not None and f"rank {victim} died or did not answer" in got["error"], got
    assert f"rank 0 of {world}: receiving the logits from rank {victim}" in got["error"]
    assert got["seconds"] < 30


def test_one_process_pipeline_is_the_model():
    torch.manual_seed(0)
    model = build(CFG, seed=0)
    tokens = torch.randint(0, CFG.d_vocab, (5, 7))
    with torch.no_grad():
        ref = model(tokens)
    mask = torch.ones(5, 7, dtype=torch.long)
    mask[1, :2] = mask[4, :3] = 0  # left-padded rows, in different micro-batches
    with torch.no_grad():
        ref_padded = model(tokens, attention_mask=mask)
    assert not torch.equal(ref_padded, ref)
    for m in (1, 2, 5, 9):
        assert torch.equal(Pipeline(model, micro_batches=m)(tokens), ref)
        assert torch.equal(Pipeline(model, micro_batches=m)(tokens, attention_mask=mask), ref_padded)
    names = ["blocks.1.attn.hook_result", "blocks.3.attn.hook_pattern"]
    out, ref_trace = model.run_with_cache(tokens, names_filter=names)
    for m in (2, 5):  # 5 micro-batches of 5 rows: 2 of 3 and 2 rows (a one-row batch takes other kernels)
        got, trace = Pipeline(model, micro_batches=m).run_with_cache(tokens, names_filter=names)
        assert torch.equal(got, out) and list(trace.keys()) == list(ref_trace.keys())
        for name in names:
            assert torch.equal(trace[name], ref_trace[name]), name


def test_stage_slice_reads_only_its_modules(checkpoint):
    full = load_checkpoint(checkpoint)
    stage = load_checkpoint_stage(checkpoint, rank=1, world=2)
    sd = full.state_dict()
    for name, p in stage.named_parameters():
        held = name.startswith(("blocks.2.", "blocks.3.", "ln_final.", "W_E."))
        assert p.is_meta != held, name
        if held:
            assert torch.equal(p, sd[name]), name
    assert stage.unembed.weight is stage.embed.weight
    with torch.no_grad():  # the slice runs its blocks: the residual entering block 2 in, the logits out
        resid = full(torch.tensor([[1, 2, 3]]), stop_at_layer=2)
        assert torch.equal(stage(resid, start_at_layer=2), full(torch.tensor([[1, 2, 3]])))
    with pytest.raises(ValueError, match="rank=2 is not in 0..1"):
        load_checkpoint_stage(checkpoint, rank=2, world=2)


def test_schedule_bounds_and_bubble():
    assert stage_bounds(5, 2) == [(0, 3), (3, 5)]
    with pytest.raises(ValueError, match="needs at least 5 layers; the model has n_layers=4"):
        stage_bounds(4, 5)
    table = gpipe_schedule(4, 8)
    assert len(table) == 11 and [row[3] for row in table][3:] == list(range(8))
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11) and bubble_fraction(1, 3) == 0.0
    skeleton = build(CFG, device="meta")
    assert stage_prefixes(skeleton, 1, 4) == ["blocks.1"]
    with pytest.raises(ValueError, match="micro_batches=0"):
        Pipeline(skeleton, micro_batches=0)


def test_cross_attention_is_refused_by_name():
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=8, cross_attention=True)
    with pytest.raises(ValueError, match="cfg.cross_attention=True is not supported"):
        Pipeline(build(cfg, device="meta"))


def test_bad_input_is_refused_before_any_send():
    pipe = Pipeline(build(CFG, seed=0))
    with pytest.raises(ValueError, match="rank 0 passed tokens=None"):
        pipe(None)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 50\), got min 0 and max 50"):
        pipe(torch.tensor([[0, 50]]))
    with pytest.raises(ValueError, match="sequence length 17 exceeds the model's n_ctx=16"):
        pipe(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 3\), expected \(2, 3\)"):
        pipe(torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(1, 3))


def test_stage_refuses_damaged_files_by_name(checkpoint, tmp_path):
    data = checkpoint.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-100])  # the last tensor's bytes end early
    with pytest.raises(ValueError, match=r"cut.safetensors: tensor .* is cut short"):
        load_checkpoint_stage(cut, rank=1, world=2)
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF  # a byte of the last tensor (the last rank's), under the header's sha256 record
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=r"flipped.safetensors is damaged"):
        load_checkpoint_stage(bad, rank=1, world=2)
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="junk.safetensors' is not a readable safetensors file"):
        load_checkpoint_stage(tmp_path / "junk.safetensors", rank=0, world=2)
