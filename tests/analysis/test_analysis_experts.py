"""Routing statistics and expert ablation on a random mixture-of-experts model, against naive computations."""

import math

import pytest
import torch

from interp import ModelConfig, Transformer
from interp.analysis.ablate import compare_with_random, random_expert_sets
from interp.analysis.experts import RoutingStats, ablate_experts, expert_out_means, expert_stats
from interp.data import Batch
from interp.interventions import ablate, unit_means
from interp.streaming import stream

pytestmark = pytest.mark.usefixtures("one_thread")  # many tiny ops: one thread is faster on two shared cores


def moe_model(seed=0, **kw):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=50, n_ctx=24, activation="swiglu", positional="rotary",
                      normalization="rms", n_experts=6, n_experts_per_token=2, d_expert=16, router_renormalize=True,
                      **kw)
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            if hasattr(block.mlp, "W_router"):  # dense_mlp_layers have none
                block.mlp.W_router.normal_(0, 1.0)  # a decisive router: routing varies from token to token
    return model


def tokens(n=6, t=12, seed=1):
    return torch.randint(0, 50, (n, t), generator=torch.Generator().manual_seed(seed))


def test_routing_stats_match_naive_counts_and_entropy():
    model, x = moe_model(), tokens()
    with torch.no_grad():
        _, trace = model.run_with_cache(x, names_filter=["*hook_expert_ids", "*hook_router_logits"])
    stats = expert_stats(model, x, batch_size=4)
    for i, layer in enumerate(stats.layers):
        ids = trace[f"blocks.{layer}.mlp.hook_expert_ids"].reshape(-1)
        naive = torch.tensor([(ids == e).sum().item() for e in range(6)], dtype=torch.float32) / ids.numel()
        torch.testing.assert_close(stats.share[i], naive)
        p = trace[f"blocks.{layer}.mlp.hook_router_logits"].double().softmax(-1).reshape(-1, 6)
        h = float(-(p * p.log()).sum(-1).mean())
        assert stats.token_entropy[i].item() == pytest.approx(h, rel=1e-5)
        load = float(-(naive * naive.clamp_min(1e-30).log()).sum() / math.log(6))
        assert stats.load_entropy[i].item() == pytest.approx(load, rel=1e-5)
    assert stats.n_tokens == x.numel()
    assert len(stats.frame()) == 2 * 6
    assert stats.figure().data[0].z is not None


def test_routing_stats_skip_padding_and_merge():
    model, x = moe_model(), tokens()
    mask = torch.ones_like(x)
    mask[:, 9:] = 0
    padded = RoutingStats(model)
    stream(model, [Batch(tokens=x, mask=mask)], [padded])
    with torch.no_grad():
        _, trace = model.run_with_cache(x[:, :9], names_filter="*hook_expert_ids")
    ids = trace["blocks.1.mlp.hook_expert_ids"].reshape(-1)
    naive = torch.tensor([(ids == e).sum().item() for e in range(6)], dtype=torch.float32) / ids.numel()
    torch.testing.assert_close(padded.result().share[1], naive)  # causal: padding at the end changes nothing before
    a, b, whole = RoutingStats(model), RoutingStats(model), RoutingStats(model)
    stream(model, x[:3], [a])
    stream(model, x[3:], [b])
    stream(model, x, [whole])
    torch.testing.assert_close(a.merge(b).result().share, whole.result().share)


def test_zero_ablation_equals_zeroed_expert_weights():
    model, x = moe_model(), tokens()
    with torch.no_grad(), ablate_experts(model, [(0, 2), (1, 4)], "zero"):
        ablated = model(x)
    with torch.no_grad():
        model.blocks[0].mlp.W_out[2].zero_()
        model.blocks[1].mlp.W_out[4].zero_()
        reference = model(x)
    torch.testing.assert_close(ablated, reference, rtol=0, atol=1e-6)


def naive_expert(mlp, e, x):
    """Expert e of an MoE layer on rows x ``[N, M]``, from its weights."""
    return (torch.nn.functional.silu(x @ mlp.W_gate[e].T) * (x @ mlp.W_in[e].T)) @ mlp.W_out[e].T


def test_ablate_zero_on_experts_equals_zeroed_down_projections():
    """The head ablation API with component="experts" against the expert's down-projection zeroed."""
    model, x = moe_model(), tokens()
    experts = [(0, 2), (1, 4), (1, 5)]
    with torch.no_grad(), ablate(model, experts, "zero", component="experts"):
        ablated = model(x)
    with torch.no_grad():
        for layer, e in experts:
            model.blocks[layer].mlp.W_out[e].zero_()
        reference = model(x)
    torch.testing.assert_close(ablated, reference, rtol=0, atol=1e-6)


