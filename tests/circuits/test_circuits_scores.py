"""Edge scores: EAP against a finite-difference reference, exact patching against a naive loop on the model's own
hooks, EAP-IG on a model whose circuit is known, and the bad inputs."""

import pytest
import torch
from known_circuit import CIRCUIT, known_circuit_model, known_circuit_task
from test_circuits_graph import FAMILIES, tiny

from interp.circuits import build_graph
from interp.circuits.patch import edge_pass, node_writes
from interp.circuits.scores import _naive_hook, _write_of, eap, eap_ig, exact_scores, exact_scores_naive


def pair(seed=3):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 20, (3, 8), generator=gen), torch.randint(0, 20, (3, 8), generator=gen)


def logit_diff(logits):
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_exact_patching_in_shared_passes_equals_a_naive_loop(family):
    model = tiny(**FAMILIES[family])
    clean, corrupted = pair()
    graph = build_graph(model)
    edges = graph.edges[::6]  # every kind of edge, a sixth of them (cheap)
    shared = exact_scores(model, clean, corrupted, logit_diff, edges=edges, batch_size=12)
    naive = exact_scores_naive(model, clean, corrupted, logit_diff, edges=edges)
    assert shared.scores.abs().max() > 1e-3
    torch.testing.assert_close(shared.scores, naive.scores, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", ["sequential", "parallel_one_norm", "gqa"])  # MoE: its float32 router is too noisy for differences
def test_eap_equals_the_finite_difference_of_each_edge(family):
    """EAP's score of u -> d is the derivative of the metric along (corrupted - clean write of u) at input d."""
    model = tiny(**FAMILIES[family])
    graph = build_graph(model)
    clean, corrupted = pair()
    scores = eap(model, clean, corrupted, logit_diff, graph=graph).scores
    names = [n for n in model.hook_names if n.endswith(("hook_result", "hook_mlp_out", "hook_resid_pre",
                                                        "hook_resid_mid"))]
    with torch.no_grad():
        logits_b, trace_b = model.run_with_cache(clean, names_filter=names)
        _, trace_c = model.run_with_cache(corrupted, names_filter=names)
    resid = {n: trace_b[n] for n in trace_b.keys() if "resid" in n}
    # Central differences: the error is O(eps^2) and the float32 router of the MoE model stays below it.
    eps = 1e-4
    edges = graph.allowed.nonzero().tolist()
    for u, d in edges[::7]:  # a spread of edges of every kind
        diff = _write_of(graph, u, trace_c) - _write_of(graph, u, trace_b)
        m = []
        for sign in (1, -1):
            name, hook = _naive_hook(model, graph, u, d, sign * eps * diff, resid)
            with torch.no_grad():
                m.append(float(logit_diff(model.run_with_hooks(clean, fwd_hooks=[(name, hook)]))))
        fd = (m[0] - m[1]) / (2 * eps)
        assert fd == pytest.approx(float(scores[u, d]), rel=1e-3, abs=1e-4), (graph.upstream[u], graph.downstream[d])


@pytest.mark.parametrize("family", ["sequential", "parallel_one_norm"])
def test_every_method_reports_the_metric_of_both_runs(family):
    """metric_clean and metric_corrupted are the metric of plain runs of clean and corrupted, whichever method
    scored (EAP and EAP-IG compute the corrupted one when it is first read, from the final residual they kept)."""
    model = tiny(**FAMILIES[family])
    clean, corrupted = pair()
    with torch.no_grad():
        want = float(logit_diff(model(clean))), float(logit_diff(model(corrupted)))
    assert abs(want[0] - want[1]) > 1e-3  # the two differ: the test can tell them apart
    found = [eap(model, clean, corrupted, logit_diff), eap_ig(model, clean, corrupted, logit_diff, steps=2),
             exact_scores(model, clean, corrupted, logit_diff, edges=build_graph(model).edges[:2]),
             exact_scores_naive(model, clean, corrupted, logit_diff, edges=build_graph(model).edges[:2])]
    for result in found:
        assert (result.metric_clean, result.metric_corrupted) == pytest.approx(want, abs=1e-5), result.method


def test_nothing_of_a_gradient_pass_outlives_the_call(monkeypatch):
    """EAP's and EAP-IG's pass state (differences [U, B, T, M], gradient buffer, residuals) is freed when the call
    returns: no hook may hold the tensor it is registered on (a cycle through autograd's C++ graph, which Python's
    collector cannot break, kept ~1 GB per call alive on SmolLM2)."""
    import gc
    import weakref

    from interp.circuits import gradients

    made = []
    init = gradients._GradientPass.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(gradients._GradientPass, "__init__", tracked)
    model = tiny()
    clean, corrupted = pair()
    eap(model, clean, corrupted, logit_diff)
    eap_ig(model, clean, corrupted, logit_diff, steps=2, steps_per_pass=1)
    gc.collect()
    assert len(made) == 3 and all(ref() is None for ref in made)


def test_eap_ig_recovers_the_known_circuit_exactly():
    model = known_circuit_model()
    clean, corrupted, metric = known_circuit_task()
    for result in (eap_ig(model, clean, corrupted, metric, steps=4), eap(model, clean, corrupted, metric)):
        found = {e for e, s in result.edge_scores().items() if abs(s) > 1e-9}
        assert found == CIRCUIT, result.method
    exact = exact_scores(model, clean, corrupted, metric)
    assert {e for e, s in exact.edge_scores().items() if abs(s) > 1e-9} == CIRCUIT


def test_eap_ig_with_one_step_is_eap():
    model = tiny()
    clean, corrupted = pair()
    torch.testing.assert_close(eap_ig(model, clean, corrupted, logit_diff, steps=1).scores,
                               eap(model, clean, corrupted, logit_diff).scores)


def test_bad_inputs_are_named():
    model = tiny()
    clean, corrupted = pair()
    with pytest.raises(ValueError, match=r"clean has shape \(3, 8\) and corrupted \(3, 6\)"):
        eap(model, clean, corrupted[:, :6], logit_diff)
    with pytest.raises(ValueError, match="does not depend on the logits"):
        eap(model, clean, corrupted, lambda logits: torch.tensor(1.0))
    with pytest.raises(ValueError, match="edges is empty"):
        exact_scores(model, clean, corrupted, logit_diff, edges=[])
    with pytest.raises(ValueError, match=r"edge \('a1.h0', 'a0.h0<q>'\) does not exist"):
        exact_scores(model, clean, corrupted, logit_diff, edges=[("a1.h0", "a0.h0<q>")])
    with pytest.raises(ValueError, match="steps must be a positive int.*0"):
        eap_ig(model, clean, corrupted, logit_diff, steps=0)
    with pytest.raises(ValueError, match="steps_per_pass must be a positive int or None.*0"):
        eap_ig(model, clean, corrupted, logit_diff, steps=2, steps_per_pass=0)


def eap_ig_reference(model, graph, clean, corrupted, metric, steps):
    """EAP-IG by plain autograd: one forward and backward per point on the path, the gradient of the metric with
    respect to every downstream input read from edge_pass's probes, times the corrupted minus clean writes."""
    _, source = node_writes(model, graph, corrupted)
    _, own = node_writes(model, graph, clean)
    diff = (source - own).double()  # [U, B, T, M]
    total = torch.zeros(graph.allowed.shape, dtype=torch.float64)
    for k in range(1, steps + 1):
        embed = source[0] + k / steps * (own[0] - source[0])  # [B, T, M]
        with torch.enable_grad(), edge_pass(model, graph, probes=True, embed=embed) as run:
            value = metric(model(clean))
        grads = torch.autograd.grad(value, list(run.probes.values()))
        for (layer, kind), g in zip(run.probes, grads):
            cols = graph.down_slice(layer, kind)
            total[:, cols] += torch.einsum("ubtm,btnm->un", diff, g.double())  # g: [B, T, n, M]
    return (total / steps * graph.allowed).float()


@pytest.mark.parametrize("family", ["sequential", "parallel_one_norm", "gqa"])
def test_eap_ig_in_batched_passes_equals_one_pass_per_step_and_plain_autograd(family):
    model = tiny(**FAMILIES[family])
    graph = build_graph(model)
    clean, corrupted = pair()
    batched = eap_ig(model, clean, corrupted, logit_diff, steps=3, graph=graph, progress=False)
    assert batched.scores.abs().max() > 1e-3
    for per_pass in (1, 2):
        torch.testing.assert_close(eap_ig(model, clean, corrupted, logit_diff, steps=3, graph=graph,
                                          steps_per_pass=per_pass, progress=False).scores,
                                   batched.scores, atol=1e-5, rtol=1e-5)
    reference = eap_ig_reference(model, graph, clean, corrupted, logit_diff, 3)
    torch.testing.assert_close(batched.scores, reference, atol=1e-5, rtol=1e-5)


class _LastOnly:
    """``logit_diff`` that says it reads the last position only, and keeps the shapes it was given."""

    reads_last_only = True

    def __init__(self):
        self.shapes = []

    def __call__(self, logits):
        self.shapes.append(tuple(logits.shape))
        return logit_diff(logits)


@pytest.mark.parametrize("family", ["sequential", "parallel_one_norm"])
def test_a_metric_of_the_last_position_gets_its_logits_alone_and_the_same_scores(family):
    model = tiny(**FAMILIES[family])
    graph = build_graph(model)
    clean, corrupted = pair()
    edges = graph.edges[::5]
    runs = {"eap": lambda m: eap(model, clean, corrupted, m, graph=graph),
            "eap-ig": lambda m: eap_ig(model, clean, corrupted, m, steps=3, steps_per_pass=2, graph=graph,
                                       progress=False),
            "exact": lambda m: exact_scores(model, clean, corrupted, m, edges=edges, graph=graph, batch_size=12)}
    for name, run in runs.items():
        last = _LastOnly()
        got = run(last)
        full = run(lambda logits: logit_diff(logits))  # the same metric, saying nothing of its positions
        assert full.scores.abs().max() > 1e-3, name
        torch.testing.assert_close(got.scores, full.scores, atol=1e-6, rtol=1e-5)  # float32 scores
        assert got.metric_clean == pytest.approx(full.metric_clean, abs=1e-12)
        # The scores' passes unembedded one position; only the clean and corrupted runs' own metric saw all.
        passes = [s for s in last.shapes if s[1] == 1]
        assert len(passes) >= 1 and len(last.shapes) - len(passes) <= 2, (name, last.shapes)


def test_eap_ig_on_a_cpu_bounds_the_token_rows_of_a_pass(monkeypatch):
    from interp.circuits import scores as scores_module

    model = tiny()
    assert scores_module._points_per_pass(model, torch.zeros(4, 128, dtype=torch.long), 5) == 2  # 2 x 512 rows
    assert scores_module._points_per_pass(model, torch.zeros(8, 200, dtype=torch.long), 5) == 1  # never none
    assert scores_module._points_per_pass(model, torch.zeros(5, 14, dtype=torch.long), 5) == 5  # never more
    # The default splits the points into passes of at most that many rows, and the scores do not move.
    graph = build_graph(model)
    clean, corrupted = pair()  # 3 x 8 = 24 rows a point
    monkeypatch.setattr(scores_module, "CPU_ROWS_PER_PASS", 48)
    rows = []
    hook = model.blocks[0].register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[0]))
    try:
        split = eap_ig(model, clean, corrupted, logit_diff, steps=5, graph=graph, progress=False)
    finally:
        hook.remove()
    assert sorted(rows) == [3, 3 * 1, 3 * 2, 3 * 2]  # the corrupted run, then passes of 1, 2 and 2 points
    one = eap_ig(model, clean, corrupted, logit_diff, steps=5, steps_per_pass=5, graph=graph, progress=False)
    torch.testing.assert_close(split.scores, one.scores, atol=1e-6, rtol=1e-5)  # float32 scores, summed apart
