"""The mixture-of-experts MLP against a naive every-expert reference, its config checks, and its cost model."""

import pytest
import torch
import torch.nn.functional as F

from interp import ModelConfig, Transformer
from interp.flops import flops_per_layer, parameter_counts
from interp.moe import route


def moe_cfg(**kw):
    base = dict(n_layers=1, d_model=16, n_heads=2, d_vocab=30, n_ctx=16, activation="swiglu", normalization="rms",
                positional="rotary", mlp_bias=False, n_experts=8, n_experts_per_token=3, d_expert=12)
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("kw", [
    dict(),
    dict(router_renormalize=True, d_shared_expert=20, shared_expert_gate=True),
    dict(router_score="sigmoid", router_renormalize=True, router_groups=4, router_topk_groups=2,
         router_group_score="top2_sum", router_choice_bias=True, routed_scaling=2.5, d_shared_expert=12),
    dict(router_groups=2, router_topk_groups=1, routed_scaling=1.5),
])
def test_moe_equals_naive_every_expert_reference(kw):
    cfg = moe_cfg(**kw)
    torch.manual_seed(0)
    moe = Transformer(cfg).blocks[0].mlp
    with torch.no_grad():
        moe.W_router.normal_()
        if moe.router_bias is not None:
            moe.router_bias.normal_(0, 0.1)
    x = torch.randn(2, 7, 16)
    rows = []
    with torch.no_grad():
        out = moe(x)
        logits = x.reshape(-1, 16) @ moe.W_router.T  # [N, E]
        s = logits.softmax(-1) if cfg.router_score == "softmax" else logits.sigmoid()
        for n in range(14):  # one token at a time, every expert evaluated: the naive reference
            c = s[n] + (moe.router_bias if moe.router_bias is not None else 0)
            G = cfg.router_groups
            if G > 1:
                g = c.view(G, -1)
                gs = g.max(-1).values if cfg.router_group_score == "max" else g.topk(2, -1).values.sum(-1)
                allowed = torch.zeros(G, dtype=torch.bool)
                allowed[gs.topk(cfg.router_topk_groups).indices] = True
                c = c.masked_fill(~allowed.repeat_interleave(8 // G), float("-inf"))
            ids = c.topk(3).indices
            w = s[n][ids]
            if cfg.router_renormalize:
                w = w / w.sum()
            w = w * cfg.routed_scaling
            xn = x.reshape(-1, 16)[n]
            every = torch.stack([moe.W_out[e] @ (F.silu(moe.W_gate[e] @ xn) * (moe.W_in[e] @ xn)) for e in range(8)])
            y = (w[:, None] * every[ids]).sum(0)
            if moe.shared is not None:
                sh = moe.shared(xn[None])[0]
                if moe.shared_gate is not None:
                    sh = torch.sigmoid(moe.shared_gate(xn)) * sh
                y = y + sh
            rows.append(y)
    torch.testing.assert_close(out.reshape(-1, 16), torch.stack(rows), rtol=1e-5, atol=1e-6)


def test_experts_run_only_on_the_tokens_routed_to_them():
    cfg = moe_cfg()
    moe = Transformer(cfg).blocks[0].mlp
    seen = []
    act = moe.act
    moe.act = lambda h: (seen.append(h.shape[0]), act(h))[1]
    moe(torch.randn(3, 5, 16))
    assert sum(seen) == 3 * 5 * 3  # N tokens x k slots, not N x E
    assert len(seen) <= 8


needs_grouped_mm = pytest.mark.skipif(not hasattr(F, "grouped_mm"), reason="torch.nn.functional.grouped_mm "
                                                                           "needs torch >= 2.10")


@needs_grouped_mm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_tokens", [1, 2, 40])  # 1 and 2 tokens leave most experts without a token
def test_grouped_gemm_and_one_expert_at_a_time_give_the_same_outputs(dtype, n_tokens, monkeypatch):
    from interp.moe import MoE

    torch.manual_seed(0)
    moe = Transformer(moe_cfg(d_expert=16)).blocks[0].mlp.to(dtype)  # 16 bf16 = 32 bytes: grouped_mm's strides
    x = torch.randn(1, n_tokens, 16, dtype=dtype)
    calls = []
    loop = MoE._expert_loop
    monkeypatch.setattr(MoE, "_expert_loop", lambda self, *a: (calls.append(1), loop(self, *a))[1])
    one_by_one = moe(x)  # parameters need gradients here: the experts run one by one
    assert calls == [1] and one_by_one.requires_grad
    with torch.inference_mode():
        grouped = moe(x)
    assert calls == [1]  # no second loop: the grouped path ran
    # The same products; a kernel may sum them in another order (a slice at an odd offset): an ulp or so.
    torch.testing.assert_close(grouped, one_by_one.detach())


@needs_grouped_mm
def test_experts_without_gradients_make_no_host_sync(monkeypatch):
    # The one-by-one path is where the expert counts go to the host (.tolist()); without gradients, in a
    # supported dtype, it must not run (on a GPU that sync would stall every MoE layer of every batch).
    from interp.moe import MoE

    def refuse(self, *a):
        raise AssertionError("the experts ran one by one (a host sync)")

    model = Transformer(moe_cfg(n_layers=2, d_expert=16)).eval()
    monkeypatch.setattr(MoE, "_expert_loop", refuse)
    with torch.inference_mode():
        model(torch.randint(0, 30, (3, 9)))
    with torch.no_grad():
        model.to(torch.bfloat16)(torch.randint(0, 30, (3, 9)))


@pytest.mark.parametrize("dtype, d_expert", [(torch.float64, 16), (torch.bfloat16, 12)])
def test_experts_grouped_mm_cannot_take_run_one_by_one(dtype, d_expert):
    # float64 (no grouped_mm kernel) and 12 bf16 = 24-byte rows (not on 16-byte strides) take the loop.
    torch.manual_seed(0)
    moe = Transformer(moe_cfg(d_expert=d_expert)).blocks[0].mlp
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = moe(x)
        got = moe.to(dtype)(x.to(dtype))
    torch.testing.assert_close(got.float(), want, rtol=0, atol=1e-5 if dtype == torch.float64 else 0.05)


def test_route_hooks_have_the_documented_shapes():
    model = Transformer(moe_cfg(n_layers=2, dense_mlp_layers=[0]))
    _, trace = model.run_with_cache(torch.randint(0, 30, (2, 5)), names_filter="blocks.1.mlp.*")
    assert trace["blocks.1.mlp.hook_router_logits"].shape == (2, 5, 8)
    assert trace["blocks.1.mlp.hook_expert_weights"].shape == (2, 5, 3)
    assert trace["blocks.1.mlp.hook_expert_ids"].shape == (2, 5, 3)
    assert trace["blocks.1.mlp.hook_expert_out"].shape == (2, 5, 3, 16)
    assert not hasattr(model.blocks[0].mlp, "W_router")  # a dense first layer
    w, ids = route(torch.tensor([[0.0, 5.0, 1.0, 4.0, 2.0, 3.0, -1.0, -2.0]]), moe_cfg())
    assert ids.tolist() == [[1, 3, 5]]  # decreasing score


@pytest.mark.parametrize("kw, message", [
    (dict(n_experts_per_token=9), r"router top-k n_experts_per_token=9 is larger than the number of experts "
                                  r"n_experts=8"),
    (dict(router_groups=3), r"n_experts=8 is not divisible by router_groups=3"),
    (dict(router_groups=4, router_topk_groups=1), r"n_experts_per_token=3 is more than the 2 experts"),
    (dict(router_groups=8, router_group_score="top2_sum"), r"needs >= 2 experts per group"),
    (dict(activation="gelu"), r"experts are gated MLPs: activation='gelu'"),
    (dict(n_experts=0), r"n_experts_per_token=3, d_expert=12 only apply to a mixture of experts"),
    (dict(dense_mlp_layers=[1]), r"dense_mlp_layers=\[1\] must be distinct layer indices in \[0, 1\)"),
])
def test_bad_moe_configs_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        moe_cfg(**kw)


def test_parameter_counts_match_transformers_and_mixtral_8x7b():
    tf = pytest.importorskip("transformers")
    from interp.zoo.hf import from_hf, moe_config

    hf = tf.MixtralForCausalLM(tf.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                num_local_experts=8, num_experts_per_tok=2))
    model = from_hf(hf)
    counts = parameter_counts(model.cfg)
    assert counts["total"] == sum(p.numel() for p in hf.parameters()) + 64  # + interp's zero W_U bias
    assert counts["active"] == counts["total"] - 2 * 6 * 3 * 32 * 48  # 6 of 8 experts idle per layer
    big = moe_config(dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                          num_experts_per_tok=2, max_position_embeddings=32768, rms_norm_eps=1e-5,
                          rope_theta=1e6))
    c = parameter_counts(big)
    print(f"Mixtral-8x7B: {c['total'] / 1e9:.2f}B parameters, {c['active'] / 1e9:.2f}B active per token")
    assert c["total"] == pytest.approx(46.70e9, rel=1e-3)
    assert c["active"] == pytest.approx(12.88e9, rel=2e-3)


