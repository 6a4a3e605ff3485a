"""The ``devices`` argument of place / interp.load: an empty list names the argument, the meta device (which holds
no weights: a model "placed" there is weightless) is refused by name, and so is anything that is not a device."""

import pytest
import torch
from helpers import tiny_model

import interp
from interp.placement import is_split, place


@pytest.mark.parametrize("devices, match", [
    ([], r"devices=\[\] is empty: give at least one device"),
    (["meta"], r"devices\[0\]='meta': the meta device holds no weights"),
    (["cpu", torch.device("meta")], r"devices\[1\]='meta': the meta device holds no weights"),
    (["cpu", "not-a-device"], r"devices\[1\]='not-a-device' is not a device"),
    ("cpu", r"devices='cpu': give a list of devices or 'auto'"),
    (torch.device("cpu"), r"devices=device\(type='cpu'\): give a list of devices"),
    (3, r"devices=3: give a list of devices or 'auto'"),
])
def test_bad_devices_are_refused_by_name_and_leave_the_model_as_it_was(devices, match):
    model = tiny_model(0)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        before = model(ids)
    with pytest.raises(ValueError, match=match):
        place(model, devices)
    assert not is_split(model) and next(model.parameters()).device.type == "cpu"
    with torch.no_grad():
        torch.testing.assert_close(model(ids), before, rtol=0, atol=0)


def test_interp_load_names_the_devices_argument():
    with pytest.raises(ValueError, match=r"devices=\[\] is empty"):
        interp.load("random-tiny", devices=[])
    with pytest.raises(ValueError, match=r"devices\[0\]='meta'"):
        interp.load("random-tiny", devices=["meta"])
    assert is_split(interp.load("random-tiny", devices=["cpu", "cpu"]))
