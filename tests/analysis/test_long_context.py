"""Long context in linear memory: attention computed a query chunk at a time inside the pass, fed to the
reducers chunk by chunk, gives the scores of whole materialised patterns; ``stream`` chooses the chunk itself
when every reducer reading patterns folds chunks."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from interp import streaming
from interp.analysis import classify_heads
from interp.streaming import MeanReducer, Reducer, stream


def redrawn(model):
    """Every parameter re-drawn (norm weights and biases too), seeded: no zero bias or unit norm hides a bug."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return model


def patterns(model, tokens, chunk, **kwargs):
    model.set_query_chunk(chunk)
    try:
        with torch.no_grad():
            return model.run_with_cache(tokens, names_filter=["*hook_pattern", "*hook_attn_scores"], **kwargs)
    finally:
        model.set_query_chunk(None)


@pytest.mark.parametrize("variant,config", [("gqa-rotary", {}), ("mqa", {"sliding_window": [None, 5]}),
                                            ("mha", {"attn_softcap": 3.0}), ("mla", {})])
def test_causal_query_chunks_give_the_whole_patterns_scores_and_outputs(variant, config):
    model = redrawn(tiny_model(variant=variant, **config))
    tokens = torch.randint(0, 20, (2, 23), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 23, dtype=torch.long)
    mask[1, :4] = 0  # left padding: the padding mask is sliced per chunk as well
    out, whole = patterns(model, tokens, None, attention_mask=mask)
    out_c, chunked = patterns(model, tokens, 4, attention_mask=mask)
    torch.testing.assert_close(out_c, out, atol=1e-5, rtol=0)
    for name in whole.keys():
        assert chunked[name].shape == whole[name].shape  # [B, H, T, S]: the dropped keys are handed over too
        torch.testing.assert_close(chunked[name], whole[name], atol=1e-5, rtol=0)
    p = chunked["blocks.1.attn.hook_pattern"]
    assert torch.equal(p.triu(1), torch.zeros_like(p))  # nothing above the diagonal: exact zeros


def test_query_chunks_after_a_cache_see_the_cached_keys():
    model = redrawn(tiny_model(variant="gqa-rotary"))
    tokens = torch.randint(0, 20, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)[:, 8:]
        cache = model.make_cache(batch_size=1)
        model(tokens[:, :8], kv_cache=cache)
        model.set_query_chunk(3)
        with model.hooks([("blocks.0.attn.hook_pattern", lambda t, hook: t)]):  # forces the explicit path
            rest = model(tokens[:, 8:], kv_cache=cache)
        model.set_query_chunk(None)
    torch.testing.assert_close(rest, full, atol=1e-5, rtol=0)


def test_a_hook_returning_a_new_pattern_still_reaches_every_key():
    """A hook may return a pattern that puts weight on keys the causal mask hides (uniform rows here): the
    chunk then multiplies all of v, as the unchunked path does."""
    model = redrawn(tiny_model())
    tokens = torch.randint(0, 20, (1, 12), generator=torch.Generator().manual_seed(3))
    uniform = [("blocks.0.attn.hook_pattern", lambda t, hook: torch.full_like(t, 1 / t.shape[-1]))]
    outs = []
    for chunk in (None, 5):
        model.set_query_chunk(chunk)
        with torch.no_grad(), model.hooks(uniform):
            outs.append(model(tokens))
    model.set_query_chunk(None)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)


class Shapes(Reducer):
    """Records the shape of every pattern tensor it is handed."""

    names = "blocks.0.attn.hook_pattern"

    def __init__(self, chunks: bool) -> None:
        super().__init__()
        self.reads_query_chunks = chunks
        self.shapes: list[tuple[int, ...]] = []

    def update(self, name, tensor, *, q_start):
        self.shapes.append((q_start, *tensor.shape))

    def result(self):
        return self.shapes


