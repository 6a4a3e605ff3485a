"""``experiments/benchmarks/gpu_check.py`` in its small-shapes mode on the CPU, so that the script a GPU machine
runs in one short call does not rot where no GPU is lent: every correctness check in it (logits and patterns
against transformers, greedy tokens equal to HF's, bf16 top-1 agreement, absorbed MLA decode equal to expanded)
must pass, and the JSON it writes must hold them. The speed ratios are a GPU's figures and are not checked here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
BENCH = Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"


def test_gpu_check_quick_passes_its_correctness_checks_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    run = subprocess.run([sys.executable, "gpu_check.py", "--device", "cpu", "--quick", "--skip-tests", "--reps", "1",
                          "--out", str(out)], cwd=BENCH, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(out.read_text())
    text = json.dumps(rows)
    for check in ("max |logit diff| vs HF", "patterns, layer 0: max |diff| vs HF eager",
                  "patterns, all 4 layers: max |diff| vs HF eager", "greedy 8 tokens, batch 1",
                  "top-1 agreement with float32", "MLA absorbed == expanded greedy tokens"):
        assert check in text, f"{check!r} missing from {out}"
    assert "skipped" not in text, text
