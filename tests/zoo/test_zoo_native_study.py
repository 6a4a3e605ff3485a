"""The study-set families of issue 34 converted natively (nemotron, ...), beyond the parity test every
:data:`interp.zoo.compat.FAMILIES` entry gets in ``test_zoo_families.py`` (logits on both attention paths,
patterns, greedy decoding with and without the cache): the route's tiny configs now load natively, each
family-specific mechanism changes the logits (so matching transformers shows it is reproduced), and the
settings we do not reproduce are refused by name.
"""

import re
import warnings

import pytest
import torch

from interp.zoo.compat import SEQ, V, hf_test_model
from interp.zoo.hf import convert, from_hf

transformers = pytest.importorskip("transformers")

from route_configs import tiny_hf  # noqa: E402
from test_zoo_hf_moe import hf_router_ids  # noqa: E402  (tests/zoo is on sys.path)


@pytest.mark.parametrize("model_type", ["nemotron", "granitemoe", "glm4_moe", "phimoe", "llama4_text"])
def test_route_configs_load_natively_and_match(model_type):
    """``interp.load`` takes the native converter (not the attention-level route) on the route tests' configs,
    and the native model gives transformers' logits there too (other sizes than the compat config)."""
    import interp

    hf = tiny_hf(model_type, "eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = interp.load(hf)
    assert model.native is True
    ids = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-4)


def _logit_change(model, **fields):
    """max |logit change| when the converted model's config takes ``fields`` (same weights)."""
    ids = torch.randint(1, V, (1, SEQ), generator=torch.Generator().manual_seed(5))
    other = type(model)(type(model.cfg).from_dict({**model.cfg.to_dict(), **fields}))
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        return (other.eval()(ids) - model(ids)).abs().max().item()


def test_nemotron_mechanisms_bite():
    """Partial rotary (half of each head) and the ``1 + w`` LayerNorm scale each change the logits."""
    hf = hf_test_model("nemotron")
    model = from_hf(hf)
    assert (model.cfg.rotary_dim, model.cfg.d_head, model.cfg.activation) == (8, 16, "relu2")
    assert _logit_change(model, rotary_dim=16) > 1e-3
    hf_norm = hf.model.layers[0].input_layernorm.weight
    torch.testing.assert_close(model.blocks[0].ln1.weight, hf_norm + 1, rtol=0, atol=0)
    sd = {k: v for k, v in hf.state_dict().items()}
    unshifted = from_hf(hf)
    with torch.no_grad():
        unshifted.blocks[0].ln1.weight.copy_(sd["model.layers.0.input_layernorm.weight"])
    ids = torch.randint(1, V, (1, SEQ), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (unshifted(ids) - model(ids)).abs().max() > 1e-3


def _same_routing(hf, routers):
    """Our hook_expert_ids equal the experts transformers chose, on every token of every MoE layer."""
    model = from_hf(hf)
    ids = torch.randint(1, V, (2, SEQ), generator=torch.Generator().manual_seed(1))
    ref, chosen = hf_router_ids(hf, ids, routers)
    with torch.no_grad():
        logits, trace = model.run_with_cache(ids, names_filter="*hook_expert_ids")
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-4)
    assert sorted(chosen) == [i for i in range(model.cfg.n_layers) if model.cfg.is_moe_layer(i)]
    for layer, want in chosen.items():
        ours = trace[f"blocks.{layer}.mlp.hook_expert_ids"].reshape(-1, model.cfg.n_experts_per_token)
        assert torch.equal(ours.sort(-1).values, want)
        assert len({tuple(r) for r in want.tolist()}) > 4  # routing really varies
    return model


def test_granitemoe_routes_as_transformers_and_reads_published_names():
    """The same experts as transformers' top-k-then-softmax router; the residual multiplier is folded into the
    experts' W_out; a checkpoint with the published names (``router.layer``, ``input_linear``, ``output_linear``,
    which transformers renames on loading) converts to the same model."""
    hf = hf_test_model("granitemoe")
    model = _same_routing(hf, lambda layer: layer.block_sparse_moe.router)
    down = hf.model.layers[0].block_sparse_moe.experts.down_proj
    torch.testing.assert_close(model.blocks[0].mlp.W_out, down * 0.5, rtol=0, atol=0)
    renamed = {re.sub(r"router\.weight$", "router.layer.weight", k)
               .replace("experts.gate_up_proj", "input_linear.weight")
               .replace("experts.down_proj", "output_linear.weight"): v for k, v in hf.state_dict().items()}
    assert any(k.endswith("router.layer.weight") for k in renamed)
    published = convert(hf.config.to_dict(), renamed).state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(published[key], value, rtol=0, atol=0)


