"""The circuit graph and edge interventions, checked against the model's own forward pass."""

import pytest
import torch

import interp
from interp.circuits import build_graph, edge_pass, node_writes

FAMILIES = {
    "sequential": {},
    "parallel_two_norms": {"parallel_block": "two_norms"},
    "parallel_one_norm": {"parallel_block": "one_norm"},
    "gqa": {"n_kv_heads": 2},
    "moe": {"n_experts": 4, "n_experts_per_token": 2, "activation": "swiglu"},
    "attn_only_layernorm": {"attn_only": True, "normalization": "pre"},
}


def tiny(seed: int = 0, **kw) -> interp.Transformer:
    torch.manual_seed(seed)
    base = dict(n_layers=2, d_model=16, n_heads=4, d_vocab=20, n_ctx=8, positional="rotary", normalization="rms")
    model = interp.Transformer(interp.ModelConfig(**{**base, **kw})).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # every parameter re-drawn: no zero biases or unit norms
            p.normal_(0, 0.5)
    return model


def reads_of(model, graph):
    """For each downstream input, the model hook whose value it reads (the residual before its norm)."""
    out = []
    for name in graph.downstream:
        if name == "logits":
            out.append(f"blocks.{graph.n_layers - 1}.hook_resid_post")
        elif name.startswith("m"):
            out.append(f"blocks.{name[1:]}.hook_resid_{'pre' if graph.parallel else 'mid'}")
        else:
            out.append(f"blocks.{name[1:].split('.')[0]}.hook_resid_pre")
    return out


def writes_of(graph):
    """For each upstream node, the model hook (and head) whose value it writes."""
    out = []
    for name in graph.upstream:
        if name == "input":
            out.append(("hook_embed", None))
        elif name.startswith("m"):
            out.append((f"blocks.{name[1:]}.hook_mlp_out", None))
        else:
            layer, head = (int(x) for x in name[1:].split(".h"))
            out.append((f"blocks.{layer}.attn.hook_result", head))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_edges_are_the_residual_paths_of_the_forward(family):
    """u -> d is an edge exactly when perturbing u's write in the model's own forward changes the residual d reads."""
    model = tiny(**FAMILIES[family])
    graph = build_graph(model)
    tokens = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1))
    reads = reads_of(model, graph)
    _, base = model.run_with_cache(tokens, names_filter=sorted(set(reads)))
    for u, (hook_name, head) in enumerate(writes_of(graph)):
        def bump(t, hook, head=head):
            t = t.clone()
            if head is None:
                t += 1.0
            else:
                t[:, :, head] += 1.0
            return t
        with model.hooks([(hook_name, bump)]):
            _, bumped = model.run_with_cache(tokens, names_filter=sorted(set(reads)))
        changed = torch.tensor([not torch.allclose(bumped[r], base[r]) for r in reads])
        assert torch.equal(changed, graph.allowed[u]), (family, graph.upstream[u])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_writes_sum_to_the_residual_and_full_ablation_is_the_corrupted_run(family):
    model = tiny(**FAMILIES[family])
    graph = build_graph(model)
    gen = torch.Generator().manual_seed(2)
    clean, corrupted = torch.randint(0, 20, (3, 8), generator=gen), torch.randint(0, 20, (3, 8), generator=gen)
    final, writes = node_writes(model, graph, clean)
    last = f"blocks.{graph.n_layers - 1}.hook_resid_post"
    plain, trace = model.run_with_cache(clean, names_filter=last)
    biases = sum(b.attn.W_O.bias for b in model.blocks)
    torch.testing.assert_close(writes.sum(0) + biases, trace[last])
    torch.testing.assert_close(final, trace[last])  # the run stopped where the logits read
    torch.testing.assert_close(model.unembed_residual(final), plain)
    final_c, source = node_writes(model, graph, corrupted)
    logits_c = model.unembed_residual(final_c)
    with torch.no_grad(), edge_pass(model, graph, source=source, ablate=graph.allowed.double()):
        torch.testing.assert_close(model(clean), logits_c)
    with torch.no_grad(), edge_pass(model, graph, source=source, ablate=torch.zeros(graph.allowed.shape)):
        torch.testing.assert_close(model(clean), plain)


def test_gqa_has_key_and_value_inputs_per_kv_head():
    graph = build_graph(tiny(n_kv_heads=2))
    assert [n for n in graph.downstream if n.startswith("a0.")] == (
        [f"a0.h{h}<q>" for h in range(4)] + ["a0.h0<k>", "a0.h1<k>", "a0.h0<v>", "a0.h1<v>"])


@pytest.mark.parametrize("kw, named", [
    ({"normalization": "post"}, "normalization='post'"),
    ({"sublayer_norm": "sandwich"}, "sublayer_norm='sandwich'"),
    ({"unembed": False}, "unembed=False"),
])
def test_models_that_do_not_decompose_are_refused_by_name(kw, named):
    with pytest.raises(ValueError, match=named):
        build_graph(tiny(**kw))


def test_an_edge_that_does_not_exist_is_named():
    graph = build_graph(tiny())
    with pytest.raises(ValueError, match=r"'a1.h0', 'a0.h1<q>'.*does not exist"):
        graph.edge_mask([("a1.h0", "a0.h1<q>")])
    with pytest.raises(ValueError, match="'a9.h0' is not an upstream node"):
        graph.edge_mask([("a9.h0", "logits")])
    with pytest.raises(ValueError, match="'a0.h0<x>' is not a downstream input"):
        graph.edge_mask([("input", "a0.h0<x>")])