def test_stream_chunks_the_pattern_only_when_every_pattern_reducer_reads_chunks(monkeypatch):
    monkeypatch.setattr(streaming, "AUTO_QUERY_CHUNK", 8)
    model = tiny_model()
    tokens = torch.randint(0, 20, (2, 20), generator=torch.Generator().manual_seed(4))
    chunked = Shapes(True)
    stream(model, tokens, [chunked])
    assert chunked.shapes == [(0, 2, 4, 8, 20), (8, 2, 4, 8, 20), (16, 2, 4, 4, 20)]
    assert all(b.attn.query_chunk is None for b in model.blocks)  # the model's own setting is back
    whole, other = Shapes(False), Shapes(True)
    stream(model, tokens, [whole, other])  # one whole-pattern reader: nobody gets chunks
    assert whole.shapes == other.shapes == [(0, 2, 4, 20, 20)]
    model.set_query_chunk(5)  # a chunk the caller set is kept
    kept = Shapes(True)
    stream(model, tokens, [kept])
    assert [s[0] for s in kept.shapes] == [0, 5, 10, 15]
    model.set_query_chunk(None)
    explicit = Shapes(True)
    stream(model, tokens, [explicit], query_chunk=6)
    assert [s[3] for s in explicit.shapes] == [6, 6, 6, 2]


def test_automatic_chunks_are_sized_by_the_bytes_of_their_rows(monkeypatch):
    monkeypatch.setitem(streaming.AUTO_CHUNK_BYTES, "cpu", 5 * 2 * 4 * 20 * 4)  # 5 rows of [2, 4, rows, 20] float32
    monkeypatch.setattr(streaming, "AUTO_MIN_QUERY_CHUNK", 2)
    model = tiny_model()
    tokens = torch.randint(0, 20, (2, 20), generator=torch.Generator().manual_seed(4))
    sized = Shapes(True)
    stream(model, tokens, [sized])
    assert [s[0] for s in sized.shapes] == [0, 5, 10, 15] and {s[3] for s in sized.shapes} == {5}
    monkeypatch.setitem(streaming.AUTO_CHUNK_BYTES, "cpu", 1)  # the floor holds
    floored = Shapes(True)
    stream(model, tokens, [floored])
    assert {s[3] for s in floored.shapes} == {2}
    assert all(b.attn.query_chunk is None for b in model.blocks)


def test_automatic_chunks_are_at_most_so_many_per_layer_within_a_byte_ceiling(monkeypatch):
    """Small byte budgets would cut a long sequence in many chunks: AUTO_MAX_CHUNKS bounds their count, while a
    chunk's rows stay under AUTO_CHUNK_CAP_BYTES (so memory stays linear in T)."""
    monkeypatch.setitem(streaming.AUTO_CHUNK_BYTES, "cpu", 1)  # the budget alone: the floor of 2 queries
    monkeypatch.setattr(streaming, "AUTO_MIN_QUERY_CHUNK", 2)
    monkeypatch.setattr(streaming, "AUTO_MAX_CHUNKS", 4)  # 20 queries in at most 4 chunks: 5 a chunk
    model = tiny_model()
    tokens = torch.randint(0, 20, (2, 20), generator=torch.Generator().manual_seed(5))
    counted = Shapes(True)
    stream(model, tokens, [counted])
    assert [s[0] for s in counted.shapes] == [0, 5, 10, 15] and {s[3] for s in counted.shapes} == {5}
    monkeypatch.setitem(streaming.AUTO_CHUNK_CAP_BYTES, "cpu", 3 * 2 * 4 * 20 * 4)  # 3 rows of [2, 4, rows, 20]
    capped = Shapes(True)
    stream(model, tokens, [capped])
    assert [s[0] for s in capped.shapes] == list(range(0, 20, 3)) and max(s[3] for s in capped.shapes) == 3


def test_stream_refuses_a_chunk_for_a_whole_pattern_reducer_and_a_bad_chunk():
    model = tiny_model()
    tokens = torch.randint(0, 20, (1, 10))
    with pytest.raises(ValueError, match=r"query_chunk=4 but reducers \['Shapes'\] read whole patterns"):
        stream(model, tokens, [Shapes(False)], query_chunk=4)
    with pytest.raises(ValueError, match="query_chunk=0 must be 'auto', None or an int >= 1"):
        stream(model, tokens, [MeanReducer("blocks.0.attn.hook_pattern")], query_chunk=0)


def test_stream_mean_pattern_is_the_same_chunked(monkeypatch):
    model = redrawn(tiny_model(variant="gqa-rotary"))
    tokens = torch.randint(0, 20, (3, 21), generator=torch.Generator().manual_seed(5))
    whole = MeanReducer("blocks.*.attn.hook_pattern")
    stream(model, tokens, [whole], query_chunk=None)
    monkeypatch.setattr(streaming, "AUTO_QUERY_CHUNK", 4)
    chunked = MeanReducer("blocks.*.attn.hook_pattern")
    stream(model, tokens, [chunked])
    assert {k for k in chunked.state if "@" in k} >= {"blocks.0.attn.hook_pattern@16"}  # it did chunk
    for name, mean in whole.result().items():
        torch.testing.assert_close(chunked.result()[name], mean, atol=1e-6, rtol=0)


