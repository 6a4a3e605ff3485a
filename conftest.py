"""Names every docstring example may use without defining them (pytest's ``doctest_namespace``).

The doctests (``--doctest-modules`` over ``interp/``, see pyproject.toml) run each docstring's ``>>>`` lines in
its module's namespace plus ``torch``, ``interp``, ``tmp`` (a fresh temporary folder, a ``Path``) and the
ready-made inputs of :mod:`interp.examples` the example names (``model``, ``tokens``, ``trace``, ``clean``,
``corrupted``, ``answers``, ``metric``, ``train``, ``held_out``, ``objective``, ``batches``, ``moe_model``,
``moe_tokens``, ``tok``), built there. The examples import what they use, so they also run pasted into a new
notebook (``tests/docs/test_docstring_examples_fresh.py`` runs them so); these names serve the modules that test
does not cover yet.

``fig.show()`` draws nothing during the doctests.

An example line with no expected output below it is run for its effect: it must not raise, and what it returns
is not compared (most examples end on a DataFrame or a figure, whose repr is no contract; a comment beside the
line says what it holds). A line with an expected output must match it (with ELLIPSIS, NORMALIZE_WHITESPACE and
NUMBER). Examples that need a data file beside the project (``../shared/data/...``) or SmolLM2-135M's cached weights are
skipped with the reason when those are absent.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))

# The Streamlit app's script draws the app when imported: never import it to look for doctests. The app's other
# modules import without drawing; their doctests run where Streamlit is installed (the app extra).
collect_ignore_glob = ["interp/app/dashboard.py"]
if importlib.util.find_spec("streamlit") is None:
    collect_ignore_glob.append("interp/app/*")
_DATA = re.compile(r"""["'](\.\./shared/data/[^"']+)["']""")


def _smollm2_cached() -> bool:
    if os.path.isfile(os.environ.get("INTERP_SMOLLM2_GGUF", "")):
        return True
    cache = os.environ.get("INTERP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "interp")
    return any(os.path.isfile(os.path.join(cache, "smollm2-135m", f))
               for f in ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m.float32.safetensors"))


def _run_only_checker() -> None:
    """Make pytest's doctest checker accept any output where the example shows none."""
    import _pytest.doctest as pytest_doctest

    base = pytest_doctest._init_checker_class()

    class RunForEffectWithoutWant(base):  # type: ignore[misc, valid-type]
        def check_output(self, want: str, got: str, optionflags: int) -> bool:
            return not want.strip() or super().check_output(want, got, optionflags)

    pytest_doctest.CHECKER_CLASS = RunForEffectWithoutWant


_run_only_checker()


@pytest.fixture(autouse=True)
def _doctest_names(request, doctest_namespace):
    test = getattr(request.node, "dtest", None)
    if test is None:  # not a doctest
        yield
        return
    source = "\n".join(ex.source for ex in test.examples)
    for path in _DATA.findall(source):
        if not os.path.exists(os.path.join(ROOT, path)):
            pytest.skip(f"needs {path}, not found beside the project")
    if re.search(r"\"smollm2-135m\"|fetch_gguf\(|load_smollm2\(", source) and not _smollm2_cached():
        pytest.skip("needs SmolLM2-135M in interp's cache (interp.load would download 98 MB)")
    import torch

    import interp
    import interp.examples

    doctest_namespace.update(torch=torch, interp=interp, tmp=request.getfixturevalue("tmp_path"))
    # The ready-made inputs an example names (interp.examples builds each, seeded; an example that imports them
    # itself, as every covered one does, gets equal ones).
    used = [name for name in dir(interp.examples) if name != "tmp" and re.search(rf"\b{name}\b", source)]
    doctest_namespace.update({name: getattr(interp.examples, name) for name in used})
    import plotly.basedatatypes

    request.getfixturevalue("monkeypatch").setattr(plotly.basedatatypes.BaseFigure, "show", lambda self, *a, **k: None)
    cwd = os.getcwd()
    os.chdir(ROOT)  # relative data paths resolve from the repository root, as in the docs
    try:
        yield
    finally:
        os.chdir(cwd)
