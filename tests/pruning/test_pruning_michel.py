"""Michel et al.'s per-example importance E_x |dL(x)/d xi_h| against an autograd loop over single examples, the
group-level (K/V group) variant against the chain rule, and group-level pruning curves with KV bytes."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model

from interp import Transformer
from interp.pruning import (
    LanguageModelObjective,
    head_importance,
    importance_curve,
    kv_cache_savings,
)
from interp.pruning.importance import group_matrix

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gqa(seed: int = 0, **over) -> Transformer:
    return tiny_model(seed, variant="gqa", positional="rotary", dtype=torch.float64, **over)


def data(n: int = 2, b: int = 5, t: int = 10, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        toks = torch.randint(0, 20, (b, t), generator=g)
        loss_mask = torch.rand(b, t, generator=g) > 0.3  # uneven scored tokens per example
        loss_mask[:, -1] = True
        out.append({"tokens": toks, "loss_mask": loss_mask})
    return out


def per_example_loop(model, batches, objective, pruned=None) -> torch.Tensor:
    """The definition, one example at a time: gates [L, H] at 1 (0 where pruned), autograd of L(x), |.|, mean."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    total, n = torch.zeros(L, H, dtype=torch.float64), 0
    for batch in batches:
        for i in range(batch["tokens"].shape[0]):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            gates = torch.ones(L, H, dtype=torch.float64)
            if pruned is not None:
                gates[pruned] = 0.0
            gates.requires_grad_(True)
            model.set_head_gates(gates)
            (g,) = torch.autograd.grad(objective.loss(model, one), gates)
            model.set_head_gates(None)
            total += g.abs()
            n += 1
    return total / n


def test_michel_per_example_equals_autograd_loop():
    model, batches, obj = tiny_gqa(), data(), LanguageModelObjective()
    ref = per_example_loop(model, batches, obj)
    got = head_importance(model, batches, obj, normalize_layers=False)
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=1e-5)
    assert (ref > 1e-4).all()  # no head trivially 0: the comparison has something to compare
    # the batch-mean recipe is a different number (|mean grad| <= mean |grad|), so the test can tell them apart
    batch_mean = head_importance(model, batches, obj, normalize_layers=False, per_example=False)
    assert (batch_mean.double() <= ref + 1e-9).all() and not torch.allclose(batch_mean.double(), ref, atol=1e-5)
    assert model.blocks[0].attn.gate is None and all(p.requires_grad for p in model.parameters())


def test_michel_per_example_with_pruned_heads():
    model, batches, obj = tiny_gqa(1), data(seed=1), LanguageModelObjective()
    pruned = torch.zeros(2, 4, dtype=torch.bool)
    pruned[0, 1] = pruned[1, 3] = True
    ref = per_example_loop(model, batches, obj, pruned)
    got = head_importance(model, batches, obj, normalize_layers=False, pruned=pruned)
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=1e-5)


def test_group_importance_is_abs_of_summed_head_gradients():
    model, batches, obj = tiny_gqa(2), data(seed=2), LanguageModelObjective()
    L, H, K = 2, 4, 2
    total, n = torch.zeros(L, K, dtype=torch.float64), 0
    for batch in batches:  # independent reference: one gate per K/V group, expanded to its query heads
        for i in range(batch["tokens"].shape[0]):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            g = torch.ones(L, K, dtype=torch.float64, requires_grad=True)
            model.set_head_gates(g.repeat_interleave(H // K, dim=1))  # [L, K] -> [L, H]
            (grad,) = torch.autograd.grad(obj.loss(model, one), g)
            model.set_head_gates(None)
            total += grad.abs()
            n += 1
    got = head_importance(model, batches, obj, normalize_layers=False, level="group")
    assert got.shape == (L, K)
    torch.testing.assert_close(got.double(), total / n, rtol=0, atol=1e-5)


def test_group_importance_curve_prunes_whole_groups_and_reports_kv_bytes():
    model, batches, obj = tiny_gqa(3), data(seed=3), LanguageModelObjective("neg_loss")
    curve = importance_curve(model, batches, obj, step=1, level="group")
    assert curve.method == "importance-group"
    assert [p.n_pruned for p in curve.points] == [0, 2, 4, 6, 8]  # two query heads per K/V group
    onehot = group_matrix(model)
    for k, p in enumerate(curve.points):
        mask = torch.tensor(p.mask)
        # every K/V group is either fully pruned or fully kept
        per_group = torch.einsum("lhk,lh->lk", onehot, mask.float())
        assert set(per_group.flatten().tolist()) <= {0.0, 2.0}
        assert p.kv_bytes_saved == kv_cache_savings(model, mask)["bytes_saved_per_token"]
        # K and V, d_head 8, fp16: 32 bytes per token per K/V head removed
        assert p.kv_bytes_saved == k * 2 * model.cfg.d_head * 2


def test_bad_level_and_objective_without_example_losses():
    model, batches, obj = tiny_gqa(), data(n=1), LanguageModelObjective()
    with pytest.raises(ValueError, match="level='kv'"):
        head_importance(model, batches, obj, level="kv")

    class MeanOnly:
        metric_name = "x"

        def loss(self, model, batch):
            return obj.loss(model, batch)

    with pytest.raises(ValueError, match="example_losses"):
        head_importance(model, batches, MeanOnly())
    assert head_importance(model, batches, MeanOnly(), per_example=False).shape == (2, 4)


def test_masked_metric_ablations():
    model, batches, obj = tiny_gqa(4), data(seed=4), LanguageModelObjective("neg_loss")
    pruned = torch.zeros(2, 4, dtype=torch.bool)
    pruned[1, 2] = True
    from interp.pruning import masked_metric

    gates = torch.ones(2, 4, dtype=torch.float64)
    gates[1, 2] = 0
    model.set_head_gates(gates)
    want_zero = obj.metric(model, batches)
    model.set_head_gates(None)
    assert masked_metric(model, batches, obj, pruned) == pytest.approx(want_zero)
    ref = [b["tokens"] for b in data(seed=5)]
    mean = masked_metric(model, batches, obj, pruned, ablation="mean", reference=ref)
    assert mean != pytest.approx(want_zero) and mean != pytest.approx(obj.metric(model, batches))
    assert masked_metric(model, batches, obj, torch.zeros(2, 4, dtype=torch.bool), ablation="mean",
                         reference=ref) == pytest.approx(obj.metric(model, batches))
    with pytest.raises(ValueError, match="needs reference"):
        masked_metric(model, batches, obj, pruned, ablation="mean")
