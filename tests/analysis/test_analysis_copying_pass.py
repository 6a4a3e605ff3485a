"""The copying score's pass and the reducers' precision: the pass stops after the last layer's hook_z, query
chunks and head gates give the same scores as a plain pass / the naive direct logit attribution, and bf16
patterns are folded in float32 with float64 sums."""

import pytest
import torch
from helpers import tiny_model

from interp import stream
from interp.analysis import induction_scores
from interp.analysis.induction import CopyingReducer, InductionReducer
from interp.data import repeated_sequences
from interp.streaming import record


def _model(seed=2, d_vocab=40, **kw):
    model = tiny_model(seed, d_vocab=d_vocab, n_ctx=24, causal=True, attn_only=True, normalization="pre", **kw)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_qkv.weight.mul_(3.0)
    return model


def _calls(module):
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_the_copying_pass_stops_after_the_last_head_output():
    """Nothing after the last layer's hook_z is read: its output projection and the unembedding never run in
    stream's pass, and the scores equal those of the same reducer fed by a pass that ran whole (record)."""
    model = _model()
    toks = repeated_sequences(4, 6, 40, seed=1)
    w_o, unembed = _calls(model.blocks[-1].attn.W_O), _calls(model.unembed)
    red = CopyingReducer(model, comparisons=16)
    stream(model, toks, [red, InductionReducer(model)], batch_size=4)
    assert w_o[0] == 0 and unembed[0] == 0
    whole = CopyingReducer(model, comparisons=16)
    record(model, toks, names_filter=[], reducers=[whole])
    assert w_o[0] == 1 and unembed[0] == 1
    assert int(red.state["rows"]) > 0
    torch.testing.assert_close(red.result(), whole.result(), atol=0, rtol=0)


@pytest.mark.parametrize("comparisons", [None, 16])
def test_copying_is_the_same_with_query_chunks(comparisons):
    model = _model()
    toks = repeated_sequences(4, 7, 40, seed=3)
    plain = induction_scores(model, toks, copying_comparisons=comparisons)
    model.set_query_chunk(5)
    try:
        chunked = induction_scores(model, toks, copying_comparisons=comparisons)
    finally:
        model.set_query_chunk(None)
    assert plain.copying.notna().all()
    assert (plain.copying - chunked.copying).abs().max() < 1e-9


def test_copying_of_a_gated_head_is_that_of_its_gated_write():
    """With a gate, a head writes gate_h z_h W_O[h]: the score follows the gated write, read off the trace's
    hook_result (which holds the gated writes), exactly as the naive direct logit attribution."""
    model = _model(d_vocab=24)
    toks = repeated_sequences(3, 6, 24, seed=1)
    model.blocks[1].attn.set_gate(torch.tensor([1.0, -1.0, 0.0, 0.5]))
    df = induction_scores(model, toks, copying_comparisons=None).set_index(["layer", "head"])
    _, trace = model.run_with_cache(toks, names_filter=lambda n: n.endswith(("hook_pattern", "hook_result")))
    ln, W_U = model.ln_final, model.unembed.weight
    for head in range(4):
        fracs = []
        for b in range(3):
            for q in range(12):
                if not any(toks[b, k - 1] == toks[b, q] for k in range(1, q)):
                    continue
                out = trace.head_out(1)[b, q, head]
                logits = W_U @ ((out - out.mean()) * ln.weight)  # the positive norm scale cannot change ranks
                attended = toks[b, int(trace.pattern(1)[b, head, q].argmax())]
                fracs.append(float((logits < logits[attended]).float().mean()))
        assert df.loc[(1, head), "copying"] == pytest.approx(sum(fracs) / len(fracs), abs=1e-6)
    assert df.loc[(1, 2), "copying"] == 0  # a head gated to zero writes nothing


def test_bf16_patterns_are_folded_in_float32_with_float64_sums():
    """A bf16 model's patterns reach the reducers as softmax computed them, in float32, and are summed in
    float64: the scores equal float64 sums of the recorded patterns within float32 rounding (a bf16 accumulator
    would be off by ~1e-3), and the state is float64. ``dtype=torch.bfloat16`` records them rounded."""
    model = _model().to(torch.bfloat16)
    toks = repeated_sequences(8, 8, 40, seed=4)
    red = InductionReducer(model)
    stream(model, toks, [red], batch_size=8)
    assert {v.dtype for v in red.state.values()} == {torch.float64}
    _, trace = model.run_with_cache(toks, names_filter="*hook_pattern")
    T = toks.shape[1]
    got = red.result()["previous_token"]["mass"]  # [L, H]
    for layer in range(model.cfg.n_layers):
        p = trace.pattern(layer).double()  # [B, H, T, S] float32 values, summed in float64
        assert trace.pattern(layer).dtype == torch.float32
        want = p[:, :, torch.arange(1, T), torch.arange(0, T - 1)].mean((0, 2))  # [H]: mass on q - 1
        torch.testing.assert_close(got[layer].double(), want, atol=1e-6, rtol=0)
    _, rounded = model.run_with_cache(toks, names_filter="*hook_pattern", dtype=torch.bfloat16)
    assert rounded.pattern(0).dtype == torch.bfloat16
    torch.testing.assert_close(rounded.pattern(0), trace.pattern(0).bfloat16(), atol=0, rtol=0)
