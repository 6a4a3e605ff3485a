"""Circuit figures and the generated tasks."""

import os

import pandas as pd
import pytest
import torch

import interp
from interp.analysis.taxonomy import HeadReport
from interp.circuits import Circuit
from interp.circuits.tasks import TASKS, circuit_task, prob_diff_metric
from interp.viz.circuits import circuit_figure, faithfulness_figure


def test_circuit_figure_widths_and_kind_colours():
    c = Circuit([("input", "a0.h1<v>"), ("a0.h1", "a1.h0<k>"), ("a1.h0", "logits")],
                {("input", "a0.h1<v>"): -1.0, ("a0.h1", "a1.h0<k>"): -4.0, ("a1.h0", "logits"): -2.0}, method="eap")
    report = HeadReport(pd.DataFrame({"layer": [0, 1], "head": [1, 0], "kind": ["previous-token", "induction"],
                                      "score": [0.9, 0.8], "evidence": ["", ""]}), n_layers=2, n_heads=2)
    fig = circuit_figure(c, report=report, max_width=8.0)
    widths = {t.text: t.line.width for t in fig.data if t.mode == "lines"}
    assert widths["a0.h1 -> a1.h0<k>: -4"] == 8.0 and widths["a1.h0 -> logits: -2"] == 4.0
    names = {t.name for t in fig.data if t.mode == "markers+text"}
    assert names == {"previous-token", "induction", "other"}
    with pytest.raises(ValueError, match="is empty: 0 edges"):
        circuit_figure(Circuit([]))


def test_faithfulness_figure_needs_the_curve_columns():
    with pytest.raises(ValueError, match=r"lacks the columns \['faithfulness'\]"):
        faithfulness_figure(pd.DataFrame({"method": ["eap"], "n_edges": [1]}))


def test_induction_task_has_a_corrupted_twin_and_the_in_context_metric():
    model = interp.load("induction-2l")
    task = circuit_task(model, "induction", n=4)
    assert task.clean.shape == task.corrupted.shape == (4, 21)
    # Corrupted: other repeated sequences (BOS shared, both halves new, still repeating), mean-ablated.
    assert torch.equal(task.clean[:, 0], task.corrupted[:, 0])
    assert torch.equal(task.corrupted[:, 1:11], task.corrupted[:, 11:])
    assert bool((task.clean[:, 1:11] != task.corrupted[:, 1:11]).any(dim=1).all())
    assert task.ablation == "mean"
    with torch.no_grad():
        assert float(task.metric(model(task.clean))) > float(task.metric(model(task.corrupted))) + 1


def test_text_tasks_refuse_a_model_without_a_text_tokenizer():
    model = interp.load("induction-2l")
    with pytest.raises(ValueError, match="task 'ioi' needs a text tokenizer; model .* has TokenIdTokenizer"):
        circuit_task(model, "ioi")
    with pytest.raises(ValueError, match="task 'docstring' needs a text tokenizer"):
        circuit_task(model, "docstring")
    with pytest.raises(ValueError, match=r"task must be one of .*'docstring'\), got 'sva'"):
        circuit_task(model, "sva")


def test_prob_diff_metric_is_the_naive_sum():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    good = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 1, 0]], dtype=torch.bool)
    bad = ~good
    p = logits[:, -1].softmax(-1)
    want = ((p[0, 0] + p[0, 1] - p[0, 2:].sum()) + (p[1, 3] - p[1, :3].sum() - p[1, 4])) / 2
    assert float(prob_diff_metric(good, bad)(logits)) == pytest.approx(float(want))


def _smollm2_cached():
    cache = os.path.join(os.path.expanduser("~/.cache"), "interp", "smollm2-135m")
    return os.path.isdir(cache) and any(f.endswith((".gguf", ".safetensors")) for f in os.listdir(cache))


@pytest.mark.slow
@pytest.mark.skipif(not _smollm2_cached(), reason="needs SmolLM2-135M in interp's cache")
@pytest.mark.parametrize("name", [t for t in TASKS if t != "induction"])
def test_text_tasks_on_smollm2_separate_clean_from_corrupted(name):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = interp.load("smollm2-135m")
    task = circuit_task(model, name, n=6)
    assert task.clean.shape == task.corrupted.shape and len(task.clean) >= 3
    with torch.no_grad():
        assert float(task.metric(model(task.clean))) > float(task.metric(model(task.corrupted)))
