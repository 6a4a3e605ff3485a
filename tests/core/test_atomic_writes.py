"""Writes are atomic: a writer killed with SIGKILL mid-save leaves the previous file whole (or no file).

A child process saves two different versions of a large trace / checkpoint to the same path in turn; the
test kills it at several moments of a save and reads what is left under the real name.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from interp import Trace

ROOT = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent("""
    import sys, torch
    from interp import ModelConfig, Trace, Transformer
    from interp.zoo import save_checkpoint
    kind, path = sys.argv[1], sys.argv[2]
    def version(i):
        if kind == "trace":
            return Trace({"blocks.0.hook_resid_pre": torch.full((32, 256, 256), float(i % 2))},
                         {"version": i % 2}, tokens=torch.zeros(32, 256, dtype=torch.long))
        torch.manual_seed(i % 2)
        return Transformer(ModelConfig(n_layers=2, d_model=256, n_heads=4, d_mlp=1024, d_vocab=4000, n_ctx=64))
    objs = [version(0), version(1)]
    for i in range(10**6):
        print("saving", i, flush=True)
        obj = objs[i % 2]
        obj.save(path) if kind == "trace" else save_checkpoint(obj, path)
        print("saved", i, flush=True)
""")


def _read(kind, path):
    if kind == "trace":
        tr = Trace.load(path)
        value = tr["blocks.0.hook_resid_pre"]
        assert value.shape == (32, 256, 256) and bool((value == tr.meta["version"]).all())
        return tr.meta["version"]
    from interp.zoo import load_checkpoint

    return load_checkpoint(path).cfg.d_model


@pytest.mark.parametrize("kind", ["trace", "checkpoint"])
def test_sigkill_mid_save_leaves_the_old_file_whole(kind, tmp_path):
    path = tmp_path / "out.safetensors"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for fraction in (0.3, 0.6, 0.9):  # kill at these fractions of one save's measured duration
        child = subprocess.Popen([sys.executable, "-c", WRITER, kind, str(path)], stdout=subprocess.PIPE, text=True,
                                 env=env, cwd=tmp_path)
        try:
            began = {}
            for line in child.stdout:
                word, i = line.split()
                began.setdefault((word, int(i)), time.perf_counter())
                if word == "saving" and int(i) == 2:
                    break
            duration = began[("saved", 1)] - began[("saving", 1)]
            time.sleep(fraction * duration)  # inside the third save, which overwrites an existing file
            child.send_signal(signal.SIGKILL)
        finally:
            child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL
        assert path.is_file(), "a whole earlier version must remain"
        _read(kind, path)  # loads whole: no truncated file under the real name
        assert not [p for p in tmp_path.iterdir() if p.name != path.name and not p.name.startswith(".")]
        _next_save(kind, path)  # removes what the killed save left (its writer is dead)
        assert [p.name for p in tmp_path.iterdir()] == [path.name]


def _next_save(kind, path):
    if kind == "trace":
        Trace({"blocks.0.hook_resid_pre": torch.zeros(1, 1, 1)}, {"version": 0}).save(path)
        return
    from interp import ModelConfig, Transformer
    from interp.zoo import save_checkpoint

    save_checkpoint(Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=5, n_ctx=4)), path)


def test_atomic_path_keeps_the_old_file_when_the_writer_raises(tmp_path):
    from interp._io import atomic_path, atomic_write_text

    target = atomic_write_text(tmp_path / "r.json", "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]  # the temporary file is gone too


def test_trace_save_is_atomic_in_a_folder_without_leftovers(tmp_path):
    tr = Trace({"blocks.0.hook_resid_pre": torch.ones(1, 2, 3)}, tokens=torch.tensor([[1, 2]]))
    tr.save(tmp_path / "a.safetensors")
    tr.save(tmp_path / "a.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]
    assert oct((tmp_path / "a.safetensors").stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode
