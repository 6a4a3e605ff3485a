"""``interp heads`` / ``interp prune`` under torchrun: ``--nproc N``, ``python -m interp``, rank 0 prints."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from interp.cli import main
from interp.distributed import TORCHRUN_LAUNCHER, torchrun_command

REPO = Path(__file__).resolve().parents[2]


def test_nproc_becomes_a_torchrun_command_without_nproc():
    cmd = torchrun_command(3, ["heads", "--model", "induction-2l", "--nproc", "3", "--json", "--nproc=3"])
    assert cmd[:3] == [sys.executable, "-c", TORCHRUN_LAUNCHER]  # torchrun, Ctrl-C ending in one line
    assert cmd[cmd.index("--nproc_per_node") + 1] == "3"
    assert cmd[cmd.index("-m", 3) + 1:] == ["interp", "heads", "--model", "induction-2l", "--json"]


def test_nproc_inside_torchrun_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert main(["heads", "--model", "induction-2l", "--nproc", "2"]) == 1
    err = capsys.readouterr().err
    assert "--nproc 2 given inside torchrun" in err and "--nproc_per_node" in err


@pytest.mark.slow
def test_heads_on_two_processes_prints_the_single_process_json(capsys):
    assert main(["heads", "--model", "induction-2l", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run([sys.executable, "-m", "interp", "heads", "--model", "induction-2l", "--json", "--nproc", "2"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    two = json.loads(res.stdout)  # one JSON document: only rank 0 wrote to stdout
    assert [(r["layer"], r["head"], r["kind"]) for r in two] == [(r["layer"], r["head"], r["kind"]) for r in one]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(one, two)) <= 1e-6


def test_a_rank_whose_peer_died_reports_and_exits_without_the_group_teardown(monkeypatch, capsys):
    # Under torchrun, a DistributedError (a peer gone) is reported in one line, then the rank leaves through
    # exit_after_failure with the report's status instead of tearing down gloo's broken connections.
    from interp import cli, distributed

    left = []

    def heads_fails(args):
        raise distributed.DistributedError("rank 0 of 2: the all-reduce failed; another rank died")

    def exit_now(status):
        left.append(status)
        raise SystemExit(status)

    monkeypatch.setattr(cli, "_start_distributed", lambda args: "rank 0 of 2: ")
    monkeypatch.setattr(cli, "_heads", heads_fails)
    monkeypatch.setattr(distributed, "exit_after_failure", exit_now)
    monkeypatch.setattr(distributed, "shutdown", lambda wait=True: left.append(("shutdown", wait)))
    with pytest.raises(SystemExit):
        cli.main(["heads", "--model", "induction-2l"])
    assert left[0] == 1  # the error's status, before any teardown
    assert "another rank died" in capsys.readouterr().err
