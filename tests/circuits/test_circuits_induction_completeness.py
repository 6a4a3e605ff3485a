"""induction-2l's textbook circuit under the induction task, completeness, head circuits, the bounded gradient
buffer and the norms' closed-form backward."""

import pytest
import torch
from known_circuit import CIRCUIT, known_circuit_model, known_circuit_task
from test_circuits_graph import FAMILIES, tiny

import interp
from interp.analysis.taxonomy import HeadReport
from interp.circuits import Circuit, build_graph, eap, eap_ig, exact_scores, faithfulness, top_n
from interp.circuits.evaluate import head_circuits, heads_circuit
from interp.circuits.gradients import _norm_vjp
from interp.circuits.tasks import circuit_task
from interp.norms import RMSNorm

# Previous-token head a0.h2 feeding the keys of induction heads a1.h1 and a1.h3 (classify_heads' labels), each
# induction head reading the current token as its query and the token to copy as its value.
INDUCTION = [("input", "a0.h2<v>"), ("a0.h2", "a1.h1<k>"), ("a0.h2", "a1.h3<k>"), ("input", "a1.h1<q>"),
             ("input", "a1.h3<q>"), ("input", "a1.h1<v>"), ("input", "a1.h3<v>"), ("a1.h1", "logits"),
             ("a1.h3", "logits")]


@pytest.fixture(scope="module")
def induction():
    model = interp.load("induction-2l")
    return model, circuit_task(model, "induction", n=16)


def test_k_composition_edges_score_under_the_induction_task(induction):
    model, task = induction
    graph = build_graph(model)
    exact = exact_scores(model, task.clean, task.corrupted, task.metric, graph=graph, batch_size=2048)
    top = sorted(exact.edge_scores().items(), key=lambda kv: kv[1])[:8]  # most negative: the edges it needs
    kcomp = {e for e, _ in top if e[0].startswith("a0.") and e[1].endswith("<k>")}
    assert {("a0.h2", "a1.h1<k>"), ("a0.h2", "a1.h3<k>")} <= kcomp
    # Plain top-8 keeps no edge into the logits (faithfulness ~0); grown from the logits it keeps a path.
    grown = top_n(exact, 8, connected=True)
    assert ("a0.h2", "a1.h3<k>") in grown.edges and any(d == "logits" for _, d in grown.edges)
    f = [faithfulness(model, c, task.clean, task.corrupted, task.metric, ablation=task.ablation)["faithfulness"]
         for c in (top_n(exact, 8), grown)]
    assert f[0] < 0.05 < 0.25 < f[1]


def test_textbook_circuit_is_faithful_and_complete_with_nine_edges(induction):
    model, task = induction
    f = faithfulness(model, Circuit(INDUCTION), task.clean, task.corrupted, task.metric, ablation=task.ablation)
    assert f["faithfulness"] > 0.9 and f["n_edges"] == 9  # 11 % of 81 edges
    assert f["completeness"] > 0.5  # without these 9 edges most of the behaviour is gone
    # Without its K-composition edges the circuit does not work.
    part = Circuit([e for e in INDUCTION if not e[1].endswith("<k>")])
    assert faithfulness(model, part, task.clean, task.corrupted, task.metric,
                        ablation=task.ablation)["faithfulness"] < 0.2


def test_connected_top_n_recovers_the_known_circuit():
    model = known_circuit_model()
    clean, corrupted, metric = known_circuit_task()
    scores = eap_ig(model, clean, corrupted, metric, steps=3)
    assert set(top_n(scores, 3, connected=True).edges) == CIRCUIT
    grown = top_n(scores, 10, connected=True)  # past the circuit only zero-score edges are left: still connected
    reads = {u for u, _ in grown.edges} - {"input"}
    assert all(any(d == "logits" or d.split("<")[0] == u for _, d in grown.edges) for u in reads)


def test_completeness_of_the_known_circuit_and_of_a_distractor():
    model = known_circuit_model()
    clean, corrupted, metric = known_circuit_task()
    whole = faithfulness(model, Circuit(sorted(CIRCUIT)), clean, corrupted, metric)
    assert whole["completeness"] == pytest.approx(1.0)  # nothing outside it carries the task
    assert whole["metric_complement"] == pytest.approx(whole["metric_empty"])
    distractor = faithfulness(model, Circuit([("input", "a0.h1<v>"), ("a0.h1", "a1.h0<v>")]), clean, corrupted,
                              metric)
    assert distractor["completeness"] == pytest.approx(0.0, abs=1e-9)
    assert distractor["metric_complement"] == pytest.approx(distractor["metric_full"])


