"""``interp prune --out DIR``: the curve is written to DIR, read back by PruningCurve, and a second run resumes
from DIR instead of computing again."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli, tiny_model

from interp.pruning import PruningCurve
from interp.pruning import baseline as baseline_mod
from interp.pruning import importance as importance_mod


@pytest.fixture
def tiny_decoder_path(tmp_path):
    from interp.zoo.checkpoint import save_checkpoint

    return save_checkpoint(tiny_model(attn_only=True), tmp_path / "tiny.safetensors")


@pytest.fixture
def counted(monkeypatch):
    """Calls of the two computations a pruning curve is made of: head importance and the masked metric."""
    calls = {"importance": 0, "metric": 0}

    def counting(kind, real):
        def wrapped(*a, **k):
            calls[kind] += 1
            return real(*a, **k)
        return wrapped

    monkeypatch.setattr(importance_mod, "head_importance", counting("importance", importance_mod.head_importance))
    monkeypatch.setattr(importance_mod, "masked_metric", counting("metric", importance_mod.masked_metric))
    monkeypatch.setattr(baseline_mod, "masked_metric", counting("metric", baseline_mod.masked_metric))
    return calls


def _prune(capsys, model, out, *extra):
    code, stdout, err = run_cli(capsys, "prune", "--model", str(model), "--n-seqs", "4", "--step", "0.25",
                                "--out", str(out), "--json", "--no-progress", *extra)
    assert code == 0, err
    return json.loads(stdout)


def test_prune_out_writes_the_curve_and_a_second_run_computes_nothing(capsys, tmp_path, tiny_decoder_path,
                                                                      counted):
    out = tmp_path / "d"
    rows = _prune(capsys, tiny_decoder_path, out, "--method", "importance")
    # 8 heads, 2 per step: 5 points, each one masked metric; one importance pass before each of the 4 steps.
    assert counted == {"importance": 4, "metric": 5}
    saved = PruningCurve.from_dict(json.loads((out / "importance.json").read_text()))
    assert saved.method == "importance" and saved.n_heads_total == 8
    assert [(r["fraction_pruned"], r["metric"]) for r in rows] == list(zip(saved.fractions, saved.metrics))
    assert [sum(map(sum, p.mask)) for p in saved.points] == [0, 2, 4, 6, 8]  # the masks travel with the curve
    for name in ("importance.csv", "curves.html", "summary.json", "partial/importance.json"):
        assert (out / name).is_file(), name

    counted.update(importance=0, metric=0)
    again = _prune(capsys, tiny_decoder_path, out, "--method", "importance")
    assert counted == {"importance": 0, "metric": 0}  # everything came from DIR
    assert again == rows

    # An interrupted run (2 of 5 points saved) computes only the 3 missing points, and the same curve.
    part = PruningCurve.load(out / "partial" / "importance.json")
    part.points = part.points[:2]
    part.save(out / "partial" / "importance.json")
    counted.update(importance=0, metric=0)
    resumed = _prune(capsys, tiny_decoder_path, out, "--method", "importance")
    assert counted == {"importance": 3, "metric": 3}
    assert resumed == rows

    # --fresh starts over.
    counted.update(importance=0, metric=0)
    assert _prune(capsys, tiny_decoder_path, out, "--method", "importance", "--fresh") == rows
    assert counted == {"importance": 4, "metric": 5}


def test_prune_out_random_resumes_per_seed(capsys, tmp_path, tiny_decoder_path, counted):
    out = tmp_path / "d"
    rows = _prune(capsys, tiny_decoder_path, out, "--method", "random", "--seeds", "2")
    assert counted["metric"] == 2 * 5  # 2 seeds x 5 points
    assert sorted(p.name for p in (out / "partial").iterdir()) == ["random_seed0.json", "random_seed1.json"]
    saved = PruningCurve.load(out / "random.json")
    assert [r["metric"] for r in rows] == pytest.approx(saved.metrics.tolist())
    (out / "partial" / "random_seed1.json").unlink()
    counted["metric"] = 0
    assert _prune(capsys, tiny_decoder_path, out, "--method", "random", "--seeds", "2") == rows
    assert counted["metric"] == 5  # only seed 1 again


@pytest.mark.parametrize("extra, needle", [
    (["--fresh"], "--fresh starts a saved run over: it needs --out DIR"),
    (["--out", "{file}"], "is a file, not a folder"),
    (["--out", "{dir}", "--nproc", "2"], "--out (a saved, resumable run) works in one process only"),
])
def test_prune_out_refusals(capsys, tmp_path, extra, needle):
    (tmp_path / "f").write_text("x")
    extra = [a.format(file=tmp_path / "f", dir=tmp_path / "d") for a in extra]
    code, _, err = run_cli(capsys, "prune", "--model", "random-tiny", "--method", "importance", *extra)
    assert code == 1 and needle in err and "Traceback" not in err
