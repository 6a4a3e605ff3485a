"""Saved figures open offline; image export says which extra provides kaleido, in a whole sentence;
experiments write where they are told."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest
import tomllib

from interp import viz
from interp.pruning import CurvePoint, PruningCurve
from interp.pruning.experiment import write_results

REPO = Path(__file__).resolve().parents[2]
HAS_KALEIDO = importlib.util.find_spec("kaleido") is not None


def _fig():
    return go.Figure(go.Scatter(x=[0, 1, 2], y=[3, 1, 2]))


def _offline(html: str) -> bool:
    # plotly.js itself inside the page (its licence banner), and no <script src=...> pointing at a CDN.
    return "plotly.js v" in html and 'src="https://cdn.plot.ly' not in html


def test_saved_html_figures_embed_plotly_js(tmp_path):
    path = viz.save_figure(_fig(), tmp_path / "f.html")
    assert _offline(path.read_text())


@pytest.mark.skipif(HAS_KALEIDO, reason="kaleido is installed here: the missing-kaleido message cannot be shown")
def test_png_without_kaleido_names_the_extra_in_a_whole_message(tmp_path):
    with pytest.raises(ImportError, match=r'pip install "interp\[png\]"') as err:
        viz.save_figure(_fig(), tmp_path / "f.png")
    assert str(err.value).endswith("needs nothing.")
    assert not (tmp_path / "f.png").exists()


def test_the_png_extra_provides_kaleido():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("kaleido") for dep in extras[viz.export.PNG_EXTRA])


def test_an_unknown_figure_suffix_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"'f\.txt'"):
        viz.save_figure(_fig(), tmp_path / "f.txt")


def test_pruning_results_open_offline_and_say_why_a_png_is_missing(tmp_path):
    curve = PruningCurve("importance", "accuracy", 4, [CurvePoint(0.0, 0, 0.9), CurvePoint(1.0, 4, 0.1)])
    summary = write_results({"importance": curve}, tmp_path)
    assert _offline((tmp_path / "curves.html").read_text())
    if not HAS_KALEIDO:
        assert summary["png"].startswith("not written") and summary["png"].endswith("needs nothing.")
        assert json.loads((tmp_path / "summary.json").read_text())["png"] == summary["png"]


def test_the_taxonomy_experiment_needs_an_output_folder():
    proc = subprocess.run([sys.executable, str(REPO / "experiments" / "head_taxonomy_minilm.py")],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "--out" in proc.stderr
