"""Mixture-of-experts and DeepSeek MLA models against transformers: random tiny configs whose routing varies
(8 experts, top-2/3, DeepSeek with expert groups), converted with from_hf and compared in float32."""

import math

import pytest
import torch

tf = pytest.importorskip("transformers")

from interp import ModelConfig, Transformer  # noqa: E402
from interp.zoo.hf import convert, deepseek_config, deepseek_state_dict, from_hf  # noqa: E402

V = 97
BASE = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, moe_intermediate_size=24,
           intermediate_size=48, n_routed_experts=8, num_experts_per_tok=3, first_k_dense_replace=1,
           num_key_value_heads=4)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.8,
        "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}

FAMILIES = {
    "mixtral": lambda: tf.MixtralConfig(**BASE, intermediate_size=48, num_key_value_heads=2, num_local_experts=8,
                                        num_experts_per_tok=2),
    "qwen2_moe": lambda: tf.Qwen2MoeConfig(**BASE, intermediate_size=48, moe_intermediate_size=24,
                                           shared_expert_intermediate_size=40, num_key_value_heads=2, num_experts=8,
                                           num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1]),
    "qwen3_moe": lambda: tf.Qwen3MoeConfig(**BASE, intermediate_size=48, moe_intermediate_size=24, head_dim=8,
                                           num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
                                           norm_topk_prob=True, decoder_sparse_step=2),
    "olmoe": lambda: tf.OlmoeConfig(**BASE, intermediate_size=24, num_key_value_heads=2, num_experts=8,
                                    num_experts_per_tok=3, norm_topk_prob=False),
    "deepseek_v2": lambda: tf.DeepseekV2Config(**BASE, **MLA, q_lora_rank=None, n_shared_experts=2,
                                               topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                               routed_scaling_factor=1.5),
    "deepseek_v2_greedy": lambda: tf.DeepseekV2Config(**BASE, **MLA, q_lora_rank=12, n_shared_experts=1),
    "deepseek_v3": lambda: tf.DeepseekV3Config(**BASE, **MLA, q_lora_rank=12, n_shared_experts=1, n_group=4,
                                               topk_group=2, rope_parameters=YARN),
}


def hf_model(family: str, seed: int = 0):
    """A random HF model with non-trivial norms, router bias and expert weights (so routing varies)."""
    torch.manual_seed(seed)
    cfg = FAMILIES[family]()
    cfg._attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.05 * torch.randn_like(b))
        for mod in model.modules():
            if hasattr(mod, "gate_up_proj"):
                torch.nn.init.normal_(mod.gate_up_proj, std=0.1)
                torch.nn.init.normal_(mod.down_proj, std=0.1)
            if type(mod).__name__.endswith("Router"):
                torch.nn.init.normal_(mod.weight, std=0.3)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _gate_router(layer):
    gate = getattr(layer.mlp, "gate", None)
    return gate if gate is not None and type(gate).__name__.endswith("Router") else None


def hf_router_ids(hf, tokens, routers=_gate_router):
    """The logits and {layer: [B*T, k] chosen expert ids, sorted} from transformers' routers (``routers(layer)``:
    the module whose output's third element holds them, None on a dense layer)."""
    got, handles = {}, []
    for i, layer in enumerate(hf.model.layers):
        if routers(layer) is None:
            continue
        handles.append(routers(layer).register_forward_hook(
            lambda mod, inp, out, i=i: got.__setitem__(i, out[2].sort(-1).values)))
    try:
        with torch.no_grad():
            logits = hf(tokens).logits
    finally:
        for h in handles:
            h.remove()
    return logits, got


@pytest.mark.parametrize("family", list(FAMILIES))
def test_moe_family_matches_transformers(family):
    hf = hf_model(family)
    model = from_hf(hf)
    tokens = torch.randint(0, V, (2, 48), generator=torch.Generator().manual_seed(1))
    ref, hf_ids = hf_router_ids(hf, tokens)
    with torch.no_grad():
        logits, trace = model.run_with_cache(tokens, names_filter="*hook_expert_ids")
    assert (logits - ref).abs().max().item() <= 1e-4
    moe_layers = [i for i in range(model.cfg.n_layers) if model.cfg.is_moe_layer(i)]
    assert sorted(hf_ids) == moe_layers
    for layer in moe_layers:
        ours = trace[f"blocks.{layer}.mlp.hook_expert_ids"].reshape(-1, model.cfg.n_experts_per_token)
        assert torch.equal(ours.sort(-1).values, hf_ids[layer])  # the same experts on every token
        assert len({tuple(r) for r in ours.sort(-1).values.tolist()}) > 4  # routing really varies
    prompt = tokens[:1, :8]
    with torch.no_grad():
        hf_out = hf.generate(prompt, max_new_tokens=32, do_sample=False)
    cached = model.generate(prompt, 32)
    assert torch.equal(cached, hf_out)
    assert torch.equal(model.generate(prompt, 32, use_cache=False), cached)


