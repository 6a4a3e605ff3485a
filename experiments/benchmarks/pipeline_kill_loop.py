"""A rank killed mid-run, N times in a row: the survivor must stop naming it, with no hang and no SIGABRT.

Each run starts 2 gloo ranks (tests/analysis/pipeline_worker.py's ``die`` case): the last rank exits (status 7)
inside its layers on the second micro-batch; rank 0, waiting for the logits, must raise a DistributedError that
names it and leave with status 0 (``exit_after_failure``). Prints, per run, the exit codes and how long rank 0
took to stop; then the count of good runs.

Usage:
    python experiments/benchmarks/pipeline_kill_loop.py [--runs 30]
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "analysis"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30)
    a = p.parse_args(argv)
    import test_pipeline
    from test_distributed import launch

    from interp.placement import build
    from interp.zoo.checkpoint import save_checkpoint

    good, slowest = 0, 0.0
    with tempfile.TemporaryDirectory() as d:
        ckpt = save_checkpoint(build(test_pipeline.CFG, seed=0), Path(d) / "model.safetensors")
        for i in range(a.runs):
            out = Path(d) / f"run{i}"
            out.mkdir()
            t0 = time.monotonic()
            codes = launch(2, ["die"], out, conllu=str(ckpt), worker=test_pipeline.WORKER, timeout=120)
            with open(out / "die.rank0.pkl", "rb") as f:
                got = pickle.load(f)
            ok = codes == [0, 7] and "rank 1 died or did not answer" in (got["error"] or "")
            good += ok
            slowest = max(slowest, got["seconds"])
            print(f"run {i}: exit codes {codes}, named: {ok}, rank 0 stopped {got['seconds']:.2f} s after its "
                  f"call ({time.monotonic() - t0:.1f} s with start-up)", flush=True)
    print(f"{good}/{a.runs} runs: the survivor named the dead rank (slowest stop {slowest:.2f} s); "
          "no hang, no SIGABRT")
    return 0 if good == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
