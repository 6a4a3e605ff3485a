"""Data parallel head statistics and importance over ``torch.distributed`` (launched by ``torchrun``).

Head statistics and importance gradients are sums over examples, so data parallelism is exact: every rank runs
the hooked forward passes over its shard of the batches (batch ``i`` goes to rank ``i % world_size``, the
``rank::world_size`` slice), then one all-reduce (sum) of the reducers' states (:class:`~interp.streaming.Reducer`
keeps only sums and counts) combines them, and every rank holds the result of the whole dataset; the CLI prints
it on rank 0 only. Before any forward pass the ranks all-gather a checksum of the model's config and weights and
of the data, and stop with an error naming the ranks that differ.

Sharding is by batch, so each rank's batches are exactly the batches of one process (same padding and length
buckets) and the sums agree with one process to float64 rounding. Every rank builds the list of batches (reads
and tokenizes the whole corpus, cheap next to the forward passes; it also gives the data checksum) and runs the
model only on its own.

Nothing here runs unless ``torch.distributed`` is initialised with more than one process: :func:`active` is
False and :func:`~interp.streaming.stream` and :func:`~interp.pruning.head_importance` take their single-process
path unchanged. ``torchrun`` sets the environment; :func:`init_from_env` (called by ``python -m interp``)
opens the process group (gloo on CPU, nccl on GPU) with a timeout, so a rank that dies or hangs stops the job
with a message naming it instead of blocking it forever.

Example (two processes on one machine, or two machines with ``--nnodes 2 --rdzv-endpoint HOST:29500``)::

    torchrun --nproc_per_node 2 -m interp heads --model minilm-l6 --conllu en_ewt-ud-dev.conllu --json
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import hashlib
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import torch

if TYPE_CHECKING:
    from .streaming import Reducer

__all__ = ["DistributedError", "active", "all_reduce_", "all_reduce_reducers", "check_ranks_fit", "check_same",
           "data_parallel", "describe_batches", "exit_after_failure", "init_from_env", "rank", "rank_device",
           "replicated", "shard", "shutdown", "torchrun_command", "world_size"]

#: Seconds a collective may wait for the other ranks before the job stops (``INTERP_DIST_TIMEOUT`` overrides).
DEFAULT_TIMEOUT_S = 600.0


class DistributedError(RuntimeError):
    """A collective failed: a peer rank died, timed out, or the ranks disagree."""


#: The exit status of a command ended by Ctrl-C (128 + SIGINT), as the shell reports it.
EXIT_INTERRUPTED = 130


def _exit_interrupted(signum: int, frame: Any) -> None:
    sys.stderr.write("interp: interrupted\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def run_torchrun(argv: Sequence[str]) -> int:
    """torchrun (``torch.distributed.run``) with ``argv``, ending on Ctrl-C with one line and status 130.

    ``interp ... --nproc N`` replaces itself with this (``python -c``), so a Ctrl-C to the terminal's process group
    reaches this launcher alone (torchrun starts each rank in its own session). torchrun's agent then stops the
    ranks and raises its ``SignalException``, which would end the launcher with torch elastic's traceback: here it
    ends it with ``interp: interrupted`` and ``128 + signal``. A signal before torchrun installs its handlers (while
    torch imports) or after they are gone exits the same way, so no Ctrl-C, at any moment, prints a traceback or
    exits 0.

    Args:
        argv: torchrun's arguments (``--standalone --nproc_per_node N -m interp heads ...``).

    Returns:
        torchrun's exit status (0, or 128 + the signal that stopped it).
    """
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_interrupted)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(list(argv))
    except SignalException as e:  # the agent has stopped the ranks; what is left to say is one line
        sys.stderr.write("interp: interrupted\n")
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        sys.stderr.write("interp: interrupted\n")
        return EXIT_INTERRUPTED
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # torchrun's handlers raise: not after its run
            signal.signal(sig, _exit_interrupted)
    return 0


def active() -> bool:
    """True when ``torch.distributed`` is initialised with more than one process."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# Ranks that hold parts of one model (heads across ranks) must all run every batch: no data parallelism then.
_replicated_depth = 0


