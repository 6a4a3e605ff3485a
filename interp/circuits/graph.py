"""The computation graph of a model at head granularity: which node writes into which node's input.

Upstream nodes (they write into the residual stream): ``"input"`` (the embedding: the residual entering layer 0),
every attention head ``"a{l}.h{h}"`` and every MLP ``"m{l}"`` (a mixture-of-experts layer's experts, router and
shared expert taken together). Downstream inputs (they read the residual stream): each head's query input
``"a{l}.h{h}<q>"``, each K/V head's key and value inputs ``"a{l}.h{g}<k>"`` / ``"a{l}.h{g}<v>"`` (``g`` indexes the
layer's K/V heads: with grouped-query attention one key input serves its group of query heads), every MLP's input
``"m{l}"`` and the unembedding's input ``"logits"``.

An edge ``(u, d)`` exists when ``u`` writes before ``d`` reads: the residual ``d`` reads is then the sum of ``u``'s
write and the others (and constant biases). Layer l's heads feed its MLP in a sequential block; in a parallel block
(GPT-NeoX, Phi) both sublayers read the same residual, so no head feeds its own layer's MLP.

Only models whose residual stream is a plain sum of per-node writes decompose this way. Post-norm blocks (BERT),
norms on the sublayers' outputs (Gemma, OLMo 2), cross-attention, multi-head latent attention (queries, keys and
values from shared latents) and models without an unembedding are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["Graph", "build_graph", "check_decomposable"]


def check_decomposable(model: Transformer) -> None:
    """Refuse, by name, a model whose blocks do not write per-node sums into the residual stream.

    Raises:
        ValueError: post-norm blocks, sublayer output norms, cross-attention, latent attention, or no unembedding.

    Example:
        >>> from interp.circuits.graph import check_decomposable
        >>> from interp.examples import model
        >>> check_decomposable(model)  # induction-2l: pre-norm, attention only
    """
    cfg = model.cfg
    refusals = [
        (cfg.normalization == "post", f"normalization={cfg.normalization!r} (a norm after each sublayer mixes "
                                      "every node's write)"),
        (cfg.sublayer_norm != "input", f"sublayer_norm={cfg.sublayer_norm!r} (a norm on each sublayer's output "
                                       "mixes its heads' writes)"),
        (cfg.cross_attention, "cross_attention=True (keys and values read a second sequence)"),
        (cfg.attention == "latent", "attention='latent' (queries, keys and values come from shared latents)"),
        (not cfg.unembed, "unembed=False (no logits node)"),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(f"circuits need a residual stream that is a sum of per-node writes; this model has {why}")


@dataclass(frozen=True)
class Graph:
    """Nodes and allowed edges of a model (see the module docstring for the node names).

    Attributes:
        upstream: names of the nodes that write, in the order of the forward pass.
        downstream: names of the inputs that read, in the order of the forward pass.
        allowed: ``[U, D]`` bool, True where ``upstream[u]`` writes before ``downstream[d]`` reads.
        n_layers, parallel: the model's layer count and whether its blocks are parallel.
        heads, kv_heads: per layer, the number of query heads and of K/V heads.
        mlp: whether the layers have an MLP.
        feeds: per downstream input, the upstream nodes whose write it feeds (a query its head, a key or value
            its group's heads, an MLP input its MLP; the logits none).

    Example:
        >>> from interp.circuits.graph import build_graph
        >>> from interp.examples import model
        >>> g = build_graph(model)
        >>> g.n_edges, g.upstream[:2], g.downstream[-1]
        (81, ('input', 'a0.h0'), 'logits')
    """

    upstream: tuple[str, ...]
    downstream: tuple[str, ...]
    allowed: torch.Tensor
    n_layers: int
    parallel: bool
    heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    mlp: bool
    feeds: tuple[tuple[int, ...], ...] = ()
    _up_index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _down_index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._up_index.update({n: i for i, n in enumerate(self.upstream)})
        self._down_index.update({n: i for i, n in enumerate(self.downstream)})

    @property
    def n_edges(self) -> int:
        """The number of edges."""
        return int(self.allowed.sum())

    @property
    def edges(self) -> list[tuple[str, str]]:
        """Every edge as ``(upstream, downstream)`` names, in the order of :meth:`edge_index`."""
        return [(self.upstream[u], self.downstream[d]) for u, d in self.allowed.nonzero().tolist()]

    def up(self, name: str) -> int:
        """Index of an upstream node. Raises ValueError naming an unknown node."""
        if name not in self._up_index:
            raise ValueError(f"{name!r} is not an upstream node of this model's graph "
                             f"(known: 'input', 'a{{l}}.h{{h}}', 'm{{l}}' for {self.n_layers} layers)")
        return self._up_index[name]

    def down(self, name: str) -> int:
        """Index of a downstream input. Raises ValueError naming an unknown input."""
        if name not in self._down_index:
            raise ValueError(f"{name!r} is not a downstream input of this model's graph "
                             "(known: 'a{l}.h{h}<q|k|v>', 'm{l}', 'logits')")
        return self._down_index[name]

    def edge_mask(self, edges: list[tuple[str, str]] | set[tuple[str, str]]) -> torch.Tensor:
        """``[U, D]`` bool mask of ``edges``.

        Raises:
            ValueError: an edge that names an unknown node or does not exist (its upstream writes after its input
                reads).

        Example:
            >>> from interp.circuits.graph import build_graph
            >>> from interp.examples import model
            >>> int(build_graph(model).edge_mask([("input", "logits")]).sum())
            1
        """
        mask = torch.zeros_like(self.allowed)
        for edge in edges:
            if not (isinstance(edge, tuple | list) and len(edge) == 2):
                raise ValueError(f"an edge is an (upstream, downstream) pair of names, got {edge!r}")
            u, d = self.up(edge[0]), self.down(edge[1])
            if not self.allowed[u, d]:
                raise ValueError(f"edge {tuple(edge)!r} does not exist: {edge[0]!r} writes after {edge[1]!r} reads")
            mask[u, d] = True
        return mask

    def edges_of(self, mask: torch.Tensor) -> list[tuple[str, str]]:
        """The edges where ``mask`` (``[U, D]``) is True."""
        return [(self.upstream[u], self.downstream[d]) for u, d in (mask & self.allowed).nonzero().tolist()]

    def node_of(self, down: str) -> str:
        """The node a downstream input belongs to: ``"a1.h0<k>"`` -> ``"a1.h0"``, ``"m1"`` -> ``"m1"``."""
        return down.split("<")[0]

    def down_slice(self, layer: int, kind: str) -> slice:
        """The downstream indices of layer ``layer``'s ``kind`` inputs (``"q"``, ``"k"``, ``"v"``, ``"mlp"``), or
        of ``"logits"`` (layer ignored)."""
        return self._down_slices[(layer, kind) if kind != "logits" else (-1, "logits")]

    @property
    def _down_slices(self) -> dict[tuple[int, str], slice]:
        out: dict[tuple[int, str], slice] = {}
        i = 0
        for layer in range(self.n_layers):
            for kind, n in (("q", self.heads[layer]), ("k", self.kv_heads[layer]), ("v", self.kv_heads[layer]),
                            ("mlp", 1 if self.mlp else 0)):
                out[(layer, kind)] = slice(i, i + n)
                i += n
        out[(-1, "logits")] = slice(i, i + 1)
        return out

    def up_slice(self, layer: int, kind: str) -> slice:
        """The upstream indices of layer ``layer``'s ``"heads"`` or ``"mlp"``, or of ``"input"``."""
        if kind == "input":
            return slice(0, 1)
        i = 1
        for ell in range(self.n_layers):
            for k, n in (("heads", self.heads[ell]), ("mlp", 1 if self.mlp else 0)):
                if ell == layer and k == kind:
                    return slice(i, i + n)
                i += n
        raise ValueError(f"no upstream {kind!r} in layer {layer}")


def build_graph(model: Transformer) -> Graph:
    """The head-level computation graph of ``model``, from its config.

    Args:
        model: an interp Transformer whose residual stream is a sum of per-node writes.

    Returns:
        A :class:`Graph`.

    Raises:
        ValueError: a model that does not decompose (see :func:`check_decomposable`).

    Example:
        >>> from interp.circuits.graph import build_graph
        >>> from interp.examples import model
        >>> g = build_graph(model)
        >>> len(g.upstream), len(g.downstream)
        (9, 25)
    """
    check_decomposable(model)
    cfg = model.cfg
    L = cfg.n_layers
    heads = tuple(block.attn.n_heads for block in model.blocks)
    kv_heads = tuple(getattr(block.attn, "n_kv_heads", block.attn.n_heads) for block in model.blocks)
    mlp = not cfg.attn_only
    parallel = cfg.parallel_block != "none"
    # Stages order writes and reads: u feeds d when write_stage(u) < read_stage(d). Layer l's attention reads at
    # 4l+1, its heads write at 4l+2, its MLP reads at 4l+3 (4l+1 in a parallel block: the same residual as the
    # heads) and writes at 4l+4; the logits read after everything.
    up, up_stage = ["input"], [0]
    down: list[str] = []
    down_stage: list[int] = []
    for layer in range(L):
        up += [f"a{layer}.h{h}" for h in range(heads[layer])]
        up_stage += [4 * layer + 2] * heads[layer]
        for kind, n in (("q", heads[layer]), ("k", kv_heads[layer]), ("v", kv_heads[layer])):
            down += [f"a{layer}.h{h}<{kind}>" for h in range(n)]
            down_stage += [4 * layer + 1] * n
        if mlp:
            up.append(f"m{layer}")
            up_stage.append(4 * layer + 4)
            down.append(f"m{layer}")
            down_stage.append(4 * layer + (1 if parallel else 3))
    down.append("logits")
    down_stage.append(4 * L + 1)
    index = {n: i for i, n in enumerate(up)}
    feeds: list[tuple[int, ...]] = []
    for layer, block in enumerate(model.blocks):
        H, K = heads[layer], kv_heads[layer]
        attn: Any = block.attn
        kv_of = getattr(attn, "kv_index", None)
        group = [int(kv_of[h]) if kv_of is not None else h // max(1, H // max(1, K)) for h in range(H)]
        feeds += [(index[f"a{layer}.h{h}"],) for h in range(H)]
        for _ in ("k", "v"):
            feeds += [tuple(index[f"a{layer}.h{h}"] for h in range(H) if group[h] == g) for g in range(K)]
        if mlp:
            feeds.append((index[f"m{layer}"],))
    feeds.append(())
    allowed = torch.tensor(up_stage)[:, None] < torch.tensor(down_stage)[None, :]  # [U, D]
    return Graph(upstream=tuple(up), downstream=tuple(down), allowed=allowed, n_layers=L, parallel=parallel,
                 heads=heads, kv_heads=kv_heads, mlp=mlp, feeds=tuple(feeds))
