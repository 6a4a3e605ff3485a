"""``start_at_layer`` / ``stop_at_layer`` (TransformerLens' names and semantics) on forward, run_with_hooks and
run_with_cache, against the full forward pass and its recorded residual stream."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model

CONFIGS = {
    "mha-learned": dict(variant="mha"),
    "gqa-rotary": dict(variant="gqa-rotary"),
    "mla": dict(variant="mla"),
    "gemma-like": dict(variant="gqa-rotary", embed_scale=32 ** 0.5, final_softcap=5.0),
    "encoder": dict(variant="mha", causal=False, unembed=False),
}


def _model(name: str):
    model = tiny_model(3, n_layers=3, **CONFIGS[name])
    torch.manual_seed(1)
    with torch.no_grad():  # every parameter re-drawn: norms and biases are not left at 1 and 0
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


TOKENS = torch.tensor([[1, 5, 7, 2, 9, 3], [4, 4, 8, 1, 0, 6]])


@pytest.mark.parametrize("name", CONFIGS)
def test_stop_then_start_at_every_layer_equals_the_full_forward(name):
    model = _model(name)
    L = model.cfg.n_layers
    with torch.no_grad():
        full, trace = model.run_with_cache(TOKENS, names_filter=["*hook_resid_pre", "*hook_resid_post"])
        for k in range(L + 1):
            resid = model(TOKENS, stop_at_layer=k)
            want = trace[f"blocks.{k}.hook_resid_pre"] if k < L else trace[f"blocks.{L - 1}.hook_resid_post"]
            assert torch.equal(resid, want), k  # the residual entering block k (after the last, before ln_final)
            assert torch.allclose(model(resid, start_at_layer=k), full, atol=1e-5, rtol=1e-5), k
        # negative indices count from the end, as in TransformerLens
        assert torch.equal(model(TOKENS, stop_at_layer=-1), model(TOKENS, stop_at_layer=L - 1))
        mid = model(TOKENS, stop_at_layer=1)
        assert torch.equal(model(mid, start_at_layer=-(L - 1)), model(mid, start_at_layer=1))
        # start and stop together: a middle slice of the blocks
        assert torch.allclose(model(mid, start_at_layer=1, stop_at_layer=2), trace["blocks.1.hook_resid_post"],
                              atol=1e-6)


def test_stop_at_layer_0_is_the_embedding_by_hand():
    model = _model("mha-learned")
    with torch.no_grad():
        emb = model.W_E[TOKENS] + model.W_pos[: TOKENS.shape[1]]  # [B, T, M]
        assert torch.allclose(model(TOKENS, stop_at_layer=0), emb)


def test_unembed_residual_is_the_head_of_forward():
    model = _model("gemma-like")
    with torch.no_grad():
        resid = model(TOKENS, stop_at_layer=model.cfg.n_layers)
        x = model.ln_final(resid)
        by_hand = torch.tanh((x @ model.W_U + model.b_U) / 5.0) * 5.0  # Gemma 2's soft-capped logits
        assert torch.allclose(model.unembed_residual(resid), by_hand, atol=1e-6)
        assert torch.equal(model.unembed_residual(resid), model(TOKENS))


def test_padding_mask_and_positions_apply_to_a_pass_from_a_residual():
    model = _model("gqa-rotary")
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    with torch.no_grad():
        full = model(TOKENS, attention_mask=mask, position_ids=positions)
        resid = model(TOKENS, attention_mask=mask, position_ids=positions, stop_at_layer=2)
        again = model(resid, attention_mask=mask, position_ids=positions, start_at_layer=2)
    assert torch.allclose(again, full, atol=1e-5)


def test_hooks_below_start_and_above_stop_do_not_fire():
    model = _model("mha-learned")
    with torch.no_grad():
        resid = model(TOKENS, stop_at_layer=1)
        _, trace = model.run_with_cache(resid, start_at_layer=1, stop_at_layer=2)
        seen = model.run_with_hooks(TOKENS, stop_at_layer=1, fwd_hooks=[("*", lambda t, hook: None)])
    names = set(trace.tensors)
    assert any(n.startswith("blocks.1.") for n in names)
    assert not any(n.startswith(("blocks.0.", "blocks.2.", "ln_final")) or n == "hook_embed" for n in names)
    assert torch.allclose(seen, resid, atol=1e-6)  # hooked attention takes the explicit path: rounding differs


@pytest.mark.parametrize("call, error, needle", [
    (lambda m: m(TOKENS, start_at_layer=2, stop_at_layer=1), ValueError, "comes after stop_at_layer=1"),
    (lambda m: m(TOKENS, stop_at_layer=4), ValueError, "stop_at_layer=4 must be an int in [-3, 3]"),
    (lambda m: m(TOKENS, start_at_layer=1), TypeError, "the input is the residual stream"),
    (lambda m: m(torch.zeros(2, 6, 5), start_at_layer=1), ValueError, "got shape (2, 6, 5)"),
    (lambda m: m(TOKENS, kv_cache=m.make_cache(2), stop_at_layer=1), ValueError, "would not store"),
    (lambda m: m.run_with_cache(torch.zeros(2, 6, 32), start_at_layer=1, reducers=[object()]), ValueError,
     "reducers read the batch's tokens"),
])
def test_bad_layer_arguments_are_refused_by_name(call, error, needle):
    with pytest.raises(error) as info:
        call(_model("mha-learned"))
    assert needle in str(info.value)