def test_moe_and_mla_flops_rows():
    cfg = moe_cfg(d_shared_expert=20)
    rows = flops_per_layer(cfg, seq_len=4).set_index("operation")["flops"]
    assert rows["router"] == 2 * 4 * 16 * 8
    assert rows["experts (3 of 8 per token)"] == 3 * 2 * 4 * 3 * 16 * 12
    assert rows["shared expert"] == 3 * 2 * 4 * 16 * 20
    mla = ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=8, attention="latent", kv_latent_dim=12, rope_dim=4,
                      v_head_dim=6, positional="rotary", d_vocab=10, n_ctx=8)
    r = flops_per_layer(mla, seq_len=2).set_index("operation")["flops"]
    assert r["kv_up"] == 2 * 2 * 12 * 4 * (8 + 6)
    assert r["out_proj"] == 2 * 2 * 4 * 6 * 32


@pytest.mark.parametrize("kw", [dict(), dict(d_shared_expert=20), dict(attention="latent", kv_latent_dim=12,
                                                                         q_latent_dim=10, rope_dim=4, v_head_dim=6)])
def test_moe_flops_match_flop_counter(kw):
    from torch.utils.flop_counter import FlopCounterMode

    cfg = moe_cfg(use_sdpa=False, **kw)
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 30, (2, 9))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(tokens)
    counted = sum(counter.get_flop_counts()["Transformer.blocks.0"].values())
    assert flops_per_layer(cfg, seq_len=9, batch=2)["flops"].sum() == counted
