"""generate with extreme sampling arguments: a denormal temperature (1e-45) samples the argmax instead of failing
deep in torch on NaN probabilities, and a seed torch's generator cannot take (2**64) is refused by name."""

import pytest
import torch
from helpers import tiny_model

from interp.generate import SHIFTED_BELOW, generate, process_logits


@pytest.mark.parametrize("temperature", [1e-45, 1e-50, 1e-30, SHIFTED_BELOW / 2])
def test_a_tiny_temperature_samples_the_greedy_tokens(temperature):
    model = tiny_model(0, causal=True)
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    greedy = generate(model, prompt, 6)
    assert torch.equal(generate(model, prompt, 6, temperature=temperature, seed=0), greedy)


def test_the_shifted_scores_are_a_shift_of_logits_over_t():
    torch.manual_seed(0)
    logits = torch.randn(3, 11) * 5
    t = SHIFTED_BELOW / 10
    want = (logits.double() - logits.double().max(-1, keepdim=True).values) / t  # [B, V], exact in float64
    got = process_logits(logits, temperature=t)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    assert torch.isfinite(process_logits(logits, temperature=1e-45).softmax(-1)).all()
    ties = torch.tensor([[2.0, 2.0, -1.0]])  # a tie at the top shares the mass
    torch.testing.assert_close(process_logits(ties, temperature=1e-45).softmax(-1), torch.tensor([[0.5, 0.5, 0.0]]))


@pytest.mark.parametrize("seed", [2 ** 64, -(2 ** 63) - 1, 10 ** 30])
def test_a_seed_torch_cannot_take_is_refused_by_name(seed):
    model = tiny_model(0, causal=True)
    with pytest.raises(ValueError, match=rf"seed={seed} is outside what torch's random generator takes"):
        generate(model, torch.tensor([[1, 2]]), 2, temperature=0.5, seed=seed)
    for ok in (2 ** 64 - 1, -(2 ** 63), 0):
        assert generate(model, torch.tensor([[1, 2]]), 2, temperature=0.5, seed=ok).shape == (1, 4)
