"""A mixture-of-experts MLP: a router picks k of E gated experts per token; optional shared expert.

One module covers Mixtral, Qwen-MoE (Qwen2-MoE, Qwen3-MoE), OLMoE and DeepSeek-V2/V3 (see the ``n_experts``
block of :class:`~interp.config.ModelConfig`). For a token with normalised residual x:

* router logits ``l = x @ W_router^T (+ b_router)`` ``[E]`` (``router_logit_bias``: gpt-oss); scores
  ``s = softmax(l)`` or ``sigmoid(l)`` (in float32);
* choice scores ``c = s (+ router_bias)``; with ``router_groups > 1`` only the experts of the
  ``router_topk_groups`` best groups stay eligible (a group's score: the max of its ``c``, or the sum of its
  two best); the k experts with the highest eligible ``c`` are chosen;
* weights ``w = s[chosen]``, divided by their sum if ``router_renormalize``, times ``routed_scaling``;
* Phi-MoE's ``router_score="sparsemixer"`` chooses and weighs its two experts otherwise (:func:`sparsemixer`);
* output ``sum_j w_j expert_{id_j}(x)`` plus the shared expert (times ``sigmoid(x @ w_gate)`` for Qwen-MoE).
  In half precision each product ``w_j expert_{id_j}(x)`` is rounded (``w`` in the model's dtype) and the sum
  is taken in float32 and rounded once, as transformers' experts kernels do; the ``expert_weights_float32``
  policy (:class:`interp.precision.Precision`) keeps ``w`` in float32 and ``router_float32`` the router.

gpt-oss's router (top-k of the logits, then a softmax over the k chosen) is ``router_score="softmax"`` with
``router_renormalize``: ``softmax(l)_i / sum_chosen softmax(l)_j = exp(l_i) / sum_chosen exp(l_j)``, and the top-k
of the logits are the top-k of their softmax. Its experts have biases (``expert_bias``) and the clamped SwiGLU
(``activation="swiglu_clamped"``, :func:`gated_unit`).

Experts run on the tokens routed to them only: token slots are sorted by expert, each expert multiplies its
contiguous run, and the outputs are put back in slot order (cost ``k / E`` of running every expert on every
token). Without gradients the runs go through one grouped GEMM per projection (``F.grouped_mm``, no host sync);
otherwise the experts run one by one. Load-balancing (auxiliary) losses and router jitter are training-only and are left out.

Hooks: ``hook_router_logits`` ``[B, T, E]``, ``hook_expert_weights`` and ``hook_expert_ids`` ``[B, T, k]``
(ids in order of decreasing choice score), ``hook_expert_out`` ``[B, T, k, M]`` (each chosen expert's output
before its weight: ablating an expert replaces it here), ``hook_routed_out`` and ``hook_shared_out``
``[B, T, M]`` (the block's ``hook_mlp_out`` is their sum).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .hooks import HookPoint

__all__ = ["MoE", "float32_names", "gated_unit", "route", "sparsemixer"]


def gated_unit(cfg: ModelConfig,
               act: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The hidden activation of a gated MLP or expert from its two projections: ``h = unit(gate, up)``.

    ``act(gate) * up`` (SwiGLU, GeGLU), or for ``activation="swiglu_clamped"`` gpt-oss's clamped unit
    ``(clamp(up, -l, l) + 1) * g * sigmoid(alpha g)`` with ``g = clamp(gate, max=l)`` (``l = cfg.swiglu_limit``,
    ``alpha = cfg.swiglu_alpha``), in the order transformers computes it.

    Args:
        cfg: the model config (``activation``, ``swiglu_alpha``, ``swiglu_limit``).
        act: the gate's non-linearity (unused by the clamped unit).

    Returns:
        a function of ``(gate, up)`` tensors of one shape.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from interp import ModelConfig
        >>> from interp.moe import gated_unit
        >>> cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu_clamped")
        >>> round(float(gated_unit(cfg, F.silu)(torch.tensor([100.0]), torch.tensor([-100.0]))), 3)  # clamped to 7, -7
        -42.0
    """
    if cfg.activation != "swiglu_clamped":
        return lambda gate, up: act(gate) * up
    alpha, limit = cfg.swiglu_alpha, cfg.swiglu_limit

    def clamped(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(max=limit)
        return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))

    return clamped