@contextlib.contextmanager
def replicated() -> Iterator[None]:
    """Within this block every rank runs every batch: :func:`data_parallel` is False, so
    :func:`~interp.streaming.stream` neither shards the batches nor sums the reducers over ranks.

    Ranks that split one model between them (:mod:`interp.tensor_parallel`) run each pass together, and each
    holds the whole dataset's statistics of its own heads.

    Example:
        >>> from interp.distributed import data_parallel, replicated
        >>> with replicated():
        ...     data_parallel()
        False
    """
    global _replicated_depth
    _replicated_depth += 1
    try:
        yield
    finally:
        _replicated_depth -= 1


def data_parallel() -> bool:
    """True when analyses shard their batches over the ranks: several processes, outside :func:`replicated`.

    Example:
        >>> from interp.distributed import data_parallel
        >>> data_parallel()     # one process
        False
    """
    return _replicated_depth == 0 and active()


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    return torch.distributed.get_rank() if active() else 0


_this_rank = rank  # rank() under a name that rank_and_world's parameter does not shadow


def world_size() -> int:
    """The number of processes (1 when not distributed)."""
    return torch.distributed.get_world_size() if active() else 1


def rank_and_world(rank: int | None = None, world: int | None = None) -> tuple[int, int]:
    """``(rank, world)``: the ones given, else this process's (:func:`rank`, :func:`world_size`).

    Raises:
        ValueError: ``rank`` is not in ``0 .. world - 1``.

    Example:
        >>> from interp.distributed import rank_and_world
        >>> rank_and_world(1, 4), rank_and_world()
        ((1, 4), (0, 1))
    """
    rank = _this_rank() if rank is None else rank
    world = world_size() if world is None else world
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} is not in 0..{world - 1} (world={world})")
    return rank, world


# --- launching ranks on this machine (``--nproc N``) -------------------------------------------------------
#: One Python + PyTorch process before any model is loaded (a rank also holds its model copy and activations).
RANK_RUNTIME_BYTES = 400 << 20
#: Beyond this many ranks per core the ranks only take turns on the cores.
RANKS_PER_CORE = 2


