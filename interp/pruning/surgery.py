"""Physically remove heads: a new, smaller Transformer (fewer Q/K/V/O rows and columns), and the KV-cache bytes
that removal saves in GQA/MQA models."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence

import torch

from ..config import ModelConfig
from ..model import Transformer
from ..placement import build
from ..quantized import refuse_quantized

HeadSpec = torch.Tensor | Mapping[int, Sequence[int]] | Sequence[Sequence[bool]]


def heads_to_sets(model: Transformer, heads: HeadSpec) -> list[set[int]]:
    """Normalise a head selection to one set of head indices per layer.

    Args:
        model: the model the heads belong to.
        heads: a bool mask ``[L, H]`` (True = remove), a list of per-layer bool lists (models with per-layer head
            counts), or a dict ``{layer: [heads]}``.

    Raises:
        TypeError: another type.
        ValueError: a layer or head index out of range, or a mask of the wrong shape.
    """
    counts = [block.attn.n_heads for block in model.blocks]
    L = len(counts)
    out: list[set[int]] = [set() for _ in range(L)]
    if isinstance(heads, Mapping):
        for layer, hs in heads.items():
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < L:
                raise ValueError(f"layer {layer!r} is not in [0, {L})")
            for h in hs:
                if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < counts[layer]:
                    raise ValueError(f"head {h!r} of layer {layer} is not in [0, {counts[layer]})")
                out[layer].add(h)
        return out
    if isinstance(heads, torch.Tensor):
        if heads.dtype != torch.bool:
            raise TypeError(f"a head mask must be a bool tensor (True = remove), got dtype {heads.dtype}")
        rows = list(heads)
    elif isinstance(heads, Sequence):
        rows = [torch.as_tensor(r, dtype=torch.bool) for r in heads]
    else:
        raise TypeError(f"heads must be a bool mask [L, H] or a dict {{layer: [heads]}}, got {type(heads).__name__}")
    if len(rows) != L or any(r.shape != (c,) for r, c in zip(rows, counts)):
        raise ValueError(f"head mask has shape {[tuple(r.shape) for r in rows]}, expected per-layer sizes {counts}")
    for layer, r in enumerate(rows):
        out[layer] = {int(i) for i in torch.nonzero(r).flatten()}
    return out


def _kept_kv(model: Transformer, layer: int, kept: list[int]) -> tuple[list[int], list[int]]:
    """The K/V heads still read by the kept query heads, and the new query -> K/V map."""
    old_map = model.cfg.kv_map(layer)
    kv_kept = sorted({old_map[h] for h in kept})
    rank = {kv: i for i, kv in enumerate(kv_kept)}
    return kv_kept, [rank[old_map[h]] for h in kept]


def kv_cache_savings(model: Transformer, heads: HeadSpec, *, bytes_per_element: int = 2) -> dict:
    """What removing ``heads`` does to the KV cache. A K/V head leaves the cache only when every query head of its
    group is removed; MLA caches a latent shared by a layer's heads, so it saves only when a whole layer goes.

    Args:
        model: the (gated or original) model.
        heads: as :func:`remove_heads`.
        bytes_per_element: 2 for fp16/bf16, 4 for fp32.

    Returns:
        ``{"heads_pruned", "heads_total", "kv_heads_removed", "kv_heads_total", "bytes_per_token_before",
        "bytes_per_token_after", "bytes_saved_per_token", "fraction_saved"}``.

    Example:
        >>> import interp
        >>> from interp.pruning.surgery import kv_cache_savings
        >>> gqa = interp.Transformer(interp.ModelConfig(n_layers=1, d_model=64, n_heads=8, n_kv_heads=2, d_vocab=10, n_ctx=8))
        >>> kv_cache_savings(gqa, {0: [0, 1, 2, 3]})["kv_heads_removed"]   # a whole group of 4
        1
    """
    sets = heads_to_sets(model, heads)
    cfg = model.cfg
    before = cfg.kv_cache_bytes_per_token(bytes_per_element)
    kv_total = kv_removed = emptied_layers = after_std = 0
    for layer, block in enumerate(model.blocks):
        kept = [h for h in range(block.attn.n_heads) if h not in sets[layer]]
        shape = cfg.layer(layer)
        kv_total += shape.n_kv_heads
        if cfg.attention != "latent":
            k_after = len(_kept_kv(model, layer, kept)[0])
            kv_removed += shape.n_kv_heads - k_after
            # The layer's own byte count, with the K/V heads that survive.
            after_std += dataclasses.replace(shape, n_kv_heads=k_after).kv_bytes_per_token(bytes_per_element)
        elif block.attn.n_heads and not kept:
            emptied_layers += 1
    if cfg.attention == "latent":
        after = before - emptied_layers * (cfg.kv_latent_dim + cfg.rope_dim) * bytes_per_element
    else:
        after = after_std
    return {
        "heads_pruned": sum(len(s) for s in sets),
        "heads_total": sum(b.attn.n_heads for b in model.blocks),
        "kv_heads_removed": kv_removed,
        "kv_heads_total": kv_total,
        "bytes_per_token_before": before,
        "bytes_per_token_after": after,
        "bytes_saved_per_token": before - after,
        "fraction_saved": (before - after) / before if before else 0.0,
    }


def _slopes(cfg: ModelConfig, layer: int) -> list[float]:
    """``layer``'s ALiBi slopes (the config has them)."""
    slopes = cfg.layer_alibi_slopes(layer)
    assert slopes is not None
    return slopes