def float32_names(model: nn.Module) -> set[str]:
    """The state-dict keys of ``model`` that its modules keep in float32 whatever the model's dtype (each module's
    ``float32_names``: the router of a ``router_float32`` family).

    Example:
        >>> from interp import ModelConfig
        >>> from interp.moe import float32_names
        >>> from interp.placement import build
        >>> cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu",
        ...                   n_experts=4, n_experts_per_token=2, precision="deepseek_v3")
        >>> sorted(float32_names(build(cfg, meta_weights=True)))
        ['blocks.0.mlp.W_router']
    """
    own = set(model.state_dict(keep_vars=True))
    return {f"{name}.{attr}" if name else attr for name, module in model.named_modules()
            for attr in getattr(module, "float32_names", ()) if (f"{name}.{attr}" if name else attr) in own}


def sparsemixer(logits: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-MoE's router at inference (transformers' ``sparsemixer`` outside training): ``(weights, ids)``,
    each ``[N, 2]``.

    The first expert is the best logit; its weight is its softmax over the logits within ``2 * eps`` of it
    (relative: ``(top - l) / max(|l|, top) <= 2 eps``). The second is the best of the others, weighed by its
    softmax over the others within ``2 * eps`` of it. The weights do not sum to one.

    Args:
        logits: router logits ``[N, E]`` (the weights are computed in their dtype, as transformers does).
        eps: ``router_jitter_noise``.

    Returns:
        float32 ``weights`` and int64 ``ids``, the first choice first.

    Example:
        >>> import torch
        >>> from interp.moe import sparsemixer
        >>> w, ids = sparsemixer(torch.tensor([[0.0, 3.0, 2.99, 2.0]]), eps=0.01)
        >>> ids.tolist(), [round(x, 4) for x in w[0].tolist()]  # 2.99 is within 2 eps of 3: both share the first
        ([[1, 2]], [0.5025, 1.0])
    """

    def chosen_weight(candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, best = candidates.max(dim=-1, keepdim=True)  # [N, 1] each
        far = (top - logits) / logits.abs().clamp(min=top) > 2 * eps  # [N, E]
        return candidates.masked_fill(far, float("-inf")).softmax(-1).gather(-1, best), best

    w1, first = chosen_weight(logits)
    w2, second = chosen_weight(logits.scatter(-1, first, float("-inf")))  # the others
    return torch.cat([w1, w2], -1).float(), torch.cat([first, second], -1)  # [N, 2] each


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
        >>> import torch
        >>> from interp import ModelConfig
        >>> from interp.moe import route
        >>> cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu",
        ...                   n_experts=4, n_experts_per_token=2, router_renormalize=True)
        >>> w, ids = route(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), cfg)
        >>> ids.tolist(), round(float(w.sum()), 4)
        ([[1, 3]], 1.0)
    """
    if cfg.router_score == "sparsemixer":
        weights, ids = sparsemixer(logits, cfg.sparsemixer_eps)
        return _finish(weights, cfg), ids
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
    return _finish(scores.gather(1, ids), cfg), ids  # [N, k] each