def test_deepseek_absorbed_decode_equals_expanded():
    hf = hf_model("deepseek_v3")
    model = from_hf(hf)
    prompt = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(3))

    def step_logits(path):
        for block in model.blocks:
            block.attn.decode_path = path
        cache = model.make_cache(batch_size=2)
        out = [model(prompt, kv_cache=cache)[:, -1]]
        tok = out[-1].argmax(-1, keepdim=True)
        for _ in range(12):
            out.append(model(tok, kv_cache=cache)[:, -1])
            tok = out[-1].argmax(-1, keepdim=True)
        return torch.stack(out)

    with torch.no_grad():
        absorbed, expanded = step_logits("absorbed"), step_logits("expanded")
    assert (absorbed - expanded).abs().max().item() <= 1e-5


def test_absorbed_attention_hooks_see_the_same_values():
    """On a decode step, hook_pattern and hook_z fire with the same values on both paths; hook_k forces the
    expanded path (it exists only there)."""
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=8, attention="latent", kv_latent_dim=12,
                      q_latent_dim=10, rope_dim=4, v_head_dim=6, positional="rotary", normalization="rms",
                      d_vocab=50, n_ctx=32, attn_bias=False, out_bias=False, activation="swiglu")
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    prompt = torch.randint(0, 50, (1, 7))
    seen = {}
    for path in ("absorbed", "expanded"):
        model.blocks[0].attn.decode_path = path
        cache = model.make_cache()
        with torch.no_grad():
            model(prompt, kv_cache=cache)
            _, trace = model.run_with_cache(torch.tensor([[3]]), kv_cache=cache,
                                            names_filter=["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"])
        seen[path] = trace
    for name in ("blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"):
        torch.testing.assert_close(seen["absorbed"][name], seen["expanded"][name], rtol=0, atol=1e-6)
    assert seen["absorbed"]["blocks.0.attn.hook_z"].shape == (1, 1, 4, 6)


# --- published DeepSeek dimensions (layers cut to 2, experts to 8), on the meta device: no memory ---------------
V3_PUBLISHED = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                    n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
                    qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
                    num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True,
                    max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                     "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                     "rope_theta": 10000.0})
V2_LITE_PUBLISHED = dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
                         num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
                         n_routed_experts=64, routed_scaling_factor=1.0, kv_lora_rank=512, q_lora_rank=None,
                         qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, topk_method="greedy", n_group=1,
                         topk_group=1, num_experts_per_tok=6, first_k_dense_replace=1, norm_topk_prob=False,
                         max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                          "mscale": 0.707, "mscale_all_dim": 0.707,
                                          "original_max_position_embeddings": 4096, "rope_theta": 10000.0})


@pytest.mark.parametrize("kind, published, cut", [
    ("deepseek_v3", V3_PUBLISHED, dict(num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8, n_group=4,
                                       topk_group=2, num_experts_per_tok=4)),
    ("deepseek_v2", V2_LITE_PUBLISHED, dict(num_hidden_layers=2, n_routed_experts=8, num_experts_per_tok=4)),
])
def test_published_deepseek_dimensions_convert_exactly(kind, published, cut):
    make = tf.DeepseekV3Config if kind == "deepseek_v3" else tf.DeepseekV2Config
    hf_cfg = make(**{**published, **cut})
    with torch.device("meta"):
        hf = tf.AutoModelForCausalLM.from_config(hf_cfg)
    cfg = deepseek_config(hf_cfg.to_dict())
    p = published
    assert (cfg.d_model, cfg.n_heads, cfg.d_head, cfg.rope_dim, cfg.v_head_dim, cfg.kv_latent_dim, cfg.q_latent_dim,
            cfg.d_mlp, cfg.d_expert, cfg.d_vocab) == (
        p["hidden_size"], p["num_attention_heads"], p["qk_nope_head_dim"], p["qk_rope_head_dim"], p["v_head_dim"],
        p["kv_lora_rank"], p["q_lora_rank"], p["intermediate_size"], p["moe_intermediate_size"], p["vocab_size"])
    assert cfg.d_shared_expert == p["n_shared_experts"] * p["moe_intermediate_size"]
    mscale = 0.1 * p["rope_parameters"]["mscale_all_dim"] * math.log(40) + 1
    assert cfg.attn_scale == pytest.approx((128 + 64) ** -0.5 * mscale ** 2)
    sd = deepseek_state_dict(hf.state_dict(), cfg)
    with torch.device("meta"):
        ours = Transformer(cfg)
    want = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in sd.items()} == want  # every tensor, exactly its shape


