"""A trace's meta ``n_layers`` must agree with the layers it holds: a file whose every hook runs through layers
0..29 but whose meta says 99 layers is refused on load, naming both numbers; recordings of some layers (which
record() states in meta ``layers_recorded``) and old single-layer files still load."""

import pytest
import torch
from helpers import tiny_model

from interp import Trace


def _whole(n_layers_stored, meta_n_layers):
    tensors = {f"blocks.{i}.{h}": torch.zeros(1, 2, 4) for i in range(n_layers_stored)
               for h in ("hook_resid_pre", "hook_resid_post")}
    return Trace(tensors, {"n_layers": meta_n_layers}, tokens=torch.tensor([[1, 2]]))


def test_meta_n_layers_99_on_a_30_layer_trace_is_refused_naming_both_numbers(tmp_path):
    path = _whole(30, 99).save(tmp_path / "t.safetensors")
    with pytest.raises(ValueError, match=r"n_layers = 99.*0\.\.29 \(30 layers\)"):
        Trace.load(path)
    assert len(Trace.load(_whole(30, 30).save(tmp_path / "ok.safetensors")).layers) == 30


def test_a_recording_of_some_layers_states_them_and_loads(tmp_path):
    model = tiny_model(0, n_layers=4)
    _, trace = model.run_with_cache(torch.tensor([[1, 2, 3]]), names_filter="blocks.[01].*")
    assert trace.meta["n_layers"] == 4 and trace.meta["layers_recorded"] == [0, 1]
    loaded = Trace.load(trace.save(tmp_path / "t.safetensors"))
    assert loaded.layers == [0, 1]
    _, full = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    assert "layers_recorded" not in full.meta  # every layer: nothing to state
    lying = Trace(dict(trace.tensors), {**trace.meta, "layers_recorded": [0]})
    with pytest.raises(ValueError, match=r"layers_recorded = \[0\] does not list the layers the file holds"):
        Trace.load(lying.save(tmp_path / "lying.safetensors"))


def test_one_layer_of_a_deep_model_still_loads(tmp_path):
    tr = Trace({"blocks.0.hook_resid_pre": torch.zeros(1, 2, 4)}, {"n_layers": 30})
    assert Trace.load(tr.save(tmp_path / "t.safetensors")).layers == [0]
