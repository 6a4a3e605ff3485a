"""The notebook environment: in a real Jupyter kernel ``from interp import viz`` raises no tqdm warning (tqdm's
notebook bars need ipywidgets, which the notebook / dev extras install), an attention view renders as HTML, and
the ``png`` extra exports a PNG."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_the_notebook_and_dev_extras_install_ipywidgets():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("notebook", "dev"):
        assert any(dep.startswith("ipywidgets") for dep in extras[extra]), extra
    assert any(dep.startswith("kaleido") for dep in extras["png"])


@pytest.mark.slow
def test_importing_viz_in_a_kernel_warns_nothing(monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets", reason="ipywidgets (the notebook extra) is not installed")
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    code = ("import warnings\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from interp import viz\n"
            "print('WARNINGS', [f'{w.category.__name__}: {w.message}' for w in caught if 'tqdm' in str(w.category).lower()\n"
            "                   or 'IProgress' in str(w.message)])\n"
            "import torch\n"
            "viz.attention_view(torch.softmax(torch.randn(2, 3, 3), -1), ['a', 'b', 'c'])")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nbclient.NotebookClient(nb, timeout=180, kernel_name=NATIVE_KERNEL_NAME,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "WARNINGS []" in text, text
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert 'class="av-root"' in html  # _repr_html_ is what the kernel shows


def test_png_extra_exports_a_png(tmp_path):
    if importlib.util.find_spec("kaleido") is None:
        pytest.skip("kaleido (the png extra) is not installed")
    import plotly.graph_objects as go

    from interp import viz

    try:
        path = viz.save_figure(go.Figure(go.Bar(y=[1, 3, 2])), tmp_path / "f.png", width=300, height=200)
    except RuntimeError as e:  # kaleido without a Chrome / Chromium to drive
        pytest.skip(f"kaleido is installed but cannot export here: {e}")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