def _finish(weights: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """The chosen experts' weights ``[N, k]`` renormalised and scaled as the config says."""
    if cfg.router_renormalize:
        # The tiny epsilon is DeepSeek-V3's (sigmoid scores can all be ~0); for softmax scores it changes nothing.
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    if cfg.routed_scaling != 1.0:
        weights = weights * cfg.routed_scaling
    return weights


def _register_grouped_mm_flops() -> None:
    """Teach torch's ``FlopCounterMode`` the grouped GEMM (torch 2.13 has no formula for it and counts 0), so
    that the FLOPs it counts for an MoE forward stay those of the experts' matmuls."""
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    op = getattr(torch.ops.aten, "_grouped_mm", None)
    if op is None or op in flop_registry:
        return

    @register_flop_formula(op)
    def grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        # [S, K] @ [G, K, N] by runs of rows, or [G, M, K] @ [G, K, N]: 2 K per output; [M, K] @ [K, N] with K
        # split into G runs (a weight gradient): out [G, M, N], each output sums its run only.
        if len(a_shape) == 2 and len(b_shape) == 2:
            return 2 * out_shape[-2] * out_shape[-1] * a_shape[-1]
        return 2 * math.prod(out_shape) * a_shape[-1]


_register_grouped_mm_flops()


def _grouped_mm_fits(tokens: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``F.grouped_mm`` can run the experts here: torch >= 2.10; no gradient needed (its CPU backward
    fails in torch 2.13); CPU in float32 / bfloat16 / float16, or CUDA (compute capability 8.0+) in bfloat16,
    the one dtype its CUDA kernels take; rows and weights on 16-byte strides (widths ``d_model`` and
    ``d_expert`` a multiple of 16 bytes) at 16-byte-aligned addresses, as its kernels require.
    Untested on CUDA in this project so far (no GPU run yet): ``tests/gpu/test_cuda.py`` covers it.
    """
    if not hasattr(F, "grouped_mm") or tokens.dtype != weight.dtype:
        return False
    if torch.is_grad_enabled() and (tokens.requires_grad or weight.requires_grad):
        return False
    size = weight.element_size()
    if weight.data_ptr() % 16 or tokens.data_ptr() % 16 or any(d * size % 16 for d in weight.shape[1:]):
        return False
    if tokens.device.type == "cpu":
        return tokens.dtype in (torch.float32, torch.bfloat16, torch.float16)
    return (tokens.device.type == "cuda" and tokens.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(tokens.device) >= (8, 0))


class MoE(nn.Module):
    """Routed experts (and an optional shared expert) in place of a block's MLP.

    Args:
        cfg: a config with ``n_experts > 0``.
        shared: the shared expert (an :class:`interp.model.MLP` of width ``cfg.d_shared_expert``), or None.
        act: the experts' gate non-linearity.

    Parameters: ``W_router`` ``[E, M]``, ``W_gate`` / ``W_in`` ``[E, F, M]``, ``W_out`` ``[E, M, F]``
    (expert e computes ``W_out[e] (act(W_gate[e] x) * W_in[e] x)``, see :func:`gated_unit`); ``b_router`` ``[E]``
    when ``cfg.router_logit_bias``; ``b_gate`` / ``b_in`` ``[E, F]`` and ``b_out`` ``[E, M]`` when
    ``cfg.expert_bias``; buffer ``router_bias`` ``[E]`` when ``cfg.router_choice_bias``; ``shared_gate``
    ``[1, M]`` when ``cfg.shared_expert_gate``.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from interp import ModelConfig
        >>> from interp.moe import MoE
        >>> cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu",
        ...                   n_experts=4, n_experts_per_token=2)
        >>> MoE(cfg, None, F.silu)(torch.randn(2, 3, 8)).shape
        torch.Size([2, 3, 8])
    """

    router_bias: torch.Tensor | None  # [E], a buffer

    def __init__(self, cfg: ModelConfig, shared: nn.Module | None, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        E, M, Fe = cfg.n_experts, cfg.d_model, cfg.d_expert
        self.cfg = cfg
        self.n_experts, self.top_k = E, cfg.n_experts_per_token
        self.act = act
        # The router's parameters in float32 where the family's policy keeps them so (DeepSeek, GLM-4-MoE):
        # listed in ``float32_names``, which loaders honour (interp.zoo.checkpoint.assign_weights).
        router32 = cfg.precision.router_float32
        self.float32_names: tuple[str, ...] = ("W_router", "b_router", "router_bias") if router32 else ()
        self.W_router = nn.Parameter(torch.empty(E, M).float() if router32 else torch.empty(E, M))
        self.W_gate = nn.Parameter(torch.empty(E, Fe, M))
        self.W_in = nn.Parameter(torch.empty(E, Fe, M))
        self.W_out = nn.Parameter(torch.empty(E, M, Fe))
        for w, fan_in in ((self.W_router, M), (self.W_gate, M), (self.W_in, M), (self.W_out, Fe)):
            nn.init.uniform_(w, -fan_in ** -0.5, fan_in ** -0.5)  # nn.Linear's default range
        router_dtype = torch.float32 if router32 else None
        self.b_router = nn.Parameter(torch.zeros(E, dtype=router_dtype)) if cfg.router_logit_bias else None
        biased = cfg.expert_bias
        self.b_gate = nn.Parameter(torch.zeros(E, Fe)) if biased else None
        self.b_in = nn.Parameter(torch.zeros(E, Fe)) if biased else None
        self.b_out = nn.Parameter(torch.zeros(E, M)) if biased else None
        self.register_buffer("router_bias", torch.zeros(E, dtype=router_dtype) if cfg.router_choice_bias else None)
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
        router32 = self.cfg.precision.router_float32
        if router32:  # the float32 residual through the float32 router: the logits are never rounded
            b32 = None if self.b_router is None else self.b_router.float()
            logits = F.linear(x.float(), self.W_router.float(), b32)  # [B, T, E]
        else:
            logits = F.linear(x, self.W_router, self.b_router)  # [B, T, E]
        logits = self.hook_router_logits(logits)
        weights, ids = route(logits.reshape(B * T, -1), self.cfg, self.router_bias)  # [N, k] each, float32
        if not self.cfg.precision.expert_weights_float32:  # rounded, as most of transformers' routers return them
            weights = weights.to(x.dtype)
        weights = self.hook_expert_weights(weights.view(B, T, k))  # [B, T, k]
        ids = self.hook_expert_ids(ids.view(B, T, k))  # [B, T, k]
        on_input = self.cfg.expert_input_weighting  # Llama 4: expert(w x), summed unweighted
        slots = self._run_experts(x.reshape(B * T, M), ids.reshape(-1),
                                  weights.reshape(-1).to(x.dtype) if on_input else None)  # [N*k, M], slot order
        slots = self.hook_expert_out(slots.view(B, T, k, M))  # [B, T, k, M]
        if on_input:
            routed = slots.sum(-2)  # [B, T, M]
        else:  # each expert's output times its weight (rounded, unless float32 weights), summed in float32 and
            # rounded once, as transformers' grouped / batched experts kernels do
            routed = (slots * weights.unsqueeze(-1)).sum(-2).to(x.dtype)  # [B, T, k, M] * [B, T, k, 1] -> [B, T, M]
        out = self.hook_routed_out(routed)
        if self.shared is not None:
            shared = self.shared(x)  # [B, T, M]
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared  # [B, T, 1] * [B, T, M]
            out = out + self.hook_shared_out(shared)
        return out

    def _run_experts(self, x: torch.Tensor, ids: torch.Tensor, input_weights: torch.Tensor | None = None) -> torch.Tensor:
        """x ``[N, M]``, ids ``[N*k]`` (token n's slots are ``n*k .. n*k+k-1``) -> unweighted outputs ``[N*k, M]``
        (of the inputs times ``input_weights`` ``[N*k]``, when given).

        Slots are sorted by expert so that each expert multiplies one contiguous block of the tokens routed
        to it; the results go back to slot order.
        """
        sorted_ids, order = torch.sort(ids, stable=True)  # [N*k] each: slots grouped by expert
        # Where each expert's run ends, found on the device (bincount would sync on CUDA to size its output).
        ends = torch.searchsorted(sorted_ids, torch.arange(self.n_experts, device=ids.device), right=True)  # [E]
        tokens = x.index_select(0, order // self.top_k)  # [N*k, M], sorted by expert
        if input_weights is not None:
            tokens = tokens * input_weights.index_select(0, order)[:, None]  # [N*k, M] * [N*k, 1]
        if _grouped_mm_fits(tokens, self.W_gate):
            # One grouped GEMM per projection; the runs' ends stay on the device, so nothing waits for the host.
            ends = ends.to(torch.int32)

            def grouped(inp: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
                out = F.grouped_mm(inp, w.transpose(1, 2), offs=ends)  # [N*k, in] @ [E, in, out] by run
                return out if b is None else out + b.index_select(0, sorted_ids)  # each row its expert's bias

            unit = gated_unit(self.cfg, self.act)
            h = unit(grouped(tokens, self.W_gate, self.b_gate), grouped(tokens, self.W_in, self.b_in))  # [N*k, F]
            sorted_out = grouped(h, self.W_out, self.b_out)  # [N*k, M]
        else:
            sorted_out = self._expert_loop(tokens, ends)
        # Back to slot order by a gather through the inverse permutation (a row gather is several times faster
        # on CPU than scattering the rows with index_copy_).
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))  # [N*k]
        return sorted_out.index_select(0, inverse)  # [N*k, M]

    def _expert_loop(self, tokens: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """The experts one by one on their runs of ``tokens`` ``[N*k, M]`` (sorted by expert; expert e's run ends
        at ``ends[e]``) -> ``[N*k, M]``."""
        # Slicing runs of data-dependent length needs their lengths on the host: one sync per layer. This path
        # serves only where grouped_mm cannot (see _grouped_mm_fits): gradients, float64, older torch, CUDA
        # float32.
        outs, start = [], 0
        biases = (self.b_gate, self.b_in, self.b_out)
        unit = gated_unit(self.cfg, self.act)
        for e, end in enumerate(ends.tolist()):
            if end > start:
                run = tokens[start:end]  # [n, M]
                b_gate, b_in, b_out = (None if b is None else b[e] for b in biases)
                h = unit(F.linear(run, self.W_gate[e], b_gate), F.linear(run, self.W_in[e], b_in))  # [n, F]
                outs.append(F.linear(h, self.W_out[e], b_out))  # [n, M]
            start = end
        return torch.cat(outs)  # [N*k, M]

    def extra_repr(self) -> str:
        return (f"experts={self.n_experts}, top_k={self.top_k}, d_expert={self.cfg.d_expert}, "
                f"router={self.cfg.router_score}, shared={self.cfg.d_shared_expert}")
