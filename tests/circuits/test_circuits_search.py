"""Circuit search, the Circuit type and faithfulness, on the hand-built model whose circuit is known."""

import json
import warnings

import pytest
import torch
from known_circuit import CIRCUIT, known_circuit_model, known_circuit_task

from interp.circuits import (
    Circuit,
    acdc,
    build_graph,
    circuit_metrics,
    eap_ig,
    edge_pruning,
    faithfulness,
    faithfulness_curve,
    top_n,
)
from interp.circuits.evaluate import ablation_source


@pytest.fixture(scope="module")
def known():
    model = known_circuit_model()
    clean, corrupted, metric = known_circuit_task()
    return model, clean, corrupted, metric


def test_acdc_recovers_the_known_circuit_at_its_threshold(known):
    model, clean, corrupted, metric = known
    found = acdc(model, clean, corrupted, metric, threshold=1e-6)
    assert set(found.edges) == CIRCUIT
    # Above the smallest effect of a circuit edge, ACDC removes circuit edges too.
    assert set(acdc(model, clean, corrupted, metric, threshold=10.0).edges) < CIRCUIT


def test_edge_pruning_recovers_the_known_circuit(known):
    model, clean, corrupted, metric = known
    n = build_graph(model).n_edges
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # it reaches its target: no warning
        found = edge_pruning(model, clean, corrupted, metric, target=1 - len(CIRCUIT) / n, steps=100)
    assert set(found.edges) == CIRCUIT
    assert found.method == "edge-pruning"


def test_edge_pruning_that_stops_short_of_its_target_says_so(known):
    model, clean, corrupted, metric = known
    n = build_graph(model).n_edges
    with pytest.warns(RuntimeWarning, match=rf"kept \d+ of {n} edges after 3 steps, against {len(CIRCUIT)} for"):
        found = edge_pruning(model, clean, corrupted, metric, target=1 - len(CIRCUIT) / n, steps=3)
    assert len(found) > 1.25 * len(CIRCUIT) + 1


def test_top_n_of_eap_ig_is_the_circuit_and_it_is_fully_faithful(known):
    model, clean, corrupted, metric = known
    circuit = top_n(eap_ig(model, clean, corrupted, metric, steps=3), 3)
    assert set(circuit.edges) == CIRCUIT
    for ablation in ("resample", "mean"):
        f = faithfulness(model, circuit, clean, corrupted, metric, ablation=ablation)
        assert f["faithfulness"] == pytest.approx(1.0)
    # Without one of its edges nothing is left: the metric is the empty circuit's.
    part = Circuit(sorted(CIRCUIT)[:2])
    f = faithfulness(model, part, clean, corrupted, metric)
    assert f["normalized"] == pytest.approx(0.0, abs=1e-9)


def test_circuit_metrics_in_shared_passes_equal_one_at_a_time(known):
    model, clean, corrupted, metric = known
    graph = build_graph(model)
    source = ablation_source(model, graph, corrupted)
    gen = torch.Generator().manual_seed(0)
    masks = (torch.rand(5, *graph.allowed.shape, generator=gen) < 0.5) & graph.allowed
    together = circuit_metrics(model, graph, clean, source, masks, metric, batch_size=20)
    alone = [circuit_metrics(model, graph, clean, source, m[None], metric)[0] for m in masks]
    assert together == pytest.approx(alone, abs=1e-12)


def test_curve_has_methods_and_random_draws(known):
    model, clean, corrupted, metric = known
    scores = eap_ig(model, clean, corrupted, metric, steps=2)
    df = faithfulness_curve(model, scores, clean, corrupted, metric, sizes=[3, 10], n_random=4)
    assert len(df[df.method == "random"]) == 8
    top = df[(df.method == "eap-ig")].set_index("n_edges")["faithfulness"]
    assert top[3] == pytest.approx(1.0) and top[10] == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"sizes must be numbers of edges in \[1, 29\], got \[0\]"):
        faithfulness_curve(model, scores, clean, corrupted, metric, sizes=[0])


