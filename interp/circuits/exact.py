"""Exact edge patching in shared, growing passes.

Patching edge ``(u, d)`` (input ``d`` reads the clean residual plus ``u``'s corrupted minus clean write) changes
nothing before ``d`` reads. Copies of the batch, one per edge, therefore share a pass that grows, as in
:func:`~interp.analysis.activation_patching`: it starts at the lowest layer any of its copies patches, and each
copy joins at its own input's layer from the clean run's residual entering it (``Transformer._forward``'s
``enter``). There the copy's query, key or value of one head, or its MLP's input, is recomputed from the
patched residual; every later layer runs as usual. An edge into the logits needs no block: its logits are the
final norm and unembedding of the clean final residual plus the difference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..analysis.patching import _LOGITS_BYTES
from ..progress import bar as progress_bar
from .graph import Graph
from .patch import edge_pass, qkv_weight

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["CleanRun", "growing_exact"]

Metric = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class CleanRun:
    """What patched copies resume from: the clean run's logits, writes and residuals.

    Attributes:
        logits: ``[B, T, V]``.
        writes: ``[U, B, T, M]`` every upstream node's write.
        resid: ``(layer, "pre" | "mid")`` -> ``[B, T, M]`` the residual entering the block / its MLP;
            ``(n_layers, "pre")`` the final residual.
    """

    logits: torch.Tensor
    writes: torch.Tensor
    resid: dict[tuple[int, str], torch.Tensor]

    @classmethod
    def record(cls, model: Transformer, graph: Graph, tokens: torch.Tensor,
               attention_mask: torch.Tensor | None = None) -> CleanRun:
        """One plain run of ``tokens`` recording what :func:`growing_exact` needs (call under no_grad).

        Example:
            >>> import torch
            >>> from interp.circuits.exact import CleanRun
            >>> from interp.examples import model, clean
            >>> from interp.circuits import build_graph
            >>> with torch.no_grad():
            ...     run = CleanRun.record(model, build_graph(model), clean)
            >>> run.resid[(2, "pre")].shape
            torch.Size([2, 21, 128])
        """
        resid: dict[tuple[int, str], torch.Tensor] = {}
        L = graph.n_layers

        def keep(key: tuple[int, str]):
            def hook(t: torch.Tensor, hook: Any) -> None:
                resid[key] = t.detach()
            return hook

        names = [(f"blocks.{layer}.hook_resid_pre", keep((layer, "pre"))) for layer in range(L)]
        names.append((f"blocks.{L - 1}.hook_resid_post", keep((L, "pre"))))
        if graph.mlp and not graph.parallel:
            names += [(f"blocks.{layer}.hook_resid_mid", keep((layer, "mid"))) for layer in range(L)]
        with edge_pass(model, graph, record=True) as run, model.hooks(names):
            logits = model(tokens, attention_mask=attention_mask)
        return cls(logits, run.stacked_writes(), resid)


def _layer_kind(graph: Graph, d: int) -> tuple[int, str, int]:
    """Input ``d`` as ``(layer, kind, head)``: kind ``"q"`` / ``"k"`` / ``"v"`` / ``"mlp"`` / ``"logits"``."""
    name = graph.downstream[d]
    if name == "logits":
        return graph.n_layers, "logits", 0
    if name.startswith("m"):
        return int(name[1:]), "mlp", 0
    layer, rest = name[1:].split(".h")
    return int(layer), rest[-2], int(rest.split("<")[0])


def _run_group(model: Transformer, graph: Graph, base: CleanRun, delta: list[torch.Tensor],
               where: list[tuple[int, str, int]], attention_mask: torch.Tensor | None,
               last_only: bool) -> torch.Tensor:
    """Logits ``[n B, T', V]`` of ``n`` patched copies, copy ``j`` reading ``delta[j]`` (``[B, T, M]``) more at
    input ``where[j]`` (sorted by layer; no logits inputs)."""
    L = graph.n_layers
    B = base.writes.shape[1]
    joining = [0] * L
    for layer, _, _ in where:
        joining[layer] += 1
    first = where[0][0]
    row0 = [sum(joining[:layer]) for layer in range(L)]  # the first copy joining each layer

    def enter(layer: int, x: torch.Tensor) -> torch.Tensor:
        if not joining[layer]:
            return x
        new = base.resid[(layer, "pre")].repeat(joining[layer], 1, 1)  # [k B, T, M]
        return new if layer == first else torch.cat([x, new])  # [present B, T, M]

    def mine(layer: int, kinds: Sequence[str]) -> list[tuple[int, int, int]]:
        """(copy, head, row) of the copies joining at ``layer`` and patching one of ``kinds``."""
        out, k = [], 0
        for j, (ell, kind, head) in enumerate(where):
            if ell == layer:
                if kind in kinds:
                    out.append((j, head, row0[layer] + k))
                k += 1
        return out

    def qkv_hook(layer: int, kind: str):
        block: Any = model.blocks[layer]
        todo = mine(layer, (kind,))

        def hook(t: torch.Tensor, hook: Any) -> torch.Tensor:
            w, b = qkv_weight(block.attn, kind)  # [n, D, M], [n, D]
            t = t.clone()
            for j, head, row in todo:
                x = block.ln1(base.resid[(layer, "pre")] + delta[j].to(t.dtype))  # [B, T, M]
                new = x @ w[head].T if b is None else x @ w[head].T + b[head]  # [B, T, D]
                t[row * B:(row + 1) * B, :, head] = new.to(t.dtype)
            return t
        return hook

    def mlp_hook(layer: int):
        block: Any = model.blocks[layer]
        norm = block.ln2 if hasattr(block, "ln2") else block.ln1  # a one-norm parallel block shares ln1
        reads = base.resid[(layer, "pre" if graph.parallel else "mid")]
        todo = mine(layer, ("mlp",))

        def hook(_module: Any, args: tuple) -> tuple:
            h = args[0].clone()
            for j, _, row in todo:
                h[row * B:(row + 1) * B] = norm(reads + delta[j].to(h.dtype)).to(h.dtype)
            return (h, *args[1:])
        return hook

    hooks = []
    handles = []
    for layer in sorted({ell for ell, _, _ in where}):
        kinds = {kind for ell, kind, _ in where if ell == layer}
        hooks += [(f"blocks.{layer}.attn.hook_{kind}", qkv_hook(layer, kind)) for kind in ("q", "k", "v")
                  if kind in kinds]
        if "mlp" in kinds:
            mlp: Any = model.blocks[layer].mlp
            handles.append(mlp.register_forward_pre_hook(mlp_hook(layer)))
    try:
        with model.lock, model.hooks(hooks):
            resid_out = model._forward(base.resid[(first, "pre")], attention_mask=attention_mask,
                                       start_at_layer=first, stop_at_layer=L, enter=enter)  # [n B, T, M]
    finally:
        for h in handles:
            h.remove()
    return model.unembed_residual(resid_out[:, -1:] if last_only else resid_out)  # [n B, T', V]


def growing_exact(model: Transformer, graph: Graph, base: CleanRun, source: torch.Tensor,
                  edges: list[tuple[int, int]], metric: Metric, *, batch_size: int = 64,
                  attention_mask: torch.Tensor | None = None, progress: bool | None = None) -> list[float]:
    """The metric with each edge of ``edges`` (``(u, d)`` indices) patched alone, in shared growing passes.

    Args:
        model, graph: the model and its graph.
        base: the clean run (:meth:`CleanRun.record`).
        source: ``[U, B, T, M]`` the corrupted run's writes.
        edges: the edges, as upstream / downstream indices.
        metric: ``metric(logits) -> scalar``; with ``reads_last_only = True`` it gets ``[B, 1, V]``.
        batch_size: rows per pass (copies of the batch).
        attention_mask: optional padding mask.
        progress: a bar over the passes.

    Returns:
        One metric per edge, in the order of ``edges``.

    Example:
        >>> import torch
        >>> from interp.circuits.exact import CleanRun, growing_exact
        >>> from interp.examples import model, clean, corrupted, metric
        >>> from interp.circuits import build_graph, node_writes
        >>> g = build_graph(model); _, src = node_writes(model, g, corrupted)
        >>> with torch.no_grad():
        ...     base = CleanRun.record(model, g, clean)
        ...     vals = growing_exact(model, g, base, src, [(1, g.down("a1.h0<k>"))], metric)
        >>> len(vals)
        1
    """
    B, T = base.writes.shape[1:3]
    last_only = bool(getattr(metric, "reads_last_only", False))
    per = max(1, batch_size // B)
    if not last_only:  # every position's logits come back: keep one pass's under the cap
        row = B * T * model.cfg.d_vocab * base.logits.element_size()
        per = max(1, min(per, _LOGITS_BYTES // row))
    where = [_layer_kind(graph, d) for _, d in edges]
    order = sorted(range(len(edges)), key=lambda i: (where[i][0], i))
    found: list[float] = [0.0] * len(edges)
    groups = [order[k:k + per] for k in range(0, len(order), per)]
    with torch.no_grad():
        for group in progress_bar(groups, desc="exact_scores", progress=progress, unit="pass"):
            delta = [(source[edges[i][0]] - base.writes[edges[i][0]]).expand(B, T, -1) for i in group]  # [B, T, M]
            if where[group[0]][0] == graph.n_layers:  # logits only (they sort last): no block runs
                final = base.resid[(graph.n_layers, "pre")]
                resid = torch.cat([final + d.to(final.dtype) for d in delta])  # [n B, T, M]
                logits = model.unembed_residual(resid[:, -1:] if last_only else resid)
            else:
                blocks = [i for i in group if where[i][0] < graph.n_layers]
                tail = [i for i in group if where[i][0] == graph.n_layers]
                logits = _run_group(model, graph, base, delta[:len(blocks)], [where[i] for i in blocks],
                                    attention_mask, last_only)
                if tail:
                    final = base.resid[(graph.n_layers, "pre")]
                    resid = torch.cat([final + d.to(final.dtype) for d in delta[len(blocks):]])  # [k B, T, M]
                    logits = torch.cat([logits, model.unembed_residual(resid[:, -1:] if last_only else resid)])
            for j, i in enumerate(group):
                found[i] = float(metric(logits[j * B:(j + 1) * B]))
    return found
