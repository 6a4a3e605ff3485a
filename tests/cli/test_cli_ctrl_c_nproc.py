"""Ctrl-C under ``interp ... --nproc N``: the command replaces itself with interp's torchrun launcher, which ends a
Ctrl-C with one line and status 130 instead of torch elastic's ``SignalException`` traceback. The real signal race
is measured by experiments/benchmarks/ctrl_c_nproc.py (a process group, SIGINT at moments over a whole run)."""

import signal
import sys

import pytest
import torch.distributed.run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException

from interp import cli, distributed


@pytest.fixture
def keep_signal_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_signal_torchrun_raises_ends_in_one_line_and_130(monkeypatch, capsys, keep_signal_handlers):
    seen = []

    def agent_interrupted(argv):
        seen.append(argv)
        raise SignalException("Process 1 got signal: 2", sigval=signal.SIGINT)

    monkeypatch.setattr(torchrun, "main", agent_interrupted)
    assert distributed.run_torchrun(["--standalone", "-m", "interp"]) == 130
    assert seen == [["--standalone", "-m", "interp"]]
    err = capsys.readouterr().err
    assert err == "interp: interrupted\n"  # no traceback
    # torchrun's own handlers raise; after its run ours are back: a late Ctrl-C exits at once, never with 0
    assert signal.getsignal(signal.SIGINT) is distributed._exit_interrupted
    assert signal.getsignal(signal.SIGTERM) is distributed._exit_interrupted


def test_a_finished_run_returns_torchruns_status(monkeypatch, keep_signal_handlers):
    monkeypatch.setattr(torchrun, "main", lambda argv: None)
    assert distributed.run_torchrun([]) == 0


def test_nproc_replaces_the_command_with_the_launcher(monkeypatch):
    ran = []
    monkeypatch.setattr(cli, "_exec", lambda cmd, env=None: ran.append(cmd) or 0)
    monkeypatch.setattr(cli, "check_nproc", lambda nproc, model: None)
    assert cli.main(["heads", "--model", "induction-2l", "--nproc", "2"]) == 0
    (cmd,) = ran
    assert cmd[:3] == [sys.executable, "-c", distributed.TORCHRUN_LAUNCHER]
    assert cmd[3:] == ["--standalone", "--nproc_per_node", "2", "-m", "interp", "heads", "--model", "induction-2l"]
    compile(distributed.TORCHRUN_LAUNCHER, "launcher", "exec")  # the -c code is valid Python


def test_as_the_program_the_one_line_ctrl_c_exit_stays_to_the_end(monkeypatch, keep_signal_handlers, capsys):
    """A torchrun rank (``python -m interp``) interrupted during its distributed teardown or its exit: Python's
    default handler, restored there, would print a KeyboardInterrupt traceback. Called as the program (no argv)
    main keeps its handler; a caller passing argv gets its own back."""
    sentinel = signal.getsignal(signal.SIGINT)
    args = ["kv-cache", "--layers", "2", "--heads", "4", "--d-head", "8"]
    assert cli.main(args) == 0
    assert signal.getsignal(signal.SIGINT) is sentinel
    monkeypatch.setattr(sys, "argv", ["interp", *args])
    assert cli.main() == 0
    handler = signal.getsignal(signal.SIGINT)
    assert handler is not sentinel and callable(handler) and handler.__name__ == "on_sigint"
