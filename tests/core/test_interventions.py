"""interp.interventions: gates, zero / mean / resample ablation of named components, and the patching hooks,
against the model's own gate path and naive recomputations from recorded activations."""

import pytest
import torch
from helpers import tiny_model

from interp.interventions import (
    COMPONENTS,
    Component,
    ablate,
    check_units,
    gates_only,
    head_mask,
    register_component,
    unit_means,
    unit_samples,
)


@pytest.fixture
def model():
    return tiny_model(0, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=40, n_ctx=16)


def test_zero_ablation_equals_gating_the_heads_off(model):
    tokens = torch.randint(0, 40, (3, 9))
    pruned = torch.zeros(2, 4, dtype=torch.bool)
    pruned[0, 1] = pruned[1, 3] = True
    with torch.no_grad():
        with head_mask(model, pruned):
            gated = model(tokens)
        with ablate(model, [(0, 1), (1, 3)], "zero"):
            ablated = model(tokens)
        plain = model(tokens)
    torch.testing.assert_close(ablated, gated, rtol=0, atol=1e-5)
    assert (plain - gated).abs().max() > 1e-3  # the heads mattered
    assert all(block.attn.gate is None for block in model.blocks)  # gates restored, hooks removed:
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), plain, rtol=0, atol=0)


def test_mean_and_resample_ablation_match_naive_replacements(model):
    ref = torch.randint(0, 40, (5, 8))
    tokens = torch.randint(0, 40, (2, 8))
    with torch.no_grad():
        _, trace = model.run_with_cache(ref, names_filter=["blocks.1.attn.hook_z"])
    z_ref = trace["blocks.1.attn.hook_z"]  # [R, T, H, D]
    means = unit_means(model, ref, [1])
    torch.testing.assert_close(means[1], z_ref.mean((0, 1)), rtol=0, atol=1e-6)
    assert torch.equal(unit_samples(model, ref, [1])[1], z_ref)

    def with_z(replace):
        def hook(z, hook):
            z = z.clone()
            z[:, :, 2] = replace(z)
            return z
        with torch.no_grad():
            return model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", hook)])

    with torch.no_grad(), ablate(model, [(1, 2)], "mean", reference=ref):
        got = model(tokens)
    torch.testing.assert_close(got, with_z(lambda z: means[1][2].expand(2, 8, -1)), rtol=0, atol=1e-5)
    draw = torch.randint(0, 5, (2,), generator=torch.Generator().manual_seed(7))  # the rows seed 7 draws
    with torch.no_grad(), ablate(model, [(1, 2)], "resample", reference=ref, seed=7):
        got = model(tokens)
    torch.testing.assert_close(got, with_z(lambda z: z_ref[draw][:, :, 2]), rtol=0, atol=1e-5)


def test_a_registered_component_is_ablated_through_the_same_api(model):
    # Units other than heads: the d_model dimensions of each layer's residual output, ablated to zero.
    register_component(Component("resid_dims", "blocks.{layer}.hook_resid_post", 2, lambda m: [m.cfg.d_model] *
                                 m.cfg.n_layers))
    try:
        seen = {}
        tokens = torch.randint(0, 40, (2, 6))
        with torch.no_grad(), ablate(model, [(0, 3), (0, 5)], "zero", component="resid_dims"):
            model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", lambda t, hook: seen.update(t=t))])
        assert not seen["t"][..., [3, 5]].any() and seen["t"][..., 4].abs().sum() > 0
        with pytest.raises(ValueError, match=r"resid_dim \(0, 32\) is outside the model"):
            check_units(model, [(0, 32)], "resid_dims")
        with pytest.raises(ValueError, match="already registered"):
            register_component(COMPONENTS["resid_dims"])
    finally:
        COMPONENTS.pop("resid_dims")
    with pytest.raises(ValueError, match="component='resid_dims' is not one of"):
        check_units(model, [(0, 1)], "resid_dims")


def test_bad_units_methods_and_references_are_refused(model):
    with pytest.raises(ValueError, match=r"head \(2, 0\) is outside the model"):
        check_units(model, [(2, 0)])
    with pytest.raises(TypeError, match="pairs"):
        check_units(model, [1])
    with pytest.raises(ValueError, match="method='half'"):
        with ablate(model, [(0, 0)], "half"):
            pass
    with pytest.raises(ValueError, match="needs reference"):
        with ablate(model, [(0, 0)], "mean"):
            pass
    with pytest.raises(ValueError, match="reference is empty"):
        unit_means(model, [])


def test_gates_only_freezes_weights_and_restores_flags_and_gates(model):
    before = torch.ones(4)
    model.blocks[0].attn.set_gate(before)
    gates = torch.ones(2, 4, requires_grad=True)
    with gates_only(model):
        model.set_head_gates(gates)
        model(torch.randint(0, 40, (1, 5))).sum().backward()
    assert gates.grad is not None and all(p.grad is None for p in model.parameters())
    assert all(p.requires_grad for p in model.parameters())
    assert model.blocks[0].attn.gate is before and model.blocks[1].attn.gate is None