def test_classify_heads_pattern_scores_are_the_same_in_query_chunks(monkeypatch):
    """Every pattern-based kind (positional, previous / duplicate-token, induction with its copying score, sink,
    retrieval): chunks of 8 queries over 48 tokens against each pass's whole patterns."""
    model = redrawn(tiny_model(variant="gqa-rotary", n_ctx=64, d_vocab=48))
    kinds = ["positional", "previous-token", "duplicate-token", "induction", "sink", "retrieval"]
    g = torch.Generator().manual_seed(6)
    half = torch.randint(0, 48, (4, 24), generator=g)
    args = dict(tokens=torch.randint(0, 48, (4, 48), generator=g), induction_tokens=torch.cat([half, half], 1),
                kinds=kinds, n_seqs=4, options={"needle_context": 48, "needle_len": 6, "sink_threshold": 0.0},
                copying_comparisons=None, progress=False)
    model.set_query_chunk(48)  # one chunk per pass: whole [B, H, 48, 48] patterns
    whole = classify_heads(model, **args)
    model.set_query_chunk(None)
    seen: list[int] = []
    original = streaming._query_chunk

    def spy(model, chunk):
        seen.append(chunk)
        return original(model, chunk)

    monkeypatch.setattr(streaming, "_query_chunk", spy)
    monkeypatch.setattr(streaming, "AUTO_QUERY_CHUNK", 8)
    chunked = classify_heads(model, **args)
    assert seen == [8, 8, 8]  # the text, repeats and needle passes all ran in chunks
    assert set(chunked.details) == set(whole.details) >= {"positional", "induction", "sink", "retrieval"}
    for key, table in whole.details.items():
        num = table.select_dtypes("number")
        diff = (chunked.details[key].select_dtypes("number") - num).abs().max().max()
        assert diff <= 1e-5, (key, diff)
    assert chunked.df[["layer", "head", "kind"]].equals(whole.df[["layer", "head", "kind"]])


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operator returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_a_chunked_classify_pass_never_creates_a_whole_pattern(monkeypatch):
    """Every tensor of the positional / sink / induction passes at 96 tokens in chunks of 8 stays far below one
    layer's [1, H, T, T] pattern; with whole patterns the same passes create it."""
    model = tiny_model(n_ctx=96)
    g = torch.Generator().manual_seed(7)
    half = torch.randint(0, 20, (1, 48), generator=g)
    args = dict(tokens=torch.randint(0, 20, (1, 96), generator=g), induction_tokens=torch.cat([half, half], 1),
                kinds=["positional", "induction", "sink"], n_seqs=1, batch_size=1, progress=False,
                copying_rows=8)  # the copying score's [rows, heads, vocabulary] logits are linear, not a pattern
    whole_pattern = model.cfg.n_heads * 96 * 96
    model.set_query_chunk(96)
    with LargestTensor() as seen:
        classify_heads(model, **args)
    assert seen.largest >= whole_pattern  # the probe sees a materialised pattern
    model.set_query_chunk(None)
    monkeypatch.setattr(streaming, "AUTO_QUERY_CHUNK", 8)
    with LargestTensor() as seen:
        classify_heads(model, **args)
    assert seen.largest <= whole_pattern // 2, seen.largest


# --- cut rows: a causal chunk's rows handed to reducers without the keys after its last query -------------------
class Rows(Reducer):
    """Keeps a copy of every score / pattern chunk it is handed, and declares cut rows or not."""

    names = ["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_attn_scores"]
    reads_query_chunks = True

    def __init__(self, cut: bool) -> None:
        super().__init__()
        self.reads_cut_rows = cut
        self.seen: dict[tuple[str, int], torch.Tensor] = {}

    def update(self, name, tensor, *, q_start):
        self.seen[(name, q_start)] = tensor.clone()

    def result(self):
        return self.seen


def _left_padded(T=21, seed=8):
    tokens = torch.randint(0, 20, (2, T), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :6] = 0  # left padding longer than a chunk: the first chunk of row 1 holds no real key
    return [{"tokens": tokens, "attention_mask": mask}]


