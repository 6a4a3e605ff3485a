"""The dashboard on a real LM: results cached on disk by (weights hash, data, options), written atomically and
computed once per key; progress reported layer by layer (interp.progress.listen); long runs in a background
job while the page stays usable. All on toy models."""

import os
import threading
import time

import pytest
import torch

pytest.importorskip("streamlit")
from helpers import tiny_model  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import interp  # noqa: E402
from interp import progress  # noqa: E402
from interp.app import DASHBOARD, jobs, results_cache  # noqa: E402
from interp.app.results_cache import CACHE_ENV  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "results"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


# --- weights hash and keys ------------------------------------------------------------------------------


def test_weights_hash_is_stable_and_follows_the_weights():
    a, b = interp.load("random-tiny"), interp.load("random-tiny")
    assert a is not b and results_cache.weights_hash(a) == results_cache.weights_hash(b)
    other = tiny_model(1)
    assert results_cache.weights_hash(other) != results_cache.weights_hash(a)
    before = results_cache.weights_hash(a)
    with torch.no_grad():
        a.blocks[0].attn.W_O.weight.add_(1e-3)  # an in-place change is noticed (tensor versions), not served stale
    changed = results_cache.weights_hash(a)
    with torch.no_grad():
        a.blocks[0].attn.W_O.weight.sub_(1e-3)
    assert changed != before


def test_a_key_hits_only_for_the_same_weights_and_options(cache):
    calls = []

    def compute(tag):
        calls.append(tag)
        return {"tag": tag}

    k1 = results_cache.key_of("demo", "weights-a", {"n_seqs": 8, "texts": ["a b"]})
    assert results_cache.cached("demo", k1, lambda: compute(1)) == ({"tag": 1}, False)
    assert results_cache.cached("demo", k1, lambda: compute(2)) == ({"tag": 1}, True)  # hit: not recomputed
    for other in (results_cache.key_of("demo", "weights-b", {"n_seqs": 8, "texts": ["a b"]}),
                  results_cache.key_of("demo", "weights-a", {"n_seqs": 16, "texts": ["a b"]})):
        assert results_cache.cached("demo", other, lambda: compute(3))[1] is False
    assert calls == [1, 3, 3]
    assert (cache / "demo" / f"{k1}.pkl").is_file()
    assert oct((cache).stat().st_mode & 0o777) == "0o700"  # private: cached results are pickles


def test_writes_are_atomic_and_a_damaged_file_is_recomputed(cache):
    key = results_cache.key_of("demo", "w", {})
    values = [torch.full((1 << 16,), float(i)) for i in range(8)]  # 256 kB each

    def writer(i):
        for _ in range(5):
            assert results_cache.store("demo", key, values[i])

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hit, got = results_cache.load("demo", key)
    assert hit and any(torch.equal(got, v) for v in values)  # one writer's whole value, never a mix
    assert [p.name for p in (cache / "demo").iterdir()] == [f"{key}.pkl"]  # no temporary file left behind
    (cache / "demo" / f"{key}.pkl").write_bytes(b"\x80\x05truncated")
    assert results_cache.load("demo", key) == (False, None)
    assert results_cache.cached("demo", key, lambda: "again") == ("again", False)


def test_one_key_is_computed_once_when_many_sessions_ask_at_once(cache):
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.3)
        return "result"

    key = results_cache.key_of("demo", "w", {"once": True})
    out = []
    threads = [threading.Thread(target=lambda: out.append(results_cache.cached("demo", key, slow)))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(hit for _, hit in out) == [False] + [True] * 5


def test_a_folder_others_can_write_is_never_read(cache):
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o777)
    folder, why = results_cache.usable_folder()
    assert folder is None and "writable by others" in why and CACHE_ENV in why
    key = results_cache.key_of("demo", "w", {})
    assert results_cache.cached("demo", key, lambda: 1) == (1, False)
    assert results_cache.cached("demo", key, lambda: 2) == (2, False)  # computed, not read from there


# --- progress -------------------------------------------------------------------------------------------


def test_progress_reports_classify_heads_layer_by_layer_without_changing_it():
    from interp.analysis import classify_heads
    from interp.analysis.positional import PositionalReducer

    model = tiny_model(2, n_layers=3)
    quiet = classify_heads(model, n_seqs=4, batch_size=2, progress=False)
    events, elsewhere = [], []
    other = threading.Thread(target=lambda: elsewhere.append(progress.listening()))
    with progress.listen(events.append):
        heard = classify_heads(model, n_seqs=4, batch_size=2)
        other.start()
        other.join()
    assert elsewhere == [False]  # another thread (another session) does not report to this listener
    assert heard.df.equals(quiet.df)
    stages = list(dict.fromkeys(e.desc for e in events))
    assert stages == ["classify_heads: positional", "classify_heads: induction"]
    induction = [e for e in events if e.desc == "classify_heads: induction"]
    assert induction[0].total == 2 and induction[-1].fraction == 1.0
    # Inside each batch, once per layer: 1/3, 2/3, 3/3 of the pass, then the batch count.
    assert [round(e.done, 3) for e in induction] == [0, 0.333, 0.667, 1.0, 1, 1.333, 1.667, 2.0, 2]
    assert any(isinstance(r, PositionalReducer) for e in events if "positional" in e.desc for r in e.state)
    assert not progress.listening()


