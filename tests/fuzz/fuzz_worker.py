"""The fuzz tests' loader process (tests/fuzz/test_fuzz_loaders.py starts one and keeps it).

It imports torch and the loaders once, then serves one JSON request per line on stdin:
``{"loader": NAME, "path": FILE, "extra_bytes": N, "seconds": S}``. Each request runs in a forked child under
``RLIMIT_AS`` = the address space after the imports + N bytes and an alarm of S seconds; the child loads the
file twice (the second read must equal the first) and reports ``{"status": "ok" | "error" | "memory" |
"timeout" | "crash", ...}`` as one JSON line on stdout.
"""

import json
import os
import resource
import select
import signal
import sys
import time

import torch

torch.set_num_threads(1)  # fork-safe: no OpenMP pool in the parent
import torch._dynamo  # noqa: E402,F401 - imported lazily by the first model built; once here, not per child

from interp import Trace  # noqa: E402
from interp._io import tensor_sha256  # noqa: E402
from interp.data import read_conllu  # noqa: E402
from interp.data.coref import read_corefud, read_gap  # noqa: E402
from interp.zoo import load_checkpoint  # noqa: E402
from interp.zoo.gguf import load_gguf  # noqa: E402


def _model_key(m):
    return (m.cfg.to_json(), {k: tensor_sha256(v) for k, v in m.state_dict().items()},
            None if m.tokenizer is None else m.tokenizer.to_json())


def _trace_key(t):
    return ({k: (str(v.dtype), tuple(v.shape), tensor_sha256(v)) for k, v in t.items()}, json.dumps(t.meta),
            None if t.tokens is None else tensor_sha256(t.tokens))


LOADERS = {
    "gguf": lambda p: _model_key(load_gguf(p)),
    "checkpoint": lambda p: _model_key(load_checkpoint(p)),
    "trace": lambda p: _trace_key(Trace.load(p)),
    "conllu": lambda p: repr(list(read_conllu(p))),
    "gap": lambda p: repr(list(read_gap(p))),
    "corefud": lambda p: repr(list(read_corefud(p))),
}


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def _child(req, w: int) -> None:
    def out(obj):
        os.write(w, (json.dumps(obj) + "\n").encode())

    def alarm(*_):
        raise TimeoutError("time cap")

    signal.signal(signal.SIGALRM, alarm)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + req["extra_bytes"], resource.RLIM_INFINITY))
    signal.alarm(req["seconds"])
    try:
        load = LOADERS[req["loader"]]
        first = load(req["path"])
        second = load(req["path"])
        out({"status": "ok", "same": first == second})
    except TimeoutError:
        out({"status": "timeout"})
    except MemoryError:
        out({"status": "memory"})
    except BaseException as e:  # noqa: BLE001 - reported to the test, which judges the type
        out({"status": "error", "type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
             "message": str(e)[:2000]})


def serve() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                _child(req, w)
            finally:
                os._exit(0)
        os.close(w)
        chunks, deadline = [], time.monotonic() + req["seconds"] + 10  # the alarm cannot stop C code: kill
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                chunks = [json.dumps({"status": "hang"}).encode()]
                break
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(r)
        reply = b"".join(chunks).decode()
        _, status = os.waitpid(pid, 0)
        if not reply.strip():
            reply = json.dumps({"status": "crash", "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                                "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None})
        sys.stdout.write(reply.strip().splitlines()[-1] + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