def test_heads_circuit_keeps_the_edges_among_its_heads():
    model = known_circuit_model()
    graph = build_graph(model)
    c = heads_circuit(graph, [(0, 0), (1, 1)])
    assert CIRCUIT <= set(c.edges)
    assert all(u in {"input", "a0.h0", "a1.h1"} for u, _ in c.edges)
    clean, corrupted, metric = known_circuit_task()
    assert faithfulness(model, c, clean, corrupted, metric)["faithfulness"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="'a3.h0' is not an upstream node"):
        heads_circuit(graph, [(3, 0)])


def test_heads_circuit_with_grouped_keys_reads_the_group():
    graph = build_graph(tiny(n_kv_heads=2))  # heads 0, 1 share K/V head 0; heads 2, 3 K/V head 1
    c = heads_circuit(graph, [(1, 3)], mlps=False)
    reads = {d for _, d in c.edges}
    assert {"a1.h3<q>", "a1.h1<k>", "a1.h1<v>", "logits"} == reads


def test_head_circuits_rank_by_classify_heads_score():
    import pandas as pd
    report = HeadReport(pd.DataFrame({"layer": [0, 1, 1], "head": [1, 0, 1], "kind": ["previous-token", "induction",
                                      "induction"], "score": [0.5, 0.9, 0.7], "evidence": [""] * 3}),
                        n_layers=2, n_heads=2)
    graph = build_graph(known_circuit_model())
    cs = head_circuits(report, graph, ["induction", "previous-token"], [1, 2, 3])
    assert [c.info["heads"] for c in cs.values()] == [[[1, 0]], [[1, 0], [1, 1]], [[1, 0], [1, 1], [0, 1]]]
    with pytest.raises(ValueError, match="found no head of kinds \\['duplicate'\\]"):
        head_circuits(report, graph, ["duplicate"], [1])


@pytest.mark.parametrize("family", ["parallel_one_norm", "moe"])
def test_a_small_gradient_buffer_gives_the_same_scores(family):
    """The buffer bound only changes when the columns are folded, never the scores."""
    model = tiny(**FAMILIES[family])
    gen = torch.Generator().manual_seed(1)
    clean, corrupted = torch.randint(0, 20, (2, 6), generator=gen), torch.randint(0, 20, (2, 6), generator=gen)

    def metric(logits):
        return (logits[:, -1, 3] - logits[:, -1, 5]).mean()

    one_block = 2 * 6 * 16 * 8  # bytes of one float64 column: every block is folded on its own
    for method in (eap, lambda *a, **k: eap_ig(*a, steps=2, **k))[:1 if family == "moe" else 2]:
        big = method(model, clean, corrupted, metric).scores
        small = method(model, clean, corrupted, metric, buffer_bytes=one_block).scores
        torch.testing.assert_close(small, big)
    with pytest.raises(ValueError, match="buffer_bytes must be a positive int .* got 0"):
        eap(model, clean, corrupted, metric, buffer_bytes=0)


@pytest.mark.parametrize("norm", [RMSNorm(16, eps=1e-5), torch.nn.LayerNorm(16), torch.nn.RMSNorm(16),
                                  torch.nn.Identity(), torch.nn.Tanh()])
def test_norm_backward_closed_forms_equal_autograd(norm):
    torch.manual_seed(0)
    for p in norm.parameters():
        p.data.normal_()
    x, g = torch.randn(2, 3, 16), torch.randn(5, 2, 3, 16)  # 5 inputs reading one residual
    xe = x[None].expand(5, 2, 3, 16).clone().requires_grad_()
    (want,) = torch.autograd.grad(norm(xe), xe, g)
    out = torch.empty(5, 6, 16)
    _norm_vjp(norm, x, g.reshape(5, 6, 16), out)
    torch.testing.assert_close(out, want.reshape(5, 6, 16), atol=1e-5, rtol=1e-5)
