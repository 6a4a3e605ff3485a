"""Data parallel head statistics and importance (interp.distributed) against one process.

Each test starts 2 or 3 real processes (gloo on CPU, one thread each, a free port), which run the same calls as
the single-process reference computed here; results must agree within 1e-6, for uneven shards and for a rank
whose shard is empty. The ranks are tests/analysis/dist_worker.py.
"""

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp import distributed
from interp.analysis import classify_heads
from interp.pruning import LanguageModelObjective, head_importance
from interp.streaming import MeanReducer, Reducer, stream
from interp.zoo import load

WORKER = Path(__file__).with_name("dist_worker.py")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(WORKER.parent))
import dist_worker  # noqa: E402 - the ranks' data, shared with the reference computed here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, cases: list[str], out: Path, conllu: str | None = None, timeout: float = 240,
           worker: Path = WORKER) -> list[int]:
    """Start ``world`` ranks of ``worker`` running ``cases``; returns their exit codes."""
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "INTERP_DIST_TIMEOUT": "60"}
    args = [",".join(cases)] + ([conllu] if conllu else [])
    procs = [subprocess.Popen([sys.executable, str(worker), str(r), str(world), port, str(out), *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    codes = []
    for r, p in enumerate(procs):
        try:
            log, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"rank {r} of {world} hung") from None
        codes.append(p.returncode)
        if p.returncode not in (0, 7):
            raise AssertionError(f"rank {r} of {world} failed ({p.returncode}):\n{log[-3000:]}")
    return codes


def read(out: Path, case: str, world: int) -> list:
    results = []
    for r in range(world):
        with open(out / f"{case}.rank{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return results


def assert_same_report(got: dict, ref) -> None:
    """Score tables within 1e-6 (NaN where the reference has NaN) and the same classification rows."""
    assert set(got["details"]) == set(ref.details)
    for name, table in ref.details.items():
        pd.testing.assert_frame_equal(got["details"][name].reset_index(drop=True), table.reset_index(drop=True),
                                      check_exact=False, rtol=0, atol=1e-6, check_dtype=False)
    pd.testing.assert_frame_equal(got["df"], ref.df, check_exact=False, rtol=0, atol=1e-6)


def _importance_reference(world: int) -> dict[str, torch.Tensor]:
    model = load("induction-2l")
    batches = dist_worker.importance_batches(model, world)
    obj = LanguageModelObjective()
    return {"raw": head_importance(model, batches, obj, normalize_layers=False),
            "normalized": head_importance(model, batches, obj)}


@pytest.fixture(scope="module")
def induction_reference():
    model = load("induction-2l")
    tokens, ind = dist_worker.data_for(model, 2)
    return classify_heads(model, tokens=tokens, induction_tokens=ind, batch_size=8)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, ud_ewt_dev):
    """``{world: out_dir}``: each world size launched once (process start-up dominates), for every case."""
    runs = {}

    def get(world: int) -> Path:
        if world not in runs:
            out = tmp_path_factory.mktemp(f"world{world}")
            cases = ["classify_induction", "importance", "classify_treebank"] + (["mismatch"] if world == 2 else [])
            launch(world, cases, out, conllu=ud_ewt_dev)
            runs[world] = out
        return runs[world]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_match_one_process(world, ranks, induction_reference, ud_ewt_dev):
    # 2 ranks: 3 token batches split 2 + 1 (uneven); 3 ranks: the induction data and the importance batches
    # are 2 batches, so the third rank's shard is empty. The treebank case adds syntactic state keys that
    # exist only for relations a rank saw (the union of keys is reduced).
    out = ranks(world)
    for got in read(out, "classify_induction", world):
        assert_same_report(got, induction_reference)
    ref = _importance_reference(world)
    for got in read(out, "importance", world):
        for k in ("raw", "normalized"):
            torch.testing.assert_close(got[k], ref[k], rtol=0, atol=1e-6)
    tree_ref = classify_heads(load("minilm-l6"), conllu=ud_ewt_dev, max_sentences=16, batch_size=8, n_seqs=12,
                              syntactic_min_count=1)
    assert len(tree_ref.details["syntactic"]) > 0
    for got in read(out, "classify_treebank", world):
        assert_same_report(got, tree_ref)


@pytest.mark.slow
def test_mismatched_data_or_weights_are_named_before_any_work(ranks):
    for got in read(ranks(2), "mismatch", 2):
        assert "data differ from rank 0's on rank(s) [1]" in got["data"]
        assert "weights differ from rank 0's on rank(s) [1]" in got["weights"]
        assert "config differ" not in got["weights"]


@pytest.mark.slow
def test_a_dead_rank_stops_the_others_with_a_message(tmp_path):
    codes = launch(2, ["die"], tmp_path)
    assert codes == [0, 7]
    (got,) = read(tmp_path, "die", 1)
    assert got["error"] is not None and "rank 0 of 2" in got["error"] and "another rank died" in got["error"]


class _Keyed(Reducer):
    """A reducer whose state keys depend on the data (as the syntactic reducer's relations do)."""

    names = "blocks.0.attn.hook_pattern"

    def update(self, name, tensor, *, q_start):
        self._add(f"len{tensor.shape[-1]}", tensor.detach().double().sum(0))


def test_single_process_needs_no_process_group():
    # Nothing initialised: the helpers are identities and stream runs every batch itself.
    assert not distributed.active() and distributed.world_size() == 1 and distributed.rank() == 0
    assert distributed.shard([1, 2, 3]) == [1, 2, 3]
    t = torch.ones(3)
    distributed.all_reduce_(t)
    distributed.check_same(None, "anything")
    assert torch.equal(t, torch.ones(3))
    model = load("induction-2l")
    r = MeanReducer("blocks.0.attn.hook_pattern")
    assert stream(model, torch.zeros(5, 4, dtype=torch.long), [r], batch_size=2) == 5
    assert distributed.all_reduce_reducers([r], 5) == 5


def test_checksums_tell_models_and_data_apart():
    model = load("induction-2l")
    a = distributed.model_checksum(model)
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    b = distributed.model_checksum(model)
    assert a["config"] == b["config"] and a["weights"] != b["weights"]
    x = [torch.zeros(2, 3, dtype=torch.long)]
    assert distributed.describe_batches(x) != distributed.describe_batches([torch.ones(2, 3, dtype=torch.long)])
    assert distributed.describe_batches(x) == distributed.describe_batches([{"tokens": torch.zeros(2, 3).long()}])
