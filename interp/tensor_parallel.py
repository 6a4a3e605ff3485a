"""Heads across ranks: tensor parallelism over attention heads, Megatron style, on ``torch.distributed``.

Rank ``r`` of ``W`` holds a contiguous share of every layer's query heads (:func:`head_split`) with the K/V heads
they read, and ``1 / W`` of every dense MLP's hidden units; the embeddings, norms, unembedding, MLA's shared
latent projections and any mixture-of-experts layer are replicated. Each attention and dense MLP module returns
its partial sum of the residual write, and one ``all_reduce`` after it makes the residual stream whole again on
every rank, so every hook point outside the split modules sees what one process sees.

Why a shard is a pruned model: a rank's attention is exactly the model with the other ranks' heads removed, so
the shard is :func:`interp.pruning.remove_heads` of the model (per-layer head counts, K/V groups kept together
when the split follows them, a K/V head repeated on the ranks that share its group otherwise) plus a narrower
MLP. Its forward, hooks, head gates, KV cache and ``generate`` are the model's own; nothing here is a second
forward. ``torch.distributed.tensor`` (DTensor) was not used: its sharded ``nn.Linear`` hides the per-head
layout behind a redistributed tensor, and the per-head hook points would have to be re-gathered to be read.
Here per-head records stay on the rank that owns the head, and :meth:`HeadParallel.run_with_cache` gathers
them along the head axis only when rank 0 builds a :class:`~interp.trace.Trace`.

Biases of W_O and of the MLP's output are kept on rank 0 only (every rank adds its partial sum). Autograd sees
Megatron's pair of operators: the reduction after a split module passes the gradient through unchanged (every rank
computes the same loss from the same whole residual), and the module's input sums its gradient over ranks on the
way back. Gradient-based analyses (attribution patching, Michel importance, gate gradients) therefore get one
process's gradients on every rank, for the replicated weights and for each rank's own heads.

Example (``torchrun --nproc_per_node 2 script.py``)::

    from interp import distributed
    from interp.tensor_parallel import HeadParallel

    distributed.init_from_env()
    tp = HeadParallel.from_model(model)                   # every rank passes the same model
    logits = tp(tokens)                                    # on every rank
    logits, trace = tp.run_with_cache(tokens, names_filter="*hook_pattern")   # trace on rank 0; None elsewhere
    distributed.shutdown()
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import distributed
from .hooks import NamesFilter
from .model import MLP, Transformer
from .placement import build
from .trace import Trace

if TYPE_CHECKING:
    import pandas as pd
    from torch.utils.hooks import RemovableHandle

__all__ = ["HeadParallel", "head_split", "shard_heads", "shard_slices", "zero_output_biases"]

# Hook points whose tensors hold one slice per query head, and the axis of the heads.
_QUERY_HEAD_AXIS = {"hook_q": 2, "hook_q_normed": 2, "hook_z": 2, "hook_result": 2, "hook_attn_scores": 1,
                    "hook_pattern": 1}
# K/V hook points: per K/V head on grouped attention (a head may sit on several ranks), per query head on MLA.
_KV_HEAD_AXIS = {"hook_k": 2, "hook_v": 2, "hook_k_normed": 2}


def head_split(n_heads: int, world: int) -> list[list[int]]:
    """The query heads each of ``world`` ranks holds in a layer of ``n_heads``: contiguous, as even as can be (the
    earlier ranks take one more when ``world`` does not divide).

    Contiguous shares keep grouped-query groups together whenever ``world`` divides the K/V head count (and a
    head count that divides evenly); otherwise a group's K/V head is held by each rank that holds one of its
    query heads.

    Args:
        n_heads: the layer's query heads.
        world: the ranks.

    Returns:
        One list of head indices per rank (a rank may get none when ``n_heads < world``).

    Raises:
        ValueError: ``world`` < 1 or ``n_heads`` < 0.

    Example:
        >>> from interp.tensor_parallel import head_split
        >>> head_split(6, 4)
        [[0, 1], [2, 3], [4], [5]]
    """
    if world < 1:
        raise ValueError(f"head_split: world={world} must be at least 1")
    if n_heads < 0:
        raise ValueError(f"head_split: n_heads={n_heads} must not be negative")
    base, extra = divmod(n_heads, world)
    out, start = [], 0
    for r in range(world):
        n = base + (1 if r < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def _dense_mlp_split(d_mlp: int, world: int) -> int:
    if d_mlp % world:
        raise ValueError(f"shard_heads: d_mlp={d_mlp} does not divide over world={world} ranks; every rank "
                         "needs an equal share of each dense MLP's hidden units (the config has one d_mlp)")
    return d_mlp // world


@torch.no_grad()
def shard_heads(model: Transformer, rank: int, world: int) -> Transformer:
    """Rank ``rank``'s shard of ``model`` for head-parallel runs: its heads (:func:`head_split` of each layer), the
    K/V heads they read, its share of each dense MLP, and everything else replicated.

    Args:
        model: a native :class:`~interp.Transformer` (MHA, GQA, MQA or MLA; dense or mixture-of-experts MLPs,
            the experts replicated). Every rank passes the same model.
        rank: this rank.
        world: the ranks.

    Returns:
        A new :class:`~interp.Transformer` whose attention and dense MLP outputs are this rank's partial sums
        (:class:`HeadParallel` adds the reduction). ``model`` is left unchanged.

    Raises:
        ValueError: ``rank`` outside ``0 .. world - 1``, a dense ``d_mlp`` that ``world`` does not divide, or a
            setting under which heads are not separable (``qk_norm='full'``, cross-attention).
        TypeError: not a native :class:`~interp.Transformer`, or weights kept quantised.

    Example:
        >>> from interp.tensor_parallel import shard_heads
        >>> from interp import ModelConfig
        >>> from interp.placement import build
        >>> full = build(ModelConfig(n_layers=1, d_model=16, n_heads=4, n_kv_heads=2, d_vocab=8, n_ctx=8), seed=0)
        >>> [shard_heads(full, r, 2).blocks[0].attn.n_heads for r in range(2)]
        [2, 2]
    """
    from .pruning.surgery import remove_heads  # pruning sits above the core; only the shard builder needs it

    if not isinstance(model, Transformer):
        raise TypeError(f"shard_heads: model must be a native interp Transformer, got {type(model).__name__}")
    if not 0 <= rank < world:
        raise ValueError(f"shard_heads: rank={rank} is outside 0 .. {world - 1} (world={world})")
    if model.cfg.cross_attention:
        raise ValueError("shard_heads: cross_attention=True is not split over heads (an encoder-decoder's "
                         "cross-attention would need its own reduction); run it in one process")
    owned = [head_split(block.attn.n_heads, world)[rank] for block in model.blocks]
    latent = model.cfg.attention == "latent"
    layout = [(block.attn.n_heads, list(range(block.attn.n_heads)) if latent else model.cfg.kv_map(layer))
              for layer, block in enumerate(model.blocks)]
    drop = {layer: [h for h in range(block.attn.n_heads) if h not in owned[layer]]
            for layer, block in enumerate(model.blocks)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="remove_heads: every head")  # a rank may own no head of a layer
        shard = remove_heads(model, drop)
    dense = [isinstance(block.mlp, MLP) for block in shard.blocks]
    if any(dense) and world > 1:
        shard = _narrow_dense_mlps(shard, rank, world)
    if rank != 0:
        zero_output_biases(shard)
    shard.tp_heads = owned  # type: ignore[assignment]  # global query-head ids of each layer, for gathers
    shard.tp_layout = layout  # type: ignore[assignment]
    shard.tp_rank, shard.tp_world = rank, world  # type: ignore[assignment]
    return shard


@torch.no_grad()
def zero_output_biases(shard: Transformer) -> None:
    """Zero the output biases of the split modules (W_O's and each dense MLP's W_out) of a shard that is not rank
    0's: every rank adds its partial write, and the biases are added once, on rank 0."""
    for block in shard.blocks:
        if block.attn.W_O.bias is not None:
            block.attn.W_O.bias.zero_()
        if isinstance(block.mlp, MLP) and block.mlp.W_out.bias is not None:
            block.mlp.W_out.bias.zero_()


