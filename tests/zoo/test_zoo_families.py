"""The dense decoder families against transformers, on random tiny configs chosen so every feature bites:
odd head counts, sliding windows shorter than the sequence, soft-caps small enough to change the logits,
partial rotary, parallel blocks, QK-norm, sandwich / output norms, MQA and grouped K/V (no download).

For each family: logits (SDPA path and pattern-recording path) within 1e-4, patterns within 1e-5 of HF eager
``output_attentions``, 32 greedy tokens equal to HF ``generate``, and cached decoding equal to a full
recompute, decoding well past the window.
"""

import pytest
import torch

from interp.zoo.compat import FAMILIES, NEW, PROMPT, SEQ, WINDOW, V, hf_test_model
from interp.zoo.hf import convert, from_hf

transformers = pytest.importorskip("transformers")

hf_model = hf_test_model


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_transformers(name):
    hf = hf_model(name)
    model = from_hf(hf)
    torch.manual_seed(4)
    ids = torch.randint(1, V, (2, SEQ))
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
        logits, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
        torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-4)
        torch.testing.assert_close(model(ids), ref.logits, rtol=0, atol=1e-4)  # SDPA path where it applies
        for layer, pattern in enumerate(ref.attentions):
            torch.testing.assert_close(trace.pattern(layer), pattern, rtol=0, atol=1e-5)
    prompt = ids[:1, :PROMPT]
    want = hf.generate(prompt, max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(prompt),
                       eos_token_id=None, pad_token_id=0)
    got = model.generate(prompt, max_new_tokens=NEW)
    assert torch.equal(got, want), (got, want)
    assert len(set(got[0, PROMPT:].tolist())) > 2  # a constant continuation would prove little
    assert torch.equal(model.generate(prompt, max_new_tokens=NEW, use_cache=False), got)


def test_phi3_longrope_past_the_original_context():
    """LongRoPE switches to the long factors once a pass reaches past the original context; transformers then
    recomputes the whole cache once, which is interp's full recompute."""
    short, long = [1.0 + 0.05 * i for i in range(8)], [1.5 + 0.5 * i for i in range(8)]
    cfg = transformers.Phi3Config(vocab_size=V, hidden_size=80, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=5, max_position_embeddings=64,
                                  original_max_position_embeddings=16, bos_token_id=0, eos_token_id=0,
                                  pad_token_id=0, rope_parameters={"rope_type": "longrope", "short_factor": short,
                                                                   "long_factor": long})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    from interp.zoo.compat import _seed_init

    hf = _seed_init(transformers.Phi3ForCausalLM(cfg))
    model = from_hf(hf)
    assert model.cfg.rope_scaling["rope_type"] == "longrope"
    ids = torch.randint(1, V, (2, SEQ))
    with torch.no_grad():
        for n in (12, SEQ):  # inside the original context (short factors), then past it (long)
            torch.testing.assert_close(model(ids[:, :n]), hf(ids[:, :n]).logits, rtol=0, atol=1e-4)
    prompt = ids[:1, :PROMPT]
    want = hf.generate(prompt, max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(prompt),
                       eos_token_id=None, pad_token_id=0)
    assert torch.equal(model.generate(prompt, max_new_tokens=NEW, use_cache=False), want)


def test_features_bite():
    """Each feature the configs above exercise changes the logits (so matching HF shows it is implemented)."""
    torch.manual_seed(5)
    ids = torch.randint(1, V, (1, SEQ))
    cases = {"gemma2": ("attn_softcap", "final_softcap", "sliding_window"), "mistral": ("sliding_window",),
             "qwen3": ("qk_norm",), "gemma3_text": ("local_rotary_base",),
             "olmo3": ("sliding_window", "local_rotary_base"), "ministral": ("sliding_window",),
             "starcoder2": ("sliding_window",), "smollm3": ("nope_layers", "sliding_window"),
             "exaone4": ("nope_layers", "sliding_window"), "cohere2": ("nope_layers", "sliding_window")}
    for name, fields in cases.items():
        model = from_hf(hf_model(name))
        with torch.no_grad():
            base = model(ids)
        for field in fields:
            cfg = model.cfg.to_dict()
            cfg[field] = {"qk_norm": "none"}.get(field)
            if field == "sliding_window":
                cfg["local_rotary_base"] = None
            other = type(model)(type(model.cfg).from_dict(cfg))
            other.load_state_dict(model.state_dict(), strict=False)
            with torch.no_grad():
                assert (other.eval()(ids) - base).abs().max() > 1e-3, (name, field)


