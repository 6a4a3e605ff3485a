"""Head gates: Hard-Concrete gates (Louizos et al. 2018); :func:`head_mask` and :func:`gates_only` (which apply a
head mask and train gates only) come from :mod:`interp.interventions`.

A Hard-Concrete gate per head is a stretched, clipped binary-concrete variable. During training it is sampled
(reparameterised, so ``log_alpha`` gets gradients); its probability of being non-zero gives a differentiable
expected L0 norm. At evaluation the gates are deterministic.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["HardConcreteGate", "LOUIZOS_TEMPERATURE", "TEST_GATES", "VOITA_TEMPERATURE", "uniform_heads"]

#: beta in Louizos et al. 2018 ("Learning Sparse Neural Networks through L0 Regularization").
LOUIZOS_TEMPERATURE = 2.0 / 3.0
#: beta in Voita et al. 2019 ("Analyzing Multi-Head Self-Attention"), section 6.1.
VOITA_TEMPERATURE = 0.33

#: Test-time gate modes of :meth:`HardConcreteGate.test_gates`.
TEST_GATES = ("expected", "threshold", "continuous")


class HardConcreteGate(nn.Module):
    """One Hard-Concrete gate per head, ``[n_layers, n_heads]`` (or per K/V group: any ``[L, U]`` grid).

    Args:
        n_layers, n_heads: the gate grid.
        temperature: beta of the concrete distribution. The two papers differ: Louizos et al. (2018) use
            beta = 2/3 (:data:`LOUIZOS_TEMPERATURE`, the default here); Voita et al. (2019), who apply the gates to
            heads, use beta = 0.33 (:data:`VOITA_TEMPERATURE`). A lower beta makes samples closer to 0 / 1.
        limits: stretch interval (l, r) = (-0.1, 1.1) (both papers); samples are clipped back to [0, 1], so a
            gate is exactly 0 or 1 with positive probability.
        init_log_alpha: initial log_alpha (2.0: gates start mostly open); a little noise breaks ties.
        seed: seed of the initial noise.

    Test-time gates (:meth:`test_gates`): both papers use the continuous estimator
    z = clip(sigmoid(log_alpha) (r - l) + l, 0, 1) (``"continuous"``); interp also offers binarised masks
    (``"expected"``, ``"threshold"``, see :meth:`deterministic`).

    Example:
        >>> from interp.pruning.gates import HardConcreteGate, VOITA_TEMPERATURE
        >>> gate = HardConcreteGate(2, 4, temperature=VOITA_TEMPERATURE)
        >>> gate.sample().shape, float(gate.expected_l0().sum()) <= 8
        (torch.Size([2, 4]), True)
    """

    def __init__(self, n_layers: int, n_heads: int, *, temperature: float = LOUIZOS_TEMPERATURE,
                 limits: tuple[float, float] = (-0.1, 1.1), init_log_alpha: float = 2.0, seed: int = 0) -> None:
        super().__init__()
        lo, hi = limits
        if not lo < 0.0 < 1.0 < hi:
            raise ValueError(f"limits={limits} must satisfy l < 0 < 1 < r")
        if temperature <= 0:
            raise ValueError(f"temperature={temperature} must be > 0")
        gen = torch.Generator().manual_seed(seed)
        noise = 0.01 * torch.randn(n_layers, n_heads, generator=gen)
        self.log_alpha = nn.Parameter(torch.full((n_layers, n_heads), float(init_log_alpha)) + noise)
        self.temperature = float(temperature)
        self.limits = (float(lo), float(hi))

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """A reparameterised sample of the gates, ``[L, H]`` in [0, 1]."""
        lo, hi = self.limits
        u = torch.rand(self.log_alpha.shape, generator=generator).clamp(1e-6, 1 - 1e-6).to(self.log_alpha.device)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + self.log_alpha) / self.temperature)
        return (s * (hi - lo) + lo).clamp(0.0, 1.0)

    def expected_l0(self) -> torch.Tensor:
        """P(gate != 0) per head, ``[L, H]``: sigmoid(log_alpha - beta * log(-l / r))."""
        lo, hi = self.limits
        return torch.sigmoid(self.log_alpha - self.temperature * math.log(-lo / hi))

    def expected_sparsity(self) -> torch.Tensor:
        """Expected fraction of heads whose gate is 0 (a differentiable scalar)."""
        return 1.0 - self.expected_l0().mean()

    @torch.no_grad()
    def deterministic(self, mode: str = "expected") -> torch.Tensor:
        """Evaluation-time binary keep mask ``[L, H]`` (True = keep).

        Args:
            mode: ``"expected"`` (CoFiPruning): prune the round(expected number of zero gates) heads with the
                smallest log_alpha, so a target sparsity reached in expectation is hit within one head;
                ``"threshold"`` (Louizos et al.): keep a head when clip(sigmoid(log_alpha) (r - l) + l) > 0.5.

        Raises:
            ValueError: unknown mode (``"continuous"`` gates are not a mask: see :meth:`test_gates`).
        """
        if mode == "expected":
            n = self.log_alpha.numel()
            n_zero = int(round(float(n - self.expected_l0().sum())))
            keep = torch.ones(n, dtype=torch.bool)
            if n_zero > 0:
                keep[torch.argsort(self.log_alpha.detach().flatten().cpu())[:n_zero]] = False
            return keep.view_as(self.log_alpha)  # [L*H] -> [L, H]
        if mode == "threshold":
            lo, hi = self.limits
            z = (torch.sigmoid(self.log_alpha) * (hi - lo) + lo).clamp(0.0, 1.0)
            return (z > 0.5).cpu()
        raise ValueError(f"mode={mode!r} is not 'expected' or 'threshold'")


    @torch.no_grad()
    def test_gates(self, mode: str = "expected") -> torch.Tensor:
        """Evaluation-time gate values ``[L, H]`` in [0, 1] (1 = head fully on).

        Args:
            mode: ``"continuous"``: clip(sigmoid(log_alpha) (r - l) + l, 0, 1), the test-time estimator of
                Louizos et al. (eq. 13) and Voita et al.: exactly 0 for gates pushed far closed, fractional for
                the undecided; ``"expected"`` / ``"threshold"``: the binary masks of :meth:`deterministic`.

        Raises:
            ValueError: unknown mode.
        """
        if mode == "continuous":
            lo, hi = self.limits
            return (torch.sigmoid(self.log_alpha) * (hi - lo) + lo).clamp(0.0, 1.0).detach().cpu()
        if mode not in TEST_GATES:
            raise ValueError(f"mode={mode!r} is not one of {TEST_GATES}")
        return self.deterministic(mode).float()


def uniform_heads(model: Transformer) -> tuple[int, int]:
    """``(n_layers, n_heads)`` of a model whose layers all have the same head count.

    Raises:
        ValueError: the layers have different head counts (a model already reduced by remove_heads).
    """
    counts = [block.attn.n_heads for block in model.blocks]
    if len(set(counts)) != 1:
        raise ValueError(f"pruning methods need the same head count in every layer, got {counts}; "
                         "prune the original model with gates, then call remove_heads once")
    return len(counts), counts[0]
