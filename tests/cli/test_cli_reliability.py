"""The command line under bad input and signals: one line and a status, never a traceback; output checked
before the work; help readable in a terminal; stopping `interp dashboard` by PID stops the server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import run_cli, tiny_model
from safetensors import safe_open
from safetensors.torch import save_file

import interp
from interp import cli

REPO = Path(__file__).resolve().parents[2]
# What the console script does: import interp.cli, then call main().
ENTRY = "import sys; from interp.cli import main; sys.exit(main())"


def one_line_error(code: int, err: str, *needles: str) -> str:
    assert code not in (0, None)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("interp: ") and "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture
def tiny_ckpt(tmp_path):
    model = tiny_model(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=16)
    return interp.zoo.save_checkpoint(model, tmp_path / "tiny.safetensors")


def test_a_checkpoint_with_a_garbage_tokenizer_is_one_line(capsys, tiny_ckpt, tmp_path):
    with safe_open(str(tiny_ckpt), framework="pt") as f:
        header = {**f.metadata(), "tokenizer": "{garbage"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    bad = tmp_path / "badtok.safetensors"
    save_file(tensors, str(bad), metadata=header)
    code, _, err = run_cli(capsys, "heads", "--model", str(bad), "--no-progress")
    one_line_error(code, err, "badtok.safetensors", "tokenizer")


def test_an_hf_folder_with_pickle_weights_is_one_line(capsys, tmp_path):
    transformers = pytest.importorskip("transformers")
    import datetime

    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20,
                                                              n_positions=8, bos_token_id=0, eos_token_id=0))
    hf.config.save_pretrained(tmp_path)
    torch.save({"state": hf.state_dict(), "when": datetime.datetime(2020, 1, 1)}, tmp_path / "pytorch_model.bin")
    code, _, err = run_cli(capsys, "heads", "--model", str(tmp_path), "--no-progress")
    one_line_error(code, err, "pickle")


def test_a_batch_too_large_to_allocate_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train-induction", "--batch-size", "100000000", "--steps", "1", "--no-progress",
                           "--out", str(tmp_path / "m.safetensors"))
    one_line_error(code, err, "allocate")


def test_an_unwritable_output_fails_before_training(capsys, monkeypatch):
    import interp.training as induction

    def no_training(*a, **k):
        raise AssertionError("trained although the output cannot be written")

    monkeypatch.setattr(induction, "train_induction_model", no_training)
    code, _, err = run_cli(capsys, "train-induction", "--out", "/proc/x.safetensors")
    one_line_error(code, err, "/proc/x.safetensors", "not writable")


def test_a_missing_checkpoint_path_says_file_not_found(capsys, tmp_path):
    code, _, err = run_cli(capsys, "heads", "--model", str(tmp_path / "nope.safetensors"))
    one_line_error(code, err, "FileNotFoundError", "nope.safetensors")


def test_ctrl_c_during_startup_imports_is_one_line_and_status_130():
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "heads", "--model", "induction-2l"], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Inside the start-up imports: once torch's library is mapped, main() has installed its handler and torch's
    # import (seconds) is under way. A fixed sleep could land before main() on a loaded machine.
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if "libtorch" in maps.read_text():
                break
        except OSError:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    one_line_error(proc.returncode, err, "interrupted")


@pytest.mark.parametrize("argv, needles", [
    (["kv-cache", "--layers", "2", "--heads", "4", "--d-head", "7"], ["--d-head 7", "even"]),
    (["kv-cache", "--layers", "2", "--heads", "4", "--d-head", "8", "--rope-dim", "3"], ["--rope-dim 3", "even"]),
])
def test_kv_cache_names_the_option_the_user_passed(capsys, argv, needles):
    code, _, err = run_cli(capsys, *argv)
    line = one_line_error(code, err, *needles)
    assert "rotary_dim" not in line


def _all_parsers():
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return [("interp", parser), *subs.choices.items()]


def test_help_is_plain_text_with_help_and_defaults_on_every_option():
    for name, parser in _all_parsers():
        text = parser.format_help()
        assert "``" not in text and ":func:" not in text, name
        for action in parser._actions:
            if not action.option_strings or action.help == "==SUPPRESS==":
                continue
            assert action.help, f"{name} {action.option_strings} has no help text"
            if action.default not in (None, False) and action.option_strings[0] not in ("-h", "--version"):
                assert "default" in parser._get_formatter()._get_help_string(action), (name, action.option_strings)


def test_version(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"interp {interp.__version__}"


def test_heads_shows_progress_on_stderr_unless_told_not_to(capsys):
    code, out, err = run_cli(capsys, "heads", "--model", "induction-2l", "--json")
    assert code == 0 and "classify_heads: induction" in err  # the per-stage progress bars
    rows = json.loads(out)
    code, out2, err2 = run_cli(capsys, "heads", "--model", "induction-2l", "--json", "--no-progress")
    assert code == 0 and err2 == "" and json.loads(out2) == rows


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                found.append(local.split(":")[0])
    return found


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def test_stopping_the_dashboard_by_pid_stops_the_server_which_listens_on_localhost():
    pytest.importorskip("streamlit")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "dashboard", "--headless", "--port", str(port)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[int] = []
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not _listening(port):
            time.sleep(0.3)
        assert _listening(port), "the dashboard did not start"
        children = _children(proc.pid)
        # Bound to 127.0.0.1 only (0100007F in /proc/net/tcp), not to every interface.
        assert set(_listening(port)) == {"0100007F"}
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(0.5)
        alive = [c for c in children if Path(f"/proc/{c}").exists()]
        assert not alive and not _listening(port), f"stopping PID {proc.pid} left {alive} serving port {port}"
    finally:
        for pid in [proc.pid, *children]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait(timeout=10)


def test_bench_replaces_the_process(monkeypatch, capsys):
    calls = []

    def fake_execv(path, argv):
        calls.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", fake_execv)
    code, _, _ = run_cli(capsys, "bench", "forward", "--quick")
    assert code == 0 and calls and calls[0][-2:] == ["forward", "--quick"]
    assert calls[0][1].endswith("run_all.py")
