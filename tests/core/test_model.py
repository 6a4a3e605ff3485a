"""Config and forward-pass input errors quote the offending values; generate with and without cache."""

from __future__ import annotations

import pytest
import torch
from core_helpers import VARIANTS, make, naive_attention, naive_rotary  # noqa: F401

from interp import ModelConfig


# --- bad input ----------------------------------------------------------------------------------------------
def test_config_errors_quote_values():
    base = dict(n_layers=1, d_model=32, d_vocab=10, n_ctx=8)
    with pytest.raises(ValueError, match="n_heads=8 must be a multiple of n_kv_heads=3"):
        ModelConfig(n_heads=8, n_kv_heads=3, **base)
    with pytest.raises(ValueError, match="d_model=32 is not divisible by n_heads=5"):
        ModelConfig(n_heads=5, **base)
    with pytest.raises(ValueError, match="attention='sparse'"):
        ModelConfig(n_heads=4, attention="sparse", **base)
    with pytest.raises(ValueError, match="needs kv_latent_dim"):
        ModelConfig(n_heads=4, attention="latent", **base)
    with pytest.raises(ValueError, match="rope_dim=4 needs positional='rotary'"):
        ModelConfig(n_heads=4, attention="latent", kv_latent_dim=8, rope_dim=4, **base)
    with pytest.raises(TypeError, match="n_layers=1.5 must be an int"):
        ModelConfig(n_heads=4, **{**base, "n_layers": 1.5})
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['n_head'\]"):
        ModelConfig.from_dict({**base, "n_head": 4})


def test_forward_input_errors():
    model = make("mha")
    with pytest.raises(ValueError, match="sequence length 25 .* exceeds the model's n_ctx=24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(TypeError, match="tokens must be integer ids, got dtype torch.float32"):
        model(torch.zeros(1, 5))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 37\), got min 0 and max 40"):
        model(torch.tensor([[0, 40]]))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 4\), expected \(1, 5\)"):
        model(torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match=r"gates must have shape \(2, 8\), got \(8,\)"):
        model.set_head_gates(torch.ones(8))
    cross = make("mha", cross_attention=True)
    with pytest.raises(ValueError, match=r"context has shape \(1, 3, 16\), expected \(1, S_ctx, 32\)"):
        cross(torch.zeros(1, 5, dtype=torch.long), context=torch.zeros(1, 3, 16))
    with pytest.raises(ValueError, match="hook on 'hook_embed' returned shape"):
        model.run_with_hooks(torch.zeros(1, 5, dtype=torch.long), fwd_hooks=[("hook_embed", lambda x, h: x[:, :2])])


def test_generate_with_cache_equals_without():
    model = make("gqa-rotary")
    prompt = torch.randint(0, 37, (2, 4))
    torch.testing.assert_close(model.generate(prompt, 8), model.generate(prompt, 8, use_cache=False))
