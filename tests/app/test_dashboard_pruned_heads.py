"""The dashboard on a model whose layers hold different head counts (a ``remove_heads`` result): every page
labels the heads each layer really has, and switching heads off gates exactly those heads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

import interp  # noqa: E402
from interp.app import DASHBOARD  # noqa: E402

COUNTS = [2, 3]  # heads per layer after removing heads 1 and 3 of layer 0 and head 0 of layer 1
LABELS = ["L0H0", "L0H1", "L1H0", "L1H1", "L1H2"]


@pytest.fixture(scope="module")
def pruned_checkpoint(tmp_path_factory):
    from interp.pruning import remove_heads
    from interp.zoo.induction import save_induction_model

    model = interp.load("random-tiny")  # 2 layers x 4 heads, a token-id tokenizer
    off = torch.zeros(2, 4, dtype=torch.bool)
    off[0, 1] = off[0, 3] = off[1, 0] = True
    small = remove_heads(model, off)
    assert [b.attn.n_heads for b in small.blocks] == COUNTS
    folder = tmp_path_factory.mktemp("pruned")
    save_induction_model(small, folder / "small.safetensors")  # keeps the token-id tokenizer
    return folder, small


def _app(folder, monkeypatch, page: str) -> AppTest:
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(folder))
    at = AppTest.from_file(str(DASHBOARD), default_timeout=180)
    at.query_params["model"] = "local checkpoint"
    at.run()
    at.sidebar.text_input(key="ckpt_path").set_value("small.safetensors")
    at.run()
    at.sidebar.radio(key="page").set_value(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_pruning_page_offers_the_heads_each_layer_has_and_gates_them(pruned_checkpoint, monkeypatch):
    folder, small = pruned_checkpoint
    at = _app(folder, monkeypatch, "Pruning")
    assert at.multiselect(key="heads_off").options == LABELS
    assert "[2, 3]" in at.sidebar.caption[-1].value
    at.multiselect(key="heads_off").set_value(["L0H1", "L1H2"])
    at.run()
    assert not at.exception and not at.error
    shown = {m.label: m for m in at.metric}
    assert shown["Heads off"].value == "2 / 5"
    # Reference: the same heads gated by hand on the pruned model, the page's objective on its data.
    from interp.pruning import build_task

    task = build_task(small, data={"n_seqs": 16, "half_len": min(16, (small.cfg.n_ctx - 2) // 2), "eval_seed": 123,
                                   "batch_size": 8})
    with torch.no_grad():
        small.set_head_gates([torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])])
        want = float(task.objective.metric(small, task.held_out))
        small.set_head_gates(None)
    assert float(shown[f"{task.objective.metric_name} (higher is better)"].value) == pytest.approx(want, abs=1e-4)
    # The pruning methods need equal counts: the page says so instead of failing in the background.
    assert any("different head counts" in m.value for m in at.info)


def test_attention_page_shows_each_layers_own_heads(pruned_checkpoint, monkeypatch):
    folder, small = pruned_checkpoint
    at = _app(folder, monkeypatch, "Attention patterns")
    assert "All layers x heads" not in at.radio(key="attn_view").options
    at.selectbox(key="attn_layer").set_value(0)
    at.run()
    assert list(at.selectbox(key="attn_head_2").options) == ["0", "1"]
    at.radio(key="attn_view").set_value("All heads of a layer")
    at.run()
    at.selectbox(key="attn_layer_all").set_value(1)
    at.run()
    assert not at.exception
    fig = json.loads(next(c for c in at.get("plotly_chart") if c.key == "fig_attn_layer").proto.spec)
    assert sum(t["type"] == "heatmap" for t in fig["data"]) == 3  # layer 1's three heads
    # The panels are the model's own patterns of layer 1.
    ids = small.to_tokens(at.sidebar.text_area(key="text").value)
    with torch.no_grad():
        _, trace = small.run_with_cache(ids, names_filter="blocks.1.attn.hook_pattern")
    z = np.array(fig["data"][2]["z"]["bdata"] if isinstance(fig["data"][2]["z"], dict) else fig["data"][2]["z"])
    if z.dtype.kind in "US":  # plotly's base64 encoding of numpy arrays
        import base64

        zd = fig["data"][2]["z"]
        z = np.frombuffer(base64.b64decode(zd["bdata"]), dtype=zd["dtype"]).reshape(trace.pattern(1)[0, 2].shape)
    assert np.allclose(z, trace.pattern(1)[0, 2].numpy(), atol=1e-5)


@pytest.mark.parametrize("page", ["Head map", "Induction"])
def test_head_pages_run_on_per_layer_head_counts(pruned_checkpoint, monkeypatch, page):
    folder, _ = pruned_checkpoint
    at = _app(folder, monkeypatch, page)
    assert not at.error, [e.value for e in at.error]
    if page == "Head map":
        fig = json.loads(next(c for c in at.get("plotly_chart") if c.key == "fig_head_norms").proto.spec)
        z = fig["data"][0]["z"]
        if isinstance(z, dict):
            import base64

            z = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(2, 3).tolist()
        finite = [[v is not None and np.isfinite(v) for v in row] for row in z]
        assert finite == [[True, True, False], [True, True, True]]  # layer 0 has no third head


def test_circuits_page_names_only_the_heads_each_layer_has(pruned_checkpoint, monkeypatch, tmp_path):
    import re

    monkeypatch.setenv("INTERP_DASHBOARD_CACHE", str(tmp_path / "cache"))
    folder, small = pruned_checkpoint
    at = _app(folder, monkeypatch, "Circuits")
    from interp.circuits import build_graph

    n_edges = build_graph(small).n_edges
    at.number_input(key=f"circuit_edges_{n_edges}").set_value(n_edges)  # every edge: every node shows
    at.number_input(key="circuit_random").set_value(1)
    at.run()
    at.button(key="circuit_run").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    edges = at.dataframe[0].value
    heads = {(int(m[1]), int(m[2])) for name in [*edges["from"], *edges["to"]]
             for m in [re.match(r"a(\d+)\.h(\d+)", name)] if m}
    assert heads == {(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)}  # COUNTS = [2, 3]
