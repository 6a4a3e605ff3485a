"""Hugging Face converters on randomly initialised small models (no download): BERT, GPT-2, Llama-style."""

import pytest
import torch

from interp.zoo import load
from interp.zoo.hf import convert, from_hf

transformers = pytest.importorskip("transformers")


def _seed_init(model):
    """Random init with non-trivial norms and biases, so a swapped weight cannot hide."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or "ln" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p)) if name.endswith("weight") else p.normal_(0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0, 0.2)
            else:  # larger than HF's 0.02 init so that greedy decoding does not just repeat one token
                p.normal_(0, 0.2)
    return model.eval()


def bert_model():
    cfg = transformers.BertConfig(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=80, max_position_embeddings=40, type_vocab_size=2,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    return _seed_init(transformers.BertModel(cfg))


def gpt2_model(**kw):
    cfg = transformers.GPT2Config(vocab_size=101, n_embd=48, n_layer=2, n_head=4, n_positions=48,
                                  bos_token_id=0, eos_token_id=0, **kw)
    torch.manual_seed(0)
    return _seed_init(transformers.GPT2LMHeadModel(cfg))


def llama_model(model_type="llama", **kw):
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[model_type]
    args = dict(vocab_size=103, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=2, max_position_embeddings=64, rope_theta=500.0, rms_norm_eps=1e-5,
                bos_token_id=0, eos_token_id=0, pad_token_id=0)
    args.update(kw)
    torch.manual_seed(0)
    return _seed_init(cls[1](cls[0](**args)))


def test_bert_hidden_states_and_patterns():
    hf = bert_model()
    model = from_hf(hf)
    assert (model.cfg.normalization, model.cfg.causal, model.cfg.unembed) == ("post", False, False)
    torch.manual_seed(2)
    ids = torch.randint(0, 97, (2, 11))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    tt = torch.zeros_like(ids)
    tt[:, 5:] = 1
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_attentions=True)
        out, trace = model.run_with_cache(ids, attention_mask=mask, token_type_ids=tt, names_filter="*hook_pattern")
    real = mask.bool()
    torch.testing.assert_close(out[real], ref.last_hidden_state[real], rtol=0, atol=1e-4)
    for layer, pattern in enumerate(ref.attentions):
        torch.testing.assert_close(trace.pattern(layer).transpose(1, 2)[real], pattern.transpose(1, 2)[real],
                                   rtol=0, atol=1e-5)


def test_bert_for_masked_lm_prefix_is_stripped():
    hf = transformers.BertForMaskedLM(bert_model().config).eval()
    model = from_hf(hf)
    ids = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        ref = hf.bert(input_ids=ids).last_hidden_state
    torch.testing.assert_close(model(ids), ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("kw", [{}, {"activation_function": "gelu", "tie_word_embeddings": False}])
def test_gpt2_logits_and_greedy_generation(kw):
    hf = gpt2_model(**kw)
    model = from_hf(hf)
    assert model.cfg.tie_embeddings == kw.get("tie_word_embeddings", True)
    torch.manual_seed(3)
    ids = torch.randint(0, 101, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-4)
    prompt = ids[:1, :6]
    ref = hf.generate(prompt, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt),
                      pad_token_id=0, eos_token_id=None)
    ours = model.generate(prompt, max_new_tokens=12)
    assert torch.equal(ours, ref), (ours, ref)
    assert len(set(ours[0, 6:].tolist())) > 1  # a constant continuation would prove little


@pytest.mark.parametrize("model_type,kw", [
    ("llama", {}),
    ("llama", {"num_key_value_heads": 1, "tie_word_embeddings": True, "attention_bias": True}),
    ("llama", {"num_key_value_heads": 8, "head_dim": 12, "mlp_bias": True}),
    ("mistral", {"sliding_window": None}),
    ("qwen2", {"use_sliding_window": False}),
])
def test_llama_style_logits_and_greedy_generation(model_type, kw):
    hf = llama_model(model_type, **kw)
    model = from_hf(hf)
    cfg = model.cfg
    assert cfg.n_kv_heads == kw.get("num_key_value_heads", 2) and cfg.rotary_base == 500.0
    assert (cfg.normalization, cfg.positional, cfg.activation) == ("rms", "rotary", "swiglu")
    torch.manual_seed(4)
    ids = torch.randint(0, 103, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-4)
    prompt = ids[:1, :5]
    ref = hf.generate(prompt, max_new_tokens=15, do_sample=False, attention_mask=torch.ones_like(prompt),
                      eos_token_id=None)
    ours = model.generate(prompt, max_new_tokens=15)
    assert torch.equal(ours, ref), (ours, ref)
    assert len(set(ours[0, 5:].tolist())) > 1


def test_rope_theta_matters():
    """The converter must read rope_theta: the same weights with another base give other logits."""
    hf = llama_model()
    model = from_hf(hf)
    other = from_hf(llama_model(rope_theta=10000.0))
    assert torch.equal(model.W_E, other.W_E)  # same weights, only the base differs
    ids = torch.randint(0, 103, (1, 20))
    with torch.no_grad():
        assert (model(ids) - other(ids)).abs().max() > 1e-3


def test_local_folder_with_tokenizer(tmp_path):
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers

    hf = gpt2_model()
    hf.save_pretrained(tmp_path)
    vocab = {f"w{i}": i for i in range(101)}
    tok = HFTok(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    model = load(tmp_path)
    assert model.name == str(tmp_path)
    ids = model.to_tokens("w5 w7 w9")
    assert ids.tolist() == [[5, 7, 9]]
    assert model.to_str_tokens(ids) == ["w5", "w7", "w9"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-4)


def test_conversion_errors():
    gpt2 = gpt2_model()
    cfg = gpt2.config.to_dict()
    with pytest.raises(ValueError, match=r"model_type='t5' is not supported; supported: \[.*'bert', .*'gpt2'"):
        convert({**cfg, "model_type": "t5"}, gpt2.state_dict())
    sd = dict(gpt2.state_dict())
    del sd["transformer.h.1.attn.c_proj.weight"]
    with pytest.raises(ValueError, match=r"no tensor 'transformer\.h\.1\.attn\.c_proj\.weight'"):
        convert(cfg, sd)
    sd = dict(gpt2.state_dict())
    sd["transformer.h.0.ln_1.weight"] = torch.ones(7)
    with pytest.raises(ValueError, match=r"blocks\.0\.ln1\.weight: .* has \(7,\), model expects \(48,\)"):
        convert(cfg, sd)
    llama = llama_model().config.to_dict()
    with pytest.raises(ValueError, match="rope_type='proportional'"):
        convert({**llama, "rope_parameters": {"rope_type": "proportional", "rope_theta": 1.0, "factor": 2.0}}, {})
    with pytest.raises(ValueError, match="scale_attn_weights=False"):
        convert({**cfg, "scale_attn_weights": False}, gpt2.state_dict())
    with pytest.raises(TypeError, match="Hugging Face model"):
        from_hf(42)


def test_the_families_named_in_help_texts_are_the_ones_converted():
    from interp.zoo.hf import CONVERTERS, FAMILIES, converter

    converter({"model_type": "llama"})  # registers the dense families of hf_families too
    names = FAMILIES.removesuffix(" and other families").split(", ")
    assert len(names) >= 6
    for name in names:  # "GPT-2" -> gpt2, "Qwen" -> qwen2 / qwen3 / qwen2_moe, ...
        key = name.lower().replace("-", "")
        assert any(t.startswith(key) for t in CONVERTERS), f"{name} is named but no model_type {key}* converts"
    with pytest.raises(ValueError, match=r"model_type='t5' is not supported; supported: \[.*'mixtral'.*\]"):
        converter({"model_type": "t5"})
