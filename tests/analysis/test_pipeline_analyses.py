"""Analyses over the pipeline (interp.pipeline) against one process, bit for bit in float32.

classify_heads(pipeline) and activation_patching(pipeline) on 2 and 4 real processes (gloo on localhost, one
thread each, a free port; tests/analysis/pipeline_worker.py's cases) must give the tables one process gives on
the whole checkpoint: equal, not close. The single-process tests check the routing and the refusals.
"""

import dataclasses
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp.analysis import activation_patching, classify_heads
from interp.pipeline import Pipeline, stage_bounds
from interp.placement import build
from interp.streaming import MeanReducer, stream
from interp.zoo import load
from interp.zoo.checkpoint import load_checkpoint, load_checkpoint_stage, save_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
import pipeline_worker  # noqa: E402 - the ranks' data and settings, shared with the reference computed here
from test_distributed import launch, read  # noqa: E402 - the one launcher of local ranks and its reader
from test_pipeline import CFG, write_checkpoint  # noqa: E402 - the pipeline tests' model and its file

WORKER = Path(pipeline_worker.__file__)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("pipe_analyses"))


def assert_same_report(got: dict, ref) -> None:
    """Every field of two HeadReports equal, the tables exactly (values, dtypes, order, attrs)."""
    pd.testing.assert_frame_equal(got["df"], ref.df, check_exact=True)
    assert set(got["details"]) == set(ref.details)
    for name, table in ref.details.items():
        pd.testing.assert_frame_equal(got["details"][name], table, check_exact=True)
        assert got["details"][name].attrs == table.attrs, name
    for field in ("thresholds", "probes", "kinds_run", "layer_heads", "n_heads", "n_layers"):
        assert _same(got[field], getattr(ref, field)), field