def test_glm4_moe_routes_as_transformers_and_its_mechanisms_bite():
    """DeepSeek-V3 routing (groups, choice bias, shared expert) picks transformers' experts; partial rotary and
    the per-head QK-norm each change the logits."""
    hf = hf_test_model("glm4_moe")
    model = _same_routing(hf, lambda layer: layer.mlp.gate if hasattr(layer.mlp, "gate") else None)
    cfg = model.cfg
    assert (cfg.rotary_dim, cfg.qk_norm, cfg.dense_mlp_layers, cfg.d_shared_expert) == (8, "head", [0], 24)
    assert _logit_change(model, rotary_dim=16) > 1e-3
    assert _logit_change(model, routed_scaling=1.0) > 1e-3


def test_phimoe_longrope_as_transformers_runs_it():
    """Phi-3.5-MoE's LongRoPE (equal short / long mscale): transformers' Phi-MoE rotates with the short factors on
    both sides of the original context and scales by the mscale; the logits past that context and 32 greedy
    tokens crossing it are transformers'."""
    short, long = [1.0 + 0.05 * i for i in range(4)], [1.5 + 0.5 * i for i in range(4)]
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": 16, "short_mscale": 1.3, "long_mscale": 1.3}
    hf = hf_test_model("phimoe", rope_parameters=rope, head_dim=8)
    model = from_hf(hf)
    assert model.cfg.rope_scaling["attention_factor"] == 1.3
    # Phi-3's reading (the long factors past the original context) would be another model here:
    assert _logit_change(model, rope_scaling={**model.cfg.rope_scaling, "long_factor": long}) > 1e-3
    ids = torch.randint(1, V, (2, SEQ), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for n in (12, SEQ):  # inside the original context, then past it
            torch.testing.assert_close(model(ids[:, :n]), hf(ids[:, :n]).logits, rtol=0, atol=1e-4)
    prompt = ids[:1, :8]
    want = hf.generate(prompt, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(prompt),
                       eos_token_id=None, pad_token_id=0)
    assert torch.equal(model.generate(prompt, max_new_tokens=32), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparsemixer_equals_transformers(dtype):
    """interp.moe.sparsemixer against transformers' own function (inference branch) on random logits, some
    rows with near-ties (inside the threshold) and negative maxima."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as hf_sparsemixer

    from interp.moe import sparsemixer

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(256, 8, generator=g)
    logits[:64] = logits[:64, :1] + 0.01 * torch.randn(64, 8, generator=g)  # near-ties
    logits[64:128] -= 3.0  # all negative
    logits = logits.to(dtype)
    for eps in (0.0, 0.01, 0.3):
        want_w, want_ids = hf_sparsemixer(logits, jitter_eps=eps, training=False)
        got_w, got_ids = sparsemixer(logits, eps)
        assert torch.equal(got_ids, want_ids)
        torch.testing.assert_close(got_w, want_w.float(), rtol=0, atol=0)
        if eps:
            assert (got_w[:, 0] < 1).float().mean() > 0.1  # the threshold lets other logits in


def test_phimoe_routes_as_transformers():
    """The sparsemixer's two experts are transformers' on every token, and its weights bite: with plain top-2
    renormalised softmax weights the logits differ."""
    hf = hf_test_model("phimoe")
    model = _same_routing(hf, lambda layer: layer.mlp.router)
    assert _logit_change(model, sparsemixer_eps=0.0) > 1e-3
    assert _logit_change(model, router_score="softmax", sparsemixer_eps=0.01, router_renormalize=True) > 1e-3


@pytest.mark.parametrize("change,message", [
    ({"n_experts_per_token": 3}, r"router_score='sparsemixer' picks exactly 2 experts .*n_experts_per_token=3"),
    ({"sparsemixer_eps": -1.0}, r"sparsemixer_eps=-1.0 must be a finite number >= 0"),
    ({"router_score": "softmax", "sparsemixer_eps": 0.3},
     r"sparsemixer_eps=0.3 only applies to router_score='sparsemixer'"),
])
def test_sparsemixer_config_is_checked(change, message):
    from interp import ModelConfig

    base = dict(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu", n_experts=4,
                n_experts_per_token=2, router_score="sparsemixer")
    assert ModelConfig(**base).sparsemixer_eps == 0.01
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**base, **change})


def test_llama4_routes_as_transformers_and_its_mechanisms_bite():
    """Llama 4's experts are transformers' on every token (top-k of the router logits); chunked attention, the
    NoPE layers' temperature tuning, the weightless QK-norm of the rotary layers and the input-weighted experts
    each change the logits (so matching transformers shows each is reproduced)."""
    hf = hf_test_model("llama4_text")

    class _Chosen:  # Llama4Router returns (scores, logits): the chosen ids are the logits' top k
        def __init__(self, router):
            self.router = router

        def register_forward_hook(self, fn):
            k = self.router.top_k
            return self.router.register_forward_hook(
                lambda mod, inp, out: fn(mod, inp, (None, None, out[1].topk(k, dim=-1).indices)))

    model = _same_routing(hf, lambda layer: _Chosen(layer.feed_forward.router) if layer.is_moe_layer else None)
    cfg = model.cfg
    assert (cfg.nope_layers, cfg.attention_chunk, cfg.nope_temperature) == ([3], [8, 8, 8, None], [0.5, 4.0])
    assert cfg.dense_mlp_layers == [0, 2] and cfg.expert_input_weighting and cfg.d_shared_expert == 24
    for field, value in (("attention_chunk", None), ("nope_temperature", None), ("expert_input_weighting", False)):
        assert _logit_change(model, **{field: value}) > 1e-3, field
    assert not hasattr(model.blocks[3].attn, "q_norm")  # the NoPE layer has no QK-norm
    weightless = from_hf(hf)
    for i in range(3):
        with torch.no_grad():
            weightless.blocks[i].attn.q_norm.weight.mul_(2.0)  # ones in the converted model
    ids = torch.randint(1, V, (1, SEQ), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (weightless(ids) - model(ids)).abs().max() > 1e-3


def test_llama4_chunked_cache_and_expert_attribution():
    """Prefill in pieces across chunk boundaries, then single steps: each equals the full pass (a chunked layer's
    cache keeps every position, its mask drops the earlier chunks). Direct logit attribution split by expert
    adds up to the MLP's when each expert already read its weighted input."""
    from interp.analysis.attribution import direct_logit_attribution

    model = from_hf(hf_test_model("llama4_text"))
    ids = torch.randint(1, V, (1, 30), generator=torch.Generator().manual_seed(6))
    cache = model.make_cache(1, 30)
    with torch.no_grad():
        full = model(ids)
        parts = [model(ids[:, :5], kv_cache=cache), model(ids[:, 5:19], kv_cache=cache)]
        parts += [model(ids[:, t:t + 1], kv_cache=cache) for t in range(19, 30)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-4)
    answers = torch.tensor([5, 7])
    whole = direct_logit_attribution(model, ids[:, :12], answers)
    split = direct_logit_attribution(model, ids[:, :12], answers, split_experts=True)
    experts = split[split.kind == "expert"]
    moe = experts[experts.layer == 1]["attribution"].sum()
    moe += float(split.set_index("component").loc["L1 shared", "attribution"])
    assert moe == pytest.approx(float(whole.set_index("component").loc["L1 mlp", "attribution"]), abs=1e-4)


@pytest.mark.parametrize("name,change,message", [
    ("nemotron", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4,
                                      "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor'\]=0.5 with rope_type 'linear' is not supported"),
    ("nemotron", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.5}},
     r"nemotron partial_rotary_factor=1.5 must be in \(0, 1\]"),
    ("nemotron", {"hidden_act": "tanh"}, r"nemotron hidden_act='tanh' is not supported"),
    ("granitemoe", {"hidden_act": "gelu"}, r"granitemoe hidden_act='gelu' is not supported"),
    ("glm4_moe", {"hidden_act": "gelu"}, r"glm4_moe hidden_act='gelu' is not supported"),
    ("glm4_moe", {"n_group": 3}, r"glm4_moe n_routed_experts=8 is not divisible by n_group=3"),
    ("glm4_moe", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4,
                                      "original_max_position_embeddings": 16}},
     r"glm4_moe rope_type='yarn' is not supported"),
    ("phimoe", {"num_experts_per_tok": 3}, r"phimoe num_experts_per_tok=3 is not supported"),
    ("phimoe", {"hidden_act": "gelu"}, r"phimoe hidden_act='gelu' is not supported"),
    ("phimoe", {"router_jitter_noise": -0.1}, r"router_jitter_noise=-0.1 must be a finite number > 0"),
    ("phimoe", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4,
                                    "long_factor": [2.0] * 4, "original_max_position_embeddings": 16,
                                    "short_mscale": 1.1, "long_mscale": 1.2}},
     r"phimoe short_mscale=1.1 with long_mscale=1.2 is not supported"),
    ("phimoe", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                                    "original_max_position_embeddings": 16}},
     r"phimoe rope_type='yarn' is not supported"),
    ("llama4_text", {"hidden_act": "gelu"}, r"llama4_text hidden_act='gelu' is not supported"),
    ("llama4_text", {"layer_types": ["sliding_attention"] * 4},
     r"llama4_text layer_types\[0\]='sliding_attention' is not supported"),
    ("llama4_text", {"attention_chunk_size": None}, r"layer_types\[0\]='chunked_attention' needs attention_chunk_size"),
    ("llama4_text", {"no_rope_layers": [1, 0]}, r"llama4_text no_rope_layers=\[1, 0\] must hold one 0 / 1 flag"),
    ("granitemoe", {"residual_multiplier": 0.0}, r"granitemoe residual_multiplier=0.0 must be a finite number > 0"),
])
def test_unsupported_settings_are_refused_by_name(name, change, message):
    hf = hf_test_model(name)
    with pytest.raises(ValueError, match=message):
        convert({**hf.config.to_dict(), **change}, hf.state_dict())