def hand_mean_ablation_hooks(model, layer, expert, mean):
    """Hooks that mean-ablate ``expert`` of ``layer`` by hand: the routed output plus w * (mean - expert(x)) on
    every token routed to it, with expert(x) recomputed from the weights."""
    mlp, seen = model.blocks[layer].mlp, {}

    def keep(name):
        def fn(t, hook):
            seen[name] = t
        return fn

    def fix(routed, hook):
        x = model.blocks[layer].ln2(seen["resid_mid"]).reshape(-1, routed.shape[-1])  # [N, M]: what the MoE reads
        ids, w = seen["ids"].reshape(len(x), -1), seen["w"].reshape(len(x), -1)  # [N, k]
        weight = (w * (ids == expert)).sum(-1, keepdim=True)  # [N, 1]: 0 where not routed to the expert
        return routed + (weight * (mean - naive_expert(mlp, expert, x))).view(routed.shape)

    return [(f"blocks.{layer}.hook_resid_mid", keep("resid_mid")), (f"blocks.{layer}.mlp.hook_expert_ids", keep("ids")),
            (f"blocks.{layer}.mlp.hook_expert_weights", keep("w")), (f"blocks.{layer}.mlp.hook_routed_out", fix)]


@pytest.mark.parametrize("layer", [0, 1])
def test_ablate_mean_on_experts_equals_a_hand_written_hook(layer):
    model, x, ref = moe_model(), tokens(), tokens(seed=7)
    means = unit_means(model, ref, component="experts")
    assert sorted(means) == [0, 1] and means[layer].shape == (6, 32)
    with torch.no_grad():
        clean = model(x)
        with ablate(model, [(layer, 3)], "mean", component="experts", reference=ref):
            ablated = model(x)
    assert (ablated - clean).abs().max().item() > 1e-3  # the expert's tokens really change
    with torch.no_grad(), model.hooks(hand_mean_ablation_hooks(model, layer, 3, means[layer][3])):
        by_hand = model(x)
    torch.testing.assert_close(ablated, by_hand, rtol=0, atol=1e-5)
    with torch.no_grad(), ablate_experts(model, [(layer, 3)], "mean", values=means):
        torch.testing.assert_close(model(x), ablated, rtol=0, atol=0)  # the thin wrapper: the same hooks


def test_expert_ablation_at_chosen_positions_only():
    model, x = moe_model(), tokens()
    with torch.no_grad():
        clean = model(x)
        with ablate(model, [(0, 1), (0, 2)], "zero", component="experts", positions=[5, 9]):
            ablated = model(x)
    diff = (ablated - clean).abs().amax(-1).amax(0)  # [T]
    assert diff[:5].max().item() == 0.0  # causal: nothing before the first ablated position moves
    assert diff[5].item() > 0


def test_expert_means_skip_padding():
    model, ref = moe_model(), tokens(seed=5)
    mask = torch.ones_like(ref)
    mask[:, 8:] = 0
    padded = unit_means(model, Batch(tokens=ref, mask=mask), component="experts")
    cut = unit_means(model, ref[:, :8], component="experts")  # causal: the first 8 positions are the same
    for layer in (0, 1):
        torch.testing.assert_close(padded[layer], cut[layer], rtol=1e-5, atol=1e-6)


def test_expert_means_match_a_naive_per_expert_pass():
    model, ref = moe_model(), tokens(seed=5)
    means = expert_out_means(model, ref, [1])
    with torch.no_grad():
        _, trace = model.run_with_cache(ref, names_filter=["blocks.1.hook_resid_mid", "blocks.1.mlp.hook_expert_ids"])
    mlp = model.blocks[1].mlp
    h = model.blocks[1].ln2(trace["blocks.1.hook_resid_mid"]).reshape(-1, 32)  # what the MoE reads
    ids = trace["blocks.1.mlp.hook_expert_ids"].reshape(-1, 2)
    for e in range(6):
        rows = h[(ids == e).any(-1)]
        if len(rows) == 0:
            continue
        with torch.no_grad():
            out = naive_expert(mlp, e, rows)
        torch.testing.assert_close(means[1][e], out.mean(0), rtol=1e-4, atol=1e-5)


def test_mean_ablation_changes_only_tokens_routed_to_the_expert():
    model, x, ref = moe_model(), tokens(), tokens(seed=7)
    with torch.no_grad():
        clean, trace = model.run_with_cache(x, names_filter="blocks.1.mlp.hook_expert_ids")
        with ablate_experts(model, [(1, 3)], "mean", reference=ref):
            ablated = model(x)
    routed = (trace["blocks.1.mlp.hook_expert_ids"] == 3).any(-1)  # [B, T]
    assert routed.any() and (~routed).any()
    diff = (ablated - clean).abs().amax(-1)  # [B, T]
    assert diff[~routed].max().item() < 1e-6  # the last layer: nothing else moves
    assert diff[routed].min().item() > 0


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_compare_with_random_expert_sets(method):
    model, x, ref = moe_model(), tokens(), tokens(seed=7)
    values = unit_means(model, ref, component="experts")

    def measure(experts):
        with torch.no_grad(), ablate(model, experts, method, component="experts", values=values):
            return float(torch.nn.functional.cross_entropy(model(x)[:, :-1].reshape(-1, 50), x[:, 1:].reshape(-1)))

    df = compare_with_random(measure, [(1, 0), (1, 1)], model, n_draws=5, units="experts")
    assert list(df["set"][:2]) == ["none", "target"] and len(df) == 7
    assert df["heads"][1] == "L1E0 L1E1"
    assert df.attrs["n_random"] == 5 and 0 <= df.attrs["rank"] <= 5
    assert df["value"][1] == pytest.approx(measure([(1, 0), (1, 1)]))
    assert len(set(df["value"][2:])) > 1  # different random sets really change the model differently
    sets = random_expert_sets(model, 2, 5, seed=0)
    assert all(len(s) == 2 and all(layer in (0, 1) and 0 <= e < 6 for layer, e in s) for s in sets)


