"""Edge interventions: run the model with chosen edges carrying another run's values, through hooks.

Every downstream input ``d`` of the :class:`~interp.circuits.graph.Graph` reads

    ``input_d = resid_d - sum_u a[u, d] * (write_u - source_u)``

where ``resid_d`` is the residual the model feeds it in this pass (the sum of every node's current write),
``write_u`` is node ``u``'s write in this pass, ``source_u`` its write in the source run (corrupted, or a mean
or resampled reference) and ``a[u, d]`` in [0, 1] says how much of edge ``(u, d)`` is ablated: 1 replaces the
edge's value by the source's, 0 keeps it, a fraction (Edge Pruning's gates) mixes them. Nodes then compute from
their own inputs: an ablation propagates downstream through the nodes it changes (ACDC's semantics).

Queries, keys and values of each head are recomputed from their own inputs at ``hook_q`` / ``hook_k`` /
``hook_v`` (before QK-norm and rotary, which then apply as usual); an MLP's input is replaced by a forward
pre-hook on the MLP module, the logits' input by one on the final norm (or the unembedding). Head writes are
read at ``hook_result``, MLP writes at ``hook_mlp_out`` and the embedding at ``blocks.0.hook_resid_pre``.

Several ablation patterns run in one pass as variants: ``a`` of shape ``[V, U, D]`` runs ``V`` copies of the
batch (rows ``v * B .. (v + 1) * B``), each with its own pattern.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .graph import Graph

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["EdgePass", "PassHooks", "edge_pass", "node_hooks", "node_writes", "qkv_weight"]

# Below this fraction of non-zero ablation weights a layer's deltas are gathered edge by edge, above it by one
# dense contraction over every upstream node.
_SPARSE = 0.05


@dataclass
class EdgePass:
    """What one pass with edge interventions recorded.

    Attributes:
        writes: every upstream node's write ``[U, R, T, M]`` in upstream order, when ``record`` (detached: each
            group's write is copied into its rows as it is made, so no list of them is stacked afterwards).
        probes: downstream group key ``(layer, kind)`` -> the zero tensor added to those inputs
            (``[R, T, n, M]``; requires grad), when ``probes``.
    """

    writes: torch.Tensor | None = None
    probes: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    #: The 0-d leaf every probe expands (a view, not a buffer per input): backward into it alone computes
    #: no parameter gradients, and each probe's gradient can be consumed by a hook and freed as it arrives.
    probe_base: torch.Tensor = field(default_factory=lambda: torch.zeros((), requires_grad=True))

    def stacked_writes(self) -> torch.Tensor:
        """Every upstream write as ``[U, R, T, M]``, in the graph's upstream order.

        Raises:
            ValueError: the pass did not record (``edge_pass(record=False)``) or ran no forward.
        """
        if self.writes is None:
            raise ValueError("this pass recorded no writes: run a forward inside edge_pass(..., record=True)")
        return self.writes


def qkv_weight(attn: Any, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An attention layer's W_q / W_k / W_v rows (``kind`` "q", "k" or "v") as ``[n, D, M]`` and their bias
    ``[n, D]`` (or None).

    Example:
        >>> from interp.circuits.patch import qkv_weight
        >>> from interp.examples import model
        >>> w, b = qkv_weight(model.blocks[0].attn, "k")
        >>> tuple(w.shape)
        (4, 32, 128)
    """
    H, K, D = attn.n_heads, attn.n_kv_heads, attn.d_head
    start, n = {"q": (0, H), "k": (H * D, K), "v": (H * D + K * D, K)}[kind]
    w = attn.W_qkv.weight[start:start + n * D].view(n, D, -1)  # [n*D, M] -> [n, D, M]
    b = attn.W_qkv.bias
    return w, None if b is None else b[start:start + n * D].view(n, D)  # [n*D] -> [n, D]


