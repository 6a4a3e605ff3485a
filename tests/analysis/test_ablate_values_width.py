"""ablate_heads with precomputed values of the wrong width: a clear error naming the layer, the values' shape and
the activation's (it was torch's raw size-mismatch error from inside the hook), and a missing layer named too."""

import pytest
import torch
from helpers import tiny_model

from interp.analysis import ablate_heads
from interp.interventions import unit_means, unit_samples


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)  # 2 layers, 4 heads of width 8


IDS = torch.tensor([[1, 2, 3, 4]])
REF = torch.randint(1, 20, (4, 4), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("method, bad, match", [
    ("mean", torch.zeros(4, 5), r"values\[1\] \(means\) has shape \(4, 5\), but layer 1's blocks\.1\.attn\.hook_z is "
                                r"\(1, 4, 4, 8\).*expected \(4, 8\)"),
    ("mean", torch.zeros(4, 3, 8), r"values\[1\] \(means\) has shape \(4, 3, 8\).*expected \('T_ref', 4, 8\)"),
    ("resample", torch.zeros(3, 4, 4, 7), r"values\[1\] \(resample draws\) has shape \(3, 4, 4, 7\).*"
                                          r"expected \('R', 'T_ref', 4, 8\)"),
])
def test_values_of_the_wrong_width_name_the_layer_and_both_shapes(model, method, bad, match):
    with pytest.raises(ValueError, match=match), torch.no_grad(), ablate_heads(model, [(1, 0)], method,
                                                                                values={1: bad}):
        model(IDS)
    with torch.no_grad():  # the hooks are gone: the model runs as before
        assert model(IDS).shape == (1, 4, 20)


def test_values_missing_a_layer_are_refused_by_name(model):
    with pytest.raises(ValueError, match=r"values has no tensor for layer\(s\) \[1\]"):
        with ablate_heads(model, [(1, 0)], "mean", values={0: torch.zeros(4, 8)}):
            pass


def test_values_of_the_right_width_still_ablate(model):
    means, samples = unit_means(model, REF, [1]), unit_samples(model, REF, [1])
    with torch.no_grad():
        with ablate_heads(model, [(1, 0)], "mean", reference=REF):
            want = model(IDS)
        with ablate_heads(model, [(1, 0)], "mean", values=means):
            torch.testing.assert_close(model(IDS), want, rtol=0, atol=0)
        with ablate_heads(model, [(1, 0)], "resample", values=samples, seed=3):
            got = model(IDS)
        with ablate_heads(model, [(1, 0)], "resample", reference=REF, seed=3):
            torch.testing.assert_close(got, model(IDS), rtol=0, atol=0)
