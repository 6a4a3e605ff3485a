"""The analyses on converted mixture-of-experts models (Mixtral: GQA + routed experts; Qwen2-MoE: a gated shared
expert; DeepSeek-V3 / V2: MLA with and without a query latent, grouped routing, a dense first layer), each
checked against an independent reference: transformers' own attention probabilities, hand-written patching
hooks, the expert outputs recomputed from the hooks, finite differences of the loss in the head gates, and the
head-gated model."""

import pytest
import torch

tf = pytest.importorskip("transformers")

from interp.analysis import activation_patching, classify_heads, direct_logit_attribution  # noqa: E402
from interp.interventions import head_mask  # noqa: E402
from interp.pruning import remove_heads  # noqa: E402
from interp.pruning.importance import head_importance  # noqa: E402
from interp.pruning.l0 import train_l0_gates  # noqa: E402
from interp.pruning.objectives import LanguageModelObjective  # noqa: E402
from interp.pruning.surgery import kv_cache_savings  # noqa: E402
from interp.zoo.hf import from_hf  # noqa: E402

V = 61
BASE = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, moe_intermediate_size=16,
           intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
           first_k_dense_replace=1, num_key_value_heads=4)
FAMILIES = {
    "mixtral": lambda: tf.MixtralConfig(**BASE, intermediate_size=32, num_key_value_heads=2, num_local_experts=6,
                                        num_experts_per_tok=2),
    "qwen2_moe": lambda: tf.Qwen2MoeConfig(**BASE, intermediate_size=32, moe_intermediate_size=16,
                                           shared_expert_intermediate_size=24, num_key_value_heads=2, num_experts=6,
                                           num_experts_per_tok=2),
    "deepseek_v3": lambda: tf.DeepseekV3Config(**BASE, **MLA, q_lora_rank=12, n_group=2, topk_group=1),
    "deepseek_v2": lambda: tf.DeepseekV2Config(**BASE, **MLA, q_lora_rank=None),
}


def hf_model(family):
    torch.manual_seed(0)
    cfg = FAMILIES[family]()
    cfg._attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__.endswith("Router"):
                torch.nn.init.normal_(mod.weight, std=0.5)  # a decisive router: routing varies between tokens
    return model


@pytest.fixture(scope="module", autouse=True)
def one_thread_here():
    """One intra-op thread: these tests are many tiny ops (on two shared cores two threads make them slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models(one_thread_here):
    """``{family: (hf model, interp model)}``."""
    out = {}
    for family in FAMILIES:
        hf = hf_model(family)
        out[family] = (hf, from_hf(hf))
    return out


def ids(seed, shape=(2, 10)):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


def test_classify_heads_reads_the_patterns_transformers_computes(models):
    x = ids(1)
    for family, (hf, model) in models.items():
        with torch.no_grad():
            want = hf(x, output_attentions=True).attentions
            _, trace = model.run_with_cache(x, names_filter="*hook_pattern")
        for layer in range(2):
            torch.testing.assert_close(trace.pattern(layer), want[layer], rtol=0, atol=1e-5, msg=family)
        if family in ("mixtral", "deepseek_v3"):
            report = classify_heads(model, tokens=ids(2, (4, 12)), n_seqs=4, half_len=5, copying_comparisons=16,
                                    progress=False)
            assert (report.n_layers, report.n_heads) == (2, 4), family
            assert len(report.details["positional"]) == 8, family


def hand_patch(model, clean, corrupted, name, index, metric):
    """The metric of the clean run with ``name[index]`` replaced by the corrupted run's value, by hand."""
    with torch.no_grad():
        _, trace = model.run_with_cache(corrupted, names_filter=name)

    def put(t, hook):
        t = t.clone()
        t[index] = trace[name][index]
        return t

    with torch.no_grad(), model.hooks([(name, put)]):
        return float(metric(model(clean)))


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
def test_activation_patching_equals_hand_written_hooks(models, family):
    _, model = models[family]
    clean, corrupted = ids(3), ids(4)
    answers = torch.tensor([[3, 5], [7, 9]])

    def metric(logits):
        lg = logits[:, -1]  # [B, V]
        return (lg.gather(1, answers[:, :1]) - lg.gather(1, answers[:, 1:])).mean()

    heads = activation_patching(model, clean, corrupted, act="z", by="head", answer_tokens=answers, progress=False)
    row = heads[(heads.layer == 1) & (heads["head"] == 2)].metric.item()
    assert row == pytest.approx(hand_patch(model, clean, corrupted, "blocks.1.attn.hook_z",
                                           (slice(None), slice(None), 2), metric), abs=1e-5)
    mlps = activation_patching(model, clean, corrupted, act="mlp_out", by="layer_pos", answer_tokens=answers,
                               progress=False)
    for layer, pos in ((1, 9), (1, 4), (0, 6)):  # layer 1 is an MoE layer in both; DeepSeek's layer 0 is dense
        got = mlps[(mlps.layer == layer) & (mlps.pos == pos)].metric.item()
        want = hand_patch(model, clean, corrupted, f"blocks.{layer}.hook_mlp_out", (slice(None), pos), metric)
        assert got == pytest.approx(want, abs=1e-5)
    assert mlps.metric.std() > 0  # patching the experts' output really moves the metric


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "deepseek_v3"])
def test_dla_expert_parts_equal_the_routed_outputs(models, family):
    """Each expert's part is its routing-weighted output at the last position, read through the frozen final
    norm and the unembedding difference; the parts and the shared expert add up to the layer's MLP term."""
    _, model = models[family]
    x, answers = ids(5, (3, 9)), torch.tensor([4, 8])
    whole = direct_logit_attribution(model, x, answers)
    split = direct_logit_attribution(model, x, answers, split_experts=True)
    assert split["attribution"].sum() == pytest.approx(split.attrs["logit_diff"], abs=1e-4)
    layer = 1
    with torch.no_grad():
        _, trace = model.run_with_cache(x, names_filter=[f"blocks.{layer}.mlp.hook_expert_out",
                                                         f"blocks.{layer}.mlp.hook_expert_weights",
                                                         f"blocks.{layer}.mlp.hook_expert_ids",
                                                         f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
    resid = trace[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][:, -1]  # [B, M]
    rms = (resid.pow(2).mean(-1, keepdim=True) + model.ln_final.eps).sqrt()  # [B, 1]: the frozen norm scale
    direction = model.W_U[:, 4] - model.W_U[:, 8]  # [M]
    out = trace[f"blocks.{layer}.mlp.hook_expert_out"][:, -1]  # [B, k, M]
    w = trace[f"blocks.{layer}.mlp.hook_expert_weights"][:, -1]  # [B, k]
    chosen = trace[f"blocks.{layer}.mlp.hook_expert_ids"][:, -1]  # [B, k]
    table = split.set_index("component")["attribution"]
    checked = 0
    for e in range(model.cfg.n_experts):
        routed = ((w * (chosen == e))[..., None] * out).sum(1)  # [B, M]
        want = float(((routed / rms) * model.ln_final.weight @ direction).mean().detach())
        assert table[f"L{layer}E{e}"] == pytest.approx(want, abs=1e-5), e
        checked += abs(want) > 1e-4
    assert checked >= 2  # several experts really contribute at the last position
    moe = split[(split.layer == layer) & split.component.str.match(rf"L{layer}(E\d+| shared)$")]["attribution"].sum()
    assert moe == pytest.approx(float(whole.set_index("component").loc[f"L{layer} mlp", "attribution"]), abs=1e-4)


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
def test_michel_importance_equals_finite_differences_of_the_gates(models, family):
    _, model = models[family]
    batch = {"tokens": ids(6, (2, 8))}
    obj = LanguageModelObjective()
    got = head_importance(model, [batch], obj, normalize_layers=False)  # mean over examples of |dL_b / d gate|
    eps = 1e-2
    want = torch.zeros(2, 4)
    with torch.no_grad():
        for layer in range(2):
            for h in range(4):
                losses = []
                for sign in (1, -1):
                    gates = torch.ones(2, 4)
                    gates[layer, h] += sign * eps
                    model.set_head_gates(gates)
                    losses.append(obj.example_losses(model, batch))  # [B]
                want[layer, h] = ((losses[0] - losses[1]) / (2 * eps)).abs().mean()
        model.set_head_gates(None)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-4)
    assert want.max() > 1e-3


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "deepseek_v3", "deepseek_v2"])
def test_remove_heads_equals_the_head_gated_model(models, family):
    """MLA drops the removed heads' rows of the query up-projection (W_uq, or W_q without a query latent) and of
    kv_b (W_ukv: their W_UK and W_UV slices); the latent and the rotary key stay, shared by the kept heads."""
    _, model = models[family]
    x = ids(7, (2, 12))
    pruned = torch.zeros(2, 4, dtype=torch.bool)
    pruned[0, 1] = pruned[1, 0] = pruned[1, 3] = True
    small = remove_heads(model, pruned)
    with torch.no_grad():
        with head_mask(model, pruned):
            gated = model(x)
            gated_tokens = model.generate(x[:1, :6], 8)
        torch.testing.assert_close(small(x), gated, rtol=0, atol=1e-5)
    assert torch.equal(small.generate(x[:1, :6], 8), gated_tokens)  # cached decoding of the smaller model
    if model.cfg.attention == "latent":
        attn, cfg = small.blocks[1].attn, model.cfg
        q = attn.W_uq if hasattr(attn, "W_uq") else attn.W_q
        assert q.weight.shape[0] == 2 * (cfg.d_head + cfg.rope_dim)
        assert attn.W_ukv.weight.shape == (2 * (cfg.d_head + cfg.v_head_dim), cfg.kv_latent_dim)
        assert kv_cache_savings(model, pruned)["bytes_saved_per_token"] == 0  # the latent is shared
        whole_layer = kv_cache_savings(model, {0: [0, 1, 2, 3]}, bytes_per_element=4)
        assert whole_layer["bytes_saved_per_token"] == (cfg.kv_latent_dim + cfg.rope_dim) * 4


def test_l0_gates_train_on_moe_and_prune_to_the_gated_model(models):
    _, model = models["deepseek_v3"]
    batches = [{"tokens": ids(8 + i, (2, 10))} for i in range(2)]
    res = train_l0_gates(model, batches, LanguageModelObjective(), target=0.5, steps=8, warmup=0.0, lr=0.3,
                         progress=False)
    assert 0 < res.n_pruned < 8
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in res.history)
    assert model.blocks[0].attn.gate is None  # the trained gates do not stay on the model
    x = ids(10, (1, 10))
    with torch.no_grad(), head_mask(model, res.pruned):
        gated = model(x)
    torch.testing.assert_close(remove_heads(model, res.pruned)(x), gated, rtol=0, atol=1e-5)
