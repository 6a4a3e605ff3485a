"""One model shared by many threads (Streamlit sessions): hooked and gated runs must not see each other.

Each thread does what a dashboard page does on the shared induction-2l model (record patterns and per-head
writes of its own text, or compute the loss with its own heads switched off) several times over; every
result must equal, exactly, the single-threaded result, and the model must end ungated and hook-free.
"""

import threading

import pytest
import torch
import torch.nn.functional as F

import interp
from interp.pruning import head_mask

N_THREADS = 10
REPEATS = 4


@pytest.fixture(scope="module")
def model():
    return interp.load("induction-2l")


def _tokens(seed: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (1 + seed % 3, length), generator=g)  # [B, T]: batch and length differ per job


def _pattern_job(model, seed):
    """The attention page: patterns and per-head write norms of one input."""
    tokens = _tokens(seed, 9 + 4 * seed)
    with torch.no_grad():
        _, trace = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_result")))
    return trace.patterns(), trace.head_outs().norm(dim=-1)


def _gated_job(model, seed):
    """The pruning page: next-token loss with some heads switched off (a different set per job)."""
    tokens = _tokens(100 + seed, 30)
    pruned = torch.zeros(2, 4, dtype=torch.bool)
    pruned.view(-1)[[seed % 8, (3 * seed + 1) % 8]] = True
    with torch.no_grad(), head_mask(model, pruned):
        logits = model(tokens)
        # A recording inside the gated block: its per-head writes must carry this job's gates.
        _, trace = model.run_with_cache(tokens, names_filter="*hook_result")
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    return loss, trace.head_outs().norm(dim=-1)


JOBS = [(_pattern_job, s) if s % 2 else (_gated_job, s) for s in range(N_THREADS)]


def _assert_clean(model):
    assert all(block.attn.gate is None for block in model.blocks)
    assert not any(hp.active for hp in model.hook_dict.values())


def test_threads_sharing_a_model_get_their_own_hooked_and_gated_results(model, one_thread):
    expected = [fn(model, seed) for fn, seed in JOBS]
    _assert_clean(model)
    results: dict[tuple[int, int], object] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(N_THREADS)

    def worker(i):
        fn, seed = JOBS[i]
        try:
            barrier.wait()
            for r in range(REPEATS):
                results[i, r] = fn(model, seed)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (i, r), got in results.items():
        for g, e in zip(got, expected[i]):
            assert torch.equal(g, e), f"thread {i} repeat {r} got another thread's result"
    assert len(results) == N_THREADS * REPEATS
    _assert_clean(model)


def test_overlapping_gate_contexts_restore_the_gates_they_found(model):
    outer = torch.zeros(2, 4, dtype=torch.bool)
    outer[0, 1] = True
    inner = torch.zeros(2, 4, dtype=torch.bool)
    inner[1, 0] = True
    done = threading.Event()

    def other_thread():
        with head_mask(model, inner):
            done.set()

    with head_mask(model, outer):
        t = threading.Thread(target=other_thread)
        t.start()
        # The other thread waits for this block to end instead of gating the model under it.
        assert not done.wait(0.3)
        assert model.blocks[0].attn.gate.tolist() == [1.0, 0.0, 1.0, 1.0]
        assert model.blocks[1].attn.gate.tolist() == [1.0, 1.0, 1.0, 1.0]
    t.join()
    assert done.is_set()
    _assert_clean(model)