def test_mla_cache_holds_latent_plus_rope_key_per_token():
    """DeepSeek-V3's 61 layers: the cache tensors hold 61 x (512 + 64) values per token."""
    cfg = deepseek_config(tf.DeepseekV3Config(**V3_PUBLISHED).to_dict())
    from interp.kv_cache import KVCache

    cache = KVCache(cfg, batch_size=1, max_len=4, dtype=torch.bfloat16)
    per_token = sum(b[0, 0].numel() for layer in cache.layers for b in layer.buffers)
    mha = cfg.n_layers * cfg.n_heads * ((cfg.d_head + cfg.rope_dim) + cfg.v_head_dim)
    print(f"DeepSeek-V3 MLA cache: {per_token:,} values/token; the same model with MHA: {mha:,}")
    assert per_token == 61 * (512 + 64) == 35_136
    assert mha == 61 * 128 * (192 + 128)
    assert cache.nbytes_per_token == 35_136 * 2 == cfg.kv_cache_bytes_per_token(2)


# --- bad input -------------------------------------------------------------------------------------------------
def test_router_top_k_larger_than_experts_is_refused():
    with pytest.raises(ValueError, match=r"n_experts_per_token=9 is larger than the number of experts n_experts=8"):
        ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu", n_experts=8,
                    n_experts_per_token=9)
    hf = hf_model("mixtral")
    with pytest.raises(ValueError, match=r"n_experts_per_token=9"):
        convert({**hf.config.to_dict(), "num_experts_per_tok": 9}, hf.state_dict())


def test_expert_count_disagreeing_with_weights_is_refused():
    hf = hf_model("mixtral")
    with pytest.raises(ValueError, match=r"n_experts=6, but 'model.layers.0.mlp.gate.weight' has shape \(8, 32\)"):
        convert({**hf.config.to_dict(), "num_local_experts": 6}, hf.state_dict())
    sd = dict(hf.state_dict())
    sd["model.layers.1.mlp.experts.gate_up_proj"] = sd["model.layers.1.mlp.experts.gate_up_proj"][:7]
    with pytest.raises(ValueError, match=r"n_experts=8, but 'model.layers.1.mlp.experts.gate_up_proj' has shape"):
        convert(hf.config.to_dict(), sd)


def test_mla_ranks_not_matching_tensors_are_refused():
    hf = hf_model("deepseek_v3")
    with pytest.raises(ValueError, match=r"kv_a_proj_with_mqa.weight' has shape \(20, 32\).*kv_lora_rank=24"):
        convert({**hf.config.to_dict(), "kv_lora_rank": 24}, hf.state_dict())
    with pytest.raises(ValueError, match=r"q_a_proj.weight' has shape \(12, 32\).*q_lora_rank=10"):
        convert({**hf.config.to_dict(), "q_lora_rank": 10}, hf.state_dict())
    with pytest.raises(ValueError, match=r"kv_b_proj.weight' has shape \(56, 16\).*v_head_dim=8"):
        convert({**hf.config.to_dict(), "v_head_dim": 8}, hf.state_dict())


def test_unimplemented_settings_are_refused_by_name():
    hf = hf_model("deepseek_v3")
    with pytest.raises(ValueError, match=r"scoring_func='softmax'"):
        convert({**hf.config.to_dict(), "scoring_func": "softmax"}, hf.state_dict())
    with pytest.raises(ValueError, match=r"attention_bias=True"):
        convert({**hf.config.to_dict(), "attention_bias": True}, hf.state_dict())


