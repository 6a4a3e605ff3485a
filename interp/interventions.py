"""Interventions: turn model components off or replace what they write, for analysis and pruning alike.

One place for every way of changing what a component contributes to a forward pass:

* **gates** (:func:`head_mask`, :func:`gates_only`): a multiplier per head on the model's own gate
  (``Transformer.set_head_gates``), hook-free, differentiable (pruning trains them);
* **ablation** (:func:`ablate`): zero, mean or resample replacement of chosen units' activations through
  hooks, at every position or at chosen ones, with the reference statistics from :func:`unit_means` /
  :func:`unit_samples`;
* **patching hooks** (:func:`patch_sites_hook`, :func:`patch_units_hook`, :func:`gradient_probe_hook`): the
  hook functions activation and attribution patching (:mod:`interp.analysis.patching`) attach.

Units are named by a component and an index set: ``ablate(model, [(1, 0), (1, 2)], "mean", component="heads")``.
A component (:class:`Component`, registered in :data:`COMPONENTS`) says which hook point of each layer
carries the units' activations and along which axis; ``"heads"`` is ``blocks.{layer}.attn.hook_z`` (the
head's output before ``W_O``, ``[B, T, H, D]``), so ablating head h replaces its residual write
``z_h W_O[h]`` by the write of the replacement z. ``"experts"`` are the routed experts of a mixture-of-experts
layer: ``blocks.{layer}.mlp.hook_expert_out`` (``[B, T, k, M]``, each chosen expert's output before its routing
weight) with ``blocks.{layer}.mlp.hook_expert_ids`` saying which expert each of the k slots holds. A routed unit
is replaced wherever a token was routed to it (its router weight stays), and its mean is over the reference
tokens routed to it; resample-ablation is not defined for it (an expert has no output on a reference token that
was not routed to it).

Ablation methods:

* ``"zero"``: the activation is 0 (for heads the same as a gate at 0). Off-distribution: the next layers never
  saw a missing head, so zero-ablation can hurt for reasons that have nothing to do with the head's job.
* ``"mean"``: the unit's mean activation over a reference distribution (over examples and positions, or per
  position with ``per_position=True``); keeps its constant contribution, removes what depends on the input
  (Wang et al. 2022, IOI).
* ``"resample"``: the unit's activation on *another* input from the reference distribution, at the same
  position (Chan et al. 2022, causal scrubbing): on-distribution values carrying the wrong information.

Example:
    >>> import torch
    >>> from interp.interventions import ablate, head_mask
    >>> import interp
    >>> model = interp.load("random-tiny")
    >>> tokens = torch.randint(1, 64, (2, 8))
    >>> with ablate(model, [(1, 0)], "zero"):
    ...     ablated = model(tokens)
    >>> with head_mask(model, torch.tensor([[False] * 4, [True, False, False, False]])):
    ...     gated = model(tokens)
    >>> torch.allclose(ablated, gated, atol=1e-6)
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .data import as_batch

if TYPE_CHECKING:
    from .model import Transformer

__all__ = ["ABLATIONS", "COMPONENTS", "Component", "ablate", "check_units", "gates_only", "gradient_probe_hook",
           "head_mask", "patch_sites_hook", "patch_units_hook", "position_mask", "reference_batches",
           "register_component", "site_index", "unit_means", "unit_samples"]

#: The ablation methods.
ABLATIONS = ("zero", "mean", "resample")

Units = Iterable[tuple[int, int]]


@dataclass(frozen=True)
class Component:
    """A kind of model unit that interventions act on: one hook point per layer whose activation has one axis
    over the layer's units.

    Attributes:
        name: what the units are called (``"heads"``), the ``component=`` argument of the functions here.
        hook: the hook point of layer ``{layer}`` that carries the units' activations.
        unit_axis: the axis of the units in that activation (heads: 2 of ``[B, T, H, D]``; the first two axes are
            always batch and position).
        counts: ``counts(model) -> [units in layer 0, units in layer 1, ...]``.
        ids_hook: for routed units (experts), the hook point of layer ``{layer}`` that says which unit each
            position of the unit axis holds (``[B, T, k]`` unit ids; the unit axis is then 2 and holds the k
            slots a token was routed to, not the units themselves); None when the unit axis indexes the units.
    """

    name: str
    hook: str
    unit_axis: int
    counts: Callable[[Any], list[int]]
    ids_hook: str | None = None

    def hook_name(self, layer: int) -> str:
        """The hook point of ``layer``."""
        return self.hook.format(layer=layer)

    def ids_hook_name(self, layer: int) -> str:
        """The unit-ids hook point of ``layer`` (routed units only)."""
        assert self.ids_hook is not None
        return self.ids_hook.format(layer=layer)

    def default_layers(self, model: Any) -> list[int]:
        """The layers recorded when none are named: every layer (a layer whose heads were all removed still
        records an empty z), but for routed units only the layers that have them (a dense MLP has no experts)."""
        counts = self.counts(model)
        return [layer for layer, n in enumerate(counts) if n or self.ids_hook is None]


def _head_counts(model: Any) -> list[int]:
    return [block.attn.n_heads for block in model.blocks]


def _expert_counts(model: Any) -> list[int]:
    cfg = model.cfg
    return [cfg.n_experts if cfg.is_moe_layer(layer) else 0 for layer in range(cfg.n_layers)]


#: The components interventions know, by name (add one with :func:`register_component`).
COMPONENTS: dict[str, Component] = {
    "heads": Component("heads", "blocks.{layer}.attn.hook_z", 2, _head_counts),
    "experts": Component("experts", "blocks.{layer}.mlp.hook_expert_out", 2, _expert_counts,
                         ids_hook="blocks.{layer}.mlp.hook_expert_ids"),
}


def register_component(component: Component) -> None:
    """Make ``component`` available to :func:`ablate`, :func:`unit_means` and :func:`unit_samples` by its name.

    Raises:
        TypeError: not a :class:`Component`.
        ValueError: the name is taken, or the unit axis is one of the batch / position axes.
    """
    if not isinstance(component, Component):
        raise TypeError(f"register_component takes a Component, got {type(component).__name__}")
    if component.name in COMPONENTS:
        raise ValueError(f"component {component.name!r} is already registered")
    if component.unit_axis < 2:
        raise ValueError(f"unit_axis={component.unit_axis}: axes 0 and 1 are batch and position")
    if component.ids_hook is not None and component.unit_axis != 2:
        raise ValueError(f"unit_axis={component.unit_axis}: a routed component's slots are axis 2 (its ids hook "
                         f"{component.ids_hook!r} is [B, T, k])")
    COMPONENTS[component.name] = component


def _component(name: str) -> Component:
    if name not in COMPONENTS:
        raise ValueError(f"component={name!r} is not one of {sorted(COMPONENTS)}")
    return COMPONENTS[name]


def check_units(model: Any, units: Units, component: str = "heads") -> dict[int, list[int]]:
    """``(layer, unit)`` pairs -> ``{layer: sorted units}``, validated against the model.

    Raises:
        TypeError: an item is not a pair of ints.
        ValueError: a unit outside the model (the counts per layer are named), or an unknown component.

    Example:
        >>> from interp.interventions import check_units
        >>> from interp import load
        >>> check_units(load("random-tiny"), [(1, 2), (0, 1), (1, 0)])
        {0: [1], 1: [0, 2]}
    """
    comp = _component(component)
    counts = comp.counts(model)
    by_layer: dict[int, set[int]] = {}
    for pair in units:
        try:
            layer, unit = (int(x) for x in pair)
        except (TypeError, ValueError):
            raise TypeError(f"{comp.name} must be (layer, index) pairs, got {pair!r}") from None
        if not (0 <= layer < len(counts) and 0 <= unit < counts[layer]):
            singular = comp.name.removesuffix("s")
            raise ValueError(f"{singular} ({layer}, {unit}) is outside the model ({comp.name} per layer {counts})")
        by_layer.setdefault(layer, set()).add(unit)
    return {layer: sorted(us) for layer, us in sorted(by_layer.items())}


# --- gates ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def head_mask(model: Transformer, pruned: torch.Tensor | Sequence[torch.Tensor] | None) -> Iterator[None]:
    """Run ``model`` with the heads marked True in ``pruned`` (``[L, H]`` bool) gated to 0; restores the
    gates that were set before, also when the body raises.

    Args:
        model: an interp Transformer.
        pruned: ``[L, H]`` bool (True = off); for a model whose layers hold different head counts (after
            :func:`interp.pruning.remove_heads`), a list of ``[H_layer]`` bools; or None to run with the gates
            as they are (and restore them).

    Raises:
        ValueError: ``pruned`` does not match the model's heads (see :meth:`Transformer.set_head_gates`).

    Example:
        >>> import torch
        >>> from interp.interventions import head_mask
        >>> from interp import load
        >>> model = load("random-tiny")
        >>> pruned = torch.zeros(2, 4, dtype=torch.bool)
        >>> pruned[1, 0] = True
        >>> with head_mask(model, pruned):
        ...     model.blocks[1].attn.gate.tolist()
        [0.0, 1.0, 1.0, 1.0]
        >>> model.blocks[1].attn.gate is None  # restored
        True
    """
    # The model's lock is held for the whole block: gates are shared state, and another thread (a dashboard
    # session) must neither run under these gates nor change them before they are restored. Being
    # re-entrant, it also makes nested contexts restore in the right order within one thread.
    with model.lock:
        before = [block.attn.gate for block in model.blocks]
        try:
            if pruned is not None:
                p = next(model.parameters())
                if isinstance(pruned, torch.Tensor):
                    model.set_head_gates((~pruned).to(device=p.device, dtype=p.dtype))
                else:
                    model.set_head_gates([(~m).to(device=p.device, dtype=p.dtype) for m in pruned])
            yield
        finally:
            for block, gate in zip(model.blocks, before):
                block.attn.set_gate(gate)


@contextlib.contextmanager
def gates_only(model: Transformer) -> Iterator[None]:
    """Train or differentiate head gates only: freeze every parameter, hold the model's lock, and restore the
    gates and the ``requires_grad`` flags on exit, also when the body raises.

    Example:
        >>> import torch
        >>> from interp.interventions import gates_only
        >>> from interp import load
        >>> model = load("random-tiny")
        >>> gates = torch.ones(2, 4, requires_grad=True)
        >>> with gates_only(model):
        ...     model.set_head_gates(gates)   # gradients flow to ``gates`` only
        ...     model(torch.tensor([[0, 5, 9]])).sum().backward()
        >>> gates.grad.shape, model.W_E.grad is None
        (torch.Size([2, 4]), True)
    """
    # requires_grad flags and gates are shared state: no other thread may run or re-gate the model between
    # saving and restoring them.
    with model.lock:
        flags = [q.requires_grad for q in model.parameters()]
        try:
            for q in model.parameters():
                q.requires_grad_(False)
            with head_mask(model, None):
                yield
        finally:
            for q, f in zip(model.parameters(), flags):
                q.requires_grad_(f)


# --- reference statistics -----------------------------------------------------------------------------------
def reference_batches(reference: Any) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Reference inputs -> ``[(tokens [B, T], padding mask [B, T] or None)]``.

    Args:
        reference: a ``[B, T]`` tensor, a :class:`interp.data.Batch`, a batch dict (``tokens``, optional
            ``attention_mask``) or a sequence of them.

    Raises:
        ValueError: no batch.
        TypeError: a batch that is not token ids.
    """
    if isinstance(reference, (torch.Tensor, dict)) or hasattr(reference, "tokens"):
        reference = [reference]
    out = []
    for b in reference:
        if not (isinstance(b, torch.Tensor) or hasattr(b, "tokens") or (isinstance(b, dict) and "tokens" in b)):
            raise TypeError(f"reference batches must be [B, T] token tensors, Batches or dicts with 'tokens', got "
                            f"{type(b).__name__}")
        batch = as_batch(b, "reference")
        out.append((batch.tokens, batch.mask))
    if not out:
        raise ValueError("reference is empty: mean and resample ablation need reference inputs")
    return out