def _mlp_slices(model: Transformer, rank: int, world: int) -> dict[str, tuple[int, torch.Tensor]]:
    """This rank's contiguous share of each dense MLP's hidden units: ``{state key: (dim, index)}`` (rows of W_in /
    W_gate and their biases, columns of W_out)."""
    if world == 1 or not any(isinstance(block.mlp, MLP) for block in model.blocks):
        return {}
    width = _dense_mlp_split(model.cfg.d_mlp, world)
    rows = torch.arange(rank * width, (rank + 1) * width)  # [F/W]
    keys = set(model.state_dict())
    plan: dict[str, tuple[int, torch.Tensor]] = {}
    for layer, block in enumerate(model.blocks):
        if not isinstance(block.mlp, MLP):
            continue
        pre = f"blocks.{layer}.mlp."
        for key in (pre + "W_in.weight", pre + "W_in.bias", pre + "W_gate.weight", pre + "W_gate.bias"):
            if key in keys:
                plan[key] = (0, rows)  # [F/W, M] / [F/W]
        plan[pre + "W_out.weight"] = (1, rows)  # [M, F/W]
    return plan


def shard_slices(model: Transformer, rank: int, world: int) -> dict[str, tuple[int, torch.Tensor]]:
    """Where each weight of rank ``rank``'s :func:`shard_heads` shard lies in the whole model's: ``{state key:
    (dim, index)}`` for the weights the shard cuts (its heads' rows and columns, its MLP share); every other
    weight is the whole model's. :func:`interp.zoo.checkpoint.load_checkpoint_heads` reads these slices straight
    from a checkpoint.

    Args:
        model: the whole model (its skeleton on the meta device will do).
        rank: this rank.
        world: the ranks.

    Returns:
        ``{key: (dim, index LongTensor)}``.

    Example:
        >>> from interp.tensor_parallel import shard_slices
        >>> from interp.examples import model          # 2 layers x 4 heads of d_head 32, attention only
        >>> dim, cols = shard_slices(model, 1, 2)["blocks.0.attn.W_O.weight"]   # heads 2 and 3
        >>> dim, cols[0].item(), len(cols)
        (1, 64, 64)
    """
    from .pruning.surgery import head_slices  # the one definition of a head's rows (see shard_heads)

    owned = [head_split(block.attn.n_heads, world)[rank] for block in model.blocks]
    return {**head_slices(model, owned), **_mlp_slices(model, rank, world)}


