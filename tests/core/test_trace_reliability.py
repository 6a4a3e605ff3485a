"""Trace files that disagree with themselves, and indexing mistakes: each refused with a clear message."""

import json
import struct

import pytest
import torch
from helpers import tiny_model

from interp import Trace


@pytest.fixture(scope="module")
def model():
    return tiny_model(0, n_layers=2, d_model=16, n_heads=2, d_mlp=32, d_vocab=50, n_ctx=16)


@pytest.fixture
def saved(model, tmp_path):
    _, tr = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]), names_filter="*hook_pattern")
    return tr.save(tmp_path / "t.safetensors")


def _edit_header(path, edit):
    """Rewrite a safetensors file's JSON header in place (same length, so the offsets stay valid)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + n].decode()
    new = edit(header)
    assert len(new) == len(header) and new != header
    path.write_bytes(data[:8] + new.encode() + data[8 + n:])


def test_trace_tampered_dtype_in_header_is_refused(saved):
    before = Trace.load(saved).pattern(0)
    assert before.dtype == torch.float32
    _edit_header(saved, lambda h: h.replace('"dtype":"F32"', '"dtype":"I32"', 1))
    with pytest.raises(ValueError, match=f"{saved}.*int32"):
        Trace.load(saved)


def test_trace_tampered_dtype_is_refused_without_an_integrity_record(saved):
    # as a file written before traces carried a record: the dtype check alone still refuses it
    _edit_header(saved, lambda h: h.replace('"dtype":"F32"', '"dtype":"I32"', 1).replace("tensor_record", "tensor_recorx"))
    with pytest.raises(ValueError, match=f"{saved}.*int32.*floating point"):
        Trace.load(saved)


def test_trace_str_tokens_must_match_the_tokens(tmp_path):
    tr = Trace({"blocks.0.hook_resid_pre": torch.zeros(1, 3, 4)}, {"str_tokens": [["a", "b"]]},
               tokens=torch.tensor([[1, 2, 3]]))
    path = tr.save(tmp_path / "t.safetensors")
    with pytest.raises(ValueError, match=r"str_tokens has 1 row\(s\) of lengths \[2\].*\[1, 3\]"):
        Trace.load(path)


def test_trace_meta_n_layers_must_agree_with_the_tensors(tmp_path):
    tr = Trace({"blocks.3.hook_resid_pre": torch.zeros(1, 3, 4)}, {"n_layers": 2}, tokens=torch.tensor([[1, 2, 3]]))
    path = tr.save(tmp_path / "t.safetensors")
    with pytest.raises(ValueError, match=r"n_layers = 2.*layer\(s\) \[3\]"):
        Trace.load(path)


def test_trace_overwritten_bytes_are_detected(saved):
    data = bytearray(saved.read_bytes())
    data[-16:] = b"\xff" * 16
    saved.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged"):
        Trace.load(saved)


def test_trace_slice_index_is_a_clear_error(model):
    _, tr = model.run_with_cache(torch.tensor([[1, 2, 3]]), names_filter="*hook_pattern")
    with pytest.raises(TypeError, match=r"indexed by hook name.*slice.*trace.pattern\(0\)\[0:2\]"):
        tr[0:2]
    with pytest.raises(TypeError, match="not by int"):
        tr[0]


def test_run_with_cache_layers_must_be_int_indices(model):
    with pytest.raises(TypeError, match=r"layers must be a list of int.*\['0'\]"):
        model.run_with_cache(torch.tensor([[1, 2, 3]]), layers=["0"])
    with pytest.raises(TypeError, match="layers must be a list of int"):
        model.run_with_cache(torch.tensor([[1, 2, 3]]), layers=1)
    _, tr = model.run_with_cache(torch.tensor([[1, 2, 3]]), layers=[1], names_filter="*hook_pattern")
    assert tr.layers == [1]
    assert json.dumps(tr.meta)  # still a plain trace
