"""A mixture-of-experts MLP: a router picks k of E gated experts per token; optional shared expert.

One module covers Mixtral, Qwen-MoE (Qwen2-MoE, Qwen3-MoE), OLMoE and DeepSeek-V2/V3 (see the ``n_experts``
block of :class:`~interp.config.ModelConfig`). For a token with normalised residual x:

* router logits ``l = x @ W_router^T`` ``[E]``; scores ``s = softmax(l)`` or ``sigmoid(l)`` (in float32);
* choice scores ``c = s (+ router_bias)``; with ``router_groups > 1`` only the experts of the
  ``router_topk_groups`` best groups stay eligible (a group's score: the max of its ``c``, or the sum of its
  two best); the k experts with the highest eligible ``c`` are chosen;
* weights ``w = s[chosen]``, divided by their sum if ``router_renormalize``, times ``routed_scaling``;
* output ``sum_j w_j expert_{id_j}(x)`` plus the shared expert (times ``sigmoid(x @ w_gate)`` for Qwen-MoE).

Experts run on the tokens routed to them only: token slots are sorted by expert, each expert multiplies its
contiguous run, and the outputs are put back in slot order (cost ``k / E`` of running every expert on every
token). Load-balancing (auxiliary) losses and router jitter are training-only and are left out.

Hooks: ``hook_router_logits`` ``[B, T, E]``, ``hook_expert_weights`` and ``hook_expert_ids`` ``[B, T, k]``
(ids in order of decreasing choice score), ``hook_expert_out`` ``[B, T, k, M]`` (each chosen expert's output
before its weight: ablating an expert replaces it here), ``hook_routed_out`` and ``hook_shared_out``
``[B, T, M]`` (the block's ``hook_mlp_out`` is their sum).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .hooks import HookPoint

__all__ = ["MoE", "route"]


def route(logits: torch.Tensor, cfg: ModelConfig,
          choice_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's choice: ``(weights, ids)``, each ``[N, k]``, from router logits ``[N, E]``.

    Args:
        logits: router logits, one row per token.
        cfg: an MoE config (``router_*`` fields, ``n_experts_per_token``, ``routed_scaling``).
        choice_bias: ``[E]`` added to the scores for the choice only (DeepSeek-V3), or None.

    Returns:
        float32 ``weights`` and int64 ``ids``, ids in order of decreasing choice score.

    Example:
        >>> cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu",
        ...                   n_experts=4, n_experts_per_token=2, router_renormalize=True)
        >>> w, ids = route(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), cfg)
        >>> ids.tolist(), round(float(w.sum()), 4)
        ([[1, 3]], 1.0)
    """
    scores = logits.float().softmax(-1) if cfg.router_score == "softmax" else logits.float().sigmoid()  # [N, E]
    choice = scores if choice_bias is None else scores + choice_bias.float()
    G, E = cfg.router_groups, cfg.n_experts
    if G > 1:
        grouped = choice.view(-1, G, E // G)  # [N, G, E/G]
        if cfg.router_group_score == "max":
            group_scores = grouped.amax(-1)  # [N, G]
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # [N, G]
        best = group_scores.topk(cfg.router_topk_groups, dim=-1).indices  # [N, Gk]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)  # [N, G]
        keep = keep[:, :, None].expand(-1, -1, E // G).reshape(-1, E)  # [N, E]
        choice = choice.masked_fill(~keep, float("-inf"))
    ids = choice.topk(cfg.n_experts_per_token, dim=-1).indices  # [N, k]
    weights = scores.gather(1, ids)  # [N, k]
    if cfg.router_renormalize:
        # The tiny epsilon is DeepSeek-V3's (sigmoid scores can all be ~0); for softmax scores it changes nothing.
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    if cfg.routed_scaling != 1.0:
        weights = weights * cfg.routed_scaling
    return weights, ids


class MoE(nn.Module):
    """Routed experts (and an optional shared expert) in place of a block's MLP.

    Args:
        cfg: a config with ``n_experts > 0``.
        shared: the shared expert (an :class:`interp.model.MLP` of width ``cfg.d_shared_expert``), or None.
        act: the experts' gate non-linearity.

    Parameters: ``W_router`` ``[E, M]``, ``W_gate`` / ``W_in`` ``[E, F, M]``, ``W_out`` ``[E, M, F]``
    (expert e computes ``W_out[e] (act(W_gate[e] x) * W_in[e] x)``); buffer ``router_bias`` ``[E]`` when
    ``cfg.router_choice_bias``; ``shared_gate`` ``[1, M]`` when ``cfg.shared_expert_gate``.

    Example:
        >>> cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu",
        ...                   n_experts=4, n_experts_per_token=2)
        >>> MoE(cfg, None, F.silu)(torch.randn(2, 3, 8)).shape
        torch.Size([2, 3, 8])
    """

    def __init__(self, cfg: ModelConfig, shared: nn.Module | None, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        E, M, Fe = cfg.n_experts, cfg.d_model, cfg.d_expert
        self.cfg = cfg
        self.n_experts, self.top_k = E, cfg.n_experts_per_token
        self.act = act
        self.W_router = nn.Parameter(torch.empty(E, M))
        self.W_gate = nn.Parameter(torch.empty(E, Fe, M))
        self.W_in = nn.Parameter(torch.empty(E, Fe, M))
        self.W_out = nn.Parameter(torch.empty(E, M, Fe))
        for w, fan_in in ((self.W_router, M), (self.W_gate, M), (self.W_in, M), (self.W_out, Fe)):
            nn.init.uniform_(w, -fan_in ** -0.5, fan_in ** -0.5)  # nn.Linear's default range
        self.register_buffer("router_bias", torch.zeros(E) if cfg.router_choice_bias else None)
        self.shared = shared
        self.shared_gate = nn.Linear(M, 1, bias=False) if cfg.shared_expert_gate else None
        self.hook_router_logits = HookPoint()
        self.hook_expert_weights = HookPoint()
        self.hook_expert_ids = HookPoint()
        self.hook_expert_out = HookPoint()
        self.hook_routed_out = HookPoint()
        self.hook_shared_out = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[B, T, M]`` (the normalised residual) -> ``[B, T, M]``."""
        B, T, M = x.shape
        k = self.top_k
        logits = self.hook_router_logits(F.linear(x, self.W_router))  # [B, T, E]
        weights, ids = route(logits.reshape(B * T, -1), self.cfg, self.router_bias)  # [N, k] each
        weights = self.hook_expert_weights(weights.to(x.dtype).view(B, T, k))  # [B, T, k]
        ids = self.hook_expert_ids(ids.view(B, T, k))  # [B, T, k]
        slots = self._run_experts(x.reshape(B * T, M), ids.reshape(-1))  # [N*k, M], slot order
        slots = self.hook_expert_out(slots.view(B, T, k, M))  # [B, T, k, M]
        out = self.hook_routed_out((weights.unsqueeze(-2) @ slots).squeeze(-2))  # [B, T, 1, k] @ [B, T, k, M]
        if self.shared is not None:
            shared = self.shared(x)  # [B, T, M]
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared  # [B, T, 1] * [B, T, M]
            out = out + self.hook_shared_out(shared)
        return out

    def _run_experts(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x ``[N, M]``, ids ``[N*k]`` (token n's slots are ``n*k .. n*k+k-1``) -> unweighted outputs ``[N*k, M]``.

        Slots are sorted by expert so that each expert multiplies one contiguous block of the tokens routed
        to it; the results go back to slot order.
        """
        order = torch.argsort(ids, stable=True)  # [N*k]: slots grouped by expert
        counts = torch.bincount(ids, minlength=self.n_experts).tolist()
        tokens = x.index_select(0, order // self.top_k)  # [N*k, M], sorted by expert
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n:
                run = tokens[start:start + n]  # [n, M]
                h = self.act(F.linear(run, self.W_gate[e])) * F.linear(run, self.W_in[e])  # [n, F]
                outs.append(F.linear(h, self.W_out[e]))  # [n, M]
            start += n
        sorted_out = torch.cat(outs)  # [N*k, M]
        # Back to slot order by a gather through the inverse permutation (a row gather is several times faster
        # on CPU than scattering the rows with index_copy_).
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))  # [N*k]
        return sorted_out.index_select(0, inverse)  # [N*k, M]

    def extra_repr(self) -> str:
        return (f"experts={self.n_experts}, top_k={self.top_k}, d_expert={self.cfg.d_expert}, "
                f"router={self.cfg.router_score}, shared={self.cfg.d_shared_expert}")
