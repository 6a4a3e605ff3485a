"""The head map's kind selector reads the head-kind registry: it offers the kinds the model can run, runs the
ones picked, and the legend and the kinds table come from the registry. On a hand-built model whose sink head is
known (tests/toy_kinds.py), picking the sink kind labels exactly that head."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402
from toy_kinds import sink_model  # noqa: E402

from interp.analysis import classify_heads  # noqa: E402
from interp.analysis.kinds import head_kinds  # noqa: E402
from interp.app import DASHBOARD  # noqa: E402
from interp.app.results_cache import CACHE_ENV  # noqa: E402


@pytest.fixture(scope="module")
def sink_checkpoint(tmp_path_factory):
    """The hand-built sink model with a token-id tokenizer (so the page has a text box), saved as a checkpoint."""
    from interp.zoo.induction import TokenIdTokenizer, save_induction_model

    model = sink_model()
    model.tokenizer = TokenIdTokenizer(model.cfg.d_vocab, bos_id=None)
    folder = tmp_path_factory.mktemp("sink")
    save_induction_model(model, folder / "sink.safetensors")
    return folder, model


def _head_map(monkeypatch, tmp_path, folder=None) -> AppTest:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # computed here, not read from another test's cache
    at = AppTest.from_file(str(DASHBOARD), default_timeout=180)
    if folder is None:
        at.query_params["model"] = "random-tiny"
    else:
        monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(folder))
        at.query_params["model"] = "local checkpoint"
    at.query_params["page"] = "Head map"
    at.run()
    if folder is not None:
        at.sidebar.text_input(key="ckpt_path").set_value("sink.safetensors")
        at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Head map"
    return at


def _chart(at: AppTest, key: str) -> dict:
    return json.loads(next(c for c in at.get("plotly_chart") if c.key == key).proto.spec)


def test_the_selector_offers_the_registered_kinds_this_model_can_run(monkeypatch, tmp_path):
    at = _head_map(monkeypatch, tmp_path)
    box = at.multiselect(key="head_kinds")
    # Independently from the registry: a token-id model has no treebank, no coreference data and no texts.
    registry = head_kinds()
    runnable = [n for n, k in registry.items() if k.data not in ("treebank", "coref") and "texts" not in k.needs]
    assert box.options == runnable
    assert "sink" in box.options and "successor" in box.options and "syntactic" not in box.options
    assert box.value == [n for n in runnable if registry[n].default]
    table = at.dataframe[0].value
    assert list(table["kind"]) == box.value
    for row in table.itertuples():
        kind = registry[row.kind]
        assert (row.threshold, row.reason, row.source) == (kind.threshold, kind.reason, kind.source)


def test_picking_no_kind_asks_for_one(monkeypatch, tmp_path):
    at = _head_map(monkeypatch, tmp_path)
    at.multiselect(key="head_kinds").set_value([])
    at.run()
    assert not at.exception
    assert any("Pick at least one head kind" in i.value for i in at.info)
    assert "fig_head_map" not in {c.key for c in at.get("plotly_chart")}


def test_the_sink_kind_finds_the_hand_built_sink_head_and_the_legend_names_it(sink_checkpoint, monkeypatch, tmp_path):
    folder, model = sink_checkpoint
    at = _head_map(monkeypatch, tmp_path, folder)
    assert not at.error, [e.value for e in at.error]
    at.multiselect(key="head_kinds").set_value(["positional", "sink"])
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    shown = at.dataframe[1].value  # "All kinds found": the report's rows (the first table is the kinds run)
    assert set(zip(shown["layer"], shown["head"], shown["kind"])) >= {(0, 0, "sink")}
    assert [(r.layer, r.head) for r in shown.itertuples() if r.kind == "sink"] == [(0, 0)]  # L0H1 is no sink
    # The same rows as classify_heads on the same data (the page's sizes for a small model: 16 sequences).
    want = classify_heads(model, kinds=["positional", "sink"], n_seqs=16, batch_size=32, progress=False).df
    pd.testing.assert_frame_equal(shown.reset_index(drop=True)[list(want.columns)], want.reset_index(drop=True),
                                  check_dtype=False)
    legend = {t["name"]: t for t in _chart(at, "fig_head_map")["data"] if t.get("type") == "scatter" and t.get("name")}
    assert "sink" in legend and legend["sink"]["marker"]["color"] == head_kinds()["sink"].colour
    assert list(at.dataframe[0].value["kind"]) == ["positional", "sink"]


def test_a_kind_that_needs_text_is_offered_for_a_text_model_only():
    from helpers import word_tokenizer

    from interp.app.views.head_map import available_kinds

    model = sink_model()
    assert "induction:natural" not in available_kinds(model, set())
    model.tokenizer = word_tokenizer(model.cfg.d_vocab)
    assert "induction:natural" in available_kinds(model, set())
    assert "syntactic" in available_kinds(model, {"conllu"}) and "syntactic" not in available_kinds(model, set())


def test_the_circuit_colours_its_heads_by_the_head_maps_kinds(sink_checkpoint, monkeypatch, tmp_path):
    folder, model = sink_checkpoint
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(folder))
    at = AppTest.from_file(str(DASHBOARD), default_timeout=180)
    at.query_params["model"] = "local checkpoint"
    at.query_params["page"] = "Circuits"
    at.run()
    at.sidebar.text_input(key="ckpt_path").set_value("sink.safetensors")
    at.run()
    from interp.circuits import build_graph

    n_edges = build_graph(model).n_edges
    at.number_input(key=f"circuit_edges_{n_edges}").set_value(n_edges)  # every edge: every head is a node
    at.number_input(key="circuit_random").set_value(1)
    at.run()
    at.button(key="circuit_run").click()
    at.run()
    def groups() -> dict[str, str]:
        """Each head node of the circuit figure -> the name of the node group it is drawn in."""
        return {n: t["name"] for t in _chart(at, "fig_circuit")["data"] if t.get("mode") == "markers+text"
                for n in t["text"] if n.startswith("a")}

    assert set(groups().values()) == {"node"}  # not coloured until asked
    at.toggle(key="circuit_kinds").set_value(True)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    # Reference: the head map's default kinds on the page's data; each head is drawn under one of its own kinds.
    default = [n for n, k in head_kinds().items() if k.default and k.data not in ("treebank", "coref")
               and "texts" not in k.needs]
    report = classify_heads(model, kinds=default, n_seqs=16, batch_size=32, progress=False)
    assert report.heads("previous-token") == [(0, 2)]
    drawn = groups()
    assert set(drawn) == {"a0.h0", "a0.h1", "a0.h2"}
    for node, group in drawn.items():
        layer, head = int(node[1]), int(node.split(".h")[1])
        assert group in {k.split(":")[0] for k in report.kinds(layer, head)}, (node, group)


def test_the_kinds_picked_stay_over_a_visit_to_another_page(monkeypatch, tmp_path):
    at = _head_map(monkeypatch, tmp_path)
    at.multiselect(key="head_kinds").set_value(["induction", "sink"])
    at.run()
    for page in ("Induction", "Head map"):
        at.sidebar.radio(key="page").set_value(page)
        at.run()
        assert not at.exception and at.title[0].value == page
    assert at.multiselect(key="head_kinds").value == ["induction", "sink"]
    assert list(at.dataframe[0].value["kind"]) == ["induction", "sink"]
