"""Heads as the model really has them: per-layer counts (a :func:`interp.pruning.remove_heads` result keeps
different counts per layer), their labels, and the K/V grouping the figures draw."""

from __future__ import annotations

import interp


def head_counts(model: interp.Transformer) -> list[int]:
    """Heads in each layer: equal for a model as built, per layer after :func:`interp.pruning.remove_heads`.

    Example:
        >>> import interp
        >>> from interp.app.heads import head_counts
        >>> head_counts(interp.load("random-tiny"))
        [4, 4]
    """
    return [int(block.attn.n_heads) for block in model.blocks]


def head_label(layer: int, head: int) -> str:
    """``"L{layer}H{head}"``.

    Example:
        >>> from interp.app.heads import head_label
        >>> head_label(3, 1)
        'L3H1'
    """
    return f"L{layer}H{head}"


def head_labels(model: interp.Transformer) -> dict[str, tuple[int, int]]:
    """``"L{layer}H{head}"`` -> ``(layer, head)`` for every head the model has, layer by layer.

    Example:
        >>> import interp
        >>> from interp.app.heads import head_labels
        >>> list(head_labels(interp.load("random-tiny")))[:5]
        ['L0H0', 'L0H1', 'L0H2', 'L0H3', 'L1H0']
    """
    return {head_label(layer, head): (layer, head)
            for layer, n in enumerate(head_counts(model)) for head in range(n)}


def heads_caption(model: interp.Transformer) -> str:
    """One line about the model for the sidebar: kind, layers and heads per layer, width, context.

    Example:
        >>> import interp
        >>> from interp.app.heads import heads_caption
        >>> heads_caption(interp.load("random-tiny"))
        '**random-tiny**: GQA, 2 layers x 4 heads, d_model 32, context 48, decoder'
    """
    cfg = model.cfg
    counts = head_counts(model)
    heads = f"x {counts[0]} heads" if len(set(counts)) == 1 else f"with {counts} heads"
    return (f"**{model.name}**: {cfg.kind.upper()}, {cfg.n_layers} layers {heads}, d_model {cfg.d_model}, "
            f"context {cfg.n_ctx}, {'decoder' if cfg.causal else 'encoder'}")


def kv_heads(model: interp.Transformer) -> int | None:
    """K/V heads per layer when every layer groups its query heads alike (GQA / MQA), else None.

    Example:
        >>> import interp
        >>> from interp.app.heads import kv_heads
        >>> kv_heads(interp.load("random-tiny"))
        2
    """
    cfg = model.cfg
    shapes = {cfg.layer(layer) for layer in range(cfg.n_layers)}
    if cfg.attention != "standard" or len(shapes) != 1:
        return None
    shape = next(iter(shapes))
    return int(shape.n_kv_heads) if shape.uniform_groups and shape.n_kv_heads < shape.n_heads else None
