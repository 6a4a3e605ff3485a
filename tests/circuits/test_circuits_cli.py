"""`interp circuit` writes the circuit and its curve, and refuses bad settings by name."""

import json

from interp.circuits import Circuit
from interp.cli import main


def test_circuit_command_writes_circuit_and_curve(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["circuit", "--task", "induction", "--method", "eap", "--model", "induction-2l", "--out", str(out),
                 "--n", "4", "--edges", "5", "--n-random", "2", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_edges"] == 5 and summary["n_edges_total"] == 81
    assert summary["ablation"] == "mean" and 0 <= summary["completeness"] <= 1.5  # the induction task's ablation
    circuit = Circuit.load(out / "circuit.json")
    assert len(circuit) == 5 and circuit.method == "eap" and circuit.info["task"] == "induction"
    header = (out / "curve.csv").read_text().splitlines()[0]
    assert header == "method,n_edges,draw,fraction,metric,faithfulness,normalized"


def test_circuit_command_refuses_bad_settings(tmp_path, capsys):
    assert main(["circuit", "--task", "ioi", "--method", "eap", "--model", "induction-2l",
                 "--out", str(tmp_path)]) == 1
    assert "task 'ioi' needs a text tokenizer" in capsys.readouterr().err
    assert main(["circuit", "--task", "induction", "--method", "eap", "--model", "induction-2l",
                 "--out", str(tmp_path), "--edges", "500"]) == 1
    assert "--edges 500 must be in [1, 81]" in capsys.readouterr().err
