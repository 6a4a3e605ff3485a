"""Mixture-of-experts analyses: routing statistics over a corpus, and expert ablation.

* :class:`RoutingStats` is a :class:`~interp.streaming.Reducer` (fed by :func:`interp.streaming.stream`, mergeable
  across shards) of each MoE layer's routing: the share of token slots each expert receives, and the routing
  entropy (per token, of the router's normalised scores; and of the load over experts).
  :func:`expert_stats` runs it over a dataset.
* :func:`ablate_experts` is :func:`~interp.analysis.ablate.ablate_heads` for experts, the same
  :func:`interp.interventions.ablate` with ``component="experts"``: ``"zero"`` replaces a chosen expert's output
  by 0, ``"mean"`` by that expert's mean output over the tokens routed to it in a reference corpus (the router's
  weight stays, so the rest of the layer is untouched). Compare against random expert sets with
  ``compare_with_random(..., units="experts")``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from ..interventions import ablate, unit_means
from ..streaming import Reducer, stream

__all__ = ["EXPERT_ABLATIONS", "ExpertStats", "RoutingStats", "ablate_experts", "expert_out_means", "expert_stats",
           "moe_layers"]

#: The expert ablation methods.
EXPERT_ABLATIONS = ("zero", "mean")

Experts = Iterable[tuple[int, int]]


def moe_layers(model: Any) -> list[int]:
    """The layers of ``model`` whose MLP is a mixture of experts.

    Raises:
        ValueError: the model has none.
    """
    layers = [i for i in range(model.cfg.n_layers) if model.cfg.is_moe_layer(i)]
    if not layers:
        raise ValueError(f"model {getattr(model, 'name', '?')!r} has no mixture-of-experts layer "
                         f"(cfg.n_experts={model.cfg.n_experts})")
    return layers


def _layer_of(name: str) -> int:
    return int(name.split(".")[1])  # "blocks.{l}.mlp.hook_..."


@dataclass
class ExpertStats:
    """Routing statistics of a corpus.

    Attributes:
        layers: the MoE layers, in order.
        share: ``[len(layers), E]`` fraction of token slots each expert received (rows sum to 1; a uniform
            router gives ``1 / E`` everywhere).
        token_entropy: ``[len(layers)]`` mean entropy (nats) of the router's normalised scores per token
            (softmax scores, or sigmoid scores divided by their sum); ``log E`` is a router that cannot choose.
        load_entropy: ``[len(layers)]`` entropy of ``share`` divided by ``log E`` (1 = perfectly balanced load).
        n_tokens: tokens counted (padding excluded).
        top_k: experts per token.
    """

    layers: list[int]
    share: torch.Tensor
    token_entropy: torch.Tensor
    load_entropy: torch.Tensor
    n_tokens: int
    top_k: int

    def frame(self) -> pd.DataFrame:
        """Long table ``layer, expert, share``."""
        rows = [{"layer": layer, "expert": e, "share": float(self.share[i, e])}
                for i, layer in enumerate(self.layers) for e in range(self.share.shape[1])]
        return pd.DataFrame(rows)

    def figure(self):
        """:func:`interp.viz.experts.expert_share_figure` of these statistics."""
        from ..viz.experts import expert_share_figure

        return expert_share_figure(self)


class RoutingStats(Reducer):
    """Token share per expert and routing entropy of every MoE layer, summed batch by batch.

    Reads ``hook_expert_ids`` and ``hook_router_logits`` of each MoE layer; padding (the batch's mask) is
    excluded. State: per layer the expert counts, the token count and the summed per-token entropy (float64),
    kept on the model's device (padding is weighted out, not indexed out, so no batch waits on the host);
    :meth:`result` moves them to the CPU once.

    Args:
        model: an interp Transformer with MoE layers.

    Example:
        >>> from interp import stream
        >>> from interp.analysis.experts import RoutingStats
        >>> from interp.examples import moe_model, moe_tokens
        >>> r = RoutingStats(moe_model)
        >>> stream(moe_model, moe_tokens, [r])
        >>> r.result().share.shape   # [MoE layers, E]
    """

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.layers = moe_layers(model)
        self.n_experts, self.top_k = model.cfg.n_experts, model.cfg.n_experts_per_token
        self.sigmoid = model.cfg.router_score == "sigmoid"
        self.names = [f"blocks.{layer}.mlp.{h}" for layer in self.layers
                      for h in ("hook_router_logits", "hook_expert_ids")]
        self._mask: torch.Tensor | None = None

    def begin_batch(self, batch: Any) -> None:
        self._mask = None if batch.mask is None else batch.mask.reshape(-1)  # [B*T]

    def _real(self, n: int, device: torch.device) -> torch.Tensor:
        """float64 ``[B*T]``: 1 for a real token, 0 for padding."""
        if self._mask is None:
            return torch.ones(n, dtype=torch.float64, device=device)
        return self._mask.to(device=device, dtype=torch.float64)

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = _layer_of(name)
        t = tensor.detach()
        flat = t.reshape(-1, t.shape[-1])  # [B*T, k|E]
        real = self._real(flat.shape[0], flat.device)  # [B*T]
        if name.endswith("hook_expert_ids"):
            E = self.n_experts
            # Padding slots go to an extra bin E that is dropped: integer counts with no weights (a weighted
            # bincount has no deterministic CUDA kernel) and no boolean indexing (a host sync).
            slots = torch.where(real[:, None] > 0, flat, E).reshape(-1)  # [B*T*k]
            counts = torch.bincount(slots, minlength=E + 1)[:E].to(torch.float64)  # [E]
            self._add(f"{layer}.counts", counts)
            self._add(f"{layer}.tokens", real.sum())
        else:
            logits = flat.double()
            if self.sigmoid:
                s = logits.sigmoid()
                p = s / s.sum(-1, keepdim=True)
            else:
                p = logits.softmax(-1)
            entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)  # [B*T]
            self._add(f"{layer}.entropy", (entropy * real).sum())

    def result(self) -> ExpertStats:
        """The :class:`ExpertStats` of everything seen (on the CPU).

        Raises:
            ValueError: nothing was seen yet.
        """
        if f"{self.layers[0]}.tokens" not in self.state:
            raise ValueError("RoutingStats has seen no tokens; run it through interp.streaming.stream first")
        state = {k: v.cpu() for k, v in self.state.items()}  # the one move to the host
        share, tok_h, load_h = [], [], []
        E = self.n_experts
        for layer in self.layers:
            counts, n = state[f"{layer}.counts"], state[f"{layer}.tokens"]
            s = counts / counts.sum()
            share.append(s)
            tok_h.append(state[f"{layer}.entropy"] / n)
            load_h.append(-(s * s.clamp_min(1e-300).log()).sum() / math.log(E))
        return ExpertStats(layers=list(self.layers), share=torch.stack(share).float(),
                           token_entropy=torch.stack(tok_h).float(), load_entropy=torch.stack(load_h).float(),
                           n_tokens=int(state[f"{self.layers[0]}.tokens"]), top_k=self.top_k)


def expert_stats(model: Any, data: Any, *, batch_size: int = 32) -> ExpertStats:
    """Routing statistics of ``model`` over ``data`` (one forward pass per batch, nothing stored).

    Args:
        model: an interp Transformer with MoE layers.
        data: what :func:`interp.streaming.stream` accepts (``[N, T]`` token ids, batches with masks, ...).
        batch_size: rows per forward pass when ``data`` is one tensor.

    Returns:
        :class:`ExpertStats`.

    Raises:
        ValueError: the model has no MoE layer, or the data is empty.

    Example:
        >>> import torch
        >>> from interp.analysis.experts import expert_stats
        >>> from interp import ModelConfig, Transformer
        >>> cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=8, activation="swiglu",
        ...                   n_experts=4, n_experts_per_token=2)
        >>> stats = expert_stats(Transformer(cfg), torch.randint(0, 20, (4, 8)))
        >>> stats.share.shape, round(float(stats.share.sum()), 4)
        (torch.Size([1, 4]), 1.0)
    """
    r = RoutingStats(model)
    stream(model, data, [r], batch_size=batch_size)
    return r.result()


# --- expert ablation ------------------------------------------------------------------------------------------
def expert_out_means(model: Any, reference: Any, layers: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
    """Each expert's mean output (before its routing weight) over the reference tokens routed to it:
    :func:`interp.interventions.unit_means` of the ``"experts"`` component.

    Args:
        model: an interp Transformer with MoE layers.
        reference: ``[R, T]`` token ids, a batch dict or a list of them; padding is left out.
        layers: MoE layers to measure (default all).

    Returns:
        ``{layer: [E, M]}`` means in the activations' dtype, on the model's device (zeros for an expert no
        reference token reached).

    Raises:
        ValueError: the model has no MoE layer, or the reference is empty.

    Example:
        >>> from interp.analysis.experts import expert_out_means
        >>> from interp.examples import moe_model, moe_tokens
        >>> means = expert_out_means(moe_model, moe_tokens)   # {layer: [E, M]}
    """
    layers = moe_layers(model) if layers is None else list(layers)
    return unit_means(model, reference, layers, component="experts")


def ablate_experts(model: Any, experts: Experts, method: str = "mean", *, reference: Any = None,
                   positions: Any = None,
                   values: dict[int, torch.Tensor] | None = None) -> contextlib.AbstractContextManager[None]:
    """Run ``model`` with ``experts`` ablated inside the ``with`` block: :func:`interp.interventions.ablate`
    with ``component="experts"`` (hooks on ``hook_expert_out``, removed on exit).

    The router still chooses them and keeps their weights; only what they compute is replaced, wherever a
    token is routed to them.

    Args:
        model: an interp Transformer with MoE layers.
        experts: ``(layer, expert)`` pairs.
        method: ``"zero"`` or ``"mean"`` (the expert's mean output over the reference tokens routed to it).
        reference: the reference inputs for ``"mean"`` (as :func:`expert_out_means`).
        positions: ablate only at these positions (as :func:`interp.interventions.ablate`); None = everywhere.
        values: precomputed ``{layer: [E, M]}`` means from :func:`expert_out_means` (saves the reference passes).

    Raises:
        ValueError: unknown method, a model without MoE layers, an expert out of range, or a missing reference.

    Example:
        >>> from interp.analysis.experts import ablate_experts
        >>> from interp.examples import moe_model, moe_tokens
        >>> with ablate_experts(moe_model, [(1, 3)], "zero"):
        ...     logits = moe_model(moe_tokens)
    """
    if method not in EXPERT_ABLATIONS:
        raise ValueError(f"method={method!r} is not one of {EXPERT_ABLATIONS}")
    moe_layers(model)  # a dense model is refused by name
    return ablate(model, experts, method, component="experts", reference=reference, positions=positions,
                  values=values)