# --- background jobs ------------------------------------------------------------------------------------


def test_a_background_job_reports_progress_and_completes():
    gate = threading.Event()

    def work(report):
        report(0.5, "half way")
        gate.wait(10)
        return 42

    job = jobs.start("test-job", "demo", work)
    assert jobs.start("test-job", "demo", work) is job  # a running key is shared, not started twice
    deadline = time.monotonic() + 10
    while job.progress != (0.5, "half way"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not job.done
    gate.set()
    assert job.wait(10) and job.result == 42 and job.error is None and job.progress == (1.0, "done")
    failed = jobs.start("test-job-fails", "demo", lambda report: 1 / 0)
    assert failed.wait(10) and failed.result is None and failed.error.startswith("ZeroDivisionError")


# --- the app --------------------------------------------------------------------------------------------


def _app(page: str) -> AppTest:
    at = AppTest.from_file(str(DASHBOARD), default_timeout=180)
    at.query_params["model"] = "random-tiny"
    at.run()
    at.sidebar.radio(key="page").set_value(page)
    at.run()
    assert not at.exception, at.exception
    return at


def _charts(at: AppTest) -> dict:
    return {c.key: c.proto.spec for c in at.get("plotly_chart")}


def test_a_second_visit_reads_the_disk_cache_and_other_options_compute(cache):
    first = _app("Induction")
    assert "computed in" in first.caption[0].value and "disk cache" not in first.caption[0].value
    second = _app("Induction")  # a new session (a new browser tab, or after a restart: the files are on disk)
    assert "now read from the disk cache" in second.caption[0].value
    assert _charts(second) == _charts(first)
    assert len(list((cache / "induction").glob("*.pkl"))) == 1
    second.slider(key="ind_n").set_value(8)  # other options: another key, computed
    second.run()
    assert "disk cache" not in second.caption[0].value
    assert len(list((cache / "induction").glob("*.pkl"))) == 2


def test_pruning_runs_in_the_background_and_the_other_pages_stay_usable(cache, monkeypatch):
    gate = threading.Event()
    start = jobs.start

    def gated_start(key, label, fn):
        return start(key, label, lambda report: (report(0.0, "waiting for the test"), gate.wait(60), fn(report))[2])

    monkeypatch.setattr(jobs, "start", gated_start)
    at = _app("Pruning")
    at.multiselect(key="curve_methods").set_value(["random"])  # the quicker method (a run is a run)
    at.run()
    at.button(key="curve_run").click()
    at.run()
    bars = [p.proto for p in at.get("progress")]
    assert bars and "runs in the background" in bars[0].text and "fig_pruning" not in _charts(at)
    at.sidebar.radio(key="page").set_value("Attention patterns")  # the run blocks nothing else
    at.run()
    assert not at.exception and "fig_attn_head" in _charts(at)
    gate.set()
    at.sidebar.radio(key="page").set_value("Pruning")
    deadline = time.monotonic() + 120
    while "fig_pruning" not in _charts(at) or at.get("progress"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        at.run()
        assert not at.exception, at.exception
    again = _app("Pruning")  # another session: the curve comes from the disk cache, no Run needed
    again.multiselect(key="curve_methods").set_value(["random"])
    again.run()
    assert "fig_pruning" in _charts(again) and not again.get("progress")


def test_script_runs_do_not_force_a_full_garbage_collection(cache):
    # Streamlit's server collects all generations after every script run by default (runner.postScriptGC),
    # fragment reruns included: with a real model in memory each collection holds the GIL for a large part of a
    # second, and a background job's progress poll is a script run every POLL_S, so the job's Python code waited
    # for the collector most of the time (a pruning step took ~700 s inside the server, ~40 s outside it).
    # AppTest's runner never collects, so the test reads the option the server's runner reads.
    from streamlit import config

    before = config.get_option("runner.postScriptGC")
    config.set_option("runner.postScriptGC", True)  # Streamlit's default
    try:
        at = _app("Pruning")
        assert not at.exception, at.exception
        assert config.get_option("runner.postScriptGC") is False
    finally:
        config.set_option("runner.postScriptGC", before)


def test_a_second_session_loads_hashes_and_computes_nothing(cache, monkeypatch):
    import interp.analysis

    first = _app("Induction")
    assert "disk cache" not in first.caption[0].value
    calls = []
    load, state_dict, scores = interp.load, interp.Transformer.state_dict, interp.analysis.induction_scores
    monkeypatch.setattr(interp, "load", lambda *a, **k: (calls.append("load"), load(*a, **k))[1])
    # weights_hash reads the state dict only when it hashes the bytes
    monkeypatch.setattr(interp.Transformer, "state_dict",
                        lambda self, *a, **k: (calls.append("hash"), state_dict(self, *a, **k))[1])
    monkeypatch.setattr(interp.analysis, "induction_scores",
                        lambda *a, **k: (calls.append("compute"), scores(*a, **k))[1])
    second = _app("Induction")  # a new browser tab
    assert "now read from the disk cache" in second.caption[0].value
    assert calls == []