def test_bad_expert_ablation_input_is_refused():
    model = moe_model()
    with pytest.raises(ValueError, match=r"expert \(1, 6\) is outside the model"):
        with ablate_experts(model, [(1, 6)], "zero"):
            pass
    with pytest.raises(ValueError, match=r"method='resample' is not one of"):
        with ablate_experts(model, [(1, 0)], "resample"):
            pass
    with pytest.raises(ValueError, match=r"expert \(1, 6\) is outside the model \(experts per layer \[6, 6\]\)"):
        with ablate(model, [(1, 6)], "zero", component="experts"):
            pass
    with pytest.raises(ValueError, match=r"resample ablation is not defined for experts"):
        with ablate(model, [(1, 0)], "resample", component="experts", reference=tokens()):
            pass
    with pytest.raises(ValueError, match=r"per_position means is not defined for experts"):
        with ablate(model, [(1, 0)], "mean", component="experts", reference=tokens(), per_position=True):
            pass
    with pytest.raises(ValueError, match=r"mean values of experts in layer 1 have shape \(32,\); expected \[6, ...\]"):
        with ablate(model, [(1, 0)], "mean", component="experts", values={1: torch.zeros(32)}):
            pass
    half_dense = moe_model(dense_mlp_layers=[0])
    with pytest.raises(ValueError, match=r"layers \[0\] have no experts \(experts per layer \[0, 6\]\)"):
        expert_out_means(half_dense, tokens(), [0])
    dense = Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8))
    with pytest.raises(ValueError, match=r"no mixture-of-experts layer"):
        expert_stats(dense, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"no mixture-of-experts layer"):
        ablate_experts(dense, [(0, 0)], "zero")
    with pytest.raises(ValueError, match=r"expert \(0, 0\) is outside the model \(experts per layer \[0\]\)"):
        with ablate(dense, [(0, 0)], "zero", component="experts"):
            pass


def test_routing_stats_update_never_waits_on_the_host(monkeypatch):
    """The per-batch update keeps everything on the tensors' device: no .cpu(), .item(), .tolist(), .numpy() or
    Python scalar conversion (each a host sync on a GPU); the one move to the host is in result()."""
    model, x = moe_model(), tokens()
    mask = torch.ones_like(x)
    mask[:, 10:] = 0
    names = ["*hook_expert_ids", "*hook_router_logits"]
    with torch.no_grad():
        _, trace = model.run_with_cache(x, names_filter=names, attention_mask=mask)
    want = RoutingStats(model)
    stream(model, [Batch(tokens=x, mask=mask)], [want])
    r = RoutingStats(model)

    def refuse(*args, **kwargs):
        raise AssertionError("a host sync inside RoutingStats.update")

    with monkeypatch.context() as m:
        for attr in ("cpu", "item", "tolist", "numpy", "__float__", "__int__", "__bool__"):
            m.setattr(torch.Tensor, attr, refuse)
        r.begin_batch(Batch(tokens=x, mask=mask))
        for name in r.names:
            r.update(name, trace[name], q_start=0)
    got, ref = r.result(), want.result()
    torch.testing.assert_close(got.share, ref.share)
    torch.testing.assert_close(got.token_entropy, ref.token_entropy)
    assert got.n_tokens == ref.n_tokens == 6 * 10


def test_expert_ablation_holds_in_cached_generation():
    """The ablation hooks fire on every decode step: cached generation under them equals a recompute, and the
    greedy tokens are the argmax of one ablated forward pass over the result."""
    model, x = moe_model(), tokens()[:1, :5]
    experts = [(layer, e) for layer in (0, 1) for e in range(3)]
    with torch.no_grad(), ablate(model, experts, "zero", component="experts"):
        cached = model.generate(x, 12)
        assert torch.equal(model.generate(x, 12, use_cache=False), cached)
        greedy = model(cached[:, :-1]).argmax(-1)[:, 4:]  # [1, 12]: the prediction after each prefix
    assert torch.equal(greedy, cached[:, 5:])
    with torch.no_grad():
        assert not torch.equal(model.generate(x, 12), cached)  # the ablation changes what is generated


def test_random_expert_sets_draw_only_from_moe_layers():
    model = moe_model(dense_mlp_layers=[0])
    sets = random_expert_sets(model, 3, 10, seed=1)
    assert len(sets) == 10 and all(layer == 1 and 0 <= e < 6 for s in sets for layer, e in s)
    with torch.no_grad(), ablate(model, sets[0], "zero", component="experts"):  # every drawn set is ablatable
        model(tokens())
    with pytest.raises(ValueError, match=r"k=7 experts requested but only 6 experts to draw from"):
        random_expert_sets(model, 7, 1)