def _head_rows(heads: list[int], width: int) -> torch.Tensor:
    """Row indices of the given heads in a weight whose rows are [head 0 (width rows) | head 1 | ...]."""
    return torch.tensor([h * width + i for h in heads for i in range(width)], dtype=torch.long)


def head_slices(model: Transformer, kept: list[list[int]]) -> dict[str, tuple[int, torch.Tensor]]:
    """Where the kept heads' weights lie in each attention weight: ``{state key: (dim, index)}``, the rows (dim 0)
    of the query / key / value projections (and learned sinks) and the columns (dim 1) of W_O that the heads
    ``kept[layer]`` keep (with the K/V heads they read). :func:`remove_heads` takes them from a model; a
    head-parallel shard reads them straight from a checkpoint (:func:`interp.zoo.checkpoint.load_checkpoint_heads`).

    Args:
        model: the whole model (its skeleton on the meta device will do).
        kept: per layer, the query heads kept.

    Returns:
        ``{key: (dim, index LongTensor)}`` for every attention weight that loses rows or columns.

    Example:
        >>> from interp.pruning.surgery import head_slices
        >>> from interp.examples import model          # 2 layers x 4 heads, d_head 32
        >>> dim, cols = head_slices(model, [[1], [0, 1, 2, 3]])["blocks.0.attn.W_O.weight"]
        >>> dim, cols[0].item(), len(cols)
        (1, 32, 32)
    """
    cfg = model.cfg
    D = cfg.d_head
    latent = cfg.attention == "latent"
    keys = set(model.state_dict())
    plan: dict[str, tuple[int, torch.Tensor]] = {}
    for layer, block in enumerate(model.blocks):
        attn, heads, pre = block.attn, kept[layer], f"blocks.{layer}.attn."
        H = attn.n_heads
        if latent:
            q_name = "W_uq" if hasattr(attn, "W_uq") else "W_q"
            for suffix in ("weight", "bias"):
                if pre + f"{q_name}.{suffix}" in keys:
                    plan[pre + f"{q_name}.{suffix}"] = (0, _head_rows(heads, D + cfg.rope_dim))
            plan[pre + "W_ukv.weight"] = (0, _head_rows(heads, D + cfg.v_head_dim))
        else:
            K = cfg.layer(layer).n_kv_heads
            kv_kept, _ = _kept_kv(model, layer, heads)
            # W_qkv rows: [q heads (H*D) | k heads (K*D) | v heads (K*D)]
            rows = torch.cat([_head_rows(heads, D), H * D + _head_rows(kv_kept, D),
                              (H + K) * D + _head_rows(kv_kept, D)])
            for suffix in ("weight", "bias"):
                if pre + f"W_qkv.{suffix}" in keys:
                    plan[pre + f"W_qkv.{suffix}"] = (0, rows)
        if pre + "sinks" in keys:  # a learned sink belongs to its query head: it goes with it
            plan[pre + "sinks"] = (0, torch.tensor(heads, dtype=torch.long))  # [H_kept]
        plan[pre + "W_O.weight"] = (1, _head_rows(heads, attn.d_head))  # [M, H_kept*Dv]
    return plan


