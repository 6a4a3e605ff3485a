"""Circuit tools refuse bad arguments by name before any forward pass (patching and composition)."""

import pytest
import torch
from helpers import tiny_model

from interp.analysis import activation_patching, attribution_patching, patch_heads_together
from interp.analysis.composition import composition_baseline


@pytest.fixture(scope="module")
def model():
    return tiny_model(0, n_layers=2, d_model=32, n_heads=4, d_vocab=30, n_ctx=16)


@pytest.fixture
def pair():
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 30, (3, 6), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1) % 30
    return clean, corrupted


ANSWERS = torch.tensor([[1, 2], [3, 4], [5, 6]])


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True])
def test_activation_patching_batch_size_must_be_a_positive_int(model, pair, batch_size):
    with pytest.raises(ValueError, match=f"batch_size must be a positive int, got {batch_size!r}"):
        activation_patching(model, *pair, answer_tokens=ANSWERS, batch_size=batch_size)


@pytest.mark.parametrize("fn", [activation_patching, attribution_patching])
def test_patching_answer_tokens_wrong_batch_or_outside_vocab(model, pair, fn):
    with pytest.raises(ValueError, match=r"answer_tokens must be \[batch, 2\].*batch 3.*\(2, 2\)"):
        fn(model, *pair, answer_tokens=torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match=r"answer_tokens \[30\] are outside the vocabulary \[0, 30\)"):
        fn(model, *pair, answer_tokens=torch.tensor([[1, 30], [3, 4], [5, 6]]))
    # one pair for the whole batch stays valid
    assert len(fn(model, *pair, answer_tokens=torch.tensor([1, 2])))


def test_patching_metric_per_sequence_is_refused_by_name(model, pair):
    per_sequence = lambda logits: logits[:, -1, 0]  # noqa: E731 - [B], not a scalar
    with pytest.raises(ValueError, match=r"one number for the batch, got a tensor of shape \(3,\)"):
        activation_patching(model, *pair, metric=per_sequence)


@pytest.mark.parametrize("fn", [activation_patching, attribution_patching])
def test_patching_nan_metric_is_refused_by_name(model, pair, fn):
    with pytest.raises(ValueError, match="metric returned nan"):
        fn(model, *pair, metric=lambda logits: logits.sum() * float("nan"))


def test_patching_identical_clean_and_corrupted_is_refused(model, pair):
    clean, _ = pair
    for fn in (activation_patching, attribution_patching):
        with pytest.raises(ValueError, match="clean and corrupted are the same tokens"):
            fn(model, clean, clean.clone(), answer_tokens=ANSWERS)
    with pytest.raises(ValueError, match="clean and corrupted are the same tokens"):
        patch_heads_together(model, clean, clean.clone(), [(0, 0)], answer_tokens=ANSWERS)


@pytest.mark.parametrize("heads", [[(0.5, 0)], [0], [(0, 1, 2)], "L0H0"])
def test_patch_heads_together_heads_must_be_int_pairs(model, pair, heads):
    with pytest.raises(TypeError, match=r"heads must be (a list of )?\(layer, head\) int pairs"):
        patch_heads_together(model, *pair, heads, answer_tokens=ANSWERS)


@pytest.mark.parametrize("n_samples", [0, -3, 2.0])
def test_composition_baseline_n_samples_must_be_positive(model, n_samples):
    with pytest.raises(ValueError, match=f"n_samples must be a positive int, got {n_samples!r}"):
        composition_baseline(model, "K", n_samples=n_samples)
    assert composition_baseline(model, "K", n_samples=2) == composition_baseline(model, "K", n_samples=2)
