"""One round trip: ``interp prune --out DIR`` writes a run, the dashboard's "Load a saved curve" opens DIR."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("streamlit")
from helpers import run_cli, tiny_model  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from interp.app import DASHBOARD  # noqa: E402
from interp.pruning import PruningCurve  # noqa: E402


def _ys(trace: dict) -> list[float]:
    import base64

    y = trace["y"]
    if isinstance(y, dict) and "bdata" in y:  # plotly writes numpy arrays as base64
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
    return list(y)


def test_the_saved_curve_page_opens_a_folder_written_by_interp_prune_out(capsys, tmp_path, monkeypatch):
    from interp.zoo.checkpoint import save_checkpoint

    model = save_checkpoint(tiny_model(attn_only=True), tmp_path / "tiny.safetensors")
    code, _, err = run_cli(capsys, "prune", "--model", str(model), "--method", "importance", "--n-seqs", "4",
                           "--step", "0.25", "--out", str(tmp_path / "run" / "importance"), "--no-progress")
    assert code == 0, err
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(tmp_path))
    at = AppTest.from_file(str(DASHBOARD), default_timeout=180)
    at.query_params["model"] = "random-tiny"
    at.run()
    at.sidebar.radio(key="page").set_value("Pruning")
    at.run()
    at.radio(key="curve_source").set_value("Load a saved curve")
    at.run()
    at.text_input(key="curve_path").set_value("run/importance")  # the folder, relative to the served one
    at.run()
    assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]
    fig = json.loads(next(c for c in at.get("plotly_chart") if c.key == "fig_pruning").proto.spec)
    saved = PruningCurve.load(tmp_path / "run" / "importance" / "importance.json")
    lines = [t for t in fig["data"] if t["type"] == "scatter"]
    assert len(lines) == 1 and _ys(lines[0]) == pytest.approx(saved.metrics.tolist())
    assert list(at.dataframe[0].value["method"]) == ["importance"]
    # A folder without curves: one message naming it.
    (tmp_path / "empty").mkdir()
    at.text_input(key="curve_path").set_value("empty")
    at.run()
    assert not at.exception and [e.value for e in at.error] == [
        "'empty' holds no pruning curve (<method>.json, as interp prune --out DIR writes)"]