@pytest.mark.parametrize("variant", ["gqa-rotary", "mla"])
def test_cut_rows_are_the_padded_rows_up_to_the_chunks_last_query(variant):
    """A reducer that reads cut rows gets [B, H, c, q0 + c]: exactly the padded rows' first keys; the padded rows'
    other keys are exact zeros (pattern) and the mask's finfo.min (scores). The pass runs every chunk of the layer
    it stops after, and the model's outputs do not change."""
    model = redrawn(tiny_model(variant=variant))
    data = _left_padded()
    cut, padded = Rows(True), Rows(False)
    stream(model, data, [cut], query_chunk=4)
    stream(model, data, [padded], query_chunk=4)
    assert cut.seen.keys() == padded.seen.keys()
    assert {q0 for (n, q0) in cut.seen if n == "blocks.1.attn.hook_pattern"} == {0, 4, 8, 12, 16, 20}
    for (name, q0), rows in cut.seen.items():
        whole = padded.seen[(name, q0)]
        c = rows.shape[2]
        assert rows.shape == (*whole.shape[:3], q0 + c) and whole.shape[-1] == 21
        assert torch.equal(rows, whole[..., :q0 + c])
        rest = whole[..., q0 + c:]
        fill = 0.0 if name.endswith("pattern") else torch.finfo(whole.dtype).min
        assert torch.equal(rest, torch.full_like(rest, fill))


def test_one_hook_that_wants_padded_rows_gets_every_hook_padded_rows():
    model = redrawn(tiny_model(variant="gqa-rotary"))
    data = _left_padded()
    cut, padded = Rows(True), Rows(False)
    stream(model, data, [cut, padded], query_chunk=4)
    assert {t.shape[-1] for t in cut.seen.values()} == {21}
    for key, rows in cut.seen.items():
        assert torch.equal(rows, padded.seen[key])


def test_a_cut_rows_hook_may_replace_the_rows_it_was_given():
    """A QueryChunkHook(cut_rows=True) that returns a new pattern of the cut shape changes the output as the same
    edit of the padded pattern does (its keys are the ones the chunk sees)."""
    from interp.hooks import QueryChunkHook

    model = redrawn(tiny_model(variant="gqa-rotary"))
    tokens = torch.randint(0, 20, (1, 13), generator=torch.Generator().manual_seed(9))

    def flatten(t, hook, q0):  # each row uniform over the keys its query may see
        keep = (torch.arange(t.shape[-1])[None, :] <= torch.arange(q0, q0 + t.shape[-2])[:, None]).to(t)
        return (keep / keep.sum(-1, keepdim=True)).expand_as(t).contiguous()  # [c, n or S] -> [B, H, c, n or S]

    outs = []
    for cut in (True, False):
        model.set_query_chunk(5)
        try:
            with torch.no_grad(), model.hooks([("blocks.0.attn.hook_pattern", QueryChunkHook(flatten, cut_rows=cut))]):
                outs.append(model(tokens))
        finally:
            model.set_query_chunk(None)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=0)


def _reducers(model):
    from interp.analysis.induction import CopyingReducer, InductionReducer, TLHeadDetectorReducer, induction_targets
    from interp.analysis.per_sequence import PerSequenceMass
    from interp.analysis.positional import PositionalReducer
    from interp.analysis.sink import SinkReducer

    return [PositionalReducer(model), SinkReducer(model), InductionReducer(model), TLHeadDetectorReducer(model),
            CopyingReducer(model, comparisons=8),
            PerSequenceMass(model, ["induction"], lambda b, rows: induction_targets(b.tokens, b.mask, True, rows))]


