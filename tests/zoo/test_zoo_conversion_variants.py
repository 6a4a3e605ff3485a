"""Config variants that real checkpoints carry and that used to convert silently wrong (issue 38, item 1): each
is now exact against transformers (float32, random tiny config with every parameter re-drawn, max |logit diff|
<= 1e-4, 32 greedy tokens equal, cached and uncached) or refused by name with the key and its value."""

import pytest
import torch

from interp.zoo.compat import V, _seed_init
from interp.zoo.hf import from_hf

tf = pytest.importorskip("transformers")

SEQ, PROMPT, NEW = 40, 8, 32
TINY = dict(vocab_size=V, hidden_size=40, intermediate_size=48, num_hidden_layers=2, num_attention_heads=5,
            max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _hf(config):
    """A random transformers model of ``config``: seeded, eager attention, every parameter re-drawn."""
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = _seed_init(tf.AutoModelForCausalLM.from_config(config))
    with torch.no_grad():  # buffers that are parameters in effect (DeepSeek-V3's router bias)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.05 * torch.randn_like(b))
    return model


def _assert_exact(hf, *, prompt_len: int = PROMPT, new: int = NEW):
    """Logits within 1e-4 of transformers' and ``new`` greedy tokens equal to its cached ``generate``, with and
    without interp's KV cache."""
    model = from_hf(hf)
    torch.manual_seed(4)
    ids = torch.randint(1, V, (2, SEQ))
    with torch.no_grad():
        diff = float((model(ids) - hf(ids).logits).abs().max())
    assert diff <= 1e-4, diff
    prompt = ids[:1, :prompt_len]
    want = hf.generate(prompt, max_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(prompt),
                       eos_token_id=None, pad_token_id=0)
    assert len(set(want[0, prompt_len:].tolist())) > 2  # a constant continuation would prove little
    assert torch.equal(model.generate(prompt, max_new_tokens=new), want)
    assert torch.equal(model.generate(prompt, max_new_tokens=new, use_cache=False), want)
    return model


def test_qwen2_keeps_qkv_biases_when_attention_bias_is_false():
    """transformers' Qwen2 always has q/k/v biases and never reads ``attention_bias``."""
    hf = _hf(tf.Qwen2Config(**TINY, num_key_value_heads=5, attention_bias=False))
    assert hf.model.layers[0].self_attn.q_proj.bias is not None
    model = _assert_exact(hf)
    assert model.cfg.attn_bias and not model.cfg.out_bias


def test_gemma3_ignores_attn_logit_softcapping_as_transformers_does():
    hf = _hf(tf.Gemma3TextConfig(**{**TINY, "hidden_size": 80, "num_attention_heads": 5}, head_dim=16,
                                 num_key_value_heads=1, sliding_window=8, query_pre_attn_scalar=12,
                                 attn_logit_softcapping=0.5,  # would change every score if it were applied
                                 layer_types=["sliding_attention", "full_attention"]))
    model = _assert_exact(hf)
    assert model.cfg.attn_softcap is None


def test_phi_with_tied_embeddings_keeps_the_lm_head_bias():
    hf = _hf(tf.PhiConfig(**TINY, tie_word_embeddings=True))
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert float(hf.lm_head.bias.detach().abs().max()) > 0.1
    model = _assert_exact(hf)
    torch.testing.assert_close(model.state_dict()["W_U.bias"], hf.lm_head.bias.detach(), rtol=0, atol=0)


def test_qwen3_moe_sliding_window_covers_every_layer():
    """Qwen3-MoE windows every layer when ``use_sliding_window`` is set; it has no ``max_window_layers`` rule
    (the key, carried by published configs, is not read)."""
    cfg = tf.Qwen3MoeConfig(**TINY, head_dim=8, num_key_value_heads=5, moe_intermediate_size=24, num_experts=4,
                            num_experts_per_tok=2, use_sliding_window=True, sliding_window=6, max_window_layers=1)
    model = _assert_exact(_hf(cfg))
    assert model.cfg.sliding_window == [6, 6]


def test_qwen2_moe_sliding_layers_follow_its_own_rule():
    """Qwen2-MoE's config slides the even layers below ``max_window_layers`` (not Qwen2's layers above it)."""
    raw = dict(model_type="qwen2_moe", **{**TINY, "num_hidden_layers": 3}, moe_intermediate_size=24, num_experts=4,
               num_key_value_heads=5, num_experts_per_tok=2, shared_expert_intermediate_size=24, use_sliding_window=True,
               sliding_window=6, max_window_layers=2)
    from interp.zoo.hf import sliding_windows

    assert sliding_windows(raw, "qwen2_moe") == [6, None, None]  # layers 0 and 2 are even; 2 >= max_window_layers
    hf = _hf(tf.Qwen2MoeConfig(**{k: v for k, v in raw.items() if k != "model_type"}))
    model = _assert_exact(hf)
    assert model.cfg.sliding_window == [6, None, None]


def test_deepseek_v2_mlp_bias_is_converted():
    cfg = tf.DeepseekV2Config(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              max_position_embeddings=64, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                              v_head_dim=6, moe_intermediate_size=24, intermediate_size=48, n_routed_experts=4,
                              num_experts_per_tok=2, first_k_dense_replace=1, num_key_value_heads=4,
                              q_lora_rank=None, n_shared_experts=1, mlp_bias=True)
    hf = _hf(cfg)
    assert hf.model.layers[0].mlp.up_proj.bias is not None
    model = _assert_exact(hf)
    assert model.cfg.mlp_bias


LONGROPE_LAYOUTS = {
    "plain": dict(rope_parameters={"rope_type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(8)],
                                   "long_factor": [1.5 + 0.5 * i for i in range(8)]}),
    "partial_rotary_0.5": dict(rope_parameters={"rope_type": "longrope", "partial_rotary_factor": 0.5,
                                                "short_factor": [1.0 + 0.1 * i for i in range(4)],
                                                "long_factor": [2.0 + 0.5 * i for i in range(4)]}),
    # Phi-3-mini-128k's config.json form: legacy rope_scaling with type "longrope", the original context and
    # the factors outside it.
    "phi3_mini_128k_form": dict(rope_scaling={"type": "longrope",
                                              "short_factor": [1.0 + 0.02 * i for i in range(8)],
                                              "long_factor": [1.2 + 0.3 * i for i in range(8)]}),
}


@pytest.mark.parametrize("layout", list(LONGROPE_LAYOUTS))
def test_phi3_longrope_cached_generate_crossing_the_original_context_equals_transformers(layout):
    """transformers drops its cache when a cached generation first reaches past
    ``original_max_position_embeddings`` and re-rotates every key with the long factors; interp's cached
    ``generate`` recomputes its cache at the same step, so the tokens are the same past the boundary."""
    kw = {k: v for k, v in TINY.items() if k not in ("hidden_size", "num_attention_heads")}
    cfg = tf.Phi3Config(**kw, hidden_size=80, num_attention_heads=5, num_key_value_heads=5,
                        original_max_position_embeddings=16, **LONGROPE_LAYOUTS[layout])
    hf = _hf(cfg)
    model = from_hf(hf)
    assert model.cfg.rope_scaling["rope_type"] == "longrope"
    _assert_exact(hf)  # prompt 8 + 32 new: the boundary (16) is crossed during cached decoding
    _assert_exact(hf, prompt_len=16, new=8)  # the prompt ends right at the boundary


def test_phi3_head_dim_other_than_hidden_over_heads_is_converted():
    """transformers' Phi-3 reads ``head_dim`` when the config has one (issue 38, item 10: it used to fail
    through a tensor-shape message)."""
    kw = {k: v for k, v in TINY.items() if k not in ("hidden_size", "num_attention_heads")}
    hf = _hf(tf.Phi3Config(**kw, hidden_size=80, num_attention_heads=5, num_key_value_heads=5, head_dim=24))
    model = _assert_exact(hf)
    assert model.cfg.d_head == 24


def test_phi3_longrope_factors_not_matching_head_dim_are_refused_by_name():
    from interp.zoo.hf_families import phi3_config

    raw = dict(model_type="phi3", **TINY, head_dim=16, original_max_position_embeddings=16,
               rope_parameters={"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 8})
    with pytest.raises(ValueError, match=r"phi3 rope_parameters\['short_factor'\] has 4 factors, but head_dim=16"):
        phi3_config(raw)


_LLAMA = dict(model_type="llama", hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=48,
              vocab_size=V, max_position_embeddings=64)
_L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
       "original_max_position_embeddings": 16}


@pytest.mark.parametrize("rope, message", [
    ({"rope_type": "linear", "factor": 0}, r"rope_scaling\['factor'\]=0 must be a finite number > 0"),
    ({"rope_type": "linear", "factor": float("nan")}, r"rope_scaling\['factor'\]=nan must be a finite number"),
    ({"rope_type": "dynamic", "factor": -2.0}, r"rope_scaling\['factor'\]=-2.0 must be a finite number > 0"),
    ({"rope_type": "yarn", "factor": float("inf")}, r"rope_scaling\['factor'\]=inf must be"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 0}, r"rope_scaling\['beta_fast'\]=0 must be"),
    ({**_L3, "low_freq_factor": None}, r"rope_scaling of rope_type 'llama3' has no 'low_freq_factor'"),
    ({k: v for k, v in _L3.items() if k != "original_max_position_embeddings"},
     r"has no 'original_max_position_embeddings'"),
    ({**_L3, "factor": "8"}, r"rope_scaling\['factor'\]='8' must be a finite number > 0"),
    ({**_L3, "high_freq_factor": 0.5}, r"high_freq_factor=0.5 must be at least low_freq_factor=1.0"),
    ({"rope_type": "longrope", "short_factor": [1.0, float("nan")], "long_factor": [1.0, 2.0]},
     r"rope_scaling\['short_factor'\]\[1\]=nan must be"),
    ({"rope_type": "longrope", "short_factor": [1.0, 1.0]}, r"rope_scaling\['long_factor'\]=None must be a non-empty"),
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5},
     r"rope_scaling\['partial_rotary_factor'\]=0.5 with rope_type 'linear' is not supported"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "original_max_position_embeddings": 0},
     r"rope_scaling\['original_max_position_embeddings'\]=0 must be an integer >= 1"),
])
def test_bad_rope_scaling_is_refused_naming_key_value_and_model_type(rope, message):
    from interp.zoo.hf import llama_config

    with pytest.raises(ValueError, match=message) as err:
        llama_config({**_LLAMA, "rope_scaling": rope})
    assert "model_type='llama'" in str(err.value)


