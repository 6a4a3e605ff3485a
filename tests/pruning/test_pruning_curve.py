"""PruningCurve (AUC against a hand trapezoid, I/O round trips, figure, repr) and run_experiment (files, resume)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import tiny_model

import interp.pruning.baseline as baseline_mod
import interp.pruning.l0 as l0_mod
from interp import Transformer
from interp.pruning import CurvePoint, PruningCurve, average_curves, load_config, run_experiment

pytestmark = pytest.mark.usefixtures("one_thread")


def curve(method="importance", pts=((0.0, 1.0), (0.25, 0.9), (0.5, 0.5), (1.0, 0.0))) -> PruningCurve:
    return PruningCurve(method, "accuracy", 8, [CurvePoint(f, int(f * 8), m) for f, m in pts], model_name="toy")


def test_auc_against_hand_trapezoid():
    c = curve()
    want = 0.25 * (1.0 + 0.9) / 2 + 0.25 * (0.9 + 0.5) / 2 + 0.5 * (0.5 + 0.0) / 2
    assert c.auc() == pytest.approx(want)
    assert c.auc(upto=0.5) == pytest.approx(0.25 * 1.9 / 2 + 0.25 * 1.4 / 2)
    short = curve(pts=((0.0, 1.0), (0.5, 0.6)))  # stopped early: held at its last value up to 1
    assert short.auc(upto=1.0) == pytest.approx(0.5 * 1.6 / 2 + 0.5 * 0.6)
    with pytest.raises(ValueError, match="upto=1.5"):
        c.auc(upto=1.5)
    with pytest.raises(ValueError, match="no points"):
        PruningCurve("x", "m", 4).auc()


def test_round_trips_and_tables(tmp_path):
    c = curve()
    c.points[1].mask = [[True, False, False, False], [False, True, False, False]]
    c.points[1].extra = {"target": 0.25, "step_heads": [[0, 0]]}
    c.save(tmp_path / "c.json")
    back = PruningCurve.load(tmp_path / "c.json")
    assert back.to_dict() == json.loads(json.dumps(c.to_dict()))
    c.save(tmp_path / "c.csv")
    frame = pd.read_csv(tmp_path / "c.csv")
    assert list(frame["metric"]) == [1.0, 0.9, 0.5, 0.0] and frame["target"].iloc[1] == 0.25
    assert "step_heads" not in frame  # lists stay in the JSON
    with pytest.raises(ValueError, match="json or .csv"):
        c.save(tmp_path / "c.txt")


def test_figure_repr_and_merge():
    a, b = curve(), curve("random", pts=((0.0, 1.0), (0.5, 0.3), (1.0, 0.0)))
    fig = a.figure(b)
    assert [t.name.split(" ")[0] for t in fig.data] == ["importance", "random"]
    np.testing.assert_allclose(fig.data[1].y, [1.0, 0.3, 0.0])
    r = repr(a)
    assert "importance" in r and f"auc={a.auc():.3f}" in r and "points=4" in r
    assert "<table" in a._repr_html_()
    m = PruningCurve.merge([curve(pts=((0.5, 0.4),)), curve(pts=((0.0, 1.0), (0.25, 0.8)))])
    assert list(m.fractions) == [0.0, 0.25, 0.5]


def test_average_curves():
    a = curve(pts=((0.0, 1.0), (0.5, 0.4)))
    b = curve(pts=((0.0, 1.0), (0.5, 0.2)))
    avg = average_curves([a, b])
    assert avg.metrics.tolist() == pytest.approx([1.0, 0.3])
    assert avg.points[1].metric_std == pytest.approx(np.std([0.4, 0.2]))
    with pytest.raises(ValueError, match="different pruned counts"):
        average_curves([a, curve(pts=((0.0, 1.0),))])


def test_load_config_rejects_bad_values(tmp_path):
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        load_config({"model": "m", "l0": {"targets": [0.2, 1.2]}})
    with pytest.raises(ValueError, match="unknown method"):
        load_config({"model": "m", "methods": ["magnitude"]})
    with pytest.raises(ValueError, match="needs 'model'"):
        load_config({"methods": ["random"]})
    path = tmp_path / "c.yaml"
    path.write_text("model: induction-2l\nmethods: random\n")
    assert load_config(path)["methods"] == ["random"]


def tiny() -> Transformer:
    model = tiny_model(attn_only=True)
    model.name = "tiny"
    return model


CONFIG = {"model": "tiny", "name": "tiny", "data": {"n_seqs": 8, "half_len": 6, "batch_size": 4},
          "importance": {"step": 2}, "random": {"seeds": [0, 1], "step": 2},
          "l0": {"targets": [0.5], "steps": 20}}


def test_run_experiment_writes_and_resumes(tmp_path, monkeypatch):
    model = tiny()
    first = run_experiment(CONFIG, model=model, out_dir=tmp_path, progress=False)
    assert set(first) == {"importance", "random", "l0"}
    for name in ("importance.json", "importance.csv", "random.json", "l0.csv", "curves.html", "summary.json"):
        assert (tmp_path / name).exists(), name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {row["method"] for row in summary["auc"]} == {"importance", "random", "l0"}
    assert sorted(p.name for p in (tmp_path / "partial").iterdir()) == [
        "importance.json", "l0_target0.5.json", "random_seed0.json", "random_seed1.json"]

    # simulate an interruption: importance stopped after 2 points, random seed 1 never ran
    part = PruningCurve.load(tmp_path / "partial" / "importance.json")
    part.points = part.points[:2]
    part.save(tmp_path / "partial" / "importance.json")
    (tmp_path / "partial" / "random_seed1.json").unlink()
    calls = {"random": 0}
    real = baseline_mod.masked_metric

    def counting(*a, **k):
        calls["random"] += 1
        return real(*a, **k)

    def no_training(*a, **k):
        raise AssertionError("a finished L0 target was trained again")

    monkeypatch.setattr(baseline_mod, "masked_metric", counting)
    monkeypatch.setattr(l0_mod, "train_l0_gates", no_training)
    second = run_experiment(CONFIG, model=model, out_dir=tmp_path, progress=False)
    assert calls["random"] == len(first["random"].points)  # only seed 1 was recomputed
    for method in first:
        assert second[method].metrics.tolist() == pytest.approx(first[method].metrics.tolist())
    assert [p.mask for p in second["importance"].points] == [p.mask for p in first["importance"].points]


def test_run_experiment_empty_data():
    with pytest.raises(ValueError, match="empty"):
        run_experiment({**CONFIG, "data": {"n_seqs": 0}}, model=tiny(), progress=False)
