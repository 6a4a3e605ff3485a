"""The data layer: padding, length bucketing and treebank batches with their annotations."""

import pytest
import torch

from interp.data import Sentence, as_batch, bucket_by_length, iter_batches, pad, read_conllu, treebank_batches
from interp.data.synthetic import random_tokens_for


def test_pad_and_bucket():
    tokens, mask = pad([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=0)
    assert tokens.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    lengths = [9, 1, 5, 3, 7, 2]
    groups = bucket_by_length(lengths, 2)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert [[lengths[i] for i in g] for g in groups] == [[1, 2], [3, 5], [7, 9]]
    assert bucket_by_length(lengths, 4, window=1) == [[0], [1], [2], [3], [4], [5]]
    with pytest.raises(ValueError, match="batch_size=0"):
        bucket_by_length(lengths, 0)
    with pytest.raises(ValueError, match="non-empty sequence"):
        pad([])


def test_iter_batches_normalises_inputs():
    out = list(iter_batches({"tokens": torch.zeros(5, 3, dtype=torch.long)}, batch_size=2))
    assert [len(b) for b in out] == [2, 2, 1] and out[0].real.all()
    with pytest.raises(TypeError, match="must be integers"):
        list(iter_batches(torch.zeros(2, 3)))


class _WordTok:
    pad_token_id = 0

    def encode_words(self, words):
        ids, index = [1], [None]  # a [CLS]-like token that belongs to no word
        for w, word in enumerate(words):
            for _ in range(len(word)):  # one token per character
                ids.append(2 + w)
                index.append(w)
        return ids, index


class _Model:
    class cfg:
        n_ctx = 9


def test_treebank_batches_annotate_sentences_and_word_membership():
    sents = [Sentence(["ab", "c"], [-1, 0], ["root", "dep"]), Sentence(["abcdefghij"], [-1], ["root"]),
             Sentence(["a"], [-1], ["root"])]
    stats_batches = list(treebank_batches(_Model(), sents, tokenizer=_WordTok(), batch_size=2))
    assert len(stats_batches) == 1  # the 11-token sentence is longer than n_ctx and skipped
    b = stats_batches[0]
    assert [s.words for s in b.annotations["sentences"]] == [["a"], ["ab", "c"]]  # shortest first
    member = b.annotations["member"]  # [B, W, T]
    assert member.shape == (2, 2, 4)
    assert member[1].tolist() == [[0, 1, 1, 0], [0, 0, 0, 1]]
    assert b.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    with pytest.raises(ValueError, match="has no tokenizer with encode_words"):
        treebank_batches(_Model(), sents)


def test_random_tokens_start_with_bos_and_avoid_it():
    class _Tok:
        bos_id = 3

    class _M:
        class cfg:
            d_vocab = 10
            causal = True
        tokenizer = _Tok()

    t = random_tokens_for(_M(), 50, 8, seed=0)
    assert (t[:, 0] == 3).all() and not (t[:, 1:] == 3).any() and int(t.max()) < 10


def test_dict_extras_become_annotations_and_are_split_with_their_rows():
    tokens = torch.arange(10).view(5, 2)
    loss_mask = torch.tensor([[0, 1]] * 5).bool()
    b = as_batch({"tokens": tokens, "loss_mask": loss_mask, "note": "x"})
    assert torch.equal(b.annotations["loss_mask"], loss_mask) and b.annotations["note"] == "x" and b.mask is None
    parts = list(iter_batches({"tokens": tokens, "loss_mask": loss_mask, "note": "x"}, batch_size=2))
    assert [len(p) for p in parts] == [2, 2, 1]
    assert [p.annotations["loss_mask"].shape[0] for p in parts] == [2, 2, 1]  # sliced with the rows
    assert torch.equal(parts[2].tokens, tokens[4:]) and parts[2].annotations["note"] == "x"


def test_read_conllu_keeps_the_text_comment():
    lines = ["# sent_id = a", "# text = The cat.", "1\tThe\t_\t_\t_\t_\t2\tdet\t_\t_",
             "2\tcat\t_\t_\t_\t_\t0\troot\t_\t_", "", "1\tHi\t_\t_\t_\t_\t0\troot\t_\t_", ""]
    first, second = read_conllu(lines)
    assert (first.text, first.sent_id, second.text) == ("The cat.", "a", None)
