"""The effective OV circuit of every head, read from the weights: what a head writes into the logits when it attends
to a token (the piece shared by the copy-suppression and successor kinds).

For a token ``t`` the circuit is ``unembed(final_norm(norm_l(e_l(t)) W_V[h] W_O[h]))``, where ``e_l(t)`` is the
*effective* embedding a layer-``l`` head reads: the raw embedding for layer 0, and for later layers the residual
stream after block 0 on the token alone (embedding + block 0's attention and MLP). McDougall et al. 2023 and
Gould et al. 2023 use this effective embedding because GPT-2's first MLP acts as an extended embedding that the
later heads read; ``norm_l`` is the head's own input norm applied to it as in the forward pass. The final norm is
applied to the head's write as a whole (its per-row scale is one positive number, so it changes no ranking
within a row; a LayerNorm's bias, which every head shares, is left out, as in direct logit attribution).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..weights import layer_weights
from ._stream import head_counts, state_device

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["effective_embeddings", "ov_logits", "has_unembedding"]


def has_unembedding(model: Transformer) -> bool:
    """Whether the model maps the residual stream to token logits (weight-circuit kinds need it)."""
    unembed = getattr(model, "unembed", None)
    return unembed is not None and getattr(unembed, "weight", None) is not None


@torch.no_grad()
def effective_embeddings(model: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual a layer-0 head and a later head read for each token alone: ``(embedding, after block 0)``.

    Args:
        model: an interp Transformer.
        tokens: ``[N]`` token ids.

    Returns:
        Two ``[N, M]`` float32 tensors: ``blocks.0.hook_resid_pre`` and the input of block 1 (``blocks.0``'s
        output; equal to the first for a 1-layer model). On a pipeline stage inside
        :meth:`Pipeline.routed <interp.pipeline.Pipeline.routed>` they are computed on rank 0 (which holds the
        embedding and block 0) and every rank receives them.

    Example:
        >>> import torch
        >>> from interp.analysis.ov_circuit import effective_embeddings
        >>> from interp.examples import model
        >>> e0, e1 = effective_embeddings(model, torch.arange(5))
        >>> e0.shape
        torch.Size([5, 128])
    """
    route = getattr(model, "first_stage_route", None)
    if route is not None:  # a pipeline stage (Pipeline.routed): rank 0 holds the embedding and block 0
        # Host copies travel (a pickled GPU tensor would land on the sender's device) and come to this rank's.
        pre, post = route(lambda: tuple(t.cpu() for t in _first_block_residuals(model, tokens)),
                          "the effective embeddings")
        dev = state_device(model)
        return pre.to(dev), post.to(dev)
    return _first_block_residuals(model, tokens)


def _first_block_residuals(model: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`effective_embeddings` on the model (or the pipeline stage) that holds the embedding and block 0."""
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post"]
    # One token a sequence ([N, 1]); the pass stops after block 0, the only block it reads.
    _, cache = model.run_with_cache(tokens.reshape(-1, 1), names_filter=names, stop_at_layer=1)
    pre = cache["blocks.0.hook_resid_pre"][:, 0].float()  # [N, M]
    post = cache["blocks.0.hook_resid_post"][:, 0].float() if model.cfg.n_layers > 1 else pre
    return pre, post


@torch.no_grad()
def ov_logits(model: Transformer, tokens: torch.Tensor, columns: torch.Tensor, *,
              chunk: int = 256) -> torch.Tensor:
    """Each head's effective-OV logits of ``columns`` when it attends to each of ``tokens``.

    Args:
        model: an interp Transformer with an unembedding.
        tokens: ``[N]`` the attended tokens.
        columns: ``[N, C]`` the vocabulary ids whose logits are read for each attended token (for example the
            token itself and ``C - 1`` comparison tokens), or ``[C]`` for the same columns on every row.
        chunk: rows per step (bounds the ``[H, n, M]`` writes).

    Returns:
        ``[L, H_max, N, C]`` float32 on the model's device (NaN for heads a pruned layer lacks, and for the
        layers a pipeline stage does not hold: their weights are on the meta device and their rank scores them).

    Raises:
        ValueError: the model has no unembedding.

    Example:
        >>> import torch
        >>> from interp.analysis.ov_circuit import ov_logits
        >>> from interp.examples import model
        >>> logits = ov_logits(model, torch.arange(4), torch.arange(4))   # [L, H, 4, 4]
    """
    unembed = model.unembed
    if unembed is None or not has_unembedding(model):
        raise ValueError("the effective OV circuit reads the unembedding, and this model has none")
    dev = unembed.weight.device
    tokens = tokens.to(dev)
    N = tokens.shape[0]
    columns = columns.to(dev).expand(N, -1) if columns.dim() == 1 else columns.to(dev)  # [N, C]
    W_U = unembed.weight.detach().float()  # [V, M]
    ln = model.ln_final
    bias = getattr(ln, "bias", None) if ln is not None else None
    e0, e1 = effective_embeddings(model, tokens)  # [N, M] each
    counts = head_counts(model)
    dtype = unembed.weight.dtype  # the norms run in the model's dtype
    out = torch.full((model.cfg.n_layers, max(counts, default=0), N, columns.shape[1]), torch.nan, device=dev)
    for layer, H in enumerate(counts):
        if not H:
            continue
        block = model.blocks[layer]
        w = layer_weights(model, layer)
        if w["W_V"].is_meta:  # a pipeline stage (interp.pipeline): another rank holds this layer and scores it
            continue
        W_V, W_O = w["W_V"].float(), w["W_O"].float()  # [H, M, D], [H, D, M]
        if block.attn.gate is not None:
            W_O = W_O * block.attn.gate.detach().float()[:, None, None]  # a gated head writes gate_h z_h W_O[h]
        x = block.ln1((e0 if layer == 0 else e1).to(dtype)).float()  # [N, M]: the head's input, normed
        for i in range(0, N, chunk):
            r = torch.einsum("nm,hmd,hdk->hnk", x[i:i + chunk], W_V, W_O)  # [H, n, M]: each head's write
            if ln is not None:
                r = ln(r.to(dtype)).float()
                if bias is not None:
                    r = r - bias.detach().float()
            cols = W_U[columns[i:i + chunk]]  # [n, C, M]
            out[layer, :H, i:i + chunk] = torch.einsum("hnm,ncm->hnc", r, cols)  # [H, n, C]
    return out
