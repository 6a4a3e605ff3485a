"""Copy-suppression heads (McDougall et al. 2023, "Copy suppression: comprehensively understanding an attention
head"): a head whose OV circuit *lowers* the logit of the token it attends to.

Score: the negative copying score of the effective OV circuit (:mod:`.ov_circuit`). For each scored token ``t``
the head's logits when attending to ``t`` are compared with those of ``comparisons`` tokens drawn uniformly from
the vocabulary (the whole vocabulary when it is no larger); the token's score is the fraction of them whose
logit lies strictly *above* ``t``'s own. 1 = the head always pushes the attended token to the bottom; ~0.5 =
chance; the mirror image of the positive copying score of induction heads
(:class:`~interp.analysis.CopyingReducer`). McDougall et al. find GPT-2 Small's L10H7 puts the attended token in
the bottom 10 of 50k for 85 % of tokens, a score near 1.

Threshold ``copy_suppression_threshold = 0.9``: the attended token is below 90 % of the vocabulary on average.
A random head's OV circuit gives 0.5 +- a few points, and a copying (induction, name mover) head is near 0: 0.9
keeps only heads that suppress systematically.
"""

from __future__ import annotations

from typing import Any

import torch

from ..streaming import Reducer
from ._stream import head_counts
from .kinds import HeadKind, KindRun, not_measured, register_kind, sampled_rows
from .ov_circuit import has_unembedding, ov_logits

__all__ = ["copy_suppression_scores"]


def copy_suppression_scores(model: Any, *, n_tokens: int = 512, comparisons: int = 256,
                            seed: int = 0) -> torch.Tensor:
    """Per head and scored token, the fraction of comparison tokens whose effective-OV logit beats the
    attended token's own.

    Args:
        model: an interp Transformer with an unembedding.
        n_tokens: vocabulary tokens scored (drawn without replacement, seeded; all when the vocabulary is
            smaller).
        comparisons: tokens each scored token is compared with (the whole vocabulary when it is smaller).
        seed: of the draws.

    Returns:
        ``[L, H_max, n]`` float32 (NaN for heads a pruned layer lacks); the score of a head is the mean over
        the last axis.

    Raises:
        ValueError: a model without an unembedding, or ``n_tokens`` / ``comparisons`` < 1.

    Example:
        >>> from interp.analysis.copy_suppression import copy_suppression_scores
        >>> from interp.examples import model
        >>> per_token = copy_suppression_scores(model, n_tokens=64)
        >>> per_token.mean(-1).shape       # [L, H]
    """
    for name, v in (("n_tokens", n_tokens), ("comparisons", comparisons)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be an int >= 1")
    V = model.unembed.weight.shape[0] if has_unembedding(model) else 0
    if not V:
        raise ValueError("copy-suppression scores read the unembedding, and this model has none")
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randperm(V, generator=gen)[:n_tokens]  # [n]
    if comparisons >= V:
        cols = torch.cat([tokens[:, None], torch.arange(V).expand(len(tokens), V)], dim=1)  # [n, 1 + V]
    else:
        cols = torch.cat([tokens[:, None], torch.randint(V, (len(tokens), comparisons), generator=gen)], 1)
    logits = ov_logits(model, tokens, cols)  # [L, H, n, 1 + K]: column 0 is the attended token itself
    own, other = logits[..., :1], logits[..., 1:]
    same = (cols[:, 1:] == tokens[:, None]).to(other.device)  # [n, K]: the token itself never counts as above
    above = ((other > own) & ~same).float()  # [L, H, n, K]
    valid = (~same).float().sum(-1)  # [n]
    return (above.sum(-1) / valid).masked_fill(logits[..., 0].isnan(), torch.nan).cpu()  # [L, H, n]


def _rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    model = run.model
    if not has_unembedding(model):
        return not_measured(run, "copy-suppression", "the model has no unembedding")
    n, k = run["copy_suppression_tokens"], run["copy_suppression_comparisons"]
    per_token = copy_suppression_scores(model, n_tokens=n, comparisons=k, seed=run["seed"])  # [L, H, n]
    threshold = run["copy_suppression_threshold"]
    run.probes["copy-suppression"] = (f"the weights: {per_token.shape[-1]} vocabulary tokens against {k} "
                                      "comparison tokens each")
    return sampled_rows("copy-suppression", per_token, head_counts(model), threshold, lambda s, score: (
        f"attended token below {100 * score:.0f}% of the vocabulary in the head's effective OV logits "
        f"({len(s)} tokens)"))


register_kind(HeadKind(
    "copy-suppression", ("copy-suppression",), "weights", None, _rows,
    threshold="copy_suppression_threshold=0.9",
    reason="the attended token sits below 90 % of the vocabulary in the head's own logits on average; random "
           "heads sit near 0.5 and copying heads near 0",
    source="McDougall et al. 2023, Copy suppression: comprehensively understanding an attention head",
    default=False, colour="#17a589",
    defaults={"copy_suppression_threshold": 0.9, "copy_suppression_tokens": 512,
              "copy_suppression_comparisons": 256}))
