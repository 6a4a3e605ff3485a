"""Syntactic scores: CoNLL-U reading and errors, word alignment against loops, a hand-built syntactic head."""

from pathlib import Path

import pytest
import torch

from interp import ModelConfig, Transformer
from interp.analysis import classify_heads, read_conllu, syntactic_scores
from interp.data import align_words

# Word-level vocabulary of the toy treebank. "quickly" and "sleeps" are split into two tokens, so that
# the word/token alignment rules (to a word: sum; from a word: mean) matter.
NOUNS, VERBS = ["dog", "cat", "bird"], ["runs", "sleeps"]
OTHER = ["the", "big", "quickly", "quick", "##ly", "sleep", "##s"]


class WordTok:
    """A tiny word tokenizer: one id per word, two for the words in SPLITS; [CLS] in front."""

    pad_token_id = 0
    cls_token_id = 1
    special_ids = {0, 1}

    def __init__(self):
        self.vocab = {w: i + 2 for i, w in enumerate(NOUNS + VERBS + OTHER)}

    SPLITS = {"quickly": ["quick", "##ly"], "sleeps": ["sleep", "##s"]}

    def pieces(self, w):
        return self.SPLITS.get(w, [w])

    def to_str_tokens(self, ids):
        names = {i: w for w, i in self.vocab.items()} | {0: "[PAD]", 1: "[CLS]"}
        return [names[i] for i in ids]

    def encode_words(self, words):
        ids, where = [self.cls_token_id], [None]
        for i, w in enumerate(words):
            for p in self.pieces(w):
                ids.append(self.vocab[p])
                where.append(i)
        return torch.tensor(ids), where


def _syntax_model(n_ctx=16) -> Transformer:
    """One encoder head whose verb queries match noun keys: it finds the subject wherever it is."""
    tok = WordTok()
    V = len(tok.vocab) + 2
    cfg = ModelConfig(n_layers=1, d_model=V, n_heads=1, d_head=V, attn_only=True, causal=False, positional="none",
                      normalization="none", d_vocab=V, n_ctx=n_ctx, unembed=False, attn_bias=False, out_bias=False)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.weight.copy_(torch.eye(V))
        W = model.blocks[0].attn.W_qkv.weight  # rows [q | k | v], each V wide
        for verb in ("runs", "sleep"):  # "sleeps" is "sleep" + "##s": its first token carries the query
            W[0, tok.vocab[verb]] = 20.0 * V ** 0.5
        for noun in NOUNS:
            W[V + 0, tok.vocab[noun]] = 1.0
    model.tokenizer = tok
    model.name = "toy-syntax"
    return model


SENTENCES = [  # (words, heads 1-based, relations); nsubj offsets from the verb are -1 (x3) and -2 (x3)
    (["the", "dog", "runs"], [2, 3, 0], ["det", "nsubj", "root"]),
    (["cat", "sleeps"], [2, 0], ["nsubj", "root"]),
    (["the", "big", "bird", "runs"], [3, 3, 4, 0], ["det", "amod", "nsubj", "root"]),
    (["dog", "quickly", "runs"], [3, 3, 0], ["nsubj", "advmod", "root"]),
    (["the", "cat", "quickly", "sleeps"], [2, 4, 4, 0], ["det", "nsubj", "advmod", "root"]),
    (["bird", "quickly", "runs"], [3, 3, 0], ["nsubj", "advmod", "root"]),
]


def _conllu_text(sentences) -> str:
    out = []
    for k, (words, heads, rels) in enumerate(sentences):
        out.append(f"# sent_id = s{k}")
        for i, (w, h, r) in enumerate(zip(words, heads, rels), start=1):
            out.append("\t".join([str(i), w, w, "_", "_", "_", str(h), r, "_", "_"]))
        out.append("")
    return "\n".join(out) + "\n"


@pytest.fixture
def toy_conllu(tmp_path) -> Path:
    path = tmp_path / "toy.conllu"
    path.write_text(_conllu_text(SENTENCES))
    return path


