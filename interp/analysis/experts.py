"""Mixture-of-experts analyses: routing statistics over a corpus, and expert ablation.

* :class:`RoutingStats` is a :class:`~interp.streaming.Reducer` (fed by :func:`interp.streaming.stream`, mergeable
  across shards) of each MoE layer's routing: the share of token slots each expert receives, and the routing
  entropy (per token, of the router's normalised scores; and of the load over experts).
  :func:`expert_stats` runs it over a dataset.
* :func:`ablate_experts` is :func:`~interp.analysis.ablate.ablate_heads` for experts: ``"zero"`` replaces a
  chosen expert's output by 0, ``"mean"`` by that expert's mean output over the tokens routed to it in a
  reference corpus (the router's weight stays, so the rest of the layer is untouched). Compare against random
  expert sets with ``compare_with_random(..., units="experts")``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from ..interventions import reference_batches
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
    excluded. State: per layer the expert counts, the token count and the summed per-token entropy (float64).

    Args:
        model: an interp Transformer with MoE layers.

    Example:
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
        self._keep: torch.Tensor | None = None

    def begin_batch(self, batch: Any) -> None:
        self._keep = None if batch.mask is None else batch.mask.bool().reshape(-1)  # [B*T]

    def _kept(self, t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(-1, t.shape[-1])  # [B*T, k|E]
        return flat if self._keep is None else flat[self._keep.to(flat.device)]

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = _layer_of(name)
        t = self._kept(tensor.detach())
        if name.endswith("hook_expert_ids"):
            counts = torch.bincount(t.reshape(-1).cpu(), minlength=self.n_experts).to(torch.float64)  # [E]
            self._add(f"{layer}.counts", counts)
            self._add(f"{layer}.tokens", torch.tensor(float(t.shape[0]), dtype=torch.float64))
        else:
            logits = t.double()
            if self.sigmoid:
                s = logits.sigmoid()
                p = s / s.sum(-1, keepdim=True)
            else:
                p = logits.softmax(-1)
            entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)  # [N]
            self._add(f"{layer}.entropy", entropy.sum().cpu())

    def result(self) -> ExpertStats:
        """The :class:`ExpertStats` of everything seen.

        Raises:
            ValueError: nothing was seen yet.
        """
        if f"{self.layers[0]}.tokens" not in self.state:
            raise ValueError("RoutingStats has seen no tokens; run it through interp.streaming.stream first")
        share, tok_h, load_h = [], [], []
        E = self.n_experts
        for layer in self.layers:
            counts, n = self.state[f"{layer}.counts"], self.state[f"{layer}.tokens"]
            s = counts / counts.sum()
            share.append(s)
            tok_h.append(self.state[f"{layer}.entropy"] / n)
            load_h.append(-(s * s.clamp_min(1e-300).log()).sum() / math.log(E))
        return ExpertStats(layers=list(self.layers), share=torch.stack(share).float(),
                           token_entropy=torch.stack(tok_h).float(), load_entropy=torch.stack(load_h).float(),
                           n_tokens=int(self.state[f"{self.layers[0]}.tokens"]), top_k=self.top_k)


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
def _check_experts(model: Any, experts: Experts) -> dict[int, list[int]]:
    """``(layer, expert)`` pairs -> ``{layer: sorted experts}``, validated against the model."""
    valid = set(moe_layers(model))
    E = model.cfg.n_experts
    by_layer: dict[int, set[int]] = {}
    for pair in experts:
        try:
            layer, expert = (int(x) for x in pair)
        except (TypeError, ValueError):
            raise TypeError(f"experts must be (layer, expert) pairs, got {pair!r}") from None
        if layer not in valid or not 0 <= expert < E:
            raise ValueError(f"expert ({layer}, {expert}) is outside the model (MoE layers {sorted(valid)}, "
                             f"{E} experts each)")
        by_layer.setdefault(layer, set()).add(expert)
    return {layer: sorted(es) for layer, es in sorted(by_layer.items())}


@torch.no_grad()
def expert_out_means(model: Any, reference: Any, layers: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
    """Each expert's mean output (before its routing weight) over the reference tokens routed to it.

    Args:
        model: an interp Transformer with MoE layers.
        reference: ``[R, T]`` token ids, a batch dict or a list of them.
        layers: MoE layers to measure (default all).

    Returns:
        ``{layer: [E, M]}`` float32 means (zeros for an expert no reference token reached).

    Example:
        >>> means = expert_out_means(moe_model, moe_tokens)   # {layer: [E, M]}
    """
    layers = moe_layers(model) if layers is None else list(layers)
    E, M = model.cfg.n_experts, model.cfg.d_model
    sums = {layer: torch.zeros(E, M, dtype=torch.float64) for layer in layers}
    counts = {layer: torch.zeros(E, dtype=torch.float64) for layer in layers}
    ids_now: dict[int, torch.Tensor] = {}
    keep_now: list[torch.Tensor | None] = [None]

    def grab_ids(layer: int):
        def fn(ids: torch.Tensor, hook) -> None:
            ids_now[layer] = ids
        return fn

    def grab_out(layer: int):
        def fn(out: torch.Tensor, hook) -> None:
            ids = ids_now[layer].reshape(-1)  # [B*T*k]
            vals = out.reshape(-1, M).double().cpu()  # [B*T*k, M]
            ids = ids.cpu()
            keep = keep_now[0]
            if keep is not None:
                k = model.cfg.n_experts_per_token
                sel = keep.reshape(-1).repeat_interleave(k)  # [B*T*k]
                ids, vals = ids[sel], vals[sel]
            sums[layer].index_add_(0, ids, vals)
            counts[layer].index_add_(0, ids, torch.ones(len(ids), dtype=torch.float64))
        return fn

    hooks = [(f"blocks.{layer}.mlp.hook_expert_ids", grab_ids(layer)) for layer in layers]
    hooks += [(f"blocks.{layer}.mlp.hook_expert_out", grab_out(layer)) for layer in layers]
    p = next(model.parameters())
    with model.hooks(hooks):
        for tokens, mask in reference_batches(reference):
            keep_now[0] = None if mask is None else mask.bool().cpu()
            model(tokens.to(p.device), **({} if mask is None else {"attention_mask": mask.to(p.device)}))
    return {layer: (sums[layer] / counts[layer].clamp_min(1)[:, None]).float() for layer in layers}


@contextlib.contextmanager
def ablate_experts(model: Any, experts: Experts, method: str = "mean", *, reference: Any = None,
                   values: dict[int, torch.Tensor] | None = None) -> Iterator[None]:
    """Run ``model`` with ``experts`` ablated inside the ``with`` block (hooks on ``hook_expert_out``).

    The router still chooses them and keeps their weights; only what they compute is replaced, wherever a
    token is routed to them.

    Args:
        model: an interp Transformer with MoE layers.
        experts: ``(layer, expert)`` pairs.
        method: ``"zero"`` or ``"mean"`` (the expert's mean output over the reference tokens routed to it).
        reference: the reference inputs for ``"mean"`` (as :func:`expert_out_means`).
        values: precomputed ``{layer: [E, M]}`` means (saves the reference passes).

    Raises:
        ValueError: unknown method, an expert out of range, or a missing reference.

    Example:
        >>> with ablate_experts(moe_model, [(1, 3)], "zero"):
        ...     logits = moe_model(moe_tokens)
    """
    if method not in EXPERT_ABLATIONS:
        raise ValueError(f"method={method!r} is not one of {EXPERT_ABLATIONS}")
    by_layer = _check_experts(model, experts)
    if method == "mean" and values is None:
        if reference is None:
            raise ValueError("method='mean' needs reference inputs (reference=...) or precomputed values")
        values = expert_out_means(model, reference, list(by_layer))
    ids_now: dict[int, torch.Tensor] = {}

    def grab_ids(layer: int):
        def fn(ids: torch.Tensor, hook) -> None:
            ids_now[layer] = ids
        return fn

    def replace(layer: int):
        targets = torch.tensor(by_layer[layer])

        def fn(out: torch.Tensor, hook) -> torch.Tensor:
            ids = ids_now[layer]  # [B, T, k]
            hit = torch.isin(ids, targets.to(ids.device))[..., None]  # [B, T, k, 1]
            if method == "zero":
                return out.masked_fill(hit, 0.0)
            rep = values[layer].to(device=out.device, dtype=out.dtype)[ids]  # [B, T, k, M]
            return torch.where(hit, rep, out)
        return fn

    hooks = [(f"blocks.{layer}.mlp.hook_expert_ids", grab_ids(layer)) for layer in by_layer]
    hooks += [(f"blocks.{layer}.mlp.hook_expert_out", replace(layer)) for layer in by_layer]
    with model.hooks(hooks):
        yield