@pytest.mark.parametrize("name, claims", [
    ("llama4_text", ["chunks of 8 (3/4 layers)", "NoPE (1/4 layers, temperature-tuned)", "weighting the input",
                     "QK-norm (head after rotary)", "shared expert"]),
    ("phimoe", ["sparsemixer", "window 8"]), ("glm4_moe", ["sigmoid, 2 of 4 groups", "RoPE 8/16"]),
    ("nemotron", ["relu² MLP", "RoPE 8/16"]), ("granitemoe", ["embed scale", "top-2 of 8 experts"]),
])
def test_compat_rows_claim_what_the_converted_config_has(name, claims):
    from interp.zoo.compat import variants

    text = variants(from_hf(hf_test_model(name)).cfg)
    for claim in claims:
        assert claim in text


_SCOUT_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
               "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}
_PHI35_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.01 * i for i in range(64)],
               "long_factor": [1.5 + 0.5 * i for i in range(64)], "original_max_position_embeddings": 4096,
               "short_mscale": 1.243163121714160, "long_mscale": 1.243163121714160}
PUBLISHED = {  # label: (model_type, the published config.json's values, what the converted config must hold)
    "Llama-4-Scout-17B-16E": ("llama4_text", dict(
        hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_attention_heads=40,
        num_key_value_heads=8, head_dim=128, num_hidden_layers=48, num_local_experts=16, num_experts_per_tok=1,
        interleave_moe_layer_step=1, attention_chunk_size=8192, max_position_embeddings=10485760,
        use_qk_norm=True, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1, rope_parameters=_SCOUT_ROPE),
        dict(nope_layers=list(range(3, 48, 4)), n_experts=16, dense_mlp_layers=None, d_shared_expert=8192,
             nope_temperature=[0.1, 8192.0], qk_norm="head_after_rotary")),
    "Llama-4-Maverick-17B-128E": ("llama4_text", dict(
        hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_attention_heads=40,
        num_key_value_heads=8, head_dim=128, num_hidden_layers=48, num_local_experts=128, num_experts_per_tok=1,
        interleave_moe_layer_step=2, attention_chunk_size=8192, max_position_embeddings=1048576, use_qk_norm=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
        dict(n_experts=128, dense_mlp_layers=list(range(0, 48, 2)), d_mlp=16384, qk_norm="none")),
    "Phi-3.5-MoE-instruct": ("phimoe", dict(
        hidden_size=4096, intermediate_size=6400, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32,
        num_local_experts=16, num_experts_per_tok=2, max_position_embeddings=131072, sliding_window=131072,
        attention_bias=True, lm_head_bias=True, router_jitter_noise=0.01, input_jitter_noise=0.01,
        rope_parameters=_PHI35_ROPE),
        dict(router_score="sparsemixer", sparsemixer_eps=0.01, d_expert=6400, attn_bias=True)),
    "granite-3.0-3b-a800m": ("granitemoe", dict(
        hidden_size=1536, intermediate_size=512, num_attention_heads=24, num_key_value_heads=8, num_hidden_layers=32,
        num_local_experts=40, num_experts_per_tok=8, embedding_multiplier=12.0, attention_multiplier=0.015625,
        residual_multiplier=0.22, logits_scaling=6.0, tie_word_embeddings=True, max_position_embeddings=4096),
        dict(n_experts=40, n_experts_per_token=8, d_expert=512, embed_scale=12.0, attn_scale=0.015625)),
    "GLM-4.5-Air": ("glm4_moe", dict(
        hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408, num_attention_heads=96,
        num_key_value_heads=8, head_dim=128, num_hidden_layers=46, n_routed_experts=128, n_shared_experts=1,
        num_experts_per_tok=8, n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
        use_qk_norm=False, attention_bias=True, max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5}),
        dict(rotary_dim=64, n_experts=128, d_shared_expert=1408, dense_mlp_layers=[0], router_score="sigmoid")),
    "Nemotron-Mini-4B": ("nemotron", dict(
        hidden_size=3072, intermediate_size=9216, num_attention_heads=24, num_key_value_heads=8, head_dim=128,
        num_hidden_layers=32, max_position_embeddings=4096, norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        dict(rotary_dim=64, activation="relu2", normalization="pre")),
}


@pytest.mark.parametrize("label", sorted(PUBLISHED))
def test_published_configs_convert(label):
    """Each published config.json (through transformers' own config class, every layer) converts to the config
    it should, and the model builds (on the meta device: no memory)."""
    from interp import Transformer
    from interp.families import family_for

    model_type, kw, want = PUBLISHED[label]
    hf_cfg = transformers.AutoConfig.for_model(model_type, vocab_size=64, **kw).to_dict()
    cfg = family_for(model_type).config(hf_cfg)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads) == (kw["num_hidden_layers"], kw["hidden_size"],
                                                        kw["num_attention_heads"])
    for field, value in want.items():
        assert getattr(cfg, field) == value, field
    with torch.device("meta"):
        Transformer(cfg)