@torch.no_grad()
def remove_heads(model: Transformer, heads: HeadSpec) -> Transformer:
    """A new, physically smaller model without ``heads``; ``model`` is left unchanged.

    The new model computes what ``model`` computes with those heads gated to 0 (and any other gates already set on
    ``model`` folded into W_O), with fewer parameters. In GQA/MQA a K/V head is dropped once no query head reads
    it; a partially pruned group keeps its K/V head and the layer records its query -> K/V map.

    Args:
        model: a :class:`~interp.Transformer` (MHA, GQA, MQA or MLA; self-attention heads are removed).
        heads: bool mask ``[L, H]`` of heads to remove (True = remove), or ``{layer: [heads]}``.

    Returns:
        A new :class:`~interp.Transformer` with ``cfg.layer_n_heads`` (and ``layer_n_kv_heads`` / ``layer_kv_map``)
        set, same name, tokenizer, dtype and device.

    Raises:
        TypeError / ValueError: a malformed head selection (see :func:`heads_to_sets`), or a model whose
            weights stay quantised (:func:`interp.quantized.dequantize_model` first).

    Warns:
        UserWarning: every head of a layer is removed (that attention layer then adds only W_O's bias).

    Example:
        >>> from interp.pruning.surgery import remove_heads
        >>> from interp.examples import model
        >>> small = remove_heads(model, {0: [1, 3], 1: [0]})
        >>> sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())
        True
    """
    if not isinstance(model, Transformer):
        # A model on the attention-level route (interp.zoo.hf_route) keeps transformers' own weights.
        why = (": physical head removal is not available on the attention-level route (no fused W_qkv to slice); "
               "it needs a family with a native converter" if getattr(model, "native", True) is False else "")
        raise TypeError(f"model must be an interp Transformer, got {type(model).__name__}{why}")
    refuse_quantized(model, "remove_heads")  # it rewrites W_qkv / W_O rows; blocks cannot be cut by head here
    sets = heads_to_sets(model, heads)
    cfg = model.cfg
    if cfg.qk_norm == "full":
        raise ValueError("remove_heads: qk_norm='full' normalises the queries (and keys) of all heads together, "
                         "so removing a head would change the others; gate it instead (set_head_gates)")
    latent = cfg.attention == "latent"
    layer_heads, layer_kv, layer_map, kept_all = [], [], [], []
    for layer, block in enumerate(model.blocks):
        kept = [h for h in range(block.attn.n_heads) if h not in sets[layer]]
        if not kept:
            warnings.warn(f"remove_heads: every head of layer {layer} is removed; its attention now adds only "
                          "W_O's bias", UserWarning, stacklevel=2)
        kept_all.append(kept)
        layer_heads.append(len(kept))
        if not latent:
            kv_kept, new_map = _kept_kv(model, layer, kept)
            layer_kv.append(len(kv_kept))
            k = len(kv_kept)
            uniform = not kept or (len(kept) % k == 0 and new_map == [i // (len(kept) // k) for i in range(len(kept))])
            layer_map.append(None if uniform else new_map)
    new_cfg = dataclasses.replace(
        cfg, layer_n_heads=layer_heads,
        layer_n_kv_heads=None if latent else layer_kv,
        layer_kv_map=None if latent or all(m is None for m in layer_map) else layer_map,
        # ALiBi: each kept head keeps its own slope (the formula for the smaller head count would give others).
        alibi_slopes=None if cfg.alibi_slopes is None else [
            [_slopes(cfg, layer)[h] for h in kept] for layer, kept in enumerate(kept_all)],
    )
    p = next(model.parameters())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        new = build(new_cfg, device=p.device, dtype=p.dtype)  # built in place and dtype: no float32 copy first
    # No clone of the whole model: every edit below makes a new tensor (indexing, products), and load_state_dict
    # copies into the new model, so the original's weights are read, never written.
    state = dict(model.state_dict())
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        if attn.gate is not None:
            # Fold the gates into W_O's columns, then take the kept heads': z_h * g_h @ W_O[h] = z_h @ (g_h W_O[h]).
            w_o = state[f"blocks.{layer}.attn.W_O.weight"]  # [M, H*Dv] (Dv = D except for MLA's own value width)
            scale = attn.gate.detach().to(w_o.dtype).repeat_interleave(attn.d_head)  # [H*Dv]
            state[f"blocks.{layer}.attn.W_O.weight"] = w_o * scale[None, :]
    for key, (dim, index) in head_slices(model, kept_all).items():
        state[key] = state[key].index_select(dim, index.to(state[key].device))
    new.load_state_dict(state, strict=True)
    new.name = model.name
    new.tokenizer = model.tokenizer
    for attr in ("query_chunk",):
        for nb, ob in zip(new.blocks, model.blocks):
            setattr(nb.attn, attr, getattr(ob.attn, attr))
    new.train(model.training)
    return new


def n_parameters(model: torch.nn.Module) -> int:
    """Number of parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())
