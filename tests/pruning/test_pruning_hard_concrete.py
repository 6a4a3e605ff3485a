"""Hard-Concrete details: the temperature beta (both papers' values) against the analytic P(gate = 0), the
continuous test-time gate against its formula, and group-level L0 on a GQA model (whole K/V groups, target
reached within one group, KV bytes)."""

from __future__ import annotations

import math

import pytest
import torch

from interp import ModelConfig, Transformer
from interp.pruning import (
    LOUIZOS_TEMPERATURE,
    VOITA_TEMPERATURE,
    HardConcreteGate,
    LanguageModelObjective,
    gated_metric,
    kv_cache_savings,
    l0_curve,
    train_l0_gates,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_papers_temperatures():
    assert LOUIZOS_TEMPERATURE == pytest.approx(2 / 3) and VOITA_TEMPERATURE == 0.33
    assert HardConcreteGate(1, 1).temperature == pytest.approx(2 / 3)


@pytest.mark.parametrize("beta", [LOUIZOS_TEMPERATURE, VOITA_TEMPERATURE])
def test_sampled_zero_probability_matches_the_analytic_value(beta):
    # P(z = 0) = P(s (r - l) + l <= 0) = sigmoid(beta log(-l / r) - log_alpha), Louizos et al. eq. 12
    la = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    gate = HardConcreteGate(1, 4 * 5000, temperature=beta, seed=0)  # 5000 independent gates per log_alpha
    with torch.no_grad():
        gate.log_alpha.copy_(la.repeat_interleave(5000)[None])
    zeros = (gate.sample(torch.Generator().manual_seed(0)) == 0).double().view(4, 5000).mean(1)  # [4]
    want = torch.sigmoid(beta * math.log(0.1 / 1.1) - la).double()
    torch.testing.assert_close(zeros, want, atol=0.02, rtol=0)
    torch.testing.assert_close(1 - gate.expected_l0().detach().view(4, 5000)[:, 0].double(), want, atol=1e-6, rtol=0)


def test_continuous_test_gates_follow_the_formula():
    gate = HardConcreteGate(1, 5)
    la = torch.tensor([[-8.0, -2.5, 0.0, 1.0, 8.0]])
    with torch.no_grad():
        gate.log_alpha.copy_(la)
    z = gate.test_gates("continuous")
    by_hand = [min(1.0, max(0.0, 1.2 / (1 + math.exp(-a)) - 0.1)) for a in la[0].tolist()]
    torch.testing.assert_close(z[0].double(), torch.tensor(by_hand, dtype=torch.float64), atol=1e-6, rtol=0)
    assert z[0, 0] == 0.0 and z[0, 4] == 1.0 and 0 < z[0, 2] < 1  # exact 0 / 1 at the ends, fractional between
    assert set(gate.test_gates("threshold").flatten().tolist()) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="mode='soft'"):
        gate.test_gates("soft")


def gqa(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=20, n_ctx=32, positional="rotary",
                      attn_only=True)
    return Transformer(cfg).eval()


def batches(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 20, (8, 12), generator=g) for _ in range(2)]


def test_group_l0_prunes_whole_kv_groups_within_one_group_of_target():
    model, data, obj = gqa(), batches(), LanguageModelObjective("neg_loss")
    res = train_l0_gates(model, data, obj, target=0.5, steps=150, level="group")
    assert res.pruned_units.shape == (2, 2)
    assert abs(int(res.pruned_units.sum()) - 2) <= 1  # 4 K/V groups, target half of them
    for layer in range(2):
        for k in range(2):  # query heads 2k, 2k+1 read K/V head k: both pruned or both kept
            assert bool(res.pruned[layer, 2 * k]) == bool(res.pruned[layer, 2 * k + 1]) == bool(res.pruned_units[layer, k])
    saved = kv_cache_savings(model, res.pruned)
    assert saved["kv_heads_removed"] == int(res.pruned_units.sum())
    curve = l0_curve(model, data, obj, targets=[0.5], steps=20, level="group")  # naming and bytes only
    assert curve.method == "l0-group"
    assert curve.points[-1].kv_bytes_saved == kv_cache_savings(model, torch.tensor(curve.points[-1].mask))[
        "bytes_saved_per_token"]


def test_continuous_gates_in_training_and_curve():
    model, data, obj = gqa(1), batches(1), LanguageModelObjective("neg_loss")
    res = train_l0_gates(model, data, obj, target=0.5, steps=60, deterministic="continuous")
    lo, hi = -0.1, 1.1
    torch.testing.assert_close(res.gates, (torch.sigmoid(res.log_alpha) * (hi - lo) + lo).clamp(0, 1))
    assert torch.equal(res.pruned, res.gates == 0)
    curve = l0_curve(model, data, obj, targets=[0.5], steps=60, deterministic="continuous")
    # the curve's metric is the model run with those float gates
    model.set_head_gates(res.gates)
    want = obj.metric(model, data)
    model.set_head_gates(None)
    assert curve.points[-1].metric == pytest.approx(want, abs=1e-6)
    assert gated_metric(model, data, obj, res.gates) == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="deterministic='soft'"):
        train_l0_gates(model, data, obj, target=0.5, steps=1, deterministic="soft")
    with pytest.raises(ValueError, match="level='layer'"):
        train_l0_gates(model, data, obj, target=0.5, steps=1, level="layer")


def test_target_runs_test_the_post_warmup_average_of_log_alpha():
    """average=True (off by default) changes only which log_alpha is tested (the mean after the warmup), never the training
    trajectory; without it the test-time gates are the last step's; fixed-lam runs are never averaged."""
    model, data, obj = gqa(), batches(), LanguageModelObjective("neg_loss")
    avg = train_l0_gates(model, data, obj, target=0.5, steps=40, seed=1, average=True)
    last = train_l0_gates(model, data, obj, target=0.5, steps=40, seed=1, average=False)
    assert avg.history == last.history and avg.last_step_sparsity == last.last_step_sparsity
    assert last.expected_sparsity == pytest.approx(last.last_step_sparsity, abs=1e-7)
    assert not torch.equal(avg.log_alpha, last.log_alpha)
    assert avg.expected_sparsity != pytest.approx(last.expected_sparsity, abs=1e-7)
    fixed = [train_l0_gates(model, data, obj, lam=0.5, steps=20, seed=1, average=a) for a in (True, False)]
    assert torch.equal(fixed[0].log_alpha, fixed[1].log_alpha)
