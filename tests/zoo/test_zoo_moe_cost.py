"""The cost figures of MoE / MLA models against what the models really hold: the MLA cache bytes per token of
interp.flops and `interp kv-cache` against the cache tensors after a prefill (interp's and transformers' own for
the same model), and the active parameters against the expert weights one token's gradient reaches."""

import pytest
import torch

tf = pytest.importorskip("transformers")

from interp.flops import kv_cache_bytes, kv_cache_table, parameter_counts  # noqa: E402
from interp.moe import MoE  # noqa: E402
from interp.zoo.hf import from_hf  # noqa: E402

V = 61
BASE = dict(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=64)


@pytest.fixture(scope="module", autouse=True)
def one_thread_here():
    """One intra-op thread: tiny ops (on two shared cores two threads make them slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def deepseek_v3():
    torch.manual_seed(0)
    cfg = tf.DeepseekV3Config(**BASE, kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
                              v_head_dim=6, moe_intermediate_size=16, intermediate_size=32, n_routed_experts=8,
                              num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                              first_k_dense_replace=1, num_key_value_heads=4)
    cfg._attn_implementation = "eager"
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def qwen2_moe():
    torch.manual_seed(0)
    cfg = tf.Qwen2MoeConfig(**BASE, intermediate_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                            num_key_value_heads=2, num_experts=6, num_experts_per_tok=2, mlp_only_layers=[0])
    cfg._attn_implementation = "eager"
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def test_mla_cache_bytes_equal_the_cache_tensors_after_a_prefill():
    hf = deepseek_v3()
    model = from_hf(hf).to(torch.bfloat16)
    cfg, T, B = model.cfg, 7, 2
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    cache = model.make_cache(batch_size=B, max_len=16)
    with torch.no_grad():
        _, trace = model.run_with_cache(x, kv_cache=cache, names_filter="*hook_kv_latent")
    assert cache.length == T
    stored = 0
    for layer, lc in enumerate(cache.layers):
        latent, rope_key = lc.buffers  # [B, max_len, C], [B, max_len, R]
        assert latent.shape == (B, 16, cfg.kv_latent_dim) and rope_key.shape == (B, 16, cfg.rope_dim)
        assert torch.equal(latent[:, :T], trace[f"blocks.{layer}.attn.hook_kv_latent"])  # the normed latent itself
        assert bool(rope_key[:, :T].abs().sum(-1).gt(0).all()) and not bool(rope_key[:, T:].any())
        stored += sum(b[:, :T].numel() * b.element_size() for b in lc.buffers)
    per_token = stored // (B * T)  # measured from the filled part of the cache tensors
    assert per_token == 3 * (16 + 4) * 2 == cfg.kv_cache_bytes_per_token(2) == kv_cache_bytes(cfg, dtype="bf16")
    assert cache.nbytes_used == per_token * B * T
    table = kv_cache_table(cfg, dtype="bf16").set_index("kind")
    assert int(table.loc["mla", "bytes_per_token"]) == per_token and bool(table.loc["mla", "this_model"])
    from interp.cli import kv_cache_table as cli_table  # what `interp kv-cache` prints for this shape

    rows = {r["kind"]: r for r in cli_table(layers=3, heads=4, d_head=8, latent=16, rope_dim=4, dtype="bf16")}
    assert rows["mla"]["bytes_per_token"] == per_token
    # transformers (5.x) also caches DeepSeek's latent and rotary key, not the per-head keys and values
    with torch.no_grad():
        past = hf.to(torch.bfloat16)(x, use_cache=True).past_key_values
    hf_bytes = sum(t.numel() * t.element_size() for layer in past.layers for t in (layer.keys, layer.values))
    assert hf_bytes // (B * T) == per_token
    expanded = cfg.n_layers * cfg.n_heads * ((cfg.d_head + cfg.rope_dim) + cfg.v_head_dim) * 2
    print(f"MLA cache: {per_token} bytes/token (interp's and transformers' cache tensors); the same model's keys "
          f"and values expanded per head: {expanded}")


@pytest.mark.parametrize("make", [qwen2_moe, deepseek_v3])
def test_active_expert_parameters_are_those_one_token_reaches(make):
    """One token's loss has a gradient on exactly the k experts it was routed to in each MoE layer: the nonzero
    gradient entries of the expert weights are parameter_counts' experts_active, all of them experts_total."""
    hf = make()
    model = from_hf(hf)
    counts = parameter_counts(model.cfg)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    x = torch.randint(0, V, (1, 1), generator=torch.Generator().manual_seed(2))
    model.zero_grad()
    model(x).logsumexp(-1).sum().backward()
    expert_params = [p for b in model.blocks if isinstance(b.mlp, MoE) for p in (b.mlp.W_gate, b.mlp.W_in, b.mlp.W_out)]
    assert sum(p.numel() for p in expert_params) == counts["experts_total"]
    reached = sum(int(p.grad.ne(0).sum()) for p in expert_params)
    assert reached == counts["experts_active"] < counts["experts_total"]
    assert counts["active"] == counts["total"] - counts["experts_total"] + reached


def test_a_moe_models_description_gives_its_total_and_active_parameters():
    cfg = tf.MixtralConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=64, intermediate_size=48, num_key_value_heads=2,
                           num_local_experts=6, num_experts_per_tok=2)
    torch.manual_seed(0)
    hf = tf.MixtralForCausalLM(cfg)
    model = from_hf(hf)
    # Every stored parameter: HF's count plus the zero bias interp's untied unembedding carries.
    total = hf.num_parameters() + 61
    assert total == sum(p.numel() for p in model.parameters()) == 65949
    # Per token 2 of the 6 experts run in each of the 2 layers; an expert is w1, w3 [48, 32] and w2 [32, 48].
    active = total - 2 * (6 - 2) * 3 * 48 * 32
    assert active == 29085
    line = repr(model).splitlines()[1]
    assert line.endswith(f"experts=6 (top-2), params={total:,} total / {active:,} active per token")
    assert "experts=" not in repr(from_hf(tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=61, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48))))
