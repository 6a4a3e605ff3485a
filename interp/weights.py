"""Weight views: per-head W_Q, W_K, W_V, W_O stacked over layers, and QK / OV circuits kept factored.

Layout follows TransformerLens: ``W_Q`` ``[L, H, M, D]`` (``q = x @ W_Q[l, h]``), ``W_O`` ``[L, H, D, M]``;
``QK[l, h] = W_Q W_K^T`` and ``OV[l, h] = W_V W_O`` are ``M x M`` matrices of rank <= D, stored as their two
factors (:class:`FactoredMatrix`), so nothing ``d_model x d_model`` is materialised unless asked.

What the views are, exactly:

- They act on the *normalised* residual (the output of the block's ``ln1``): the norm's weight is not
  folded in (``fold_norm=True`` in :func:`stacked` multiplies it into the reading matrices, as TL's
  ``fold_ln`` does). Biases are separate (``b_Q`` ...).
- GQA / MQA: ``W_K`` and ``W_V`` are given per *query* head, the K/V head a query head reads repeated for
  each query head of its group (so ``W_K[l, h]`` is the key matrix head h actually uses).
- Rotary models: like TL, W_Q and W_K are the un-rotated projections; the real score between positions i
  and j also rotates by (i - j).
- MLA (:class:`~interp.attention.LatentAttention`): the effective per-head matrices compose the down- and
  up-projections, ``W_K = W_dkv^T diag(g_kv) W_uk^T`` (and likewise W_V, and W_Q with a query latent), with
  the latent RMSNorm's weight ``g`` folded in. Approximate in two ways: the RMSNorm's per-token scale
  (a positive scalar per position) is dropped, and the decoupled rotary key part (``rope_dim`` R columns,
  shared by all heads) is appended to W_K unrotated: W_Q and W_K are ``[.., M, D + R]``, W_V ``[.., M, Dv]``
  and W_O ``[.., Dv, M]`` (DeepSeek's value width ``v_head_dim`` may differ from its key width D).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .attention import Attention, LatentAttention, _AttentionBase

if TYPE_CHECKING:
    from .model import Transformer

__all__ = ["OV", "QK", "FactoredMatrix", "layer_weights", "stacked"]


class FactoredMatrix:
    """A matrix ``A @ B`` kept as its factors: ``A`` ``[..., m, r]``, ``B`` ``[..., r, n]``.

    Products, transposes, norms and the SVD work on the factors (cost O((m + n) r^2)); :meth:`full`
    materialises ``[..., m, n]`` only on request. Leading axes broadcast (``[L, H, ...]`` stacks).

    Args:
        A: left factor ``[..., m, r]``.
        B: right factor ``[..., r, n]``.

    Raises:
        ValueError: the inner dimensions differ.

    Example:
        >>> import torch
        >>> from interp.weights import FactoredMatrix
        >>> fm = FactoredMatrix(torch.randn(64, 8), torch.randn(8, 64))
        >>> fm.shape, fm.rank
        (torch.Size([64, 64]), 8)
        >>> torch.allclose(fm.norm(), fm.full().norm(), rtol=1e-4)
        True
    """

    def __init__(self, A: torch.Tensor, B: torch.Tensor) -> None:
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(f"inner dimensions differ: A {tuple(A.shape)} and B {tuple(B.shape)}")
        self.A, self.B = A, B

    @property
    def shape(self) -> torch.Size:
        lead = torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        return torch.Size((*lead, self.A.shape[-2], self.B.shape[-1]))

    @property
    def rank(self) -> int:
        """The inner dimension (an upper bound of the rank)."""
        return self.A.shape[-1]

    def full(self) -> torch.Tensor:
        """The materialised ``A @ B`` ``[..., m, n]``."""
        return self.A @ self.B

    @property
    def T(self) -> FactoredMatrix:
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def __matmul__(self, other: FactoredMatrix | torch.Tensor) -> FactoredMatrix:
        if isinstance(other, FactoredMatrix):
            # A1 (B1 A2 B2): the inner product is small (r1 x r2), the result keeps rank <= r1.
            return FactoredMatrix(self.A, (self.B @ other.A) @ other.B)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: torch.Tensor) -> FactoredMatrix:
        return FactoredMatrix(other @ self.A, self.B)

    def __getitem__(self, idx) -> FactoredMatrix:
        """Index the leading (stack) axes: ``QK[1, 3]`` is layer 1 head 3."""
        lead = len(self.shape) - 2
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) > lead:
            raise ValueError(f"index {idx} has more axes than the {lead} stack axes of {tuple(self.shape)}")
        A = self.A.expand(*self.shape[:-2], *self.A.shape[-2:])
        B = self.B.expand(*self.shape[:-2], *self.B.shape[-2:])
        return FactoredMatrix(A[idx], B[idx])

    def _gram(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.A.transpose(-1, -2) @ self.A, self.B @ self.B.transpose(-1, -2)  # [..., r, r] each

    def norm(self) -> torch.Tensor:
        """Frobenius norm ``[...]``: ||AB||_F^2 = sum((A^T A) * (B B^T)), no m x n product."""
        ga, gb = self._gram()
        return (ga * gb).sum((-1, -2)).clamp_min(0).sqrt()

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Thin SVD ``U [..., m, r], S [..., r], Vh [..., r, n]`` from QR of both factors (cost O((m+n) r^2))."""
        qa, ra = torch.linalg.qr(self.A)  # [..., m, r], [..., r, r]
        qb, rb = torch.linalg.qr(self.B.transpose(-1, -2))  # [..., n, r], [..., r, r]
        u, s, vh = torch.linalg.svd(ra @ rb.transpose(-1, -2))
        return qa @ u, s, vh @ qb.transpose(-1, -2)

    @property
    def S(self) -> torch.Tensor:
        """Singular values ``[..., r]``."""
        return self.svd()[1]

    def eigenvalues(self) -> torch.Tensor:
        """Eigenvalues of a square ``AB`` (the non-zero ones are those of ``BA``, ``[..., r]``)."""
        return torch.linalg.eigvals(self.B @ self.A)

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, rank={self.rank})"