def _narrow_dense_mlps(shard: Transformer, rank: int, world: int) -> Transformer:
    """``shard`` with each dense MLP cut to this rank's contiguous share of hidden units."""
    cfg = shard.cfg
    width = _dense_mlp_split(cfg.d_mlp, world)
    p = next(shard.parameters())
    # A dense model's d_expert is derived from d_mlp: derive it again (None) rather than keep the old width.
    new_cfg = (dataclasses.replace(cfg, d_mlp=width) if cfg.n_experts
               else dataclasses.replace(cfg, d_mlp=width, d_expert=None))  # type: ignore[arg-type]
    narrow = build(new_cfg, device=p.device, dtype=p.dtype)
    state = shard.state_dict()
    for key, (dim, index) in _mlp_slices(shard, rank, world).items():
        state[key] = state[key].index_select(dim, index.to(state[key].device))
    narrow.load_state_dict(state, strict=True)
    narrow.name, narrow.tokenizer = shard.name, shard.tokenizer
    for nb, ob in zip(narrow.blocks, shard.blocks):
        nb.attn.query_chunk = ob.attn.query_chunk
    narrow.train(shard.training)
    return narrow


class HeadParallel:
    """Run a head-parallel shard (:func:`shard_heads`) under ``torch.distributed``: every rank runs the same
    call on the same input, and the attention and dense MLP writes are summed over ranks after each module.

    Args:
        shard: this rank's :func:`shard_heads` result.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised with the shard's world size.
        ValueError: ``shard`` is not a :func:`shard_heads` result.

    Example:
        >>> from interp.tensor_parallel import HeadParallel, shard_heads
        >>> import torch
        >>> from interp import ModelConfig
        >>> from interp.placement import build
        >>> full = build(ModelConfig(n_layers=1, d_model=16, n_heads=4, d_vocab=8, n_ctx=8), seed=0)
        >>> tp = HeadParallel(shard_heads(full, 0, 1))     # one rank: no process group needed
        >>> torch.allclose(tp(torch.tensor([[1, 2, 3]])), full(torch.tensor([[1, 2, 3]])), atol=1e-6)
        True
    """

    def __init__(self, shard: Transformer) -> None:
        if not hasattr(shard, "tp_heads"):
            raise ValueError("HeadParallel needs a shard_heads(model, rank, world) result, got a whole model")
        self.model = shard
        self.rank: int = shard.tp_rank  # type: ignore[assignment]
        self.world: int = shard.tp_world  # type: ignore[assignment]
        self.heads: list[list[int]] = shard.tp_heads  # type: ignore[assignment]
        # Per layer: the whole model's query heads and their K/V heads, to put records back in global order.
        self.layout: list[tuple[int, list[int]]] = shard.tp_layout  # type: ignore[assignment]
        if self.world > 1 and (not distributed.active() or distributed.world_size() != self.world):
            raise RuntimeError(f"HeadParallel: the shard is rank {self.rank} of {self.world}, but torch.distributed "
                               f"is {'not initialised' if not distributed.active() else 'of world size ' + str(distributed.world_size())}"
                               "; call interp.distributed.init_from_env() under torchrun first")
        self.n_heads = [n_total for n_total, _ in self.layout]
        self._handles: list[RemovableHandle] = []
        if self.world > 1:
            for block in shard.blocks:
                partial = [block.attn] + ([block.mlp] if isinstance(block.mlp, MLP) else [])
                for module in partial:
                    self._handles.append(module.register_forward_pre_hook(_enter_partial))
                    self._handles.append(module.register_forward_hook(_sum_over_ranks))

    @classmethod
    def from_model(cls, model: Transformer) -> HeadParallel:
        """Shard ``model`` for this process's rank of the initialised process group (rank 0 of 1 without one).

        Args:
            model: the whole model, the same on every rank.

        Returns:
            This rank's :class:`HeadParallel`.

        Example:
            >>> from interp.tensor_parallel import HeadParallel
            >>> from interp import ModelConfig
            >>> from interp.placement import build
            >>> HeadParallel.from_model(build(ModelConfig(n_layers=1, d_model=16, n_heads=4, d_vocab=8,
            ...                                           n_ctx=8), seed=0)).heads
            [[0, 1, 2, 3]]
        """
        return cls(shard_heads(model, distributed.rank(), distributed.world_size()))

    # --- running --------------------------------------------------------------------------------------
    def __call__(self, tokens: torch.Tensor, *, fwd_hooks: Sequence[tuple[Any, Any]] = (),
                 **kwargs: Any) -> torch.Tensor:
        """The model's forward on this rank's share, with ``fwd_hooks`` attached for the pass (as
        :meth:`interp.Transformer.run_with_hooks`; a per-head hook sees this rank's heads).

        Args:
            tokens: ``[B, T]`` ids, the same on every rank.
            fwd_hooks: ``(name or filter, hook)`` pairs, attached on this rank for this pass.
            **kwargs: as :meth:`interp.Transformer.forward` (``attention_mask``...).

        Returns:
            The logits, the same on every rank.

        Raises:
            DistributedError: a peer rank died or timed out.

        Example:
            >>> import torch
            >>> from interp.examples import model, tokens    # induction-2l (2 layers, 4 heads), [2, 21] ids
            >>> torch.allclose(HeadParallel.from_model(model)(tokens), model(tokens), atol=1e-5)
            True
        """
        if fwd_hooks:
            return self.model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks), **kwargs)
        return self.model(tokens, **kwargs)

    def generate(self, tokens: torch.Tensor, max_new_tokens: int, **kwargs: Any) -> Any:
        """:meth:`interp.Transformer.generate` on every rank (greedy unless sampling with the same seed everywhere).

        Example:
            >>> from interp.tensor_parallel import HeadParallel
            >>> import torch
            >>> from interp.examples import model, tokens    # induction-2l (2 layers, 4 heads), [2, 21] ids
            >>> HeadParallel.from_model(model).generate(tokens[:1], 3).shape
            torch.Size([1, 24])
        """
        return self.model.generate(tokens, max_new_tokens, **kwargs)

    def set_head_gates(self, gates: torch.Tensor | None) -> None:
        """Gate heads by their global index: ``gates`` is ``[L, H]`` of the whole model (``None`` removes them);
        each rank applies its own heads' entries.

        Raises:
            ValueError: ``gates`` has another shape than ``[L, H]``.

        Example:
            >>> from interp.tensor_parallel import HeadParallel
            >>> import torch
            >>> from interp.examples import model, tokens    # induction-2l (2 layers, 4 heads), [2, 21] ids
            >>> tp = HeadParallel.from_model(model)
            >>> g = torch.ones(2, 4); g[0, 1] = 0
            >>> tp.set_head_gates(g); model.set_head_gates(g)
            >>> torch.allclose(tp(tokens), model(tokens), atol=1e-5)
            True
        """
        if gates is None:
            self.model.set_head_gates(None)
            return
        L = len(self.heads)
        if gates.dim() != 2 or gates.shape[0] != L or gates.shape[1] != max(self.n_heads, default=0):
            raise ValueError(f"set_head_gates: gates have shape {tuple(gates.shape)}, expected "
                             f"[{L}, {max(self.n_heads, default=0)}] (the whole model's layers and heads)")
        self.model.set_head_gates([gates[layer, self.heads[layer]] for layer in range(L)])

    def run_with_cache(self, tokens: torch.Tensor, *, names_filter: NamesFilter = None,
                       **kwargs: Any) -> tuple[torch.Tensor, Trace | None]:
        """Record hook points on every rank and join them on rank 0 into the whole model's :class:`Trace`.

        Per-head records (``hook_q``, ``hook_k``, ``hook_v``, ``hook_attn_scores``, ``hook_pattern``, ``hook_z``,
        ``hook_result``) are joined along the head axis in global head order (a K/V head held by several ranks
        is taken once); a dense MLP's ``hook_post`` along its hidden units; every other record is the same on
        every rank and is rank 0's.

        Args:
            tokens: ``[B, T]`` ids, the same on every rank.
            names_filter: as :meth:`interp.Transformer.run_with_cache`.
            **kwargs: passed to the forward (``attention_mask``...).

        Returns:
            ``(logits, trace)``: logits on every rank, the trace on rank 0 (``None`` elsewhere).

        Raises:
            ValueError: a name that matches no hook point.
            DistributedError: a peer rank died or timed out.

        Example:
            >>> from interp.tensor_parallel import HeadParallel
            >>> import torch
            >>> from interp.examples import model, tokens    # induction-2l (2 layers, 4 heads), [2, 21] ids
            >>> logits, trace = HeadParallel.from_model(model).run_with_cache(tokens, names_filter="*hook_pattern")
            >>> trace.pattern(0).shape
            torch.Size([2, 4, 21, 21])
        """
        logits, trace = self.model.run_with_cache(tokens, names_filter=names_filter, **kwargs)
        mine = {name: trace[name] for name in trace.keys()}
        if self.world == 1:
            return logits, Trace(mine, trace.meta, trace.tokens, tokenizer=getattr(self.model, "tokenizer", None))
        gathered: list[Any] = [None] * self.world if self.rank == 0 else []
        distributed._collective("gather of the head-parallel records", torch.distributed.gather_object,
                                mine, gathered if self.rank == 0 else None, dst=0)
        if self.rank != 0:
            return logits, None
        joined = {name: self._join(name, [g[name] for g in gathered]) for name in mine}
        meta = dict(trace.meta)
        meta["n_heads"] = max(self.n_heads, default=0)
        return logits, Trace(joined, meta, trace.tokens, tokenizer=getattr(self.model, "tokenizer", None))

    def _join(self, name: str, parts: list[torch.Tensor]) -> torch.Tensor:
        """One hook point's records of every rank as the whole model's tensor."""
        suffix = name.rsplit(".", 1)[-1]
        if not name.startswith("blocks.") or ".cross_attn." in name:
            return parts[0]
        layer = int(name.split(".")[1])
        if ".attn." in name and suffix in _QUERY_HEAD_AXIS:
            return torch.cat(parts, dim=_QUERY_HEAD_AXIS[suffix])
        if ".attn." in name and suffix in _KV_HEAD_AXIS:
            axis = _KV_HEAD_AXIS[suffix]
            if self.model.cfg.attention == "latent":
                return torch.cat(parts, dim=axis)  # MLA's keys and values are per query head
            n_total, kv_map = self.layout[layer]
            taken: dict[int, torch.Tensor] = {}
            for part, heads in zip(parts, head_split(n_total, self.world)):
                for i, kv in enumerate(sorted({kv_map[h] for h in heads})):
                    taken.setdefault(kv, part.select(axis, i))  # a K/V head on several ranks is taken once
            return torch.stack([taken[kv] for kv in sorted(taken)], dim=axis)  # [B, S, K, D]
        if name.endswith(".mlp.hook_post") and isinstance(self.model.blocks[layer].mlp, MLP):
            return torch.cat(parts, dim=-1)  # [B, T, F]
        return parts[0]

    def gather_head_tables(self, tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        """Per-head tables of every rank joined into the whole model's, on every rank.

        Each table's ``head`` column holds this rank's local head index (what an analysis of the shard
        reports); it becomes the global index, and the ranks' rows are joined and sorted by ``(layer, head)``
        (stable, so each head's rows keep their order). A table without ``layer`` and ``head`` columns is the
        same on every rank and is taken from rank 0.

        Args:
            tables: name -> DataFrame with ``layer`` and local ``head`` columns.

        Returns:
            name -> the joined DataFrame (index reset).

        Raises:
            DistributedError: a peer rank died or timed out.

        Example:
            >>> from interp.tensor_parallel import HeadParallel, shard_heads
            >>> import pandas as pd
            >>> from interp import ModelConfig
            >>> from interp.placement import build
            >>> tp = HeadParallel(shard_heads(build(ModelConfig(n_layers=1, d_model=16, n_heads=4, d_vocab=8,
            ...                                                 n_ctx=8), seed=0), 0, 1))
            >>> tp.gather_head_tables({"t": pd.DataFrame({"layer": [0], "head": [2], "x": [1.0]})})["t"]["head"].tolist()
            [2]
        """
        import pandas as pd  # only the analyses that build tables need pandas

        mine = {}
        for name, table in tables.items():
            if {"layer", "head"} <= set(table.columns):
                table = table.copy()
                table["head"] = [self.heads[int(layer)][int(h)] for layer, h in zip(table["layer"], table["head"])]
            mine[name] = table
        if self.world == 1:
            return mine
        everyone: list[Any] = [None] * self.world
        distributed._collective("all-gather of the head-parallel tables", torch.distributed.all_gather_object,
                                everyone, mine)
        joined = {}
        for name, table in everyone[0].items():
            if {"layer", "head"} <= set(table.columns):
                table = pd.concat([part[name] for part in everyone], ignore_index=True)
                table = table.sort_values(["layer", "head"], kind="stable").reset_index(drop=True)
            joined[name] = table
        return joined

    def close(self) -> None:
        """Remove the reductions: the shard is a plain (partial) model again.

        Example:
            >>> from interp.tensor_parallel import HeadParallel
            >>> import torch
            >>> from interp.examples import model, tokens    # induction-2l (2 layers, 4 heads), [2, 21] ids
            >>> tp = HeadParallel.from_model(model); tp.close()
            >>> tp.model(tokens).shape == model(tokens).shape
            True
        """
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class _SumForward(torch.autograd.Function):
    """All-reduce forward, identity backward (Megatron's ``g``): after a partial module, every rank goes on with
    the same whole tensor and computes the same loss, so each rank's gradient of it is already the whole one."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        distributed._collective("all_reduce of a head-parallel write", torch.distributed.all_reduce, t)
        return t

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _SumBackward(torch.autograd.Function):
    """Identity forward, all-reduce backward (Megatron's ``f``): the replicated input of a partial module gets
    each rank's share of the gradient, which must be summed for the layers below."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        distributed._collective("all_reduce of a head-parallel gradient", torch.distributed.all_reduce, grad)
        return grad


def _enter_partial(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A forward pre-hook: the module's input, marked so its gradient is summed over ranks."""
    if not args or not isinstance(args[0], torch.Tensor) or not torch.is_grad_enabled():
        return None
    return (_SumBackward.apply(args[0]), *args[1:])


def _sum_over_ranks(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
    """A forward hook: the partial residual write summed over ranks."""
    return _SumForward.apply(out)
