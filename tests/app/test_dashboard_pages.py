"""The dashboard as a multipage app: one module per page in a registry, a link straight to a page, shared sidebar
widgets (and an uploaded checkpoint) kept over a page switch, saved curves found without a source checkout, and
pruning curves that are the library runner's."""

from __future__ import annotations

import base64
import importlib
import json
import pkgutil
import time

import numpy as np
import pytest

pytest.importorskip("streamlit")
from helpers import tiny_model  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import interp  # noqa: E402
from interp.app import DASHBOARD  # noqa: E402
from interp.app.results_cache import CACHE_ENV  # noqa: E402


def _app(model: str = "random-tiny", page: str | None = None) -> AppTest:
    at = AppTest.from_file(str(DASHBOARD), default_timeout=180)
    at.query_params["model"] = model
    if page:
        at.query_params["page"] = page
    at.run()
    assert not at.exception, at.exception
    return at


def test_every_page_module_is_registered_once_with_its_own_title_and_url():
    import interp.app.views as views
    from interp.app.views import PAGES, page_titles

    modules = [importlib.import_module(f"interp.app.views.{m.name}") for m in pkgutil.iter_modules(views.__path__)]
    assert sorted(m.PAGE.title for m in modules) == sorted(page_titles())  # no page module left out
    assert len({p.title for p in PAGES}) == len({p.slug for p in PAGES}) == len(PAGES)
    at = _app()
    assert at.sidebar.radio(key="page").options == page_titles()


def test_a_link_to_a_page_opens_it_with_the_linked_model():
    at = _app(model="random-tiny", page="Induction")
    assert at.title[0].value == "Induction" and at.sidebar.radio(key="page").value == "Induction"
    assert "random-tiny" in at.sidebar.caption[0].value
    at = _app(model="random-tiny", page="No such page")  # an unknown page: the first one
    assert at.title[0].value == "Attention patterns"


def test_the_model_and_an_uploaded_checkpoint_stay_over_page_switches(monkeypatch, tmp_path):
    monkeypatch.delenv("INTERP_DASHBOARD_FILES", raising=False)
    model = tiny_model(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=16)
    model.name = "uploaded-tiny"
    data = interp.zoo.save_checkpoint(model, tmp_path / "m.safetensors").read_bytes()
    at = _app(model="local checkpoint", page="Induction")
    at.sidebar.file_uploader(key="ckpt_upload").set_value(("m.safetensors", data, "application/octet-stream"))
    at.run()
    assert "uploaded-tiny" in at.sidebar.caption[0].value
    for page in ("Pruning", "KV cache & FLOPs", "Induction"):
        at.sidebar.radio(key="page").set_value(page)
        at.run()
        assert not at.exception and at.title[0].value == page
        assert at.sidebar.selectbox(key="model").value == "local checkpoint"
        assert any("uploaded-tiny" in c.value for c in at.sidebar.caption), page
    # Another model, then back to the upload box: it starts empty (the old upload is not silently reused).
    at.sidebar.selectbox(key="model").set_value("random-tiny")
    at.run()
    at.sidebar.selectbox(key="model").set_value("local checkpoint")
    at.run()
    assert any("Upload an interp checkpoint" in i.value for i in at.info)


def test_saved_curves_are_listed_from_a_named_folder_and_not_from_site_packages(tmp_path, monkeypatch):
    from interp.app import serving

    monkeypatch.delenv(serving.RESULTS_ENV, raising=False)
    fake = tmp_path / "site-packages" / "interp" / "__init__.py"  # a wheel install: no pyproject.toml above it
    fake.parent.mkdir(parents=True)
    (tmp_path / "site-packages" / "experiments" / "results").mkdir(parents=True)
    monkeypatch.setattr(interp, "__file__", str(fake))
    assert serving.results_folder() is None
    run = tmp_path / "results" / "prune_tiny"
    run.mkdir(parents=True)
    for name in ("importance.json", "summary.json"):
        (run / name).write_text("{}")
    monkeypatch.setenv(serving.RESULTS_ENV, str(tmp_path / "results"))
    assert serving.results_folder() == (tmp_path / "results").resolve()
    assert serving.saved_curve_files(serving.results_folder()) == ["prune_tiny/importance.json"]


def _ys(trace: dict) -> list[float]:
    y = trace["y"]
    if isinstance(y, dict) and "bdata" in y:  # plotly writes numpy arrays as base64
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
    return list(y)


def test_pruning_curves_are_the_experiment_runners(monkeypatch, tmp_path):
    import interp.pruning

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    calls = []
    runner = interp.pruning.run_experiment
    monkeypatch.setattr(interp.pruning, "run_experiment", lambda config, **kw: (calls.append(config), runner(
        config, **kw))[1])
    at = _app(page="Pruning")
    at.multiselect(key="curve_methods").set_value(["random"])
    at.select_slider(key="curve_step").set_value(2)
    at.run()
    at.button(key="curve_run").click()
    at.run()
    deadline = time.monotonic() + 120
    while "fig_pruning" not in {c.key for c in at.get("plotly_chart")} or at.get("progress"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        at.run()
        assert not at.exception, at.exception
    assert [c["methods"] for c in calls] == [["random"]]
    fig = json.loads(next(c for c in at.get("plotly_chart") if c.key == "fig_pruning").proto.spec)
    # Reference: the runner on the page's task, written out here (3 seeds, 2 heads per step, 16 sequences).
    model = interp.load("random-tiny")
    want = runner({"model": "random-tiny", "methods": ["random"],
                   "data": {"n_seqs": 16, "half_len": 16, "eval_seed": 123, "batch_size": 8},
                   "random": {"seeds": [0, 1, 2], "step": 2}}, model=model, progress=False)["random"]
    (line,) = [t for t in fig["data"] if t["type"] == "scatter" and t.get("name", "").startswith("random")]
    assert _ys(line) == pytest.approx(want.metrics.tolist(), abs=1e-6)