def test_every_cut_rows_reducer_folds_the_same_state_as_from_padded_rows():
    """Each reducer that declares reads_cut_rows, fed cut rows and then (the flag switched off) padded rows of the
    same left-padded chunks, ends with the same state: the sink's first real key lies after the first chunk."""
    model = redrawn(tiny_model(variant="gqa-rotary", d_vocab=20))
    half = torch.randint(0, 20, (2, 10), generator=torch.Generator().manual_seed(10))
    tokens = torch.cat([half, half], 1)  # [2, 20] repeats: every score has rows
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :6] = 0
    data = [{"tokens": tokens, "attention_mask": mask}]
    cut, padded = _reducers(model), _reducers(model)
    for r in padded:
        assert r.reads_cut_rows
        r.reads_cut_rows = False
    stream(model, data, cut, query_chunk=4)
    stream(model, data, padded, query_chunk=4)
    for a, b in zip(cut, padded):
        folded_a, folded_b = (r.state or r.values() for r in (a, b))  # PerSequenceMass keeps per-sequence values
        assert folded_a.keys() == folded_b.keys() and folded_a, type(a).__name__
        for k in folded_a:
            torch.testing.assert_close(folded_a[k], folded_b[k], atol=1e-6, rtol=0, equal_nan=True,
                                       msg=f"{type(a).__name__} {k}")
    assert float(cut[1].state["n"]) == 2  # both sequences have sink rows


def test_row_maxima_are_shared_and_leave_the_rows_as_they_were():
    from interp.analysis._stream import row_maxima

    g = torch.Generator().manual_seed(11)
    p = torch.softmax(torch.randn(2, 3, 5, 7, generator=g), -1)  # [B, H, Tc, S]
    p[0, 0, 0] = torch.tensor([0.4, 0.0, 0.4, 0.2, 0.0, 0.0, 0.0])  # a tie: the first key is the argmax
    before = p.clone()
    m = row_maxima(p, 6)
    assert row_maxima(p, 6) is m and row_maxima(p, 7) is not m  # one computation per tensor and key count
    want_top, want_best = p[..., :6].max(-1)
    second = m.runner_up()
    assert torch.equal(p, before)  # knocked out in place, then written back bit for bit
    assert torch.equal(m.top, want_top) and torch.equal(m.best, want_best) and int(m.best[0, 0, 0]) == 0
    assert float(second[0, 0, 0]) == pytest.approx(0.4)  # the tie: the runner-up equals the top
    naive = torch.stack([torch.sort(r[:6], descending=True).values[1] for r in p.reshape(-1, 7)]).view(2, 3, 5)
    assert torch.equal(second, naive)
    q = before.clone().requires_grad_(True)  # part of autograd: copied, never written into
    version = q._version
    torch.testing.assert_close(row_maxima(q, 6).runner_up(), naive)
    assert q._version == version


@pytest.mark.parametrize("n", [1, 127, 128, 255, 256, 300, 1000, 1024])
def test_first_argmax_by_blocks_is_argmax_with_its_ties_and_nans(n):
    """first_argmax against torch's argmax: the first index on ties (few distinct values), the first NaN, an
    infinite top, rows whose length is or is not a multiple of the block, and a view sliced along its keys."""
    from interp.analysis._stream import first_argmax

    g = torch.Generator().manual_seed(n)
    full = torch.randint(0, 4, (2, 3, 9, n + 37), generator=g).float()  # [B, H, Tc, S]: ties in every row
    rows = full[..., :n]  # a view cut along the keys, as a chunk's cut rows
    assert torch.equal(first_argmax(rows), rows.argmax(-1))
    spots = torch.randint(0, n, (5,), generator=g).tolist()
    rows[0, 0, 0, spots[0]] = float("nan")
    rows[1, 2, 3, spots[1]] = float("nan")
    rows[1, 2, 3, spots[2]] = float("nan")  # two NaNs: the first one wins
    rows[0, 1, 4, spots[3]] = float("inf")
    rows[1, 0, 8] = float("nan")  # a whole row of NaN
    assert torch.equal(first_argmax(rows), rows.argmax(-1))
    soft = torch.softmax(torch.randn(2, 3, 9, n, generator=g), -1)
    assert torch.equal(first_argmax(soft), soft.argmax(-1))


def test_tl_detection_rows_are_the_rows_of_tls_patterns_at_the_real_tokens():
    """The TransformerLens detector builds each chunk's detection rows, never a [T, T] matrix: they equal TL's
    whole patterns of each unpadded sequence placed at its real positions (left, right and gapped padding)."""
    from interp.analysis.induction import tl_detection_patterns, tl_detection_rows

    g = torch.Generator().manual_seed(12)
    tokens = torch.randint(0, 4, (3, 15), generator=g)  # few token ids: many duplicates
    mask = torch.ones(3, 15, dtype=torch.long)
    mask[0, :5] = 0
    mask[1, 11:] = 0
    mask[2, [3, 4, 9]] = 0
    for b in range(3):
        idx = mask[b].nonzero().flatten()
        for kind, d in tl_detection_patterns(tokens[b, idx]).items():
            want = torch.zeros(15, 15)
            want[idx[:, None], idx[None, :]] = d
            for q0, c in ((0, 4), (4, 4), (8, 7)):
                got = tl_detection_rows(tokens, mask, slice(q0, q0 + c), q0 + c)[kind][b]  # [c, q0 + c]
                assert torch.equal(got.float(), want[q0:q0 + c, :q0 + c]), (kind, b, q0)
                assert not want[q0:q0 + c, q0 + c:].any()  # nothing after the chunk's last query