def test_read_conllu_skips_multiword_and_empty_nodes(tmp_path):
    path = tmp_path / "mw.conllu"
    path.write_text("# sent_id = a\n1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n1\tdo\tdo\tAUX\t_\t_\t3\taux\t_\t_\n"
                    "2\tn't\tnot\tPART\t_\t_\t3\tadvmod\t_\t_\n3\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_\n"
                    "3.1\tgo\tgo\tVERB\t_\t_\t_\t_\t3:conj\t_\n\n")
    (sent,) = list(read_conllu(path))
    assert sent.words == ["do", "n't", "go"] and sent.heads == [2, 2, -1]
    assert sent.deprels == ["aux", "advmod", "root"] and sent.sent_id == "a" and sent.line == 1


def test_malformed_lines_name_their_line_number(tmp_path):
    good = _conllu_text(SENTENCES[:2]).splitlines()
    for lineno, bad in [(3, "2\tdog\tdog"), (4, "x\truns\truns\t_\t_\t_\t0\troot\t_\t_"),
                        (4, "3\truns\truns\t_\t_\t_\tq\troot\t_\t_"), (4, "3\truns\truns\t_\t_\t_\t9\troot\t_\t_")]:
        lines = list(good)
        lines[lineno - 1] = bad
        path = tmp_path / "bad.conllu"
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(ValueError, match=rf"bad\.conllu:{lineno}: "):
            list(read_conllu(path))


def test_align_words_rules():
    member = align_words([None, 0, 0, 1, None], 2)
    assert member.tolist() == [[0, 1, 1, 0, 0], [0, 0, 0, 1, 0]]
    with pytest.raises(ValueError, match=r"words \[2\] have no token"):
        align_words([0, 1], 3)


# Subjects at +1, +2 and +3 from their verb, which is never sentence-final (Clark's baseline clamps offsets past
# the end to the last word, so a sentence-final verb would make "+3" always right).
SUBJECTS = [
    (["the", "dog", "runs", "quickly"], [2, 3, 0, 3], ["det", "nsubj", "root", "advmod"]),
    (["cat", "sleeps", "quickly"], [2, 0, 2], ["nsubj", "root", "advmod"]),
    (["dog", "quickly", "runs", "quickly"], [3, 3, 0, 3], ["nsubj", "advmod", "root", "advmod"]),
    (["the", "cat", "quickly", "sleeps", "quickly"], [2, 4, 4, 0, 4], ["det", "nsubj", "advmod", "root", "advmod"]),
    (["bird", "big", "quick", "runs", "quickly"], [4, 1, 1, 0, 4], ["nsubj", "amod", "amod", "root", "advmod"]),
    (["cat", "the", "big", "sleeps", "quickly"], [4, 1, 1, 0, 4], ["nsubj", "det", "amod", "root", "advmod"]),
]


def test_hand_built_syntactic_head_beats_offset_baseline(tmp_path):
    path = tmp_path / "subjects.conllu"
    path.write_text(_conllu_text(SUBJECTS))
    model = _syntax_model()
    df = syntactic_scores(model, path)
    # Clark's head<-dep: the word attending most to the subject is its verb ...
    row = df[(df.relation == "nsubj") & (df.direction == "head<-dep")].iloc[0]
    assert row.n == 6 and row.accuracy == 1.0
    assert row.baseline_accuracy == pytest.approx(1 / 3) and row.baseline_offset == 1  # ... an offset 1/3 of the time
    legacy = syntactic_scores(model, path, directions=["head->dep"])  # the verb's own argmax is the subject
    assert legacy[legacy.relation == "nsubj"].accuracy.iloc[0] == 1.0
    base = {(b["relation"], b["direction"]): b for b in df.attrs["baseline"]}
    assert base[("nsubj", "dep->head")]["baseline_accuracy"] == pytest.approx(1 / 3)
    report = classify_heads(model, conllu=path, syntactic_min_count=5)
    assert "syntactic:nsubj" in report.kinds(0, 0)
    assert "+0.67" in " ".join(report.df.evidence)


def test_word_attention_matches_naive_loops(toy_conllu):
    """Random weights: compare every accuracy with a per-sentence loop over token patterns."""
    model = _syntax_model()
    torch.manual_seed(0)
    with torch.no_grad():
        model.blocks[0].attn.W_qkv.weight.normal_(0, 3.0)
    df = syntactic_scores(model, toy_conllu, batch_size=4, directions=["dep->head", "head<-dep", "head->dep"])
    tok = model.tokenizer
    hits, n = {}, {}
    for words, heads, rels in SENTENCES:
        ids, where = tok.encode_words(words)
        _, trace = model.run_with_cache(ids[None], names_filter="*hook_pattern")
        pat = trace.pattern(0)[0, 0]
        W = len(words)
        A = torch.zeros(W, W)
        for i in range(W):
            rows = [t for t, w in enumerate(where) if w == i]
            for j in range(W):
                cols = [t for t, w in enumerate(where) if w == j]
                A[i, j] = pat[rows][:, cols].sum() / len(rows)
        A.fill_diagonal_(float("-inf"))
        for d, (h, r) in enumerate(zip(heads, rels)):
            if h == 0:
                continue
            for direction, row, dst in (("dep->head", A[d], h - 1), ("head->dep", A[h - 1], d),
                                        ("head<-dep", A[:, d], h - 1)):  # the transposed map's column
                key = (r, direction)
                hits[key] = hits.get(key, 0) + int(int(row.argmax()) == dst)
                n[key] = n.get(key, 0) + 1
    assert len(df) == len(hits)
    for r in df.itertuples():
        assert r.accuracy == pytest.approx(hits[(r.relation, r.direction)] / n[(r.relation, r.direction)])


def test_too_long_sentences_are_skipped_and_counted(toy_conllu):
    model = _syntax_model(n_ctx=4)  # [CLS] + 3 tokens fit; "the big bird runs" and the "quickly" ones do not
    df = syntactic_scores(model, toy_conllu)
    assert df.attrs["n_skipped_too_long"] == 4 and df.attrs["n_sentences"] == 2


def test_empty_and_unusable_input(tmp_path, toy_conllu):
    empty = tmp_path / "empty.conllu"
    empty.write_text("# just a comment\n\n")
    with pytest.raises(ValueError, match="empty dataset"):
        syntactic_scores(_syntax_model(), empty)
    with pytest.raises(ValueError, match="longer than the model's n_ctx=2"):
        syntactic_scores(_syntax_model(n_ctx=2), toy_conllu)
    with pytest.raises(FileNotFoundError, match="no CoNLL-U file"):
        syntactic_scores(_syntax_model(), tmp_path / "missing.conllu")
    plain = _syntax_model()
    plain.tokenizer = None
    with pytest.raises(ValueError, match="has no tokenizer"):
        syntactic_scores(plain, toy_conllu)


def test_spacy_parse_is_optional():
    pytest.importorskip("spacy")  # not a dependency: only run where a user installed it
    from interp.analysis import parse_text_with_spacy

    try:
        sents = parse_text_with_spacy("The dog runs. A cat sleeps.")
    except ImportError:
        pytest.skip("no spaCy English pipeline installed")
    assert len(sents) == 2 and all(-1 in s.heads for s in sents)


@pytest.mark.slow
def test_minilm_on_ud_ewt_has_heads_that_beat_the_baseline(ud_ewt_dev):
    from interp.zoo import load

    model = load("minilm-l6")
    df = syntactic_scores(model, ud_ewt_dev, max_sentences=200)
    assert df.attrs["n_sentences"] == 200
    best = df[df.n >= 50].sort_values("gain", ascending=False).iloc[0]
    assert best.gain > 0.2  # Clark et al.: some heads track some relations far better than any fixed offset
    # The baseline, counted independently from the treebank: the share of det arcs at the commonest offset
    # from dependent to head; and a gain is accuracy minus that baseline.
    from collections import Counter

    offsets = Counter(h - d for s in read_conllu(ud_ewt_dev, max_sentences=200)
                      for d, (h, r) in enumerate(zip(s.heads, s.deprels)) if h >= 0 and r == "det")  # subtypes kept
    det = df[(df.relation == "det") & (df.direction == "dep->head")]
    assert (det.n == sum(offsets.values())).all()
    assert det.baseline_accuracy.iloc[0] == pytest.approx(offsets.most_common(1)[0][1] / sum(offsets.values()))
    assert (df.gain - (df.accuracy - df.baseline_accuracy)).abs().max() < 1e-12