@torch.no_grad()
def _record(model: Any, reference: Any, comp: Component, layers: Sequence[int],
            fold: Callable[[dict[int, torch.Tensor], dict[int, torch.Tensor], torch.Tensor], None] | None = None
            ) -> list[tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], torch.Tensor]]:
    """Clean forward passes over the reference: per batch ``({layer: activation [B, T, ...]}, {layer: unit ids
    [B, T, k]} (routed units; else empty), real mask [B, T])``, all on the model's device. With ``fold``, each
    batch's record goes to ``fold(acts, ids, real)`` and is not kept (means need running sums only)."""
    p = next(model.parameters())
    out = []
    for tokens, mask in reference_batches(reference):
        acts: dict[int, torch.Tensor] = {}
        ids: dict[int, torch.Tensor] = {}

        def grab(store: dict[int, torch.Tensor], layer: int):
            def fn(t: torch.Tensor, hook) -> None:
                store[layer] = t.detach()
            return fn

        hooks = [(comp.hook_name(layer), grab(acts, layer)) for layer in layers]
        if comp.ids_hook is not None:
            hooks += [(comp.ids_hook_name(layer), grab(ids, layer)) for layer in layers]
        with model.hooks(hooks):
            model(tokens.to(p.device), attention_mask=None if mask is None else mask.to(p.device))
        real = (torch.ones(tokens.shape, dtype=torch.bool, device=p.device) if mask is None
                else mask.to(p.device).bool())  # [B, T]
        if fold is None:
            out.append((acts, ids, real))
        else:
            fold(acts, ids, real)
    return out