def test_hunyuan_normalises_after_rotary():
    """Hunyuan's QK-norm after RoPE is not the same model as QK-norm before it (Qwen3's order): matching HF
    above shows the order is reproduced, and the NTK-alpha base differs from the plain rope_theta."""
    model = from_hf(hf_model("hunyuan_v1_dense"))
    assert model.cfg.rotary_base == pytest.approx(1000.0 * 3.0 ** (16 / 14))
    torch.manual_seed(5)
    ids = torch.randint(1, V, (1, SEQ))
    with torch.no_grad():
        base = model(ids)
        for field, value in (("qk_norm", "head"), ("rotary_base", 1000.0)):
            other = type(model)(type(model.cfg).from_dict({**model.cfg.to_dict(), field: value}))
            other.load_state_dict(model.state_dict())
            assert (other.eval()(ids) - base).abs().max() > 1e-3, field


def test_glm4_rotary_pairs_are_reordered():
    """GLM-4 rotates interleaved pairs of the first half of each head: without the converter's row reordering
    the same weights give other logits (so matching HF above shows the layout is handled)."""
    from interp.zoo.hf_families import glm4_state_dict

    hf = hf_model("glm4")
    model = from_hf(hf)
    assert model.cfg.rotary_dim == 8
    plain = dict(model.state_dict())
    H, K, D = model.cfg.n_heads, model.cfg.n_kv_heads, model.cfg.d_head
    unordered = {k: v for k, v in hf.state_dict().items()}
    for i in range(model.cfg.n_layers):
        ours = glm4_state_dict(unordered, model.cfg)[f"blocks.{i}.attn.W_qkv.weight"]
        raw = torch.cat([unordered[f"model.layers.{i}.self_attn.{n}_proj.weight"] for n in "qkv"])
        assert not torch.equal(ours, raw) and torch.equal(ours[(H + K) * D:], raw[(H + K) * D:])  # v untouched
        plain[f"blocks.{i}.attn.W_qkv.weight"] = raw
    other = type(model)(model.cfg)
    other.load_state_dict(plain)
    ids = torch.randint(1, V, (1, SEQ), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (other.eval()(ids) - model(ids)).abs().max() > 1e-3


def test_window_cache_keeps_only_the_window():
    model = from_hf(hf_model("gemma2"))
    cache = model.make_cache(1, 60)
    windowed = [i for i in range(model.cfg.n_layers) if model.cfg.window(i) is not None]
    assert windowed == [0]
    assert cache.layers[0].buffers[0].shape[2] == WINDOW - 1
    assert cache.layers[1].buffers[0].shape[2] == 60
    # Chunked prefill across the window boundary, then steps: each equals the full pass's last logits.
    ids = torch.randint(1, V, (1, 30))
    with torch.no_grad():
        full = model(ids)
        parts = [model(ids[:, :5], kv_cache=cache), model(ids[:, 5:19], kv_cache=cache)]
        parts += [model(ids[:, t:t + 1], kv_cache=cache) for t in range(19, 30)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-4)


PUBLISHED = {  # label: (model_type, the published config.json's dimensions, layers cut to 2 below)
    "Llama-3.2-1B": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                                   tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 8192})),
    "Gemma-2-2B": ("gemma2", dict(hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=256, sliding_window=4096, query_pre_attn_scalar=256,
                                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                  max_position_embeddings=8192)),
    "Gemma-3-1B": ("gemma3_text", dict(hidden_size=1152, intermediate_size=6912, num_attention_heads=4,
                                       num_key_value_heads=1, head_dim=256, sliding_window=512,
                                       query_pre_attn_scalar=256, max_position_embeddings=32768,
                                       rope_theta=1000000.0, rope_local_base_freq=10000.0)),
    "Qwen3-0.6B": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                                 tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "Pythia-160M": ("gpt_neox", dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                                     max_position_embeddings=2048,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.25})),
    "StarCoderBase-1B": ("gpt_bigcode", dict(n_embd=2048, n_head=16, n_inner=8192, n_positions=8192,
                                             multi_query=True, n_layer=2)),
    "OLMo-2-0425-1B": ("olmo2", dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=16,
                                     num_key_value_heads=16, max_position_embeddings=4096, rope_theta=500000.0)),
    "SmolLM3-3B": ("smollm3", dict(hidden_size=2048, intermediate_size=11008, num_attention_heads=16,
                                   num_key_value_heads=4, max_position_embeddings=65536, rope_theta=5000000.0,
                                   no_rope_layer_interval=2, tie_word_embeddings=True, pad_token_id=None)),
    "StarCoder2-3B": ("starcoder2", dict(hidden_size=3072, intermediate_size=12288, num_attention_heads=24,
                                         num_key_value_heads=2, max_position_embeddings=16384, sliding_window=4096,
                                         rope_theta=999999.4420358813, norm_epsilon=1e-5)),
    "granite-3.1-2b": ("granite", dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                       num_key_value_heads=8, max_position_embeddings=131072, rope_theta=5000000.0,
                                       embedding_multiplier=12.0, attention_multiplier=0.015625,
                                       residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True)),
    "stablelm-2-1_6b": ("stablelm", dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                                         num_key_value_heads=32, max_position_embeddings=4096, use_qkv_bias=True,
                                         partial_rotary_factor=0.25, rope_theta=10000.0)),
    "opt-1.3b": ("opt", dict(hidden_size=2048, ffn_dim=8192, num_attention_heads=32, max_position_embeddings=2048,
                             word_embed_proj_dim=2048, pad_token_id=None)),
    "phi-1_5": ("phi", dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                            max_position_embeddings=2048, partial_rotary_factor=0.5)),
}