def _heads_of(attn: _AttentionBase) -> tuple[int, int]:
    return attn.n_heads, attn.d_head


def layer_weights(model: Transformer, layer: int) -> dict[str, torch.Tensor]:
    """Per-head weights of one layer: ``W_Q, W_K, W_V`` ``[H, M, Dk|D]``, ``W_O`` ``[H, D, M]`` and biases.

    Args:
        model: an interp Transformer (any attention variant; also a pruned layer with its own head count).
        layer: the layer (negative counts from the end).

    Returns:
        Dict with ``W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O`` (biases zero when the model has none).

    Raises:
        ValueError: layer out of range.

    Example:
        >>> from interp.weights import layer_weights
        >>> from interp.examples import model
        >>> layer_weights(model, 0)["W_K"].shape   # [H, M, D], K/V heads repeated per query head
    """
    L = model.cfg.n_layers
    if not -L <= layer < L:
        raise ValueError(f"layer {layer} out of range for a model with {L} layers")
    attn = model.blocks[layer].attn
    H, D = _heads_of(attn)
    M = model.cfg.d_model
    W_O = attn.W_O_heads.detach()  # [H, D, M]
    b_O = attn.W_O.bias.detach() if attn.W_O.bias is not None else W_O.new_zeros(M)
    if isinstance(attn, LatentAttention):
        return {**_latent_qkv(attn, M), "W_O": W_O, "b_O": b_O}
    if not isinstance(attn, Attention):
        raise TypeError(f"unsupported attention module {type(attn).__name__}")
    K = attn.n_kv_heads
    w = attn.W_qkv.weight.detach()  # [(H + 2K) D, M]
    b = attn.W_qkv.bias.detach() if attn.W_qkv.bias is not None else w.new_zeros(w.shape[0])
    wq, wk, wv = w.split([H * D, K * D, K * D])
    bq, bk, bv = b.split([H * D, K * D, K * D])
    if attn.kv_index is not None:
        kv = attn.kv_index
    else:
        kv = torch.arange(H, device=w.device) // max(1, H // max(K, 1))  # query head -> its K/V head
    def per_head(m, n):  # [n D, M] -> [n, M, D]
        return m.reshape(n, D, M).transpose(1, 2)  # [n, M, D]
    return {
        "W_Q": per_head(wq, H), "b_Q": bq.reshape(H, D),
        "W_K": per_head(wk, K)[kv], "b_K": bk.reshape(K, D)[kv],  # [H, M, D]: repeated per query head
        "W_V": per_head(wv, K)[kv], "b_V": bv.reshape(K, D)[kv],
        "W_O": W_O, "b_O": b_O,
    }