def _strip_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` without its ``--nproc N`` / ``--nproc=N``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """The command ``--nproc N`` runs: torchrun on this machine (a free port), ``-m interp`` with ``argv``.

    Args:
        nproc: processes to start (``--nproc_per_node``).
        argv: the ``interp`` arguments; their ``--nproc`` is dropped (each rank is one process).

    Returns:
        The command line, starting with this Python interpreter.

    Example:
        >>> from interp.distributed import torchrun_command
        >>> torchrun_command(2, ["heads", "--model", "induction-2l", "--nproc", "2"])[-4:]
        ['interp', 'heads', '--model', 'induction-2l']
    """
    return [sys.executable, "-c", TORCHRUN_LAUNCHER, "--standalone", "--nproc_per_node", str(nproc),
            "-m", "interp", *_strip_nproc(argv)]


#: ``python -c`` code of the ``--nproc`` launcher: torchrun with its arguments (:func:`run_torchrun`), Ctrl-C
#: ending in one line. The handler comes first, before torch's imports (seconds on a loaded machine), which a
#: Ctrl-C would otherwise break with a KeyboardInterrupt traceback.
TORCHRUN_LAUNCHER = (
    "import os, signal, sys\n"
    "def stop(signum, frame):\n"
    "    sys.stderr.write('interp: interrupted\\n'); sys.stderr.flush(); os._exit(128 + signum)\n"
    "signal.signal(signal.SIGINT, stop); signal.signal(signal.SIGTERM, stop)\n"
    "from interp.distributed import run_torchrun\n"
    "status = run_torchrun(sys.argv[1:])\n"
    "sys.stdout.flush(); sys.stderr.flush()\n"
    "os._exit(status)\n")  # no interpreter shutdown, which would reset SIGINT to its default (death by signal)


def check_ranks_fit(nproc: int, weight_bytes: int, *, what: str = "the model", cores: int | None = None,
                    available: int | None = None) -> None:
    """Refuse a rank count that this machine cannot run: more ranks than its memory or cores allow.

    Each rank loads its own copy of the model: ``nproc`` x (weights x 2 + the PyTorch runtime) must fit in the
    available memory, and more than :data:`RANKS_PER_CORE` ranks per core only queue for the cores.

    Args:
        nproc: the ranks asked for (``--nproc``).
        weight_bytes: float32 weight bytes of one model copy (0 when unknown: only the runtime is counted).
        what: the model's name, for the message.
        cores: usable cores (default: this process's CPU affinity).
        available: available memory in bytes (default: :func:`interp.placement.host_available`).

    Raises:
        ValueError: too many ranks; the message says what ``--nproc`` should be at most, and why.

    Example:
        >>> from interp.distributed import check_ranks_fit
        >>> check_ranks_fit(2, 1 << 20, cores=2, available=8 << 30)
        >>> try:
        ...     check_ranks_fit(8, 1 << 30, cores=2, available=8 << 30)  # 8 ranks x ~2.4 GiB in 8 GiB
        ... except ValueError as e:
        ...     print(str(e).split(". ")[-1])
        Use --nproc 3 or less
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if available is None:
        from .placement import host_available  # the placement planner's reading of free host memory

        available = host_available()
    per_rank = 2 * weight_bytes + RANK_RUNTIME_BYTES
    limits, reasons = [cores * RANKS_PER_CORE], [f"this machine has {cores} core(s)"]
    if available is not None:
        limits.append(max(1, available // per_rank))
        reasons.append(f"{nproc} ranks x ~{per_rank / 2**30:.1f} GiB each ({what}: a copy of the model per rank) "
                       f"need ~{nproc * per_rank / 2**30:.1f} GiB, {available / 2**30:.1f} GiB are available")
    best = min(limits)
    if nproc > best:
        raise ValueError(f"--nproc {nproc} is more than this machine can run: {'; '.join(reasons)}. "
                         f"Use --nproc {best} or less")


def launched_by_torchrun() -> bool:
    """True when the environment of ``torchrun`` (``WORLD_SIZE`` > 1, ``MASTER_ADDR``) is present."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_ADDR" in os.environ


def init_from_env(backend: str | None = None, timeout_s: float | None = None) -> bool:
    """Open the process group from ``torchrun``'s environment, if there is one.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default nccl when CUDA is available, else gloo.
        timeout_s: how long a collective waits for the other ranks (default ``INTERP_DIST_TIMEOUT`` or 600 s).

    Returns:
        True if a process group is (now) initialised with more than one rank; False for a single process.

    Raises:
        ValueError: an unknown backend, or a non-positive timeout.

    Example:
        >>> from interp.distributed import init_from_env
        >>> init_from_env()   # under torchrun --nproc_per_node 2: True; in a plain python: False
    """
    if active():
        return True
    if not launched_by_torchrun():
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}: use 'gloo' (CPU) or 'nccl' (GPU)")
    if timeout_s is None:
        timeout_s = float(os.environ.get("INTERP_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0 seconds")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    # A rank that leaves through an exception must still close its group while the interpreter is whole:
    # gloo's worker threads and the TCP store torn down during interpreter finalisation abort the process.
    atexit.register(shutdown, wait=False)
    return active()


_EXIT_KEY = "interp/exit/"
_EXIT_TIMEOUT_S = 30.0


def shutdown(*, wait: bool = True) -> None:
    """Close the process group that :func:`init_from_env` opened; nothing happens when there is none.

    The order matters, because a rank aborted with SIGABRT ("terminate called without an active
    exception") at the very end of a finished run otherwise:

    1. every rank meets at a barrier, so no rank tears down its gloo connections while a peer still uses them;
    2. each rank destroys its group, joining gloo's worker threads while the interpreter is fully alive;
    3. the ranks other than 0 then tell rank 0 through the TCP store that they are done with it, and rank 0,
       which hosts the store, waits for them: the store's server thread is never torn down under a client;
    4. the store is released and collected here, not left to interpreter finalisation, where C++ threads
       that are still joinable when their objects die call ``std::terminate``.

    Args:
        wait: meet the other ranks before closing (steps 1 and 3). Pass False after a failure: the peers may
            never arrive (a failed barrier is ignored either way; the run's own outcome stands).

    Example:
        >>> from interp.distributed import init_from_env, shutdown
        >>> init_from_env(); ...; shutdown()   # at the end of a torchrun job
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    me, n = dist.get_rank(), dist.get_world_size()
    store = None
    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError, ValueError):  # a private helper: tolerate its absence
        pass
    try:
        if wait and n > 1:
            _collective("the closing barrier", dist.barrier)
    except DistributedError:
        wait = False  # a peer already left or died: its own error, not this rank's
    finally:
        dist.destroy_process_group()
    if store is not None and wait and n > 1:
        try:
            if me == 0:
                store.wait([f"{_EXIT_KEY}{r}" for r in range(1, n)], datetime.timedelta(seconds=_EXIT_TIMEOUT_S))
            else:
                store.set(f"{_EXIT_KEY}{me}", "1")
        except (RuntimeError, ValueError):  # a peer gone, or the store closed under us: leave anyway
            pass
    del store
    gc.collect()


def exit_after_failure(status: int) -> NoReturn:
    """End this rank at once, with ``status``, after a collective failed because a peer died or hung.

    Once a peer is gone, tearing down gloo's connections (in :func:`shutdown` or at interpreter exit) can abort
    the process with SIGABRT ("terminate called without an active exception"): its pairs to the dead peer are
    broken, and whether their threads are still joinable when their objects die is a race. The error has
    already been reported and nothing is left to collect, so this rank flushes its output and leaves without
    that teardown; ``torchrun`` then sees this rank's own status, not a signal.

    Args:
        status: the process exit status.

    Example:
        >>> from interp.distributed import exit_after_failure
        >>> exit_after_failure(1)   # doctest: +SKIP
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or redirected away: nothing more to save
            pass
    os._exit(status)


def _device() -> torch.device:
    """Where collective buffers live: the current CUDA device for nccl, else CPU."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rank_device() -> torch.device | None:
    """Where this rank's model belongs: its own GPU under nccl (each rank on the device
    :func:`init_from_env` selected), ``None`` (leave the model where it is) otherwise.

    Returns:
        The current CUDA device when the process group runs on nccl, else ``None``.

    Example:
        >>> from interp.distributed import rank_device
        >>> rank_device() is None  # not distributed
        True
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _collective(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a collective; a failure (a dead or hung peer) becomes a :class:`DistributedError` naming this rank."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:  # gloo/nccl report a lost peer or a timeout as RuntimeError (DistBackendError)
        raise DistributedError(
            f"rank {rank()} of {world_size()}: {what} failed; another rank died or did not reach it within the "
            f"timeout (torchrun's summary names the rank that failed first): {str(e).splitlines()[0]}") from e


def shard(items: Sequence[Any]) -> Sequence[Any]:
    """This rank's share of ``items``: ``items[rank::world_size]`` (everything when not distributed, or under
    :func:`replicated`).

    Example:
        >>> from interp.distributed import shard
        >>> shard(list(range(5)))   # rank 1 of 2: [1, 3]
    """
    return items[rank()::world_size()] if data_parallel() else items


def all_reduce_(*tensors: torch.Tensor) -> None:
    """Sum tensors over the ranks, in place (nothing when not distributed, or under :func:`replicated`, where
    every rank already holds the whole sums); one collective per dtype.

    Raises:
        DistributedError: a peer rank died or timed out.
    """
    if not data_parallel() or not tensors:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    dev = _device()
    for ts in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1).to(dev) for t in ts])  # [sum numel]
        _collective("all_reduce", torch.distributed.all_reduce, flat)
        i = 0
        for t in ts:
            t.copy_(flat[i:i + t.numel()].view(t.shape).to(t.device))  # [numel] -> t.shape
            i += t.numel()


def _all_gather(obj: Any, what: str) -> list[Any]:
    out: list[Any] = [None] * world_size()
    _collective(what, torch.distributed.all_gather_object, out, obj)
    return out


def all_reduce_reducers(reducers: Iterable[Reducer], n: int = 0) -> int:
    """Replace every reducer's state by its sum over the ranks; returns ``n`` summed over the ranks.

    States may hold different keys on different ranks (a relation seen on one shard only): the union of keys is
    agreed first (one all-gather of names, shapes and dtypes) and a missing key counts as zeros, as in
    :meth:`~interp.streaming.Reducer.merge`. Then one all-reduce per dtype over all reducers' flattened states.

    Raises:
        ValueError: a state key has different shapes or dtypes on different ranks.
        DistributedError: a peer rank died or timed out.
    """
    reducers = list(reducers)
    if not data_parallel():
        return n
    specs = [{k: (tuple(v.shape), str(v.dtype)) for k, v in r.state.items()} for r in reducers]
    everyone = _all_gather(specs, "all_gather of reducer state keys")
    union: list[dict[str, tuple[tuple[int, ...], str]]] = [{} for _ in reducers]
    for r_rank, per_rank in enumerate(everyone):
        if len(per_rank) != len(reducers):
            raise ValueError(f"rank {r_rank} has {len(per_rank)} reducers, rank {rank()} has {len(reducers)}")
        for i, spec in enumerate(per_rank):
            for k, s in spec.items():
                if k in union[i] and union[i][k] != s:
                    raise ValueError(f"reducer {i} ({type(reducers[i]).__name__}) state {k!r} is {union[i][k]} on "
                                     f"one rank and {s} on rank {r_rank}")
                union[i][k] = s
    tensors = []
    for r, keys in zip(reducers, union):
        for k in sorted(keys):
            shape, dtype = keys[k]
            if k not in r.state:
                r.state[k] = torch.zeros(shape, dtype=getattr(torch, dtype.removeprefix("torch.")))
            tensors.append(r.state[k])
    count = torch.tensor([n], dtype=torch.float64)
    all_reduce_(*tensors, count)
    return int(count.item())


def _sha(chunks: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()[:16]


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return str((tuple(t.shape), str(t.dtype))).encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes()


def model_checksum(model: torch.nn.Module) -> dict[str, str]:
    """``{"config": sha, "weights": sha}`` of a model (every config field; every parameter and buffer, by name)."""
    cfg = getattr(model, "cfg", None)
    weights = _sha(name.encode() + _tensor_bytes(t) for name, t in
                   [*model.named_parameters(), *model.named_buffers()])
    to_json = getattr(cfg, "to_json", None)  # every field: a config's repr shows only what differs from defaults
    text = to_json() if callable(to_json) else repr(cfg)
    return {"config": _sha([text.encode()]), "weights": weights}


def describe_batches(batches: Sequence[Any]) -> str:
    """A checksum of a list of batches: their count and every tensor in them (a
    :class:`~interp.data.Batch`'s tokens, mask and tensor annotations, a batch dict's tensors by key, or a bare tensor of ids).

    Example:
        >>> import torch
        >>> from interp.distributed import describe_batches
        >>> describe_batches([torch.zeros(2, 3, dtype=torch.long)])   # 16 hex digits
    """
    def chunks() -> Iterable[bytes]:
        yield str(len(batches)).encode()
        for b in batches:
            if isinstance(b, torch.Tensor):
                b = {"tokens": b}  # a bare tensor of ids is a batch's tokens
            items = b.items() if isinstance(b, dict) else (("tokens", b.tokens), ("mask", b.mask),
                                                            *b.annotations.items())
            for k, v in sorted(items, key=lambda kv: kv[0]):
                if isinstance(v, torch.Tensor):
                    yield k.encode() + _tensor_bytes(v)
    return _sha(chunks())


def check_same(model: torch.nn.Module | None = None, data: str | None = None) -> None:
    """Stop before any work if the ranks hold different models or data.

    All-gathers a checksum of the config, the weights and ``data`` (a description such as
    :func:`describe_batches`) and compares each to rank 0's. Nothing happens when not distributed.

    Raises:
        ValueError: on every rank, naming the ranks whose config, weights or data differ from rank 0's.
        DistributedError: a peer rank died or timed out.

    Example:
        >>> from interp.distributed import check_same, describe_batches
        >>> from interp.examples import model, batches
        >>> check_same(model, describe_batches(batches))
    """
    if not active():
        return
    mine = dict(model_checksum(model)) if model is not None else {}
    mine["data"] = data or ""
    everyone = _all_gather(mine, "all_gather of model/data checksums")
    problems = []
    for what in ("config", "weights", "data"):
        differ = [r for r, c in enumerate(everyone) if c.get(what) != everyone[0].get(what)]
        if differ:
            problems.append(f"{what} differ from rank 0's on rank(s) {differ} "
                            f"({', '.join(f'rank {r}: {everyone[r].get(what)}' for r in [0, *differ])})")
    if problems:
        raise ValueError("ranks disagree before any work: " + "; ".join(problems)
                         + "; every rank must load the same model and the same data")
