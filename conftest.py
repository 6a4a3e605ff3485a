"""Names every docstring example may use without defining them (pytest's ``doctest_namespace``).

The doctests (``--doctest-modules`` over ``interp/``, see pyproject.toml) run each docstring's ``>>>`` lines in
its module's namespace plus these, so that a short example can say ``model`` the way a reader would:

- ``torch``, ``interp``;
- ``model``: a fresh ``interp.load("induction-2l")`` (2 layers x 4 heads, vocabulary 128, BOS id 0);
- ``tokens``: ``[2, 21]`` repeated random sequences for it (``[bos] x x``, 10 tokens repeated once);
- ``trace``: ``model.run_with_cache(tokens)``'s trace (every hook recorded);
- ``clean`` (= ``tokens``), ``corrupted`` (its repeated half replaced), ``answers`` (``[2, 2]`` correct / wrong
  next tokens at the last position) and ``metric`` (the in-context advantage) for patching;
- ``train``, ``held_out``, ``objective``: ``build_task(model, data={"n_seqs": 8, "batch_size": 4})``, and
  ``batches`` (= ``train``) for pruning;
- ``tok``: MiniLM's :class:`interp.zoo.tokenizer.Tokenizer`; ``tmp``: a fresh temporary folder (a ``Path``).

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
    from interp.data import repeated_sequences

    doctest_namespace.update(torch=torch, interp=interp, tmp=request.getfixturevalue("tmp_path"))
    if re.search(r"\b(model|trace|clean|corrupted|answers|metric|train|held_out|objective|batches)\b", source):
        from interp.analysis import corrupt_repeats, in_context_metric
        from interp.pruning import build_task

        torch.manual_seed(0)
        model = interp.load("induction-2l")
        tokens = repeated_sequences(2, 10, model.cfg.d_vocab, seed=0, bos_id=model.tokenizer.bos_id)  # [2, 21]
        train, held_out, objective = build_task(model, data={"n_seqs": 8, "batch_size": 4})
        doctest_namespace.update(
            model=model, tokens=tokens, clean=tokens,
            corrupted=corrupt_repeats(tokens, 10, model.cfg.d_vocab, bos_id=model.tokenizer.bos_id, seed=1),
            answers=torch.stack([tokens[:, 11], (tokens[:, 11] + 1) % model.cfg.d_vocab], dim=1),  # [2, 2]
            metric=in_context_metric(tokens, 10, bos=True),
            train=train, held_out=held_out, objective=objective, batches=train)
        if re.search(r"\btrace\b", source):
            doctest_namespace["trace"] = model.run_with_cache(tokens)[1]
    if re.search(r"\bmoe_(model|tokens)\b", source):
        torch.manual_seed(0)  # a tiny mixture-of-experts decoder: 2 layers of 4 experts, top-2
        doctest_namespace.update(
            moe_model=interp.Transformer(interp.ModelConfig(
                n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=8, activation="swiglu", positional="rotary",
                normalization="rms", causal=True, n_experts=4, n_experts_per_token=2)).eval(),
            moe_tokens=torch.randint(0, 20, (4, 8)))
    if re.search(r"\btok\b", source):
        from interp.zoo.minilm import minilm_path
        from interp.zoo.tokenizer import Tokenizer

        doctest_namespace["tok"] = Tokenizer.from_file(os.path.join(minilm_path(), "tokenizer.json"))
    import plotly.basedatatypes

    request.getfixturevalue("monkeypatch").setattr(plotly.basedatatypes.BaseFigure, "show", lambda self, *a, **k: None)
    cwd = os.getcwd()
    os.chdir(ROOT)  # relative data paths resolve from the repository root, as in the docs
    try:
        yield
    finally:
        os.chdir(cwd)