def _routed_sums(a: torch.Tensor, ids: torch.Tensor, real: torch.Tensor, n_units: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch's per-unit sums ``[U, prod(...)]`` and token counts ``[U]`` of a routed activation ``a``
    ``[B, T, k, ...]`` whose slots hold units ``ids`` ``[B, T, k]``; padding weighted out, no host sync."""
    slot_ids = ids.reshape(-1)  # [B*T*k]
    w = real[:, :, None].expand(ids.shape).reshape(-1).double()  # [B*T*k]: 0 on padding
    rows = a.double().reshape(len(slot_ids), -1) * w[:, None]  # [B*T*k, prod(...)]
    total = torch.zeros(n_units, rows.shape[1], dtype=torch.float64, device=a.device).index_add_(0, slot_ids, rows)
    count = torch.zeros(n_units, dtype=torch.float64, device=a.device).index_add_(0, slot_ids, w)
    return total, count


def _no_routed(comp: Component, what: str) -> None:
    if comp.ids_hook is not None:
        raise ValueError(f"{what} is not defined for {comp.name}: a routed unit has no activation on a reference "
                         f"token that was not routed to it (use method='zero' or 'mean')")


def unit_means(model: Any, reference: Any, layers: Sequence[int] | None = None, *, per_position: bool = False,
               component: str = "heads") -> dict[int, torch.Tensor]:
    """Each unit's mean activation over a reference distribution (what mean-ablation puts in its place).

    The sums run batch by batch on the model's device (float64); no batch's activations are kept.

    Args:
        model: an interp Transformer.
        reference: see :func:`reference_batches`; padding (mask 0) is left out of the mean.
        layers: the layers to record (default all; for routed units, the layers that have them).
        per_position: one mean per position (all batches must have the same length) instead of one over all
            positions.
        component: the kind of unit (:data:`COMPONENTS`). A routed unit's (an expert's) mean is over the
            reference tokens routed to it.

    Returns:
        ``{layer: activation without the batch and position axes}`` (heads: ``[H, D]``; per position
        ``[T, H, D]``; experts: ``[E, M]``, zeros for an expert no reference token reached), in the
        activations' dtype, on the model's device.

    Raises:
        ValueError: empty reference, batches of different lengths with ``per_position``, ``per_position``
            for routed units, or a layer without the routed units.
        TypeError: a reference batch that is not token ids.

    Example:
        >>> import torch
        >>> from interp.interventions import unit_means
        >>> from interp.examples import moe_model, moe_tokens
        >>> from interp import load
        >>> unit_means(load("random-tiny"), torch.randint(1, 64, (4, 6)))[1].shape   # [H, D]
        torch.Size([4, 8])
        >>> unit_means(moe_model, moe_tokens, component="experts")[1].shape   # [E, M]
        torch.Size([4, 16])
    """
    comp = _component(component)
    if per_position:
        _no_routed(comp, "per_position means")
    layers = comp.default_layers(model) if layers is None else list(layers)
    counts = comp.counts(model)
    if comp.ids_hook is not None:
        bad = [layer for layer in layers if not (0 <= layer < len(counts) and counts[layer])]
        if bad:
            raise ValueError(f"layers {bad} have no {comp.name} ({comp.name} per layer {counts})")
    if per_position:
        lengths = sorted({tokens.shape[1] for tokens, _ in reference_batches(reference)})
        if len(lengths) > 1:
            raise ValueError(f"per_position means need reference batches of one length, got lengths {lengths}")
    totals: dict[int, torch.Tensor] = {}
    weights: dict[int, torch.Tensor] = {}
    like: dict[int, torch.Tensor] = {}  # one activation per layer: its dtype and unit shape

    def fold(acts: dict[int, torch.Tensor], ids: dict[int, torch.Tensor], real: torch.Tensor) -> None:
        for layer in layers:
            a = acts[layer]  # [B, T, ...]
            like[layer] = a[:1, :1]
            if comp.ids_hook is not None:
                s, c = _routed_sums(a, ids[layer], real, counts[layer])
            else:
                w = real.to(a.device).double().view(*real.shape, *[1] * (a.dim() - 2))  # [B, T, 1, ...]
                a = a.double()
                s, c = ((a * w).sum(0), w.sum(0)) if per_position else ((a * w).sum((0, 1)), w.sum((0, 1)))
            totals[layer] = s if layer not in totals else totals[layer] + s
            weights[layer] = c if layer not in weights else weights[layer] + c

    _record(model, reference, comp, layers, fold)
    means = {}
    for layer in layers:
        if comp.ids_hook is not None:  # [U, prod(...)] -> [U, ...]
            mean = (totals[layer] / weights[layer].clamp(min=1)[:, None]).view(counts[layer], *like[layer].shape[3:])
        else:  # [(T,) ...]
            mean = totals[layer] / weights[layer].clamp(min=1)
        means[layer] = mean.to(like[layer].dtype)
    return means


def unit_samples(model: Any, reference: Any, layers: Sequence[int] | None = None, *,
                 component: str = "heads") -> dict[int, torch.Tensor]:
    """Each unit's activation on every reference input ``{layer: [R, T, ...]}`` (what resample-ablation draws).

    Raises:
        ValueError: empty reference, reference batches of different lengths, or routed units (experts).
    """
    comp = _component(component)
    _no_routed(comp, "resample ablation")
    layers = comp.default_layers(model) if layers is None else list(layers)
    recs = _record(model, reference, comp, layers)
    if len({real.shape[1] for *_, real in recs}) > 1:
        raise ValueError("resample ablation needs reference batches of one length, got lengths "
                         f"{sorted({real.shape[1] for *_, real in recs})}")
    return {layer: torch.cat([acts[layer] for acts, _, _ in recs]) for layer in layers}


# --- ablation -----------------------------------------------------------------------------------------------
def position_mask(positions: Any, B: int, T: int, device: torch.device) -> torch.Tensor | None:
    """None (every position) or a bool ``[B, T]`` mask of the positions to intervene on.

    Args:
        positions: None, indices in ``[-T, T)``, or a bool ``[T]`` / ``[B, T]`` mask.

    Raises:
        ValueError: a mask of another shape, or an index out of range.
    """
    if positions is None:
        return None
    pos = torch.as_tensor(positions, device=device)
    if pos.dtype == torch.bool:
        if pos.shape == (T,):
            return pos[None].expand(B, T)
        if pos.shape == (B, T):
            return pos
        raise ValueError(f"a bool positions mask must be [T]={T} or [B, T]=({B}, {T}), got {tuple(pos.shape)}")
    if pos.dim() != 1 or (len(pos) and (int(pos.min()) < -T or int(pos.max()) >= T)):
        raise ValueError(f"positions {positions!r} must be indices in [-{T}, {T}) or a bool mask")
    m = torch.zeros(T, dtype=torch.bool, device=device)
    m[pos.long()] = True
    return m[None].expand(B, T)


@contextlib.contextmanager
def ablate(model: Any, units: Units, method: str = "mean", *, component: str = "heads", reference: Any = None,
           per_position: bool = False, positions: Any = None, seed: int = 0,
           values: dict[int, torch.Tensor] | None = None) -> Iterator[None]:
    """Run ``model`` with ``units`` ablated inside the ``with`` block (hooks on the component's hook point,
    removed on exit).

    Args:
        model: an interp Transformer.
        units: ``(layer, index)`` pairs of the component (heads: ``(layer, head)``; experts:
            ``(layer, expert)``).
        method: ``"zero"``, ``"mean"`` or ``"resample"`` (see the module docstring; experts: zero or mean).
        component: the kind of unit (:data:`COMPONENTS`; default ``"heads"``; ``"experts"`` for the routed
            experts of a mixture-of-experts model).
        reference: the reference distribution for mean / resample (see :func:`reference_batches`). It should
            come from the same distribution as the inputs, not be the inputs themselves.
        per_position: mean-ablate with a per-position mean (the inputs must have the reference's length).
        positions: ablate only at these query positions (indices, a bool ``[T]`` or ``[B, T]`` mask); None =
            everywhere.
        seed: which reference input each ablated input draws (resample); each input draws one reference input,
            with replacement, shared by all ablated units (one coherent "other input").
        values: precomputed replacements ``{layer: activation}`` from :func:`unit_means` / :func:`unit_samples`
            (saves the reference passes when the same units are ablated many times).

    Raises:
        ValueError: unknown method or component, a unit out of range, a missing reference, bad positions, an
            input whose length does not match a per-position / resample reference, or resample / per-position
            means for routed units.

    Example:
        >>> import torch
        >>> from interp.interventions import ablate
        >>> from interp import load
        >>> model = load("random-tiny")
        >>> reference = torch.randint(1, 64, (8, 6), generator=torch.Generator().manual_seed(0))
        >>> with ablate(model, [(1, 0), (1, 2)], "mean", reference=reference):
        ...     logits = model(torch.tensor([[0, 5, 9, 5]]))
        >>> logits.shape
        torch.Size([1, 4, 64])
    """
    if method not in ABLATIONS:
        raise ValueError(f"method={method!r} is not one of {ABLATIONS}")
    comp = _component(component)
    by_layer = check_units(model, units, component)
    layers = list(by_layer)
    if method == "resample":
        _no_routed(comp, "resample ablation")
    if per_position and method == "mean":
        _no_routed(comp, "per_position means")
    if method != "zero" and values is None:
        if reference is None:
            raise ValueError(f"method={method!r} needs reference inputs (reference=...) or precomputed values")
        values = (unit_means(model, reference, layers, per_position=per_position, component=component)
                  if method == "mean" else unit_samples(model, reference, layers, component=component))
    if values is not None and method != "zero":
        missing = [layer for layer in layers if not isinstance(values.get(layer), torch.Tensor)]
        if missing:
            raise ValueError(f"values has no tensor for layer(s) {missing} of the ablated units (it has layers "
                             f"{sorted(values)[:8]})")
    replacements = values if values is not None else {}  # read only by "mean" / "resample" (checked above)
    gen = torch.Generator().manual_seed(seed)
    draws: dict[int, torch.Tensor] = {}  # batch size -> reference rows, shared across layers in one forward
    ax = comp.unit_axis

    def check_width(layer: int, v: torch.Tensor, t: torch.Tensor, lead: int, what: str) -> None:
        """``v`` must be ``lead`` leading axes, then one position's activation ``t.shape[2:]``."""
        if v.dim() != lead + t.dim() - 2 or v.shape[lead:] != t.shape[2:]:
            want = ["T_ref"] * lead if lead == 1 else ["R", "T_ref"][:lead]
            raise ValueError(f"values[{layer}] ({what}) has shape {tuple(v.shape)}, but layer {layer}'s "
                             f"{comp.hook_name(layer)} is {tuple(t.shape)} (batch, position, then "
                             f"{tuple(t.shape[2:])}): expected {tuple(want) + tuple(t.shape[2:])}")

    def hook_for(layer: int):
        idx = by_layer[layer]

        def fn(t: torch.Tensor, hook) -> torch.Tensor:
            B, T = t.shape[:2]
            us = torch.tensor(idx, device=t.device)
            at = (slice(None),) * ax + (us,)  # the ablated units of a [B, T, ..., U, ...] activation
            shape = list(t[at].shape)  # [B, T, ..., k, ...]
            if method == "zero":
                rep = torch.zeros(shape, dtype=t.dtype, device=t.device)
            elif method == "mean":
                v = replacements[layer].to(device=t.device, dtype=t.dtype)
                check_width(layer, v, t, 1 if v.dim() == t.dim() - 1 else 0, "means")
                if v.dim() == t.dim() - 1:  # per position [T_ref, ...]
                    if v.shape[0] != T:
                        raise ValueError(f"per-position means have length {v.shape[0]}, the input has {T}")
                    rep = v[None][at].expand(shape)
                else:  # [...] over all positions
                    rep = v[None, None][at].expand(shape)
            else:
                v = replacements[layer].to(device=t.device, dtype=t.dtype)  # [R, T_ref, ...]
                check_width(layer, v, t, 2, "resample draws")
                if v.shape[1] != T:
                    raise ValueError(f"resample reference has length {v.shape[1]}, the input has {T}")
                if B not in draws:
                    draws[B] = torch.randint(0, v.shape[0], (B,), generator=gen)
                rep = v[draws[B].to(t.device)][at]  # [B, T, ..., k, ...]
            mask = position_mask(positions, B, T, t.device)
            t = t.clone()
            if mask is None:
                t[at] = rep
            else:
                t[at] = torch.where(mask.view(B, T, *[1] * (t.dim() - 2)), rep, t[at])
            return t

        return fn

    ids_now: dict[int, torch.Tensor] = {}  # routed units: this forward's unit id of every slot, per layer

    def grab_ids(layer: int):
        def fn(ids: torch.Tensor, hook) -> None:
            ids_now[layer] = ids
        return fn

    def routed_hook_for(layer: int):
        targets = torch.tensor(by_layer[layer])
        if method == "mean":
            v = replacements[layer]
            if v.dim() < 2 or v.shape[0] != comp.counts(model)[layer]:
                raise ValueError(f"mean values of {comp.name} in layer {layer} have shape {tuple(v.shape)}; "
                                 f"expected [{comp.counts(model)[layer]}, ...] (one mean per unit, from unit_means)")

        def fn(t: torch.Tensor, hook) -> torch.Tensor:
            B, T = t.shape[:2]
            ids = ids_now[layer]  # [B, T, k]
            hit = torch.isin(ids, targets.to(ids.device))  # [B, T, k]: slots holding an ablated unit
            mask = position_mask(positions, B, T, t.device)
            if mask is not None:
                hit = hit & mask[:, :, None]
            hit = hit.view(*hit.shape, *[1] * (t.dim() - 3))  # [B, T, k, 1, ...]
            if method == "zero":
                return t.masked_fill(hit, 0.0)
            rep = replacements[layer].to(device=t.device, dtype=t.dtype)[ids]  # [U, ...] -> [B, T, k, ...]
            return torch.where(hit, rep, t)

        return fn

    def new_forward(_module, _inputs) -> None:
        draws.clear()  # a fresh draw per forward pass, shared by every ablated layer of that pass

    if comp.ids_hook is None:
        hooks = [(comp.hook_name(layer), hook_for(layer)) for layer in layers]
    else:
        hooks = [(comp.ids_hook_name(layer), grab_ids(layer)) for layer in layers]
        hooks += [(comp.hook_name(layer), routed_hook_for(layer)) for layer in layers]
    handle = model.register_forward_pre_hook(new_forward)
    try:
        with model.hooks(hooks):
            yield
    finally:
        handle.remove()


# --- patching hooks -----------------------------------------------------------------------------------------
def patch_sites_hook(names: Sequence[str], source: Sequence[torch.Tensor], chunk: Sequence[tuple[int, int, int]],
                     rows: int, *, start: int = 0) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """The hook of one batched activation-patching pass: copy ``j`` of the base batch (rows ``j*rows`` to
    ``(j+1)*rows``) gets site ``chunk[j]`` overwritten with the source run's value.

    Args:
        names: the patched hook point of each layer (``names[layer]``).
        source: the source run's activation at each of them (``[B, T, ...]``).
        chunk: ``(layer, unit, pos)`` sites, one per copy of the batch; ``unit`` -1 is the whole layer, ``pos``
            -1 every position.
        rows: the batch size ``B`` of one copy.
        start: the first position the patched pass computes (a pass resumed at a position, with the earlier
            positions' keys and values cached, sees activations of positions ``start ..`` only); a site's
            ``pos`` is absolute.

    Returns:
        ``hook(activation, hook) -> patched activation``.
    """
    def hook(t: torch.Tensor, hook: Any) -> torch.Tensor:
        layer = names.index(hook.name)
        t = t.clone()
        computed = source[layer][:, start:]  # [B, T - start, ...]: the positions this pass computes
        for j, (site_layer, unit, pos) in enumerate(chunk):
            if site_layer == layer:
                idx = site_index((site_layer, unit, pos - start if pos >= 0 else -1))
                t[j * rows:(j + 1) * rows][idx] = computed[idx].to(t.dtype)
        return t

    return hook


def site_index(site: tuple[int, int, int]) -> tuple:
    """The index into a ``[B, T, (U,) ...]`` activation of one ``(layer, unit, pos)`` site (-1: all)."""
    _, unit, pos = site
    p = slice(None) if pos < 0 else pos
    return (slice(None), p) if unit < 0 else (slice(None), p, unit)


def patch_units_hook(names: Sequence[str], source: Any, by_layer: dict[int, list[int]]
                     ) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """The hook that overwrites units ``by_layer[layer]`` (axis 2, every position) with the source run's values.

    Args:
        names: the patched hook point of each layer (``names[layer]``).
        source: the source run's activations by hook name (a :class:`interp.Trace` or a dict).
        by_layer: ``{layer: unit indices}``.

    Returns:
        ``hook(activation, hook) -> patched activation``.
    """
    def hook(t: torch.Tensor, hook: Any) -> torch.Tensor:
        us = by_layer[names.index(hook.name)]
        t = t.clone()
        t[:, :, us] = source[hook.name][:, :, us].to(t.dtype)
        return t

    return hook


def gradient_probe_hook(acts: dict[str, torch.Tensor], probes: dict[str, torch.Tensor]
                        ) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """The hook of attribution patching: records each activation (into ``acts``) and adds a zero leaf tensor
    (into ``probes``) whose gradient is d metric / d activation.

    Returns:
        ``hook(activation, hook) -> activation + zero probe``.
    """
    def hook(t: torch.Tensor, hook: Any) -> torch.Tensor:
        # Adding a zero leaf gives d metric / d t through every later path, without cutting the graph
        # upstream (detaching t would drop the paths from earlier sites through this one).
        probe = torch.zeros_like(t, requires_grad=True)
        acts[hook.name], probes[hook.name] = t.detach(), probe
        return t + probe

    return hook