@pytest.mark.parametrize("label", sorted(PUBLISHED))
def test_published_shapes_build_and_convert(label):
    """Each family's published config.json dimensions (layers cut to 2, vocabulary cut) build and convert."""
    model_type, kw = PUBLISHED[label]
    kw = {"num_hidden_layers": 2, **kw} if model_type != "gpt_bigcode" else kw
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=64, **kw)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model = from_hf(hf)
    d_model = kw.get("hidden_size", kw.get("n_embd"))
    n_heads = kw.get("num_attention_heads", kw.get("n_head"))
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads) == (2, d_model, n_heads)
    assert model.cfg.d_head == kw.get("head_dim", d_model // n_heads)
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-3)


# --- refusals -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,change,message", [
    ("falcon", {"alibi": True, "num_attention_heads": 10}, r"falcon alibi=True with num_attention_heads=10 is not "
                                                           r"supported"),
    ("phi", {"qk_layernorm": True}, r"phi qk_layernorm=True is not supported"),
    ("gpt_neox", {"hidden_act": "swish"}, r"gpt_neox hidden_act='swish' is not supported"),
    ("gpt_bigcode", {"activation_function": "tanh"}, r"gpt_bigcode activation_function='tanh' is not supported"),
    ("gemma2", {"hidden_activation": "relu"}, r"gemma2 hidden_activation='relu' is not supported"),
    ("olmo2", {"hidden_act": "relu"}, r"olmo2 hidden_act='relu' is not supported"),
    ("phi3", {"hidden_act": "relu"}, r"phi3 hidden_act='relu' is not supported"),
    ("mistral", {"layer_types": ["chunked_attention", "full_attention"]},
     r"mistral layer_types\[0\]='chunked_attention' is not supported"),
    ("qwen3", {"rope_parameters": {"rope_type": "mrope", "rope_theta": 1.0}}, r"rope_type='mrope' is not supported"),
    ("gemma3_text", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1.0},
                                         "sliding_attention": {"rope_type": "linear", "factor": 2.0,
                                                               "rope_theta": 1.0}}},
     r"sliding_attention rope_type='linear' is not supported"),
    ("falcon_new_arch", {"parallel_attn": False}, r"new_decoder_architecture=True with parallel_attn=False"),
    ("olmo", {"clip_qkv": 8.0}, r"olmo clip_qkv=8.0 is not supported"),
    ("olmo3", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1.0},
                                   "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0}}},
     r"olmo3 sliding_attention rope_type='linear' is not supported"),
    ("ministral", {"layer_types": ["chunked_attention", "full_attention"]},
     r"ministral layer_types\[0\]='chunked_attention' is not supported"),
    ("seed_oss", {"hidden_act": "relu"}, r"seed_oss hidden_act='relu' is not supported"),
    ("starcoder2", {"hidden_act": "swish"}, r"starcoder2 hidden_act='swish' is not supported"),
    ("arcee", {"hidden_act": "tanh"}, r"arcee hidden_act='tanh' is not supported"),
    ("hunyuan_v1_dense", {"hidden_act": "relu"}, r"hunyuan_v1_dense hidden_act='relu' is not supported"),
    ("smollm3", {"no_rope_layers": [1, 0, 1]}, r"smollm3 no_rope_layers=\[1, 0, 1\] must hold one 0 / 1 flag"),
    ("stablelm", {"qk_layernorm": True}, r"stablelm qk_layernorm=True is not supported"),
    ("stablelm", {"head_dim": 8}, r"stablelm head_dim=8 is not supported"),
    ("glm4", {"hidden_act": "relu"}, r"glm4 hidden_act='relu' is not supported"),
    ("cohere", {"use_qk_norm": True}, r"cohere use_qk_norm=True is not supported"),
    ("cohere", {"logit_scale": -0.5}, r"cohere logit_scale=-0.5 must be a finite number > 0"),
    ("ernie4_5", {"hidden_act": "relu"}, r"ernie4_5 hidden_act='relu' is not supported"),
    ("gptj", {"rotary_dim": None}, r"gptj rotary_dim=None is not supported"),
    ("gptj", {"activation_function": "tanh"}, r"gptj activation_function='tanh' is not supported"),
    ("opt", {"word_embed_proj_dim": 40}, r"opt word_embed_proj_dim=40 is not supported"),
    ("opt", {"do_layer_norm_before": False}, r"opt do_layer_norm_before=False is not supported"),
    ("granite", {"logits_scaling": 0}, r"granite logits_scaling=0 must be a finite number > 0"),
    ("granite", {"embedding_multiplier": -1.0}, r"granite embedding_multiplier=-1.0 must be a finite number > 0"),
    ("exaone4", {"layer_types": ["chunked_attention", "full_attention"]},
     r"exaone4 layer_types\[0\]='chunked_attention' is not supported"),
])
def test_unsupported_settings_are_refused_by_name(name, change, message):
    hf = hf_model(name)
    with pytest.raises(ValueError, match=message):
        convert({**hf.config.to_dict(), **change}, hf.state_dict())


