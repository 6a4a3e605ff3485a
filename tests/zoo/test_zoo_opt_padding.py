"""OPT counts its learned positions over real tokens (``positions_from_mask``): a left-padded batch gives
transformers' logits at every real position, in one pass and token by token with the cache."""

import pytest
import torch

from interp import ModelConfig
from interp.zoo.compat import V, hf_test_model
from interp.zoo.hf import from_hf

transformers = pytest.importorskip("transformers")


def _padded_batch():
    torch.manual_seed(5)
    ids = torch.randint(1, V, (3, 10))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, :6] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def test_left_padded_logits_equal_transformers():
    hf = hf_test_model("opt")
    model = from_hf(hf)
    assert model.cfg.positions_from_mask
    ids, mask = _padded_batch()
    real = mask.bool()
    with torch.no_grad():
        want = hf(ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask)
        torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-4)
        unpadded = model(ids[2:, 6:])  # row 2 alone without its padding: the same logits
        torch.testing.assert_close(got[2, 6:], unpadded[0], rtol=0, atol=1e-4)
        # Token by token through the cache, with the mask growing: the same logits again.
        cache = model.make_cache(batch_size=3)
        steps = [model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], kv_cache=cache) for t in range(ids.shape[1])]
        torch.testing.assert_close(torch.cat(steps, dim=1)[real], want[real], rtol=0, atol=1e-4)


def test_without_the_field_left_padding_shifts_positions():
    """The check bites: the same weights with arange positions give other logits on a padded row."""
    hf = hf_test_model("opt")
    model = from_hf(hf)
    ids, mask = _padded_batch()
    with torch.no_grad():
        want = hf(ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask, position_ids=torch.arange(ids.shape[1]))
    assert (got[1, 3:] - want[1, 3:]).abs().max() > 1e-2


def test_positions_from_mask_needs_learned_positions():
    with pytest.raises(ValueError, match="positional='rotary' has none"):
        ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, positional="rotary",
                    positions_from_mask=True)
