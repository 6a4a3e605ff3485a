"""Composition scores between heads (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits").

A head in an earlier layer writes ``x @ OV_1`` into the residual stream; a later head reads it through its
query (Q-composition), its key (K-composition) or its value (V-composition). The score is how much of the
reading matrix the write lands in:

    score = ||OV_1 @ R_2||_F / (||OV_1||_F ||R_2||_F),   R_2 = QK_2 (Q), QK_2^T (K), OV_2 (V)

with ``QK = W_Q W_K^T`` and ``OV = W_V W_O`` (``x @ QK @ y^T`` is the score of query x on key y), as in
TransformerLens' ``all_composition_scores``. All products stay factored (rank <= d_head). Before scoring,
each reading matrix gets its layer's ``ln1`` weight folded in and, for LayerNorm models, each head's
write is centred (LayerNorm removes the mean of the residual), as TL's ``fold_ln`` and
``center_writing_weights`` do. Rotary models: the scores ignore the rotation (TL does the same).

Random baseline: the score of the same OV_1 against a random Gaussian reading matrix of the same factor
shapes; a score is only interesting well above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..weights import FactoredMatrix, stacked
from .patching_checks import check_n_samples

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["composition_baseline", "composition_scores", "composition_table"]

_MODES = ("Q", "K", "V")


def _circuits(model: Transformer) -> tuple[FactoredMatrix, FactoredMatrix]:
    cfg = model.cfg
    for name, value in (("qk_norm", cfg.qk_norm), ("sublayer_norm", cfg.sublayer_norm)):
        if value != ("none" if name == "qk_norm" else "input"):
            raise ValueError(f"composition scores read W_Q W_K^T and W_V W_O as the heads apply them: "
                             f"{name}={value!r} puts a norm inside those circuits")
    W_Q, W_K = stacked(model, "W_Q", fold_norm=True), stacked(model, "W_K", fold_norm=True)  # [L, H, M, Dk]
    W_V, W_O = stacked(model, "W_V", fold_norm=True), stacked(model, "W_O")  # [L, H, M, D], [L, H, D, M]
    if model.cfg.normalization == "pre":
        W_O = W_O - W_O.mean(-1, keepdim=True)  # the next LayerNorm removes the mean of every write
    return FactoredMatrix(W_Q, W_K.transpose(-1, -2)), FactoredMatrix(W_V, W_O)


def _score(left: FactoredMatrix, right: FactoredMatrix) -> torch.Tensor:
    """||left @ right|| / (||left|| ||right||) for every pair: left ``[L, H, ...]``, right ``[L, H, ...]`` ->
    ``[L, H, L, H]``."""
    # ||A1 C B2||_F^2 with C = B1 A2 is tr(C^T (A1^T A1) C (B2 B2^T)): only r x r products, no M x M.
    g1 = (left.A.transpose(-1, -2) @ left.A)[:, :, None, None]  # [L, H, 1, 1, r1, r1]
    g2 = (right.B @ right.B.transpose(-1, -2))[None, None]  # [1, 1, L', H', r2, r2]
    c = left.B[:, :, None, None] @ right.A[None, None]  # [L, H, L', H', r1, r2]
    sq = ((g1 @ c @ g2) * c).sum((-1, -2)).clamp_min(0)  # [L, H, L', H']
    return sq.sqrt() / (left.norm()[:, :, None, None] * right.norm()[None, None])  # [L, H, L', H']


def composition_scores(model: Transformer, mode: str = "K") -> torch.Tensor:
    """Composition scores of every (earlier head -> later head) pair.

    Args:
        model: an interp Transformer whose layers have one head count.
        mode: ``"Q"``, ``"K"`` or ``"V"``.

    Returns:
        ``[L, H, L, H]``: entry ``[l1, h1, l2, h2]`` is head (l1, h1) writing into head (l2, h2)'s query, key
        or value; NaN unless ``l1 < l2``.

    Raises:
        ValueError: an unknown mode.

    Example:
        >>> from interp.analysis.composition import composition_scores
        >>> from interp.examples import model
        >>> k = composition_scores(model, "K")
        >>> k[0, 2, 1, 0]          # previous-token head L0H2 -> induction head L1H0
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    QK, OV = _circuits(model)
    right = {"Q": QK, "K": QK.T, "V": OV}[mode]
    with torch.no_grad():
        scores = _score(OV, right)
    L = scores.shape[0]
    later = torch.arange(L)[:, None] < torch.arange(L)[None, :]  # [L, L]: l1 < l2
    return scores.masked_fill(~later[:, None, :, None], float("nan"))


def composition_baseline(model: Transformer, mode: str = "K", *, n_samples: int = 16, seed: int = 0) -> float:
    """Mean score of the model's OV circuits against random Gaussian reading matrices of the same shapes.

    Args:
        model: as :func:`composition_scores`.
        mode: ``"Q"``, ``"K"`` or ``"V"``.
        n_samples: random reading matrices per head.
        seed: seed of the generator.

    Returns:
        The mean over heads and samples (what an unrelated pair scores).

    Raises:
        ValueError: an unknown ``mode``, or ``n_samples`` that is not a positive int.

    Example:
        >>> from interp.analysis.composition import composition_baseline
        >>> from interp.examples import model
        >>> composition_baseline(model, "K")
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    n_samples = check_n_samples(n_samples)
    QK, OV = _circuits(model)
    right = {"Q": QK, "K": QK.T, "V": OV}[mode]
    gen = torch.Generator().manual_seed(seed)
    shape_a, shape_b = right.A.shape[-2:], right.B.shape[-2:]
    rand = FactoredMatrix(torch.randn(n_samples, 1, *shape_a, generator=gen).to(right.A),
                          torch.randn(n_samples, 1, *shape_b, generator=gen).to(right.B))  # [S, 1, M, M]
    with torch.no_grad():
        return float(_score(OV, rand).mean())


def composition_table(model: Transformer, *, baseline: bool = True) -> pd.DataFrame:
    """Q-, K- and V-composition of every pair of heads in different layers, as a long table.

    Args:
        model: as :func:`composition_scores`.
        baseline: add ``baseline`` (the random-reader score of :func:`composition_baseline`) and
            ``ratio`` = score / baseline.

    Returns:
        DataFrame ``mode, src_layer, src_head, dst_layer, dst_head, score`` (+ ``baseline, ratio``), sorted by
        mode and descending score.

    Example:
        >>> from interp.analysis.composition import composition_table
        >>> from interp.examples import model
        >>> composition_table(model).query("mode == 'K'").head(3)
    """
    rows = []
    for mode in _MODES:
        s = composition_scores(model, mode)
        base = composition_baseline(model, mode) if baseline else None
        L, H = s.shape[:2]
        for l1 in range(L):
            for h1 in range(H):
                for l2 in range(l1 + 1, L):
                    for h2 in range(H):
                        row: dict[str, Any] = {"mode": mode, "src_layer": l1, "src_head": h1, "dst_layer": l2, "dst_head": h2,
                               "score": float(s[l1, h1, l2, h2])}
                        if base is not None:
                            row.update(baseline=base, ratio=row["score"] / base)
                        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    return df.sort_values(["mode", "score"], ascending=[True, False], ignore_index=True)
