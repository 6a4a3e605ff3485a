"""The dashboard's model list on the dense families: a saved Hugging Face folder of a converted family (typed
into the "Hugging Face name" box, inside the served folder) and a GGUF file (the checkpoint path box) load, and
the attention page draws the pattern the library records on the same model."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from helpers import word_tokenizer

pytest.importorskip("streamlit")
transformers = pytest.importorskip("transformers")
from streamlit.testing.v1 import AppTest  # noqa: E402

from interp.app import DASHBOARD  # noqa: E402
from interp.zoo.compat import V, hf_test_model  # noqa: E402
from interp.zoo.hf import from_hf  # noqa: E402

TEXT = "w1 w2 w3 w4 w1 w2 w3 w4"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    models = {}
    for name in ("gemma2", "gpt_neox"):  # MQA + windows + soft-caps; a parallel block with partial rotary
        hf = hf_test_model(name)
        hf.save_pretrained(folder / name)
        word_tokenizer(V).save_pretrained(folder / name)
        models[name] = hf
    return folder, models


def _charts(at) -> dict[str, dict]:
    """Plotly charts by key, each as its figure JSON."""
    return {c.key: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def _arr(value) -> np.ndarray:
    """A figure array from its JSON: plotly writes numpy arrays as base64 ``{"dtype", "bdata", "shape"}``."""
    if isinstance(value, dict) and "bdata" in value:
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        return out.reshape([int(n) for n in str(shape).split(",")]) if shape else out
    return np.array(value)


@pytest.mark.parametrize("name", ["gemma2", "gpt_neox"])
def test_a_served_family_folder_loads_and_draws_its_patterns(served, monkeypatch, name):
    folder, models = served
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(folder))
    at = AppTest.from_file(str(DASHBOARD), default_timeout=300)
    at.query_params["model"] = "Hugging Face name"
    at.run()
    at.sidebar.text_input(key="hf_name").set_value(f"./{name}")
    at.run()
    assert not at.exception, at.exception
    at.sidebar.text_area(key="text").set_value(TEXT)
    at.selectbox(key="attn_layer").set_value(1)
    at.selectbox(key="attn_head").set_value(3)
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    # Reference: the in-memory HF model converted here, on the ids the folder's tokenizer gives the text.
    model = from_hf(models[name], tokenizer=word_tokenizer(V))
    caption = at.sidebar.caption[0].value
    assert name in caption and f"{model.cfg.kind.upper()}, 2 layers x 5 heads" in caption
    fig = _charts(at)["fig_attn_head"]
    z = _arr(fig["data"][0]["z"]).astype(float)
    ids = model.to_tokens(TEXT)
    assert z.shape == (ids.shape[1], ids.shape[1])
    with torch.no_grad():
        _, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
    np.testing.assert_allclose(z, trace.pattern(1)[0, 3].numpy(), atol=1e-5)


def test_a_served_gguf_file_loads_through_the_checkpoint_path_box(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    write_tiny_llama = _gguf_writer()
    write_tiny_llama(tmp_path / "tiny-llama.gguf")
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(tmp_path))
    at = AppTest.from_file(str(DASHBOARD), default_timeout=300)
    at.query_params["model"] = "local checkpoint"
    at.run()
    at.sidebar.text_input(key="ckpt_path").set_value("tiny-llama.gguf")
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert "GQA, 2 layers x 4 heads" in at.sidebar.caption[0].value
    assert "fig_attn_head" in _charts(at)


def _gguf_writer():
    """tests/zoo/test_zoo_gguf.py's writer of a tiny Llama GGUF file (the way llama.cpp's converter writes it)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "zoo" / "test_zoo_gguf.py"
    spec = importlib.util.spec_from_file_location("_zoo_gguf_writer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_tiny_llama