def test_llama4_scout_llama3_rope_with_equal_frequency_factors():
    """Llama 4 Scout's llama3 RoPE has low_freq_factor == high_freq_factor (no blended band; transformers warns
    and runs it): converted, and the logits past the original context are transformers'."""
    rope = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 16.0, "low_freq_factor": 1.0,
            "high_freq_factor": 1.0, "original_max_position_embeddings": 16}
    hf = hf_test_model("llama4_text", rope_parameters=rope)
    model = from_hf(hf)
    assert model.cfg.rope_scaling["high_freq_factor"] == model.cfg.rope_scaling["low_freq_factor"] == 1.0
    ids = torch.randint(1, V, (2, SEQ), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-4)
    assert _logit_change(model, rope_scaling=None) > 1e-3


def test_remove_heads_on_llama4_equals_gating_them_off():
    """Head removal on chunked, temperature-tuned and QK-normed layers computes what gating the heads off does,
    and the smaller model still decodes with its cache."""
    from interp.pruning import remove_heads

    model = from_hf(hf_test_model("llama4_text"))
    tokens = torch.randint(1, V, (2, 20), generator=torch.Generator().manual_seed(5))
    small = remove_heads(model, {0: [1], 3: [0, 4]})
    model.blocks[0].attn.set_gate(torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0]))
    model.blocks[3].attn.set_gate(torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]))
    with torch.no_grad():
        torch.testing.assert_close(small(tokens), model(tokens), rtol=0, atol=1e-5)
        assert torch.equal(small.generate(tokens[:1], 12), small.generate(tokens[:1], 12, use_cache=False))