class _Interventions:
    """The hooks of one pass (see the module docstring)."""

    def __init__(self, model: Transformer, graph: Graph, *, source: torch.Tensor | None, ablate: torch.Tensor | None,
                 probes: bool, record: bool, embed: torch.Tensor | None) -> None:
        self.model, self.graph = model, graph
        self.source = source  # [U, B, T, M] or [U, 1|B, 1|T, M]
        if ablate is not None:
            ablate = ablate.to(torch.float32) * graph.allowed.to(ablate.device)
            if ablate.dim() == 2:
                ablate = ablate[None]  # [1, U, D]
        self.ablate = ablate  # [V, U, D] or None
        self.want_probes, self.record, self.embed = probes, record, embed
        self.run = EdgePass()
        self.resid: dict[tuple[int, str], torch.Tensor] = {}  # (layer, "pre"|"mid") -> [R, T, M]
        self.diffs: list[tuple[slice, torch.Tensor]] = []  # (upstream slice, [V, n, B, T, M]) so far
        self.n_up = 0  # upstream nodes written so far

    # --- what a downstream group reads ---------------------------------------------------------------
    def _delta(self, cols: slice, like: torch.Tensor) -> torch.Tensor | None:
        """``-sum_u a[u, d] (write_u - source_u)`` for the inputs ``cols``: ``[R, T, n, M]``, or None if zero."""
        if self.ablate is None or not self.diffs:
            return None
        a = self.ablate[:, : self.n_up, cols].to(like.device)  # [V, U_sofar, n]
        if not bool(a.any()):
            return None
        V, n = a.shape[0], a.shape[2]
        R, T, M = like.shape
        B = R // V
        delta = like.new_zeros(V, n, B, T, M, dtype=torch.float32)
        for ups, diff in self.diffs:
            w = a[:, ups]  # [V, n_u, n]
            nz = w.nonzero()
            if not len(nz):
                continue
            if len(nz) <= _SPARSE * w.numel():
                v, u, d = nz.unbind(1)
                vals = w[v, u, d].view(-1, 1, 1, 1)
                delta.index_put_((v, d), -(vals * diff[v, u].float()), accumulate=True)  # [nnz, B, T, M]
            else:
                delta -= torch.einsum("vubtm,vud->vdbtm", diff.float(), w)
        return delta.permute(0, 2, 3, 1, 4).reshape(R, T, n, M).to(like.dtype)  # [V, n, B, T, M] -> [R, T, n, M]

    def _input(self, key: tuple[int, str], cols: slice, resid: torch.Tensor) -> torch.Tensor | None:
        """The residual each input of ``cols`` reads, ``[R, T, n, M]``, or None when it is ``resid`` for all."""
        n = cols.stop - cols.start
        delta = self._delta(cols, resid)
        if self.want_probes:
            base = self.run.probe_base
            probe = base.to(resid.device, resid.dtype).expand(resid.shape[0], resid.shape[1], n, resid.shape[2])
            self.run.probes[key] = probe
            delta = probe if delta is None else delta + probe
        if delta is None:
            return None
        return resid[:, :, None, :] + delta  # [R, T, n, M]

    # --- what an upstream group writes ------------------------------------------------------------------
    def _wrote(self, write: torch.Tensor) -> None:
        """Record an upstream group's current write ``[R, T, n, M]``."""
        n = write.shape[2]
        ups = slice(self.n_up, self.n_up + n)
        if self.record:
            if self.run.writes is None:
                R, T, _, M = write.shape
                self.run.writes = write.new_empty(len(self.graph.upstream), R, T, M)  # [U, R, T, M]
            self.run.writes[ups].copy_(write.detach().permute(2, 0, 1, 3))  # [R, T, n, M] -> [n, R, T, M]
        if self.ablate is not None and self.source is not None:
            V = self.ablate.shape[0]
            R, T, _, M = write.shape
            cur = write.view(V, R // V, T, n, M).permute(0, 3, 1, 2, 4)  # [V, n, B, T, M]
            src = self.source[ups].to(write.device, write.dtype)  # [n, B|1, T|1, M]
            self.diffs.append((ups, cur - src[None]))  # [V, n, B, T, M]
        self.n_up += n

    # --- hooks --------------------------------------------------------------------------------------
    def resid_pre(self, layer: int):
        def hook(t: torch.Tensor, hook: Any) -> torch.Tensor:
            if layer == 0:
                if self.embed is not None:
                    t = self.embed.to(t.dtype)
                self._wrote(t[:, :, None, :])
            self.resid[(layer, "pre")] = t
            return t
        return hook

    def resid_mid(self, layer: int):
        def hook(t: torch.Tensor, hook: Any) -> None:
            self.resid[(layer, "mid")] = t
        return hook

    def qkv(self, layer: int, kind: str):
        block = self.model.blocks[layer]
        cols = self.graph.down_slice(layer, kind)

        def hook(t: torch.Tensor, hook: Any) -> torch.Tensor | None:
            x = self._input((layer, kind), cols, self.resid[(layer, "pre")])
            if x is None:
                return None
            w, b = qkv_weight(block.attn, kind)
            out = torch.einsum("btnm,ndm->btnd", block.ln1(x), w)  # [R, T, n, D]
            return (out if b is None else out + b).to(t.dtype)
        return hook

    def result(self, t: torch.Tensor, hook: Any) -> None:
        self._wrote(t)

    def mlp_pre(self, layer: int):
        block = self.model.blocks[layer]
        norm = block.ln2 if hasattr(block, "ln2") else block.ln1  # a one-norm parallel block shares ln1
        cols = self.graph.down_slice(layer, "mlp")
        where = "pre" if self.graph.parallel else "mid"

        def hook(_module: Any, args: tuple) -> tuple | None:
            x = self._input((layer, "mlp"), cols, self.resid[(layer, where)])
            return None if x is None else (norm(x[:, :, 0]), *args[1:])
        return hook

    def mlp_out(self, t: torch.Tensor, hook: Any) -> None:
        self._wrote(t[:, :, None, :])

    def logits_pre(self, _module: Any, args: tuple) -> tuple | None:
        x = self._input((-1, "logits"), self.graph.down_slice(-1, "logits"), args[0])
        return None if x is None else (x[:, :, 0], *args[1:])


@contextlib.contextmanager
def edge_pass(model: Transformer, graph: Graph, *, source: torch.Tensor | None = None,
              ablate: torch.Tensor | None = None, probes: bool = False, record: bool = False,
              embed: torch.Tensor | None = None) -> Iterator[EdgePass]:
    """Install the hooks of one pass with edge interventions; forward passes inside the block use them.

    Args:
        model: the model ``graph`` was built from.
        graph: its :class:`~interp.circuits.graph.Graph`.
        source: ``[U, B, T, M]`` the source run's upstream writes (broadcastable over batch and position:
            a mean ablation passes ``[U, 1, T, M]`` or ``[U, 1, 1, M]``); needed with ``ablate``.
        ablate: ``[U, D]`` or ``[V, U, D]`` weights in [0, 1] (1 = the edge carries the source's value); ``V``
            variants run as ``V`` copies of the batch. Edges that do not exist are ignored.
        probes: add a zero tensor to every downstream input (``EdgePass.probes``, views of the leaf
            ``EdgePass.probe_base``): the gradient of a metric with respect to it is the gradient with respect to
            that input.
        record: keep every upstream node's write (``EdgePass.writes``).
        embed: ``[R, T, M]`` replaces the embedding (the residual entering layer 0).

    Yields:
        The :class:`EdgePass` the hooks fill.

    Raises:
        ValueError: ``ablate`` without ``source``, or of the wrong shape.

    Example:
        >>> from interp.circuits.patch import edge_pass
        >>> from interp.examples import model, clean
        >>> from interp.circuits import build_graph
        >>> g = build_graph(model)
        >>> with edge_pass(model, g, record=True) as run:
        ...     logits = model(clean)
        >>> run.stacked_writes().shape
        torch.Size([9, 2, 21, 128])
    """
    if ablate is not None:
        if source is None:
            raise ValueError("ablate needs source=[U, B, T, M], the writes the ablated edges carry")
        shape = (len(graph.upstream), len(graph.downstream))
        if tuple(ablate.shape[-2:]) != shape or ablate.dim() not in (2, 3):
            raise ValueError(f"ablate has shape {tuple(ablate.shape)}, expected {shape} or [V, *{shape}]")
    state = _Interventions(model, graph, source=source, ablate=ablate, probes=probes, record=record, embed=embed)
    with node_hooks(model, graph, state, writes=True):
        yield state.run


class PassHooks(Protocol):
    """The hooks of one pass over a graph's nodes (:func:`node_hooks` installs them)."""

    def resid_pre(self, layer: int) -> Callable: ...
    def resid_mid(self, layer: int) -> Callable: ...
    def qkv(self, layer: int, kind: str) -> Callable: ...
    def result(self, t: torch.Tensor, hook: Any) -> Any: ...
    def mlp_out(self, t: torch.Tensor, hook: Any) -> Any: ...
    def mlp_pre(self, layer: int) -> Callable: ...
    def logits_pre(self, module: Any, args: tuple) -> Any: ...


@contextlib.contextmanager
def node_hooks(model: Transformer, graph: Graph, state: PassHooks, *, writes: bool) -> Iterator[None]:
    """Install ``state``'s hooks on every node of ``graph``: the residual entering each layer (and its middle in a
    sequential block with an MLP), each layer's q / k / v, each MLP's input (a forward pre-hook), the logits'
    input (a pre-hook on the final norm, or the unembedding) and, with ``writes``, the heads' and MLPs' writes.

    Args:
        model, graph: the model and its graph.
        state: the pass's hooks (:class:`PassHooks`).
        writes: hook ``hook_result`` and ``hook_mlp_out`` (off: the per-head writes are never formed).

    Yields:
        None; the hooks are removed on exit.

    Example:
        >>> from interp.circuits.patch import node_hooks, _Interventions
        >>> from interp.examples import model, clean
        >>> from interp.circuits import build_graph
        >>> g = build_graph(model)
        >>> state = _Interventions(model, g, source=None, ablate=None, probes=False, record=True, embed=None)
        >>> with node_hooks(model, g, state, writes=True):
        ...     _ = model(clean)
        >>> state.run.writes.shape  # the embedding and each layer's heads
        torch.Size([9, 2, 21, 128])
    """
    hooks: list[tuple[str, Any]] = []
    handles = []
    for layer, block in enumerate(model.blocks):
        mlp: Any = block.mlp
        hooks.append((f"blocks.{layer}.hook_resid_pre", state.resid_pre(layer)))
        for kind in ("q", "k", "v"):
            hooks.append((f"blocks.{layer}.attn.hook_{kind}", state.qkv(layer, kind)))
        if writes:
            hooks.append((f"blocks.{layer}.attn.hook_result", state.result))
        if graph.mlp:
            if not graph.parallel:
                hooks.append((f"blocks.{layer}.hook_resid_mid", state.resid_mid(layer)))
            if writes:
                hooks.append((f"blocks.{layer}.hook_mlp_out", state.mlp_out))
            handles.append(mlp.register_forward_pre_hook(state.mlp_pre(layer)))
    reader: Any = model.ln_final if model.ln_final is not None else model.unembed
    handles.append(reader.register_forward_pre_hook(state.logits_pre))
    try:
        with model.hooks(hooks):
            yield
    finally:
        for h in handles:
            h.remove()


def node_writes(model: Transformer, graph: Graph, tokens: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every upstream node's write of one plain run (no gradient), and the final residual the logits read.

    The run stops before the unembedding: the writes do not need it, and on a large vocabulary it is a fifth of a
    forward pass (SmolLM2: 49,152 x 576). ``model.unembed_residual(final)`` gives the run's logits.

    Args:
        model, graph: the model and its graph.
        tokens: ``[B, T]`` ids.
        attention_mask: optional ``[B, T]`` padding mask.

    Returns:
        ``(final [B, T, M], writes [U, B, T, M])``.

    Example:
        >>> import torch
        >>> from interp.circuits.patch import node_writes
        >>> from interp.examples import model, clean
        >>> from interp.circuits import build_graph
        >>> final, writes = node_writes(model, build_graph(model), clean)
        >>> writes.shape  # input, 2 x 4 heads
        torch.Size([9, 2, 21, 128])
        >>> torch.testing.assert_close(model.unembed_residual(final), model(clean))  # per-head writes: rounding
    """
    with torch.no_grad(), edge_pass(model, graph, record=True) as run:
        final = model(tokens, attention_mask=attention_mask, stop_at_layer=model.cfg.n_layers)  # [B, T, M]
    return final, run.stacked_writes()
