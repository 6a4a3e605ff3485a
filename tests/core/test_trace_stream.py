"""streaming.stream and the Reducer protocol: one forward pass per batch, the query offset as an argument, and
mergeable states whose merge is order-independent."""

import pytest
import torch

import interp
from interp import MeanReducer, ModelConfig, Reducer, Transformer, stream
from interp.analysis import InductionReducer, PositionalReducer
from interp.data import Batch

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=37, n_ctx=40, positional="rotary")


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CFG).eval()


class _Offsets(Reducer):
    """Records which query rows arrived, per call."""

    names = "blocks.0.attn.hook_pattern"

    def __init__(self):
        super().__init__()
        self.calls = []

    def update(self, name, tensor, *, q_start):
        self.calls.append((q_start, tensor.shape[2]))

    def result(self):
        return self.calls


def test_query_offset_is_passed_as_an_argument():
    model = _model()
    red = _Offsets()
    model.set_query_chunk(8)
    try:
        stream(model, torch.randint(0, 37, (2, 20)), [red])
    finally:
        model.set_query_chunk(None)
    assert red.calls == [(0, 8), (8, 8), (16, 4)]
    assert not hasattr(model.blocks[0].attn.hook_pattern, "ctx")  # no side channel left


def test_stream_equals_record_and_counts_sequences():
    model = _model()
    tokens = torch.randint(0, 37, (6, 12))
    red = MeanReducer("*hook_pattern")
    assert stream(model, tokens, [red], batch_size=4) == 6
    _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
    torch.testing.assert_close(red.result()["blocks.1.attn.hook_pattern"], trace.pattern(1).mean(0), atol=1e-6, rtol=0)


def test_one_forward_pass_per_batch_feeds_every_reducer():
    model = _model()
    passes = []
    reds = [PositionalReducer(model), InductionReducer(model), MeanReducer("*hook_z")]
    with model.hooks([("hook_embed", lambda t, hook: passes.append(t.shape[0]))]):
        stream(model, torch.randint(0, 37, (10, 16)), reds, batch_size=4)
    assert passes == [4, 4, 2]


@pytest.mark.parametrize("make", [lambda m: PositionalReducer(m), lambda m: InductionReducer(m),
                                  lambda m: MeanReducer("*hook_pattern")])
def test_merged_states_equal_one_run_in_any_order(make):
    model = _model()
    g = torch.Generator().manual_seed(1)
    parts = [torch.randint(0, 37, (3, 14), generator=g) for _ in range(3)]
    whole = make(model)
    stream(model, parts, [whole])
    shards = []
    for p in parts:
        r = make(model)
        stream(model, p, [r])
        shards.append(r)
    a = make(model).merge(shards[0]).merge(shards[1]).merge(shards[2])
    b = make(model).merge(shards[2]).merge(shards[0]).merge(shards[1])
    for merged in (a, b):
        for k, v in whole.state_dict().items():
            torch.testing.assert_close(merged.state_dict()[k], v, atol=1e-9, rtol=1e-9)
    # The result is a function of the state alone: a fresh reducer loaded with it answers the same.
    fresh = make(model)
    fresh.load_state_dict(a.state_dict())
    ra, rw = fresh.result(), whole.result()
    key = next(iter(rw))
    got, want = ra[key], rw[key]
    if isinstance(want, dict):
        got, want = got["mass"], want["mass"]
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9, equal_nan=True)


def test_state_values_are_plain_tensors_and_bad_merges_fail():
    model = _model()
    red = PositionalReducer(model)
    stream(model, torch.randint(0, 37, (2, 10)), [red])
    assert all(isinstance(v, torch.Tensor) for v in red.state_dict().values())
    with pytest.raises(TypeError, match="cannot merge InductionReducer into PositionalReducer"):
        red.merge(InductionReducer(model))
    with pytest.raises(TypeError, match="state values must be tensors"):
        red.load_state_dict({"mass": 1.0})
    other = PositionalReducer(model, window=1)
    with pytest.raises(ValueError, match="state 'mass' has shape"):
        red.merge(other)


def test_reducers_see_the_batch_annotations():
    seen = []

    class _Ann(Reducer):
        names = "blocks.0.hook_resid_pre"

        def begin_batch(self, batch: Batch) -> None:
            seen.append(batch.annotations.get("tag"))

        def update(self, name, tensor, *, q_start):
            pass

    batches = [Batch(torch.randint(0, 37, (2, 5)), None, {"tag": i}) for i in range(3)]
    stream(_model(), batches, [_Ann()])
    assert seen == [0, 1, 2]
    with pytest.raises(ValueError, match="empty dataset"):
        stream(_model(), [], [_Ann()])
    assert interp.stream is stream


def _count_calls(module: torch.nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("chunk", [None, 7])
def test_a_pass_feeding_only_patterns_stops_after_the_last_pattern_and_agrees_with_a_full_recording(chunk):
    """Reducers that read attention patterns only: the pass stops after the last layer's pattern (the last
    block's MLP and the unembedding never run), the statistics equal those of a full recorded pass, and a
    query-chunked pass still delivers every chunk."""
    model = _model()
    tokens = torch.randint(0, 37, (6, 20))
    _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")  # full forward, reference
    mlp_calls = _count_calls(model.blocks[-1].mlp)
    unembed_calls = _count_calls(model.unembed)
    red = MeanReducer("blocks.*.attn.hook_pattern")
    model.set_query_chunk(chunk)
    try:
        stream(model, tokens, [red], batch_size=3)
    finally:
        model.set_query_chunk(None)
    assert mlp_calls[0] == 0 and unembed_calls[0] == 0
    for layer in range(CFG.n_layers):
        name = f"blocks.{layer}.attn.hook_pattern"
        torch.testing.assert_close(red.result()[name], trace[name].mean(0), atol=1e-6, rtol=0)
    assert all(not hp._fns for hp in model.hook_dict.values())  # the stop left no hook behind
    model(tokens)  # and the model still runs whole
    assert mlp_calls[0] == 1 and unembed_calls[0] == 1


def test_a_pass_feeding_a_late_hook_runs_whole():
    model = _model()
    mlp_calls = _count_calls(model.blocks[-1].mlp)
    red = MeanReducer(["blocks.0.attn.hook_pattern", f"blocks.{CFG.n_layers - 1}.hook_resid_post"])
    stream(model, torch.randint(0, 37, (4, 10)), [red], batch_size=2)
    assert mlp_calls[0] == 2
    assert f"blocks.{CFG.n_layers - 1}.hook_resid_post" in red.result()
