"""The Circuits page: pick a task and a method, press Find, see the circuit, its faithfulness and the curve beside
random circuits. The numbers are those of interp.circuits called directly on the same task."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

import interp  # noqa: E402
from interp import circuits  # noqa: E402
from interp.app import DASHBOARD  # noqa: E402
from interp.app.results_cache import CACHE_ENV  # noqa: E402
from interp.circuits.tasks import circuit_task  # noqa: E402

N_EDGES = 57  # random-tiny: 2 layers x 4 heads, attention only


def _page(monkeypatch, cache) -> AppTest:
    monkeypatch.setenv(CACHE_ENV, str(cache))
    at = AppTest.from_file(str(DASHBOARD), default_timeout=180)
    at.query_params["model"] = "random-tiny"
    at.query_params["page"] = "Circuits"
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Circuits"
    return at


def _charts(at: AppTest) -> dict[str, dict]:
    return {c.key: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def _reference(method_circuit):
    model = interp.load("random-tiny")
    task = circuit_task(model, "induction", n=16, seed=0)
    found = method_circuit(model, task)
    # Under the task's own ablation (the induction task's is the mean), as the CLI and the page measure it.
    return found, circuits.faithfulness(model, found, task.clean, task.corrupted, task.metric,
                                        ablation=task.ablation)


def test_eap_circuit_and_its_faithfulness_are_the_librarys(monkeypatch, tmp_path):
    at = _page(monkeypatch, tmp_path / "cache")
    assert at.selectbox(key="circuit_task").options == ["induction"]  # a token-id model reads no text tasks
    assert at.selectbox(key="circuit_method").options == ["EAP (two forwards, one backward)",
                                                          "EAP-IG (integrated gradients)",
                                                          "ACDC (greedy, exact patching)",
                                                          "Edge Pruning (Hard-Concrete gates)"]
    assert any("Find the circuit" in i.value for i in at.info) and not _charts(at)  # nothing runs before the press
    at.number_input(key=f"circuit_edges_{N_EDGES}").set_value(6)
    at.number_input(key="circuit_random").set_value(3)
    at.run()
    at.button(key="circuit_run").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    found, faith = _reference(lambda m, t: circuits.top_n(circuits.eap(m, t.clean, t.corrupted, t.metric), 6))
    shown = {m.label: m.value for m in at.metric}
    assert shown["Edges kept"] == f"6 / {N_EDGES}"
    assert float(shown["Faithfulness"]) == pytest.approx(faith["faithfulness"], abs=1e-3)
    assert float(shown["Normalized"]) == pytest.approx(faith["normalized"], abs=1e-3)
    edges = at.dataframe[0].value
    assert set(zip(edges["from"], edges["to"])) == set(found.edges)
    charts = _charts(at)
    assert {"fig_circuit", "fig_faithfulness"} <= set(charts)
    names = {t.get("name") for t in charts["fig_faithfulness"]["data"]}
    assert {"eap", "random"} <= names
    # Another session with the same settings reads the circuit from the disk cache: no press needed.
    again = _page(monkeypatch, tmp_path / "cache")
    again.number_input(key=f"circuit_edges_{N_EDGES}").set_value(6)
    again.number_input(key="circuit_random").set_value(3)
    again.run()
    assert "now read from the disk cache" in again.caption[0].value
    assert {m.label: m.value for m in again.metric} == shown


def test_acdc_keeps_what_its_threshold_keeps(monkeypatch, tmp_path):
    at = _page(monkeypatch, tmp_path / "cache")
    at.selectbox(key="circuit_method").set_value("acdc")
    at.run()
    assert at.number_input(key=f"circuit_edges_{N_EDGES}").disabled  # ACDC's size comes from its threshold
    at.number_input(key="circuit_threshold").set_value(0.05)
    at.number_input(key="circuit_random").set_value(2)
    at.run()
    at.button(key="circuit_run").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    found, faith = _reference(lambda m, t: circuits.acdc(m, t.clean, t.corrupted, t.metric, threshold=0.05,
                                                            ablation=t.ablation))
    shown = {m.label: m.value for m in at.metric}
    assert shown["Edges kept"] == f"{len(found)} / {N_EDGES}"
    assert float(shown["Faithfulness"]) == pytest.approx(faith["faithfulness"], abs=1e-3)


def test_find_circuit_refuses_bad_settings_by_name():
    from interp.app.views.circuits import find_circuit

    model = interp.load("random-tiny")
    with pytest.raises(ValueError, match=r"n_keep=0 must be in \[1, 57\]"):
        find_circuit(model, "induction", "eap", n_keep=0)
    with pytest.raises(ValueError, match="method must be one of .* got 'magic'"):
        find_circuit(model, "induction", "magic", n_keep=3)
    with pytest.raises(ValueError, match="ioi"):
        find_circuit(model, "ioi", "eap", n_keep=3)  # a text task on a token-id model
