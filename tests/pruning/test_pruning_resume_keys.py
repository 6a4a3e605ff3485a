"""Resuming a pruning experiment reuses only results of the same configuration."""

import json

import pytest

import interp
from interp.pruning import run_experiment


@pytest.fixture(scope="module")
def model():
    return interp.load("induction-2l")


def _config(seed, steps=20):
    return {"name": "small", "model": "induction-2l", "methods": ["importance", "random", "l0"], "metric": "neg_loss",
            "data": {"n_seqs": 8, "half_len": 5, "batch_size": 8, "seed": seed, "eval_seed": seed + 10},
            "importance": {"step": 0.25}, "random": {"seeds": [0, 1], "step": 0.25},
            "l0": {"targets": [0.5], "steps": steps, "lr": 0.5}}


def _metrics(curves):
    return {m: [round(p.metric, 10) for p in c.sorted().points] for m, c in curves.items()}


def test_a_changed_configuration_is_recomputed_not_reused(model, tmp_path, one_thread):
    out = tmp_path / "out"
    run_experiment(_config(seed=1), model=model, out_dir=out, progress=False)
    changed = run_experiment(_config(seed=5, steps=25), model=model, out_dir=out, progress=False)
    fresh = run_experiment(_config(seed=5, steps=25), model=model, out_dir=tmp_path / "fresh", progress=False)
    assert _metrics(changed) == _metrics(fresh)
    saved = json.loads((out / "importance.json").read_text())
    assert [round(p["metric"], 10) for p in saved["points"]] == _metrics(fresh)["importance"]


def test_the_same_configuration_resumes_from_its_partial_results(model, tmp_path, one_thread):
    out = tmp_path / "out"
    first = run_experiment(_config(seed=1), model=model, out_dir=out, progress=False)
    # Poison the saved importance curve: a resumed run must take it as it is (no recomputation).
    part = out / "partial"
    saved = json.loads((part / "importance.json").read_text())
    saved["points"][-1]["metric"] = 12345.0
    (part / "importance.json").write_text(json.dumps(saved))
    again = run_experiment(_config(seed=1), model=model, out_dir=out, progress=False)
    assert again["importance"].points[-1].metric == 12345.0
    assert _metrics(again)["random"] == _metrics(first)["random"]