@pytest.mark.parametrize("name,key", [
    ("gpt_neox", "gpt_neox.layers.0.attention.query_key_value.weight"),
    ("falcon", "transformer.h.1.self_attention.query_key_value.weight"),
    ("gpt_bigcode", "transformer.h.0.attn.c_attn.weight"),
    ("phi3", "model.layers.0.mlp.gate_up_proj.weight"),
    ("gemma2", "model.layers.1.post_feedforward_layernorm.weight"),
    ("olmo2", "model.layers.0.self_attn.k_norm.weight"),
    ("starcoder2", "model.layers.1.mlp.c_fc.bias"),
    ("hunyuan_v1_dense", "model.layers.0.self_attn.query_layernorm.weight"),
    ("arcee", "model.layers.0.mlp.up_proj.weight"),
    ("gptj", "transformer.h.1.mlp.fc_in.bias"),
    ("glm4", "model.layers.0.mlp.gate_up_proj.weight"),
    ("exaone4", "model.layers.1.post_feedforward_layernorm.weight"),
])
def test_state_dict_that_disagrees_with_its_config_is_refused(name, key):
    hf = hf_model(name)
    sd = dict(hf.state_dict())
    bad = tuple(s + 1 for s in sd[key].shape)
    sd[key] = torch.zeros(bad)
    with pytest.raises(ValueError, match=rf"{tuple(bad)}".replace("(", r"\(").replace(")", r"\)")):
        convert(hf.config.to_dict(), sd)


@pytest.mark.parametrize("change,message", [
    ({"nope_layers": [2]}, r"nope_layers=\[2\] must list distinct layer indices in \[0, 2\)"),
    ({"nope_layers": [0, 0]}, r"nope_layers=\[0, 0\] must list distinct"),
    ({"nope_layers": [1], "positional": "learned"}, r"nope_layers=\[1\] needs positional='rotary'"),
])
def test_nope_layers_are_checked(change, message):
    from interp import ModelConfig

    base = dict(n_layers=2, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, positional="rotary")
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**base, **change})
    assert ModelConfig(**base, nope_layers=[1, 0]).nope_layers == [0, 1]