def test_unique_argmax_asked_of_a_few_rows_or_of_many_is_that_of_the_whole_chunk():
    """RowMaxima.is_unique_argmax copies out only the rows asked about when few hold the key at their top, and
    reads the whole chunk's runner-up when many do: both answers equal the naive test on every row (ties included)."""
    from interp.analysis._stream import row_maxima

    g = torch.Generator().manual_seed(13)
    p = torch.softmax(torch.randn(2, 1, 6, 9, generator=g), -1).repeat(1, 3, 1, 1)  # [B, H, Tc, S]: heads alike
    p[1, :, 4] = torch.tensor([0.3, 0.3, 0.2, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0])  # a tie at the top
    b = torch.tensor([0, 1, 1, 0, 1, 0, 1, 0])
    t = torch.tensor([0, 4, 2, 5, 4, 1, 3, 3])
    best = p.argmax(-1)  # [B, H, Tc]
    top2 = p.topk(2, dim=-1).values  # [B, H, Tc, 2]
    unique = (top2[..., 1] < top2[..., 0] - 1e-6)[b, :, t]  # [N, H]
    for n in (2, 8):  # 6 of 36 rows at their top: copied out; 24 of 36: the chunk's runner-up
        keys = best[b[:n], 0, t[:n]]  # [n]: every head's argmax (the heads are alike)
        maxima = row_maxima(p.clone(), 9)
        got = maxima.is_unique_argmax(b[:n], t[:n], keys, 1e-6)
        assert (maxima._second is None) == (n == 2)  # which way it went
        assert torch.equal(got, unique[:n])
    assert not bool(unique[1].any())  # the tie is no unique argmax


def test_a_keys_unique_argmax_without_finding_the_argmax_is_the_naive_test():
    """RowMaxima.is_unique_argmax (a target's hit: its weight is the row's top, and no other key within tie_tol)
    equals argmax == key and a unique top by topk, for keys at the argmax, at a tied top that is not the first,
    and elsewhere; on few rows (copied out) and on many (the chunk's runner-up)."""
    from interp.analysis._stream import row_maxima

    g = torch.Generator().manual_seed(14)
    p = torch.softmax(torch.randn(2, 3, 6, 9, generator=g), -1)  # [B, H, Tc, S]
    p[1, :, 4] = torch.tensor([0.3, 0.0, 0.3, 0.2, 0.2, 0.0, 0.0, 0.0, 0.0])  # a tie at the top, keys 0 and 2
    p[0, 1, 2] = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.2, 0.2 - 1e-7, 0.1, 0.1, 0.0])  # within tie_tol
    top2 = p.topk(2, dim=-1).values  # [B, H, Tc, 2]
    unique = top2[..., 1] < top2[..., 0] - 1e-6  # [B, H, Tc]
    best = p.argmax(-1)  # [B, H, Tc]
    b = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0, 1, 0])
    t = torch.tensor([4, 4, 4, 2, 2, 0, 3, 5, 1, 1])
    few = torch.tensor([0, 2, 3, 4, 5, 1, 7, 8, 0, 2])  # the tie, the near tie, arbitrary keys: few at the top
    for keys in (few, best[b, 0, t]):  # then head 0's argmax of every row
        naive = (best[b, :, t] == keys[:, None]) & unique[b, :, t]  # [N, H]
        maxima = row_maxima(p.clone(), 9)
        got = maxima.is_unique_argmax(b, t, keys, 1e-6)
        assert torch.equal(got, naive), keys
        if keys is few:
            assert maxima._best is None  # no row's argmax was searched for
    assert not bool(row_maxima(p.clone(), 9).is_unique_argmax(b[:2], t[:2], torch.tensor([0, 2]), 1e-6).any())
