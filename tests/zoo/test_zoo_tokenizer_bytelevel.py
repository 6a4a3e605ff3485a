"""encode_words on a byte-level BPE tokenizer (GPT-2 / SmolLM2 style): words keep their leading space."""

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from interp.data.coref import gap_windows, read_gap
from interp.zoo.tokenizer import Tokenizer

CORPUS = ["Anna met Kate's brother, and she smiled.", "Simon saw the police officer and his girlfriend.",
          "Maggie played the girlfriend of Simon in the film."] * 20


@pytest.fixture(scope="module")
def tok():
    """A tiny byte-level BPE trained on a few sentences: " Simon" and "Simon" are different tokens."""
    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.train_from_iterator(CORPUS, trainer)
    return Tokenizer(bpe)


def test_words_encode_like_the_running_text(tok):
    words = ["Maggie", "played", "the", "girlfriend", "of", "Simon", "."]
    ids, where = tok.encode_words(words)
    # Reference: the tokenizer on the text itself, where every word but the first follows a space.
    assert ids.tolist() == tok.to_tokens(" ".join(words))[0].tolist()
    assert tok.backend.id_to_token(int(ids[where.index(5)])) == "ĠSimon"
    # Each word's tokens decode back to the word (with its space).
    for i, w in enumerate(words):
        assert tok.decode([t for t, wi in zip(ids.tolist(), where) if wi == i]) == (w if i == 0 else " " + w)


def test_space_before_glues_a_clitic(tok):
    words = ["Anna", "met", "Kate", "'s", "brother", ","]
    ids, where = tok.encode_words(words, space_before=[False, True, True, False, True, False])
    assert ids.tolist() == tok.to_tokens("Anna met Kate's brother,")[0].tolist()
    assert sorted(set(where)) == list(range(len(words)))
    with pytest.raises(ValueError, match=r"space_before must hold one bool per word \(6\)"):
        tok.encode_words(words, space_before=[True])


def test_gap_window_ids_are_the_texts_ids(tok):
    text = "Anna met Kate's brother, and she smiled."
    header = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"
    row = ["dev-1", text, "she", "29", "Anna", "0", "FALSE", "Kate", "9", "TRUE", "http://x"]
    (w,) = gap_windows(read_gap([header, "\t".join(row)]), tok)
    assert w.ids.tolist() == tok.to_tokens(text)[0].tolist()
    (q,) = w.queries
    assert [w.words[i] for i in q.candidates[1]] == ["Kate"] and [w.words[i] for i in q.source] == ["she"]