def test_save_load_compare(tmp_path):
    a = Circuit([("input", "a0.h0<v>"), ("a0.h0", "logits")], {("a0.h0", "logits"): -2.5}, method="eap",
                n_edges_total=29, info={"task": "toy"})
    b = Circuit.load(a.save(tmp_path / "c.json"))
    assert (b.edges, b.scores, b.method, b.n_edges_total, b.info) == (a.edges, a.scores, a.method, 29, {"task": "toy"})
    c = Circuit([("a0.h0", "logits"), ("a0.h1", "logits")])
    assert a.compare(c) == {"edge_overlap": 1 / 3, "node_overlap": 2 / 4, "shared_edges": 1.0, "shared_nodes": 2.0}
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match=r"bad.json: not a circuit file \(format 'other'"):
        Circuit.load(tmp_path / "bad.json")


def test_bad_circuits_are_named(known):
    model, clean, corrupted, metric = known
    with pytest.raises(ValueError, match="circuit .* is empty: 0 edges"):
        faithfulness(model, Circuit([]), clean, corrupted, metric)
    with pytest.raises(ValueError, match=r"edge \('a1.h1', 'a0.h0<v>'\) does not exist"):
        faithfulness(model, Circuit([("a1.h1", "a0.h0<v>")]), clean, corrupted, metric)
    with pytest.raises(ValueError, match=r"clean has shape \(4, 6\) and corrupted \(4, 5\)"):
        faithfulness(model, Circuit(sorted(CIRCUIT)), clean, corrupted[:, :5], metric)
    with pytest.raises(ValueError, match="threshold must be a number >= 0.*-1"):
        acdc(model, clean, corrupted, metric, threshold=-1)
    with pytest.raises(ValueError, match="n must be an int in .1, 29.*0"):
        top_n(eap_ig(model, clean, corrupted, metric, steps=1), 0)


class _Report:
    """A HeadReport's ``heads(kind)``, with the heads given."""

    def __init__(self, heads):
        self._heads = heads

    def heads(self, kind):
        return self._heads[kind]


def test_kind_overlap_counts_the_circuits_heads_beside_random_circuits():
    from test_circuits_graph import tiny

    from interp.circuits import kind_overlap

    graph = build_graph(tiny())  # 2 layers x 4 heads
    report = _Report({"induction": [(1, 0), (1, 2)], "previous-token": [(0, 1)], "sink": []})
    circuit = Circuit([("a0.h1", "a1.h0<k>"), ("input", "a1.h3<q>"), ("a1.h0", "logits")])
    df = kind_overlap(circuit, report, graph, ["induction", "previous-token", "sink"], n_random=30).set_index("kind")
    # heads touched: a0.h1, a1.h0, a1.h3
    assert df.loc["induction", ["kind_heads", "circuit_heads", "shared"]].tolist() == [2, 3, 1]
    assert df.loc["induction", "recall"] == 0.5 and df.loc["induction", "precision"] == pytest.approx(1 / 3)
    assert df.loc["previous-token", "shared"] == 1 and df.loc["previous-token", "recall"] == 1.0
    assert df.loc["sink", "shared"] == 0 and df.loc["sink", "random_as_many"] == 30
    # A circuit of every edge: each random circuit is the whole graph, and shares every head.
    full = Circuit(list(graph.edges))
    whole = kind_overlap(full, report, graph, ["induction"], n_random=3).iloc[0]
    assert whole.shared == whole.random_shared_mean == 2 and whole.random_as_many == 3
    # Random circuits of 3 edges touch few heads: the mean is between 0 and the 2 heads of the kind.
    assert 0 < df.loc["induction", "random_shared_mean"] < 2
    with pytest.raises(ValueError, match="empty"):
        kind_overlap(Circuit([]), report, graph, ["induction"])
    with pytest.raises(ValueError, match="a9.h0"):
        kind_overlap(Circuit([("a9.h0", "logits")]), report, graph, ["induction"])