def _latent_qkv(attn: LatentAttention, M: int) -> dict[str, torch.Tensor]:
    H, D, R, C, Dv = attn.n_heads, attn.d_nope, attn.rope_dim, attn.kv_latent_dim, attn.d_head
    if hasattr(attn, "W_dq"):
        # x -> W_dq -> RMSNorm(g_q) -> W_uq; the norm's per-token scale is dropped (see module doc).
        wq = (attn.W_uq.weight * attn.q_norm.weight[None, :]) @ attn.W_dq.weight  # [H (D+R), M]
        bq = wq.new_zeros(wq.shape[0])
    else:
        wq = attn.W_q.weight
        bq = attn.W_q.bias if attn.W_q.bias is not None else wq.new_zeros(wq.shape[0])
    wq = wq.detach().reshape(H, D + R, M).transpose(1, 2)  # [H, M, D+R]
    w_c, w_r = attn.W_dkv.weight.detach().split([C, R])  # [C, M], [R, M]
    up = (attn.W_ukv.weight.detach() * attn.kv_norm.weight.detach()[None, :]).reshape(H, D + Dv, C)  # [H, D+Dv, C]
    wk_nope = (up[:, :D] @ w_c).transpose(1, 2)  # [H, M, D]
    wv = (up[:, D:] @ w_c).transpose(1, 2)  # [H, M, Dv]
    wk = torch.cat([wk_nope, w_r.T.expand(H, M, R)], dim=-1)  # [H, M, D+R]: the rotary key is shared by all heads
    z = wq.new_zeros
    return {"W_Q": wq, "b_Q": bq.detach().reshape(H, D + R), "W_K": wk, "b_K": z(H, D + R),
            "W_V": wv, "b_V": z(H, Dv)}


def stacked(model: Transformer, name: str, *, fold_norm: bool = False) -> torch.Tensor:
    """One weight stacked over layers: ``W_Q/W_K/W_V`` ``[L, H, M, Dk|D]``, ``W_O`` ``[L, H, D, M]``, biases.

    Args:
        model: an interp Transformer whose layers all have the same head count (use :func:`layer_weights`
            per layer for a pruned model with per-layer head counts).
        name: ``"W_Q"``, ``"W_K"``, ``"W_V"``, ``"W_O"``, ``"b_Q"``, ``"b_K"``, ``"b_V"`` or ``"b_O"``.
        fold_norm: multiply the rows of the reading matrices (W_Q/W_K/W_V) by ``ln1``'s weight, so they act on
            the normalised-but-unscaled residual (TL's ``fold_ln``, without moving the bias).

    Returns:
        The stacked tensor (detached).

    Raises:
        ValueError: an unknown name, or layers with different head counts.

    Example:
        >>> from interp.weights import stacked
        >>> from interp.examples import model
        >>> stacked(model, "W_K").shape      # [L, H, M, D]
    """
    names = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
    if name not in names:
        raise ValueError(f"unknown weight {name!r}; one of {names}")
    counts = {block.attn.n_heads for block in model.blocks}
    if len(counts) != 1:
        raise ValueError(f"layers have different head counts {sorted(counts)}; use layer_weights(model, layer)")
    out = []
    for layer, block in enumerate(model.blocks):
        w = layer_weights(model, layer)[name]
        norm_weight = getattr(block.ln1, "weight", None)  # None: no input norm (nn.Identity)
        if fold_norm and name in ("W_Q", "W_K", "W_V") and norm_weight is not None:
            w = w * norm_weight.detach()[None, :, None]  # [H, M, D]: scale each residual direction
        out.append(w)
    return torch.stack(out)  # [L, ...]


def QK(model: Transformer, *, fold_norm: bool = False) -> FactoredMatrix:
    """``W_Q W_K^T`` per head, factored: shape ``[L, H, M, M]``, rank <= D (D + R for MLA).

    ``x_q @ QK[l, h] @ x_k^T`` is head (l, h)'s attention score before scaling (no rotation, no biases).

    Example:
        >>> from interp.examples import model
        >>> model.QK[1, 0].norm()
    """
    return FactoredMatrix(stacked(model, "W_Q", fold_norm=fold_norm),
                          stacked(model, "W_K", fold_norm=fold_norm).transpose(-1, -2))


def OV(model: Transformer, *, fold_norm: bool = False) -> FactoredMatrix:
    """``W_V W_O`` per head, factored: shape ``[L, H, M, M]``, rank <= D; ``x @ OV[l, h]`` is what the head
    writes for an attended position x (bias-free).

    Example:
        >>> from interp.examples import model
        >>> model.OV[0, 2].svd()[1]      # singular values
    """
    return FactoredMatrix(stacked(model, "W_V", fold_norm=fold_norm), stacked(model, "W_O"))
