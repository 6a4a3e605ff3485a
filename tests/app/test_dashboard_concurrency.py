"""Many browser sessions on one dashboard: each sees its own patterns and its own gated losses.

Streamlit runs every session in its own thread and shares the cached model between them. Eight threads call
the app's own cached computations on the shared induction-2l model at once (the attention page's patterns
and per-head write norms of different texts, the pruning page's loss with different heads switched off);
every result must equal, exactly, what the same call returns alone. (AppTest itself cannot run sessions in
parallel, so the pages' modules are imported and their functions are called directly; that the shared model ends
ungated and hook-free is checked on the library in tests/core/test_concurrent_hooks_and_gates.py.)
"""

import threading

import numpy as np
import pytest

pytest.importorskip("streamlit")

KEY = ("builtin", "induction-2l")
N_THREADS = 8
REPEATS = 3


@pytest.fixture(scope="module")
def app():
    """The attention page's patterns and the pruning page's gated scores, as the pages call them."""
    from types import SimpleNamespace

    from interp.app.views.attention import pattern_data
    from interp.app.views.pruning import gated_scores

    return SimpleNamespace(pattern_data=pattern_data, gated_scores=gated_scores)


def _call(app, i: int, r: int):
    if i % 2:
        ids = tuple([0] + [(7 * i + 3 * k + r) % 120 + 1 for k in range(6 + 3 * i)])  # its own text
        out = app.pattern_data(KEY, ids)
        return ("patterns", out["patterns"], out["norms"].to_numpy() if hasattr(out["norms"], "to_numpy")
                else np.asarray(out["norms"]))
    heads = tuple(sorted({(i % 2, i % 4), ((i + r) % 2, (i + 1 + r) % 4)}))  # its own heads switched off
    out = app.gated_scores(KEY, heads)
    return ("gated", out["loss"], out["metric"])


def _clear(app):
    app.pattern_data.clear()
    app.gated_scores.clear()


def _same(a, b) -> bool:
    return a[0] == b[0] and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a[1:], b[1:]))


def test_eight_sessions_at_once_get_exactly_their_own_results(app, one_thread):
    expected = {}
    for i in range(N_THREADS):
        for r in range(REPEATS):
            _clear(app)  # computed, not served from the cache
            expected[i, r] = _call(app, i, r)
    _clear(app)
    got, errors = {}, []
    barrier = threading.Barrier(N_THREADS)

    def session(i):
        try:
            barrier.wait()
            for r in range(REPEATS):
                got[i, r] = _call(app, i, r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    wrong = [k for k in expected if not _same(got[k], expected[k])]
    assert not wrong, f"sessions {wrong} got another session's results"