@pytest.mark.parametrize("theta", [0, -10000.0, float("nan")])
def test_zero_negative_or_nan_rope_theta_is_refused(theta):
    from interp.zoo.hf import llama_config

    with pytest.raises(ValueError, match=rf"model_type='llama': rope_theta={theta!r} must be a finite number > 0"):
        llama_config({**_LLAMA, "rope_theta": theta})
    with pytest.raises(ValueError, match=r"rope_parameters\['rope_theta'\]="):
        llama_config({**_LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": theta}})


def test_rope_error_names_the_config_file_when_known():
    from interp.zoo.hf import llama_config

    with pytest.raises(ValueError, match=r"in /models/my-llama/config.json"):
        llama_config({**_LLAMA, "_name_or_path": "/models/my-llama", "rope_theta": -1.0})


_DS = dict(model_type="deepseek_v3", vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           max_position_embeddings=64, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
           moe_intermediate_size=24, intermediate_size=48, n_routed_experts=4, num_experts_per_tok=2)


@pytest.mark.parametrize("raw, message", [
    ({**_LLAMA, "is_causal": False}, r"llama is_causal=False \(bidirectional attention\) is not supported"),
    ({**_LLAMA, "model_type": "mistral", "sliding_window": 4, "layer_types": ["full_attention"]},
     r"mistral layer_types=\['full_attention'\] with full-attention layers is not supported"),
    ({**_LLAMA, "model_type": "gpt_neox", "head_dim": 4}, r"gpt_neox head_dim=4 is not supported"),
    ({**_LLAMA, "model_type": "phi3", "original_max_position_embeddings": 32,
      "rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                          "original_max_position_embeddings": 16}},
     r"phi3 original_max_position_embeddings=32 differs from rope_parameters' 16"),
    ({**_DS, "num_key_value_heads": 1}, r"deepseek_v3 num_key_value_heads=1 is not supported \(MLA needs num_attention_heads=4\)"),
    ({"model_type": "bert", "is_decoder": True, "hidden_size": 32, "num_attention_heads": 4},
     r"BERT is_decoder=True is not supported"),
])
def test_settings_transformers_reads_but_interp_does_not_reproduce_are_refused_by_name(raw, message):
    from interp.zoo.hf import converter

    make_cfg, _ = converter(raw)
    with pytest.raises(ValueError, match=message):
        make_cfg(raw)


def test_mistral_and_mixtral_never_read_attention_bias():
    """transformers' Mistral and Mixtral hard-code bias-free projections: a stray ``attention_bias`` is not read."""
    hf = _hf(tf.MistralConfig(**TINY, num_key_value_heads=5, attention_bias=True, sliding_window=6))
    assert hf.model.layers[0].self_attn.q_proj.bias is None
    model = _assert_exact(hf)
    assert not model.cfg.attn_bias


def test_deepseek_rms_norm_eps_other_than_the_latent_norms_fixed_one_is_refused():
    """transformers' DeepSeek normalises the MLA latents with RMSNorm's default eps (1e-6) whatever
    ``rms_norm_eps`` says; interp's model has one eps, so another value is refused (it converted wrong: the
    config-key perturbation test found a max |logit diff| of 1.6 at rms_norm_eps=0.1)."""
    from interp.zoo.hf import deepseek_config

    deepseek_config(_DS)  # the default 1e-6 converts
    with pytest.raises(ValueError, match=r"deepseek_v3 rms_norm_eps=0.1 is not supported"):
        deepseek_config({**_DS, "rms_norm_eps": 0.1})
