"""Syntactic scoring as Clark et al. (2019) define it: the offset baseline (-3..+2, clamped to ROOT / the last
word) against a transcription of Clark's offset_predictor, subtypes kept by default and pooled with a
per-subtype baseline mixture, and a causal model (which arcs are scorable; predictions only look backward)
against a naive loop over token patterns."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from interp import ModelConfig, Transformer
from interp.analysis import syntactic_scores
from interp.analysis.syntactic import CLARK_OFFSETS
from interp.data import Sentence

VOCAB = ["[PAD]", "[CLS]", "a", "b", "c", "d", "e", "f", "g", "h", "x", "##y"]


class Tok:
    """One id per word; "xy" is two tokens; [CLS] in front."""

    pad_token_id = 0
    special_ids = {0, 1}

    def encode_words(self, words):
        ids, where = [1], [None]
        for i, w in enumerate(words):
            for p in (["x", "##y"] if w == "xy" else [w]):
                ids.append(VOCAB.index(p))
                where.append(i)
        return torch.tensor(ids), where


def model_for(causal: bool, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=len(VOCAB), n_ctx=16, causal=causal,
                      attn_only=True, unembed=False, positional="learned")
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1.0)
    model.tokenizer = Tok()
    return model


def sent(words, heads, rels) -> Sentence:
    """heads 1-based with 0 = ROOT (CoNLL-U), stored 0-based with -1 = ROOT."""
    return Sentence(words=words.split(), heads=[h - 1 for h in heads], deprels=list(rels))


SENTS = [
    sent("a b c d", [2, 0, 2, 3], ["nmod:poss", "root", "nmod", "obj"]),
    sent("a xy b c e", [2, 0, 2, 2, 4], ["nmod:poss", "root", "obj", "nmod", "nmod"]),
    sent("c d a b", [2, 0, 4, 2], ["nmod:poss", "root", "nmod:poss", "obj"]),
    sent("e f g h a", [0, 1, 2, 1, 1], ["root", "obj", "nmod", "nmod", "nmod"]),
    sent("b a xy", [3, 3, 0], ["obj", "nmod:poss", "root"]),
]


def clark_offset_hits(sents, offsets=CLARK_OFFSETS):
    """Clark et al.'s offset_predictor, transcribed: prediction max(0, min(i + offset + 1, len(words))) in
    1-based heads with 0 = ROOT; compared with the gold head. ROOT arcs are left out (interp does not score them)."""
    hits, n = Counter(), Counter()
    for s in sents:
        gold = [h + 1 for h in s.heads]
        for i, (y, r) in enumerate(zip(gold, s.deprels)):
            if y == 0:
                continue
            n[r] += 1
            for o in offsets:
                hits[(r, o)] += int(max(0, min(i + o + 1, len(s.words))) == y)
    return hits, n


def test_default_offsets_are_clarks():
    assert CLARK_OFFSETS == (-3, -2, -1, 0, 1, 2)


def test_baseline_matches_clarks_offset_predictor_with_subtypes_kept():
    df = syntactic_scores(model_for(False), SENTS)
    assert "nmod:poss" in set(df.relation) and "nmod" in set(df.relation)  # kept by default
    hits, n = clark_offset_hits(SENTS)
    for b in df.attrs["baseline"]:
        r = b["relation"]
        best = max(hits[(r, o)] for o in CLARK_OFFSETS)
        assert b["n"] == n[r]
        assert b["baseline_accuracy"] == pytest.approx(best / n[r]), r
        assert hits[(r, b["baseline_offset"])] == best
    # offset +3 is outside Clark's range: obj in sentence 4 ("e f g h a": f -> e) is at -1 ... fine; but a relation
    # whose head sits 3 to the right is never hit by an in-range offset unless clamped to the last word
    far = [sent("a b c d e", [4, 0, 2, 2, 2], ["dep", "root", "x", "x", "x"])]
    base = {b["relation"]: b for b in syntactic_scores(model_for(False), far).attrs["baseline"]}
    assert base["dep"]["baseline_accuracy"] == 0.0
    wide = syntactic_scores(model_for(False), far, offsets=range(-3, 4)).attrs["baseline"]
    assert {b["relation"]: b for b in wide}["dep"]["baseline_offset"] == 3


def test_pooling_mixes_each_subtypes_own_baseline():
    kept = syntactic_scores(model_for(False), SENTS)
    pooled = syntactic_scores(model_for(False), SENTS, strip_subtypes=True)
    hits, n = clark_offset_hits(SENTS)
    best = {r: max(hits[(r, o)] for o in CLARK_OFFSETS) for r in ("nmod", "nmod:poss")}
    base = {(b["relation"], b["direction"]): b for b in pooled.attrs["baseline"]}
    mix = base[("nmod", "dep->head")]
    assert mix["n"] == n["nmod"] + n["nmod:poss"]
    assert mix["baseline_accuracy"] == pytest.approx((best["nmod"] + best["nmod:poss"]) / mix["n"])
    # one offset for both fits worse than the mixture: the reason subtypes are not pooled by default
    one_offset = max(hits[("nmod", o)] + hits[("nmod:poss", o)] for o in CLARK_OFFSETS) / mix["n"]
    assert one_offset < mix["baseline_accuracy"]
    assert isinstance(mix["baseline_offset"], str) and "nmod:poss:+1" in mix["baseline_offset"]
    # head accuracies pool as hit counts
    k = kept[(kept.layer == 1) & (kept["head"] == 0) & (kept.direction == "head<-dep")].set_index("relation")
    p = pooled[(pooled.layer == 1) & (pooled["head"] == 0) & (pooled.direction == "head<-dep")].set_index("relation")
    want = (k.accuracy["nmod"] * k.n["nmod"] + k.accuracy["nmod:poss"] * k.n["nmod:poss"]) / mix["n"]
    assert p.accuracy["nmod"] == pytest.approx(want)


@pytest.mark.parametrize("chunk", [None, 3])  # 3: patterns arrive in query chunks, word maps are summed
@pytest.mark.parametrize("causal", [False, True])
def test_directions_against_a_naive_loop(causal, chunk):
    model = model_for(causal, seed=1)
    dirs = ["dep->head", "head<-dep", "head->dep"]
    model.set_query_chunk(chunk)
    try:
        df = syntactic_scores(model, SENTS, directions=dirs, batch_size=2)
    finally:
        model.set_query_chunk(None)
    hits, n, ok = Counter(), Counter(), Counter()
    for s in SENTS:
        ids, where = model.tokenizer.encode_words(s.words)
        _, trace = model.run_with_cache(ids[None], names_filter="*hook_pattern")
        W = len(s.words)
        for layer in range(2):
            for head in range(2):
                pat = trace.pattern(layer)[0, head]
                A = torch.zeros(W, W)
                for i in range(W):
                    rows = [t for t, w in enumerate(where) if w == i]
                    for j in range(W):
                        cols = [t for t, w in enumerate(where) if w == j]
                        A[i, j] = pat[rows][:, cols].sum() / len(rows)
                allowed = ~torch.eye(W, dtype=torch.bool)
                if causal:
                    allowed &= torch.ones(W, W, dtype=torch.bool).tril()
                A = A.masked_fill(~allowed, float("-inf"))
                for d, (h, r) in enumerate(zip(s.heads, s.deprels)):
                    if h < 0:
                        continue
                    for direction, vec, dst in (("dep->head", A[d], h), ("head->dep", A[h], d),
                                                ("head<-dep", A[:, d], h)):
                        pred = int(vec.argmax()) if torch.isfinite(vec).any() else -1
                        hits[(layer, head, r, direction)] += int(pred == dst)
                        if layer == head == 0:
                            n[(r, direction)] += 1
                            ok[(r, direction)] += int(not causal or (h < d if direction == "dep->head"
                                                                     else h > d if direction == "head<-dep" else d < h))
    assert len(df) == 4 * len(n)
    for r in df.itertuples():
        assert r.n == n[(r.relation, r.direction)] and r.n_scorable == ok[(r.relation, r.direction)]
        assert r.accuracy == pytest.approx(hits[(r.layer, r.head, r.relation, r.direction)] / r.n)
    if causal:  # nothing unscorable is ever right
        assert (df.accuracy * df.n <= df.n_scorable + 1e-9).all()
        assert (df.n_scorable < df.n).any()
    else:
        assert (df.n_scorable == df.n).all()


def test_bad_options():
    with pytest.raises(ValueError, match="directions=.*head-dep"):
        syntactic_scores(model_for(False), SENTS, directions=["head-dep"])
    with pytest.raises(ValueError, match="offsets=.*non-empty"):
        syntactic_scores(model_for(False), SENTS, offsets=[])
