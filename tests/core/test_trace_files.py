"""Saving and loading traces: aliased recordings, reserved names, bad metadata and missing folders."""


import pytest
import torch
from safetensors.torch import save_file

import interp
from interp import Trace


@pytest.fixture(scope="module")
def model():
    return interp.load("induction-2l")


def _assert_traces_equal(a: Trace, b: Trace):
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert torch.equal(a.tokens, b.tokens)


def test_the_default_trace_saves_and_loads_back_equal(model, tmp_path):
    tokens = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    _, tr = model.run_with_cache(tokens)
    # hook_embed and blocks.0.hook_resid_pre are one tensor in memory: the case safetensors refuses.
    assert tr["hook_embed"].data_ptr() == tr["blocks.0.hook_resid_pre"].data_ptr()
    back = Trace.load(tr.save(tmp_path / "t.safetensors"))
    _assert_traces_equal(tr, back)
    assert back.meta["model"] == "induction-2l"


def test_aliased_layer_boundaries_save_and_load_back_equal(model, tmp_path):
    tokens = torch.tensor([[1, 5, 9, 5, 9]])
    _, tr = model.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"])
    back = Trace.load(tr.save(tmp_path / "t.safetensors"))
    _assert_traces_equal(tr, back)


def test_overlapping_views_of_one_tensor_save_as_copies(tmp_path):
    base = torch.arange(12.0).view(3, 4)
    tr = Trace({"a": base, "b": base[1:], "c": base}, tokens=torch.tensor([[1, 2]]))
    back = Trace.load(tr.save(tmp_path / "t.safetensors"))
    _assert_traces_equal(tr, back)


def test_a_recorded_tensor_may_not_take_the_tokens_name(tmp_path):
    tr = Trace({"__tokens__": torch.zeros(2)}, tokens=torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="'__tokens__' is reserved"):
        tr.save(tmp_path / "t.safetensors")


def test_meta_must_be_a_dict():
    with pytest.raises(TypeError, match="meta must be a dict.*list"):
        Trace({"a": torch.zeros(1)}, meta=[1, 2])


def test_meta_that_is_not_json_is_named_on_save(tmp_path):
    tr = Trace({"a": torch.zeros(1)}, meta={"when": object()})
    with pytest.raises(ValueError, match="trace meta must be JSON"):
        tr.save(tmp_path / "t.safetensors")


@pytest.mark.parametrize("meta, match", [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object")])
def test_a_trace_file_with_bad_meta_names_the_file(tmp_path, meta, match):
    path = tmp_path / "bad.safetensors"
    save_file({"a": torch.zeros(1)}, str(path), metadata={"format": "interp.trace/1", "meta": meta})
    with pytest.raises(ValueError, match=rf"bad\.safetensors.*{match}"):
        Trace.load(path)


def test_saving_into_a_missing_folder_is_a_file_not_found_error(tmp_path):
    tr = Trace({"a": torch.zeros(1)})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tr.save(tmp_path / "nowhere" / "t.safetensors")