# --- analyses on converted MoE / MLA models ------------------------------------------------------------------
def test_dla_splits_the_mlp_term_into_experts():
    from interp.analysis.attribution import direct_logit_attribution

    model = from_hf(hf_model("qwen2_moe"))
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(4))
    answers = torch.tensor([5, 7])
    whole = direct_logit_attribution(model, tokens, answers)
    split = direct_logit_attribution(model, tokens, answers, split_experts=True)
    assert split.attrs["logit_diff"] == pytest.approx(whole.attrs["logit_diff"], abs=1e-5)
    assert split["attribution"].sum() == pytest.approx(split.attrs["logit_diff"], abs=1e-4)
    experts = split[split.kind == "expert"]
    assert len(experts) == 8  # layer 0's experts (layer 1 is dense: mlp_only_layers)
    moe_parts = experts["attribution"].sum() + float(split.set_index("component").loc["L0 shared", "attribution"])
    assert moe_parts == pytest.approx(float(whole.set_index("component").loc["L0 mlp", "attribution"]), abs=1e-4)


def test_remove_heads_on_mla_equals_gating_them_off():
    from interp.pruning import remove_heads

    model = from_hf(hf_model("deepseek_v3"))
    tokens = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(5))
    small = remove_heads(model, {0: [1], 1: [0, 3]})
    assert small.blocks[1].attn.W_ukv.weight.shape == (2 * (8 + 6), 16)  # the kept heads' slices of W_UK / W_UV
    assert small.blocks[1].attn.W_uq.weight.shape == (2 * (8 + 4), 12)
    model.blocks[0].attn.set_gate(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    model.blocks[1].attn.set_gate(torch.tensor([0.0, 1.0, 1.0, 0.0]))
    with torch.no_grad():
        torch.testing.assert_close(small(tokens), model(tokens), rtol=0, atol=1e-5)
        # the pruned model decodes with its latent cache too
        assert torch.equal(small.generate(tokens[:1], 8), small.generate(tokens[:1], 8, use_cache=False))


def test_mla_effective_weights_follow_the_deepseek_layout():
    """interp.weights' W_V [H, M, Dv] reproduces hook_v up to the latent RMSNorm's per-token scale."""
    from interp.weights import layer_weights

    model = from_hf(hf_model("deepseek_v3"))
    tokens = torch.randint(0, V, (1, 9), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        _, trace = model.run_with_cache(tokens, names_filter=["blocks.1.attn.hook_v", "blocks.1.hook_resid_pre"])
        x = model.blocks[1].ln1(trace["blocks.1.hook_resid_pre"])[0]  # [T, M], what attention reads
        w = layer_weights(model, 1)
    assert w["W_V"].shape == (4, 32, 6) and w["W_O"].shape == (4, 6, 32) and w["W_K"].shape == (4, 32, 8 + 4)
    v = trace["blocks.1.attn.hook_v"][0]  # [T, H, Dv]
    approx = torch.einsum("tm,hmd->thd", x, w["W_V"])  # without the per-token RMS scale
    ratio = v / approx  # [T, H, Dv]: one positive number per token
    torch.testing.assert_close(ratio, ratio[:, :1, :1].expand_as(ratio), rtol=1e-3, atol=1e-4)
    assert bool((ratio > 0).all())


def test_kv_cache_cli_table_gives_the_mla_bytes_as_stored():
    from interp.cli import kv_cache_table

    rows = {r["kind"]: r for r in kv_cache_table(layers=61, heads=128, d_head=128, latent=512, rope_dim=64,
                                                 dtype="bf16")}
    cfg = deepseek_config(tf.DeepseekV3Config(**V3_PUBLISHED).to_dict())
    assert rows["mla"]["bytes_per_token"] == 61 * (512 + 64) * 2 == cfg.kv_cache_bytes_per_token(2)


def test_moe_mla_checkpoint_round_trip(tmp_path):
    from interp.zoo.checkpoint import load_checkpoint, save_checkpoint

    model = from_hf(hf_model("deepseek_v3"))  # router bias buffer, YaRN, grouped routing, dense first layer
    again = load_checkpoint(save_checkpoint(model, tmp_path / "ds.safetensors"))
    tokens = torch.randint(0, V, (1, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(again(tokens), model(tokens))
    assert again.cfg == model.cfg
