"""Killed writes leave nothing behind for long: the next save of a name removes the temporaries that dead
writers of that name left (never a live writer's, never another name's), and safetensors files are written into
interp's one temporary (safetensors' ``save_file`` adds a second full-size ``.tmpXXXXXX`` of its own)."""

import os
import subprocess
import sys
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from interp import Trace
from interp._io import (
    FOREIGN_TEMP_AGE_S,
    UNTAGGED_TEMP_AGE_S,
    _host_tag,
    atomic_path,
    atomic_write_text,
    write_safetensors,
)


@pytest.fixture(scope="module")
def dead_pid():
    """The pid of a process that has exited (and been reaped): no process has it now."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))
    return path


def _st_bytes():
    buf = torch.zeros(4)
    return len(b"{}").to_bytes(8, "little") + b"{}" + buf.numpy().tobytes()  # a safetensors-like start


def _file(path, content: bytes = b"x", age: float = 0.0):
    path.write_bytes(content)
    return _age(path, age) if age else path


def test_the_next_save_removes_temporaries_of_dead_writers_only(tmp_path, dead_pid):
    target = tmp_path / "run.safetensors"
    host, other_host = _host_tag(), "0" * 8
    name = ".run.safetensors"
    stale = [
        _file(tmp_path / f"{name}.{dead_pid}-{host}.abcdefgh.tmp.safetensors"),  # a writer killed on this host
        _file(tmp_path / f"{name}.123-{other_host}.abcdefgh.tmp.safetensors", age=FOREIGN_TEMP_AGE_S + 60),
        _file(tmp_path / f"{name}.abcdefgh.tmp.safetensors", age=UNTAGGED_TEMP_AGE_S + 60),  # an older interp's
        _file(tmp_path / ".tmpAb12Cd", _st_bytes(), age=UNTAGGED_TEMP_AGE_S + 60),  # safetensors' own, old
    ]
    kept = [
        _file(tmp_path / f"{name}.{os.getpid()}-{host}.abcdefgh.tmp.safetensors"),  # this process's: live
        _file(tmp_path / f".other.safetensors.{dead_pid}-{host}.abcdefgh.tmp.safetensors"),  # another name's
        _file(tmp_path / f"{name}.123-{other_host}.ijklmnop.tmp.safetensors"),  # another host's, recent
        _file(tmp_path / f"{name}.ijklmnop.tmp.safetensors"),  # an older interp's, recent
        _file(tmp_path / ".tmpEf34Gh", _st_bytes()),  # safetensors' own, recent: maybe being written
        _file(tmp_path / ".tmpIj56Kl", b"someone's notes", age=UNTAGGED_TEMP_AGE_S + 60),  # not safetensors
        _file(tmp_path / "notes.txt"),
    ]
    Trace({"blocks.0.hook_resid_pre": torch.ones(1, 2, 3)}).save(target)
    assert {p.name for p in tmp_path.iterdir()} == {p.name for p in kept + [target]}
    assert not any(p.exists() for p in stale)


def test_a_live_writers_temporary_is_kept(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tmp = tmp_path / f".r.json.{live.pid}-{_host_tag()}.abcdefgh.tmp.json"
        tmp.write_text("being written")
        atomic_write_text(tmp_path / "r.json", "{}")
        assert tmp.exists()
    finally:
        live.kill()
        live.wait()
    atomic_write_text(tmp_path / "r.json", "{}")  # its writer is gone now
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_temporaries_name_their_writer(tmp_path):
    with atomic_path(tmp_path / "f.html") as tmp:
        assert tmp.name.startswith(f".f.html.{os.getpid()}-{_host_tag()}.") and tmp.name.endswith(".tmp.html")
        tmp.write_text("x")


def test_safetensors_written_in_place_are_the_bytes_save_file_writes(tmp_path):
    torch.manual_seed(0)
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5), "c": torch.randn(2, 3).bfloat16(),
               "d": torch.tensor([True, False]), "e": torch.zeros(0, 3), "f": torch.randn(4, 4).t(),
               "g": torch.randint(0, 9, (7,), dtype=torch.int8), "h": torch.randn(3).half(),
               "i": torch.zeros(2, dtype=torch.uint8), "j": torch.randn(2, dtype=torch.float64),
               "k": torch.ones(2, dtype=torch.int32), "l": torch.ones(2, dtype=torch.int16)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "ref.safetensors", metadata={"m": "1"})
    write_safetensors(tensors, tmp_path / "own.safetensors", metadata={"m": "1"})
    assert (tmp_path / "own.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    with safe_open(tmp_path / "own.safetensors", "pt") as f:
        assert f.metadata() == {"m": "1"}
        for k, v in tensors.items():
            assert torch.equal(f.get_tensor(k), v)
    with pytest.raises(TypeError, match="metadata must map str -> str"):
        write_safetensors({}, tmp_path / "x.safetensors", metadata={"m": 1})
    with pytest.raises(TypeError, match="tensor 'z' has dtype torch.complex64"):
        write_safetensors({"z": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "x.safetensors")
