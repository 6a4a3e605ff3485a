"""CoNLL-U input that is not clean: wrong encoding, broken trees, words that tokenize to nothing, caps on
the number of sentences, and sources that never end."""

import itertools

import pytest

import interp
from interp.analysis import classify_heads
from interp.analysis.syntactic import syntactic_scores
from interp.data import Sentence, read_conllu


def _line(i, form, head, rel):
    return f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_"


def _sentence(rows):
    return [_line(i + 1, *r) for i, r in enumerate(rows)] + [""]


GOOD = [("The", 2, "det"), ("cat", 3, "nsubj"), ("sat", 0, "root"), (".", 3, "punct")]


@pytest.fixture(scope="module")
def minilm():
    return interp.load("minilm-l6")


def test_non_utf8_input_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.conllu"
    text = "\n".join(_sentence(GOOD) + _sentence([("Caf\xe9", 0, "root")])) + "\n"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.conllu:6: not UTF-8"):
        list(read_conllu(path))


@pytest.mark.parametrize("rows, match", [
    ([("The", 1, "det"), ("cat", 0, "root")], r"<conllu>:1: word 1 is its own HEAD"),
    ([("The", 0, "root"), ("cat", 0, "root")], r"<conllu>:2: a sentence needs exactly one root.*found 2"),
    ([("a", 2, "x"), ("b", 1, "x"), ("c", 0, "root")], r"<conllu>:1: the HEADs of words \[1, 2\] form a cycle"),
])
def test_broken_trees_are_rejected_with_their_line(rows, match):
    with pytest.raises(ValueError, match=match):
        list(read_conllu(_sentence(rows)))


def test_a_good_tree_reads_back_its_heads():
    (s,) = read_conllu(_sentence(GOOD))
    assert s.heads == [1, 2, -1, 2] and s.deprels == ["det", "nsubj", "root", "punct"]


@pytest.mark.parametrize("bad", [0, -1])
def test_max_sentences_below_one_is_rejected(bad, tmp_path):
    with pytest.raises(ValueError, match=f"max_sentences={bad} must be >= 1"):
        read_conllu(_sentence(GOOD), max_sentences=bad)


def _endless():
    for i in itertools.count():
        if i > 10_000:
            raise AssertionError("the endless source was read far past the cap")
        yield Sentence(["The", "cat", "sat", "."], [1, 2, -1, 2], ["det", "nsubj", "root", "punct"])


def test_an_endless_sentence_source_is_read_only_up_to_the_cap(minilm):
    df = syntactic_scores(minilm, _endless(), max_sentences=3)
    assert df.attrs["n_sentences"] == 3


def test_a_word_that_tokenizes_to_nothing_skips_its_sentence_and_is_counted(minilm):
    sents = [Sentence(["The", "\u200b", "cat"], [2, 2, -1], ["det", "dep", "root"]),
             Sentence(["The", "cat", "sat", "."], [1, 2, -1, 2], ["det", "nsubj", "root", "punct"])]
    df = syntactic_scores(minilm, sents)
    assert df.attrs["n_sentences"] == 1 and df.attrs["n_skipped_untokenizable"] == 1
    ref = syntactic_scores(minilm, sents[1:])
    assert df.equals(ref)


def test_an_empty_treebank_in_classify_heads_says_the_treebank_is_empty(minilm, tmp_path):
    empty = tmp_path / "empty.conllu"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"treebank '.*empty\.conllu' holds no sentence"):
        classify_heads(minilm, conllu=str(empty))
