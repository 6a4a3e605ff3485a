"""Every public docstring example of interp runs in a fresh namespace, as pasted into a new notebook.

The doctest run of CI (``--doctest-modules``) gives each example its module's names plus what ``conftest.py``
injects; here an example gets nothing: it imports what it uses (``from interp.examples import model, tokens``
for the ready-made inputs). Expected outputs are compared as in the doctest run (ELLIPSIS, NORMALIZE_WHITESPACE;
a line with no expected output is run for its effect). Examples that need a data file beside the project or
SmolLM2-135M's weights are skipped when those are absent, as in the doctest run; so are the modules being rewritten
elsewhere (listed below with the reason).
"""

from __future__ import annotations

import doctest
import functools
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

import pytest

import interp

ROOT = Path(__file__).resolve().parents[2]
# Not covered yet, each with its reason: the Streamlit app draws a page when imported; the Hugging Face / GGUF
# converters and the compatibility table were being rewritten when this test was added.
# The dashboard is the Streamlit script: importing it runs the app (its modules in interp.app are covered).
NOT_COVERED: tuple[str, ...] = ("interp.app.dashboard",)
_DATA = re.compile(r"""["'](\.\./shared/data/[^"']+)["']""")
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _covered(name: str) -> bool:
    return not any(name == m or name.startswith(m + ".") or (m == "interp.zoo.gguf" and name.startswith(m))
                   for m in NOT_COVERED) and not name.endswith("__main__")


def _examples() -> list[doctest.DocTest]:
    """Each public docstring with examples, once (in the module that defines it)."""
    modules = [interp] + [importlib.import_module(m.name) for m in pkgutil.walk_packages(interp.__path__, "interp.")
                          if _covered(m.name)]
    finder, out = doctest.DocTestFinder(exclude_empty=True), []
    for module in modules:
        for test in finder.find(module, module.__name__):
            inner = test.name.split(".")[len(module.__name__.split(".")):]
            if test.examples and not any(part.startswith("_") for part in inner):
                out.append(test)
    return out


EXAMPLES = _examples()


class _RunForEffect(doctest.OutputChecker):
    """An example line without expected output is run for its effect (it must not raise), as in conftest.py."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return not want.strip() or super().check_output(want, got, optionflags)


@functools.cache
def _smollm2_cached() -> bool:
    """The root conftest.py's check (tests/ has a conftest.py of its own, so it is loaded by path)."""
    spec = importlib.util.spec_from_file_location("_interp_root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    return bool(root_conftest._smollm2_cached())


def test_the_examples_are_found():
    # 321 public docstrings with examples outside the modules not covered, when this test was added.
    assert len(EXAMPLES) >= 300, len(EXAMPLES)


@pytest.mark.parametrize("test", EXAMPLES, ids=[t.name for t in EXAMPLES])
def test_example_runs_in_a_fresh_namespace(test, monkeypatch):
    source = "\n".join(ex.source for ex in test.examples)
    for path in _DATA.findall(source):
        if not (ROOT / path).exists():
            pytest.skip(f"needs {path}, not found beside the project")
    if re.search(r"\"smollm2-135m\"|fetch_gguf\(|load_smollm2\(", source) and not _smollm2_cached():
        pytest.skip("needs SmolLM2-135M in interp's cache (interp.load would download 98 MB)")
    import plotly.basedatatypes

    monkeypatch.setattr(plotly.basedatatypes.BaseFigure, "show", lambda self, *a, **k: None)
    monkeypatch.chdir(ROOT)  # the relative data paths of the examples resolve from the repository root
    test.globs = {"__name__": "__main__"}  # nothing injected: what a new notebook has
    report: list[str] = []
    runner = doctest.DocTestRunner(checker=_RunForEffect(), optionflags=_FLAGS)
    runner.run(test, out=report.append, clear_globs=True)
    assert not runner.failures, "".join(report)
