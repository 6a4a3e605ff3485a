"""Causal evidence for a head kind: ablating the kind's heads against 20 random head sets of the same size, as the
induction kind's check does (:func:`~interp.analysis.ablate.compare_with_random`), plus a paired test over
examples and an interval.

Each kind has its own metric, measured per example with the heads mean-ablated (:func:`kind_metric`):

- ``sink``: the next-token loss of ordinary text (the sink's effect on perplexity when removed; Guo et al.'s
  dormant heads change almost nothing);
- ``copy-suppression``: the mean log-probability of tokens seen earlier in the context that are not the next
  token (copy suppression lowers them; McDougall et al.): ablating the heads should raise it;
- ``successor``: the log-probability of the next item of an ordinal sequence after three items (Monday Tuesday
  Wednesday -> Thursday); ablating successor heads should lower it;
- ``induction``: the in-context loss on the repeated half of ``[bos] x x`` (:func:`~.ablate.in_context_gain`'s
  second half);
- ``retrieval``: needle recall, the log-probability of each needle token as the answer copies it (one example
  per copied token; :func:`interp.data.needle.needle_batches`; ``half_len`` = the needle's length); ablating
  retrieval heads should lower it;
- ``name-mover``: the logit difference IO - S at the last position of IOI prompts (``answers`` ``[N, 2]``:
  :func:`interp.data.circuit_tasks.ioi_prompts`); ablating name movers should lower it, negative name movers
  raise it.

Function-vector heads are scored on ICL prompts of several lengths: their metric, ICL accuracy, is
:func:`interp.analysis.function_vector.icl_accuracy`.

:func:`paired_random_test` then compares, example by example, the target's effect (ablated minus clean) with the
mean effect of the random sets: the mean paired difference, its bootstrap interval and a Wilcoxon signed-rank
p-value, beside the rank of the target among the random sets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
import torch.nn.functional as F

from .ablate import ablate_heads, compare_with_random, head_z_means
from .uncertainty import bootstrap_interval

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["kind_metric", "ordinal_prompts", "paired_random_test"]

PerExample = Callable[[list[tuple[int, int]]], torch.Tensor]


def paired_random_test(model: Any, target: Sequence[tuple[int, int]], per_example: PerExample, *,
                       n_draws: int = 20, seed: int = 0, n_resamples: int = 2000) -> pd.DataFrame:
    """Ablating ``target`` against ``n_draws`` random head sets of its size, example by example.

    Args:
        model: gives the head counts for the random draws.
        target: the kind's heads.
        per_example: ``per_example(heads) -> [N]`` the metric of every example with ``heads`` ablated (``[]``:
            nothing ablated).
        n_draws: random sets (fewer when the model has fewer distinct sets).
        seed: of the draws and the bootstrap.
        n_resamples: bootstrap resamples of the paired difference.

    Returns:
        :func:`~interp.analysis.ablate.compare_with_random`'s table (``set, heads, value``: the mean metric);
        ``df.attrs`` adds ``target_effect`` and ``random_effect`` (mean change from the clean run),
        ``paired_mean``, ``paired_low``, ``paired_high`` (target effect minus the random sets' mean effect, per
        example: mean and bootstrap interval), ``p_value`` (Wilcoxon signed-rank, two-sided; 1.0 when every
        difference is 0), ``n_examples``, and ``beyond_random``: random sets whose effect is at least as large
        in the target's direction as the target's (0 = the target moves the metric further than every random set).

    Raises:
        ValueError: an empty target, or per-example values of different lengths.

    Example:
        >>> import torch
        >>> from interp.analysis.kind_causal import paired_random_test
        >>> from interp.examples import model
        >>> df = paired_random_test(model, [(1, 0)], lambda hs: torch.full((8,), float(len(hs))), n_draws=5)
        >>> df.attrs["target_effect"]
        1.0
    """
    cache: dict[frozenset, torch.Tensor] = {}

    def values(heads: Sequence[tuple[int, int]]) -> torch.Tensor:
        key = frozenset(tuple(map(int, h)) for h in heads)
        if key not in cache:
            cache[key] = per_example([(int(h[0]), int(h[1])) for h in heads]).detach().double().cpu().flatten()
        return cache[key]

    df = compare_with_random(lambda hs: float(values(hs).mean()), target, model, n_draws=n_draws, seed=seed)
    clean = values([])
    sets: list[list[tuple[int, int]]] = [[_head(h) for h in row.split()] for row in df.heads[2:]]
    lengths = {len(clean), len(values(target)), *(len(values(s)) for s in sets)}
    if len(lengths) != 1:
        raise ValueError(f"per_example returned different numbers of examples {sorted(lengths)}")
    t_eff = values(target) - clean  # [N]
    r_effs = torch.stack([values(s) - clean for s in sets]) if sets else torch.zeros(1, len(clean))  # [S, N]
    diff = t_eff - r_effs.mean(0)  # [N]
    low, high = bootstrap_interval(diff, n_resamples, seed=seed)
    df.attrs.update(target_effect=float(t_eff.mean()), random_effect=float(r_effs.mean()),
                    paired_mean=float(diff.mean()), paired_low=low, paired_high=high,
                    p_value=_wilcoxon(diff), n_examples=len(diff),
                    beyond_random=int((r_effs.mean(1) * torch.sign(t_eff.mean()) >= t_eff.mean().abs()).sum()))
    return df


def _head(label: str) -> tuple[int, int]:
    """``"L3H5"`` (compare_with_random's label) -> ``(3, 5)``."""
    layer, head = label[1:].split("H")
    return int(layer), int(head)


def _wilcoxon(diff: torch.Tensor) -> float:
    """Two-sided Wilcoxon signed-rank p-value of ``diff`` (1.0 when every difference is zero)."""
    from scipy.stats import wilcoxon

    x = diff.numpy()
    if not (x != 0).any():
        return 1.0
    return float(wilcoxon(x).pvalue)


def ordinal_prompts(sequences: dict[str, list[int]] | list[list[int]], *, context: int = 3,
                    bos_id: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of ``context`` consecutive ordinal tokens and the next one: ``(prompts [N, context (+1)], answers [N])``.

    Raises:
        ValueError: no sequence longer than ``context``.

    Example:
        >>> from interp.analysis.kind_causal import ordinal_prompts
        >>> ordinal_prompts([[5, 6, 7, 8, 9]])[1]
        tensor([8, 9])
    """
    seqs = list(sequences.values()) if isinstance(sequences, dict) else list(sequences)
    prompts = [s[i:i + context] for s in seqs for i in range(len(s) - context)]
    answers = [s[i + context] for s in seqs for i in range(len(s) - context)]
    if not prompts:
        raise ValueError(f"no ordinal sequence is longer than context={context}")
    x = torch.tensor(prompts)  # [N, context]
    if bos_id is not None:
        x = torch.cat([torch.full((len(x), 1), bos_id), x], dim=1)  # [N, 1 + context]
    return x, torch.tensor(answers)


@torch.no_grad()
def kind_metric(model: Transformer, kind: str, tokens: torch.Tensor, *, answers: torch.Tensor | None = None,
                half_len: int | None = None, method: str = "mean", reference: Any = None,
                per_position: bool = False) -> PerExample:
    """The per-example metric of ``kind`` (module docstring) as ``heads -> [N]``, with ``heads`` ablated.

    Args:
        model: an interp Transformer.
        kind: ``"sink"``, ``"copy-suppression"``, ``"successor"``, ``"induction"``, ``"retrieval"`` or
            ``"name-mover"``.
        tokens: ``[N, T]`` the examples: text for sink and copy suppression, :func:`ordinal_prompts` for
            successor, ``[bos] x x`` for induction.
        answers: ``[N]`` the successor of each prompt (successor); ``[N, 2]`` (IO, S) ids (name-mover).
        half_len: the length of x (induction) or of the needle (retrieval).
        method: the ablation (``"mean"`` or ``"resample"``; the reference is ``tokens`` unless given).
        reference: the ablation's reference data.
        per_position: mean ablation with one mean per position (the reference of ``tokens``' length; Wang et al.
            knock heads out with the per-position mean over the "ABC" prompts).

    Returns:
        ``per_example(heads) -> [N]`` float64 (loss: lower is better for sink and induction; log-probabilities
        for the others; name-mover: the logit difference; retrieval: ``[N * (half_len - 1)]``, one per copied token).

    Raises:
        ValueError: an unknown kind, or a missing ``answers`` / ``half_len``.

    Example:
        >>> from interp.analysis.kind_causal import kind_metric
        >>> from interp.examples import model, tokens
        >>> per = kind_metric(model, "induction", tokens, half_len=10)
        >>> per([]).shape, per([(1, 0)]).shape
        (torch.Size([2]), torch.Size([2]))
    """
    kinds = ("sink", "copy-suppression", "successor", "induction", "retrieval", "name-mover")
    if kind not in kinds:
        raise ValueError(f"kind={kind!r}: causal metrics exist for {kinds}")
    if kind == "successor" and answers is None:
        raise ValueError("the successor metric needs answers= (the next item of each prompt)")
    if kind == "name-mover" and (answers is None or answers.dim() != 2 or answers.shape[1] != 2):
        shape = None if answers is None else tuple(answers.shape)
        raise ValueError(f"the name-mover metric needs answers= [N, 2] (IO, S) ids, got {shape}")
    if kind in ("induction", "retrieval") and half_len is None:
        raise ValueError(f"the {kind} metric needs half_len= (the length of the repeated run / the needle)")
    reference = tokens if reference is None else reference
    # Mean ablation's reference means, computed once for every head set (a full pass each time otherwise).
    values = head_z_means(model, reference, per_position=per_position) if method == "mean" else None

    def run(heads: list[tuple[int, int]]) -> torch.Tensor:
        if not heads:
            return model(tokens).float()
        with ablate_heads(model, heads, method, reference=reference, values=values, per_position=per_position):
            return model(tokens).float()

    def per_example(heads: list[tuple[int, int]]) -> torch.Tensor:
        logits = run(heads)  # [N, T, V]
        if kind == "name-mover":  # logit difference IO - S at END
            last = logits[:, -1].gather(-1, answers.to(logits.device))  # type: ignore[union-attr]  # [N, 2]
            return (last[:, 0] - last[:, 1]).double().cpu()
        if kind == "successor":
            logp = F.log_softmax(logits[:, -1], dim=-1)  # [N, V]
            return logp[torch.arange(len(tokens)), answers.to(logp.device)].double().cpu()  # type: ignore[union-attr]
        if kind in ("induction", "retrieval"):  # the copied half's tokens only: no [N, T, V] log-probs
            T = tokens.shape[1]
            logp = F.log_softmax(logits[:, T - half_len:T - 1], dim=-1)  # type: ignore[operator]  # [N, n-1, V]
            copied = logp.gather(-1, tokens[:, T - half_len + 1:, None].to(logp.device))[..., 0]  # type: ignore[operator]
            # induction: the copied half's loss per sequence; retrieval: recall per copied needle token
            return (-copied.mean(-1)).double().cpu() if kind == "induction" else copied.flatten().double().cpu()
        logp = F.log_softmax(logits, dim=-1)  # [N, T, V]
        if kind == "sink":
            nxt = logp[:, :-1].gather(-1, tokens[:, 1:, None].to(logp.device))[..., 0]  # [N, T-1]
            return (-nxt).mean(-1).double().cpu()
        return _seen_logprob(logp, tokens).double().cpu()

    return per_example


def _seen_logprob(logp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per sequence, the mean log-probability at each position of the tokens seen so far (up to and including
    the current one) that are not the next token."""
    N, T, V = logp.shape
    seen = torch.zeros(N, V, dtype=torch.bool, device=logp.device)
    total = torch.zeros(N, dtype=torch.float64, device=logp.device)
    count = torch.zeros(N, dtype=torch.float64, device=logp.device)
    tok = tokens.to(logp.device)
    for t in range(T - 1):
        seen[torch.arange(N), tok[:, t]] = True
        mask = seen.clone()
        mask[torch.arange(N), tok[:, t + 1]] = False  # the correct next token is not a suppressed copy
        total += (logp[:, t] * mask).sum(-1).double()
        count += mask.sum(-1).double()
    return total / count.clamp(min=1)