def _same(a, b) -> bool:
    """Equal values, tensors (the IOI and ICL prompts among the thresholds) compared element by element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and _same(dataclasses.asdict(a), dataclasses.asdict(b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, checkpoint):
    """``{world: out_dir}``: each world size launched once (process start-up dominates), for every case."""
    runs = {}

    def get(world: int) -> Path:
        if world not in runs:
            out = tmp_path_factory.mktemp(f"pipe_world{world}")
            launch(world, ["classify", "patching"], out, conllu=str(checkpoint), worker=WORKER)
            runs[world] = out
        return runs[world]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_classify_heads_over_ranks_equals_one_process(world, ranks, checkpoint):
    got = read(ranks(world), "classify", world)
    model = load_checkpoint(checkpoint)
    ref = classify_heads(model, tokens=pipeline_worker.classify_data(), **pipeline_worker.CLASSIFY)
    # Rows of every kind were found (the thresholds are low), so the rows and not only the scores are compared.
    assert {k.split(":")[0] for k in ref.df.kind} == {"positional", "previous-token", "duplicate-token",
                                                      "induction", "sink"}
    assert ref.details["induction"]["copying"].notna().all()  # the copying gate read the unembedding
    boot = classify_heads(model, tokens=pipeline_worker.classify_data(), bootstrap=20,
                          **{**pipeline_worker.CLASSIFY, "kinds": ["induction", "sink"]})
    assert "uncertain" in boot.df.columns
    chunked = MeanReducer("*hook_pattern")
    assert stream(model, pipeline_worker.tokens(), [chunked], batch_size=4, query_chunk=4) == 7
    bounds = stage_bounds(CFG.n_layers, world)
    for r, res in enumerate(got):  # every rank receives the whole report
        assert res["held"] == list(range(*bounds[r]))
        assert_same_report(res["report"], ref)
        assert_same_report(res["bootstrap"], boot)
        assert res["chunked_n"] == 7
        for name, value in res["chunked"].items():  # this rank's layers are one process's; the others unseen
            layer = int(name.split(".")[1])
            if bounds[r][0] <= layer < bounds[r][1]:
                assert torch.equal(value, chunked.state[name]), name
        held = {n for n in res["chunked"] if bounds[r][0] <= int(n.split(".")[1]) < bounds[r][1]}
        assert held == {n for n in chunked.state if bounds[r][0] <= int(n.split(".")[1]) < bounds[r][1]}
        assert len({k.rsplit("@", 1)[1] for k in held if "@" in k}) == 3  # queries 0-3, 4-7, 8: three chunks


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_weight_kinds_over_ranks_equal_one_process(world, ranks, checkpoint):
    # Copy suppression, successor and name movers score each head on its own rank from its layer's weights, with
    # rank 0's effective embeddings and the last rank's final norm and unembedding lent: one process's report.
    got = read(ranks(world), "classify", world)
    ref = classify_heads(load_checkpoint(checkpoint), **pipeline_worker.weight_kinds_settings())
    # Rows of every kind, on layers of more than one rank (0 to 3), so rows are joined and not only scores.
    assert set(ref.df.kind) == {"copy-suppression", "successor", "name-mover", "negative-name-mover"}
    assert set(ref.df.layer) == {0, 1, 2, 3}
    assert ref.details["name-mover"]["negative_copying"].notna().all()
    for r, res in enumerate(got):
        # The lent weights were given back: rank 0 holds no unembedding (tied: the last rank's embedding), the
        # later ranks no embedding.
        assert res["embed_meta"] == (0 < r < world - 1)
        assert res["unembed_meta"] == (r < world - 1)
        assert_same_report(res["weights"], ref)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_function_vector_over_ranks_equals_one_process(world, ranks, checkpoint):
    # The task-mean z of each head on its own rank, the prefill into each rank's layers of the KV cache, one
    # patched decoding step per layer over every rank, the answer's probability on the last rank.
    got = read(ranks(world), "classify", world)
    ref = classify_heads(load_checkpoint(checkpoint), **pipeline_worker.function_vector_settings())
    assert set(ref.df.layer) == {0, 1, 2, 3}  # heads of every rank pass
    assert ref.details["function-vector"]["aie"].abs().gt(0).all()  # every head's patch changed the answer
    for res in got:
        assert_same_report(res["function_vector"], ref)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_patching_over_ranks_equals_one_process(world, ranks, checkpoint):
    got = read(ranks(world), "patching", world)
    model = load_checkpoint(checkpoint)
    clean, corrupted, _, _ = pipeline_worker.patching_inputs()
    for name, kw in pipeline_worker.patching_settings().items():
        ref = activation_patching(model, clean, corrupted, **kw)
        assert ref["normalized"].std() > 0, name  # the sites differ: a table of one value would prove little
        for r, res in enumerate(got):  # every rank returns the whole table
            pd.testing.assert_frame_equal(res["tables"][name], ref, check_exact=True)
            assert res["tables"][name].attrs == ref.attrs, (name, r)
    for r, res in enumerate(got):  # a bad metric fails on the last rank, and every rank says so
        assert res["error"] is not None and "metric returned nan" in res["error"], (r, res["error"])
        if r < world - 1:
            assert f"on rank {world - 1}:" in res["error"]


def test_one_process_patching_pipeline_is_the_model():
    model = build(CFG, seed=0)
    clean, corrupted, _, _ = pipeline_worker.patching_inputs()
    for kw in pipeline_worker.patching_settings().values():
        ref = activation_patching(model, clean, corrupted, **kw)
        got = activation_patching(Pipeline(model, micro_batches=2), clean, corrupted, **kw)
        pd.testing.assert_frame_equal(got, ref, check_exact=True)


@pytest.mark.slow
def test_classify_over_a_treebank_on_two_ranks(ud_ewt_dev, tmp_path, monkeypatch):
    # A text model whose stages tokenize on every rank (the checkpoint stores the tokenizer); rank 0's treebank
    # batches, with their sentences and word maps, are the ones every rank's reducers see.
    model = load("minilm-l6")
    path = save_checkpoint(model, tmp_path / "minilm.safetensors")
    monkeypatch.setenv("PIPELINE_CONLLU", ud_ewt_dev)
    launch(2, ["classify_treebank"], tmp_path, conllu=str(path), worker=WORKER)
    ref = classify_heads(load_checkpoint(path), **pipeline_worker.treebank_settings(ud_ewt_dev))
    assert len(ref.details["syntactic"]) > 0
    for res in read(tmp_path, "classify_treebank", 2):
        assert_same_report(res["report"], ref)


def test_one_process_routing_is_stream():
    model = build(CFG, seed=0)
    tokens = torch.randint(0, CFG.d_vocab, (5, 9), generator=torch.Generator().manual_seed(0))
    ref, got = MeanReducer("*hook_pattern"), MeanReducer("*hook_pattern")
    assert stream(model, tokens, [ref], batch_size=2, query_chunk=4) == 5
    pipe = Pipeline(model, micro_batches=2)
    with pipe.routed():
        assert stream(model, tokens, [got], batch_size=2, query_chunk=4) == 5
        with pytest.raises(RuntimeError, match="already routed"), pipe.routed():
            pass
    assert getattr(model, "stream_route", None) is None  # left as it was
    assert set(got.state) == set(ref.state)
    for k in ref.state:
        assert torch.equal(got.state[k], ref.state[k]), k


def test_one_process_classify_pipeline_is_the_model(checkpoint):
    model = load_checkpoint(checkpoint)
    ref = classify_heads(model, tokens=pipeline_worker.classify_data(), **pipeline_worker.CLASSIFY)
    got = classify_heads(Pipeline(model, micro_batches=2), tokens=pipeline_worker.classify_data(),
                         **pipeline_worker.CLASSIFY)
    assert_same_report(pipeline_worker.report_of(got), ref)


def test_one_process_weight_and_fv_kinds_pipeline_is_the_model(checkpoint):
    model = load_checkpoint(checkpoint)
    ref = classify_heads(model, **pipeline_worker.weight_kinds_settings())
    got = classify_heads(Pipeline(model, micro_batches=2), **pipeline_worker.weight_kinds_settings())
    assert len(ref.df) > 0
    assert_same_report(pipeline_worker.report_of(got), ref)
    assert getattr(model, "first_stage_route", None) is None  # the route is gone after the call
    ref = classify_heads(model, **pipeline_worker.function_vector_settings())
    got = classify_heads(Pipeline(model, micro_batches=2), **pipeline_worker.function_vector_settings())
    assert len(ref.df) > 0
    assert_same_report(pipeline_worker.report_of(got), ref)
    assert getattr(model, "call_route", None) is None


def test_classify_refuses_kinds_that_read_several_stages(checkpoint):
    pipe = Pipeline(load_checkpoint_stage(checkpoint, rank=0, world=1))
    with pytest.raises(ValueError, match=r"head kinds \['retrieval'\] do not run over a Pipeline"):
        classify_heads(pipe, kinds=["induction", "copy-suppression", "function-vector", "retrieval"])
    with pytest.raises(ValueError, match="extra_reducers are not joined across a Pipeline's ranks"):
        classify_heads(pipe, extra_reducers=[MeanReducer("*hook_pattern")])


def test_one_process_routed_call_is_the_model_and_refuses_what_it_cannot_return():
    model = build(CFG, seed=0)
    tokens = pipeline_worker.tokens()
    pipe = Pipeline(model, micro_batches=3)
    seen: list[tuple[int, ...]] = []
    hooks = [("blocks.1.attn.hook_z", lambda z, hook: seen.append(tuple(z.shape)))]
    with pipe.routed():
        got = model.call_route(tokens, hooks, reduce=lambda logits: logits[:, -1].clone())
        assert seen == [(7, 9, CFG.n_heads, CFG.d_head)]  # the whole batch at once, not micro-batches
        with pytest.raises(ValueError, match="stop_at_layer=2 returns no logits to reduce"):
            model.call_route(tokens, [], stop_at_layer=2, reduce=lambda logits: logits)
        with pytest.raises(ValueError, match=r"stop_at_layer=0 must be in 1..4"):
            model.call_route(tokens, [], stop_at_layer=0)
    assert torch.equal(got, model(tokens)[:, -1])
    assert getattr(model, "call_route", None) is None
