"""Head ablation experiments: which heads a behaviour needs, by zero, mean and resample ablation (the
interventions themselves live in :mod:`interp.interventions`, shared with pruning).

* :func:`ablate_heads` (:func:`interp.interventions.ablate` on heads), :func:`head_z_means` and
  :func:`head_z_samples` (the reference statistics of mean / resample ablation);
* :func:`compare_with_random` and :func:`random_head_sets`: claims like "these k heads do the job" compare the
  effect of ablating them with ablating k random heads, many times, not with ablating nothing;
* the causal check of induction heads: :func:`in_context_gain` on ``[bos] x_1..x_n x_1..x_n`` (the mean
  next-token loss on the first half minus the loss on the repeated half; induction heads produce it, so
  ablating them should remove most of it, while ablating a head with another job should not) and
  :func:`ablation_table`; :func:`repeated_text_sequences` builds the same test from natural text.

Zero-ablation takes the model off-distribution (induction-2l with its layer 1 zero-ablated predicts *worse*
than uniform guessing on both halves); mean- and resample-ablation are the fairer measures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
import torch.nn.functional as F

from ..data import first_occurrence_mask, repeated_sequences
from ..interventions import ABLATIONS, COMPONENTS, ablate, unit_means, unit_samples

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["ABLATIONS", "ablate_heads", "ablation_table", "compare_with_random", "head_z_means", "head_z_samples",
           "in_context_gain", "random_expert_sets", "random_head_sets", "repeated_text_sequences"]

Heads = Iterable[tuple[int, int]]


def head_z_means(model: Any, reference: Any, layers: Sequence[int] | None = None, *,
                 per_position: bool = False) -> dict[int, torch.Tensor]:
    """Each head's mean z over a reference distribution (what mean-ablation puts in its place):
    :func:`interp.interventions.unit_means` of the heads.

    Args:
        model: an interp Transformer.
        reference: ``[B, T]`` token ids, a Batch, a batch dict (``tokens``, optional ``attention_mask``) or a
            sequence of them; padding (attention_mask 0) is left out of the mean.
        layers: the layers to record (default all).
        per_position: one mean per position ``[T, H, D]`` (all batches must have the same length) instead of
            one over all positions ``[H, D]``.

    Returns:
        ``{layer: [H, D]}`` (or ``[T, H, D]``), on the model's device.

    Raises:
        ValueError: empty reference, or batches of different lengths with ``per_position``.
        TypeError: a reference batch that is not token ids.

    Example:
        >>> import interp
        >>> from interp.analysis.ablate import head_z_means
        >>> from interp.examples import model
        >>> means = head_z_means(model, interp.data.repeated_sequences(64, 25, 128, seed=7, bos_id=0))
        >>> means[1].shape
        torch.Size([4, 32])
    """
    return unit_means(model, reference, layers, per_position=per_position, component="heads")


def head_z_samples(model: Any, reference: Any, layers: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
    """Each head's z on every reference input ``{layer: [R, T, H, D]}`` (what resample-ablation draws from).

    Raises:
        ValueError: empty reference, or reference batches of different lengths.
    """
    return unit_samples(model, reference, layers, component="heads")


def ablate_heads(model: Any, heads: Heads, method: str = "mean", *, reference: Any = None,
                 per_position: bool = False, positions: Any = None, seed: int = 0,
                 values: dict[int, torch.Tensor] | None = None) -> contextlib.AbstractContextManager[None]:
    """Run ``model`` with ``heads`` ablated inside the ``with`` block (hooks on ``hook_z``, removed on exit):
    :func:`interp.interventions.ablate` with ``component="heads"``.

    Args:
        model: an interp Transformer.
        heads: ``(layer, head)`` pairs.
        method: ``"zero"``, ``"mean"`` or ``"resample"`` (see :mod:`interp.interventions`).
        reference, per_position, positions, seed, values: as :func:`interp.interventions.ablate` (the reference
            distribution of mean / resample, per-position means, the query positions ablated, the resample
            draw, precomputed :func:`head_z_means` / :func:`head_z_samples`).

    Raises:
        ValueError: unknown method, a head out of range, a missing reference, bad positions, or an input whose
            length does not match a per-position / resample reference.

    Example:
        >>> from interp.analysis.ablate import ablate_heads
        >>> from interp.examples import model, tokens
        >>> with ablate_heads(model, [(1, 0), (1, 2)], "mean", reference=tokens):
        ...     logits = model(tokens)
    """
    return ablate(model, heads, method, component="heads", reference=reference, per_position=per_position,
                  positions=positions, seed=seed, values=values)


def random_head_sets(model: Any, k: int, n_draws: int, *, seed: int = 0, exclude: Heads = (),
                     layers: Sequence[int] | None = None,
                     skip_sets: Iterable[Heads] = ()) -> list[list[tuple[int, int]]]:
    """``n_draws`` distinct random sets of ``k`` heads (sampled without replacement inside a set).

    Args:
        model: gives the head counts.
        k: heads per set.
        n_draws: how many sets (fewer when fewer distinct sets exist).
        seed: the random generator's seed.
        exclude: heads never drawn (e.g. the target heads, for a "k other heads" baseline).
        layers: draw only from these layers (default all).
        skip_sets: sets never returned (e.g. the target set itself, which is no random comparison).

    Raises:
        ValueError: k < 1, n_draws < 1, or fewer than k heads to draw from.

    Example:
        >>> from interp.analysis.ablate import random_head_sets
        >>> from interp.examples import model
        >>> random_head_sets(model, 4, 20, seed=0)[0]
        [(1, 0), (0, 0), (1, 3), (0, 3)]
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be an int >= 1")
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 1:
        raise ValueError(f"n_draws={n_draws!r} must be an int >= 1")
    ex = set(map(tuple, exclude))
    layers = range(len(model.blocks)) if layers is None else layers
    pool = [(layer, h) for layer in layers for h in range(model.blocks[layer].attn.n_heads) if (layer, h) not in ex]
    return _draw_sets(pool, k, n_draws, seed, skip_sets, "heads")


def random_expert_sets(model: Any, k: int, n_draws: int, *, seed: int = 0, exclude: Iterable[tuple[int, int]] = (),
                       layers: Sequence[int] | None = None,
                       skip_sets: Iterable[Iterable[tuple[int, int]]] = ()) -> list[list[tuple[int, int]]]:
    """``n_draws`` distinct random sets of ``k`` ``(layer, expert)`` pairs from the MoE layers, as
    :func:`random_head_sets` draws heads.

    Raises:
        ValueError: k < 1, n_draws < 1, a model without experts, or fewer than k experts to draw from.

    Example:
        >>> from interp.analysis.ablate import random_expert_sets
        >>> from interp.examples import moe_model
        >>> sets = random_expert_sets(moe_model, 2, 20, seed=0)   # 20 distinct pairs of (layer, expert)
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be an int >= 1")
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 1:
        raise ValueError(f"n_draws={n_draws!r} must be an int >= 1")
    counts = COMPONENTS["experts"].counts(model)  # experts per layer, 0 for a dense MLP: what ablate(...) accepts
    moe = [layer for layer, n in enumerate(counts) if n]
    if not moe:
        raise ValueError(f"model has no mixture-of-experts layer (cfg.n_experts={model.cfg.n_experts})")
    ex = set(map(tuple, exclude))
    layers = moe if layers is None else [layer for layer in layers if layer in moe]
    pool = [(layer, e) for layer in layers for e in range(counts[layer]) if (layer, e) not in ex]
    return _draw_sets(pool, k, n_draws, seed, skip_sets, "experts")


def _draw_sets(pool: list[tuple[int, int]], k: int, n_draws: int, seed: int, skip_sets: Iterable,
               what: str) -> list[list[tuple[int, int]]]:
    """Distinct random k-subsets of ``pool`` (heads or experts), never one of ``skip_sets``."""
    if len(pool) < k:
        raise ValueError(f"k={k} {what} requested but only {len(pool)} {what} to draw from")
    gen = torch.Generator().manual_seed(seed)
    sets: list[list[tuple[int, int]]] = []
    skip = {frozenset(tuple(map(int, h)) for h in s) for s in skip_sets}
    seen: set[frozenset] = set()
    for _ in range(50 * n_draws):
        pick = [pool[int(i)] for i in torch.randperm(len(pool), generator=gen)[:k]]
        if frozenset(pick) not in seen and frozenset(pick) not in skip:
            seen.add(frozenset(pick))
            sets.append(pick)
        if len(sets) == n_draws:
            break
    return sets


def compare_with_random(measure, target: Sequence[tuple[int, int]], model: Any, *, n_draws: int = 20,
                        seed: int = 0, exclude_target: bool = False,
                        layers: Sequence[int] | None = None, units: str = "heads") -> pd.DataFrame:
    """The effect of ablating ``target`` beside the effects of ablating random head sets of the same size.

    With ``units="experts"`` the sets are ``(layer, expert)`` pairs of a mixture-of-experts model, drawn by
    :func:`random_expert_sets` (``measure`` then ablates experts with the same
    :func:`interp.interventions.ablate`, ``component="experts"``, or its wrapper
    :func:`interp.analysis.experts.ablate_experts`).

    Args:
        measure: ``measure(heads) -> float``, the quantity with ``heads`` ablated (e.g. the in-context gain).
        target: the heads the claim is about.
        model: gives the head counts for the random draws.
        n_draws: random sets (>= 20 for a claim; fewer when the model has fewer distinct sets).
        seed: of the random draws.
        exclude_target: draw random sets among the other heads only (by default random sets may share heads
            with the target, but are never the target set itself).
        layers: draw random sets only from these layers.

    Returns:
        DataFrame ``set, heads, value``: the first row is ``"none"`` (nothing ablated), then ``"target"``, then
        ``"random {i}"``. ``df.attrs``: ``n_random``, ``target_value``, ``random_min``, ``random_max``,
        ``random_mean``, ``random_sd``, ``rank`` (random sets whose value is <= the target's; 0 = the target
        lowers the measure more than every random set).

    Example:
        >>> from interp.analysis.ablate import compare_with_random
        >>> from interp.examples import model
        >>> df = compare_with_random(lambda hs: sum(h for _, h in hs), [(1, 0), (1, 1)], model, n_draws=5)
        >>> df.attrs["rank"]   # 0: the target removes more gain than every random set
    """
    target = [(int(layer), int(head)) for layer, head in target]
    k = len(target)
    if k == 0:
        raise ValueError("target is empty: name the heads the claim is about")
    if units not in ("heads", "experts"):
        raise ValueError(f"units={units!r} must be 'heads' or 'experts'")
    draw = random_head_sets if units == "heads" else random_expert_sets
    sets = draw(model, k, n_draws, seed=seed, exclude=target if exclude_target else (), layers=layers,
                skip_sets=[target])
    tag = "H" if units == "heads" else "E"
    rows = [{"set": "none", "heads": "", "value": float(measure([]))},
            {"set": "target", "heads": " ".join(f"L{a}{tag}{b}" for a, b in target), "value": float(measure(target))}]
    for i, s in enumerate(sets):
        rows.append({"set": f"random {i}", "heads": " ".join(f"L{a}{tag}{b}" for a, b in s),
                     "value": float(measure(s))})
    df = pd.DataFrame(rows)
    rand = df.value[2:]
    tv = float(df.value[1])
    df.attrs.update(n_random=len(sets), target_value=tv, random_min=float(rand.min()), random_max=float(rand.max()),
                    random_mean=float(rand.mean()), random_sd=float(rand.std(ddof=1)) if len(rand) > 1 else 0.0,
                    rank=int((rand <= tv).sum()))
    return df


def repeated_text_sequences(model: Any, texts: Iterable[str], n_seqs: int, half_len: int, *,
                            bos_id: int | None = None) -> torch.Tensor:
    """Natural text repeated once: ``[bos] x_1..x_n x_1..x_n`` with x a run of ``half_len`` consecutive tokens
    of the texts (joined, special tokens dropped), so the first half has the model's ordinary text loss and the
    repeated half can be predicted by induction.

    Args:
        model: a model with a tokenizer (``model.to_tokens``).
        texts: the text source (e.g. UD EWT dev sentences from :func:`interp.pruning.ud_sentences`).
        n_seqs: sequences to build (consecutive, non-overlapping runs).
        half_len: tokens per half.
        bos_id: prepended when given (default: the tokenizer's ``bos_id`` when it has one).

    Returns:
        LongTensor ``[n_seqs, (1 if bos) + 2 * half_len]``.

    Raises:
        ValueError: not enough text for ``n_seqs`` runs, or non-positive sizes.

    Example:
        >>> import interp
        >>> from interp.analysis.ablate import repeated_text_sequences
        >>> toks = repeated_text_sequences(interp.load("minilm-l6"), ["The cat sat on the mat."] * 20, 4, 8)
    """
    if n_seqs < 1 or half_len < 1:
        raise ValueError(f"n_seqs={n_seqs} and half_len={half_len} must be >= 1")
    tok = model._need_tokenizer() if hasattr(model, "_need_tokenizer") else model.tokenizer
    if bos_id is None:
        bos_id = getattr(tok, "bos_id", None)
    special = set(getattr(tok, "special_ids", set()) or set())
    stream: list[int] = []
    need = n_seqs * half_len
    for text in texts:
        ids = model.to_tokens(text)[0].tolist()  # [T] with the model's special tokens
        stream.extend(i for i in ids if i not in special)
        if len(stream) >= need:
            break
    if len(stream) < need:
        raise ValueError(f"the texts hold {len(stream)} tokens, {need} needed for {n_seqs} x {half_len}")
    half = torch.tensor(stream[:need], dtype=torch.long).view(n_seqs, half_len)  # [N, n]
    parts = [half, half]
    if bos_id is not None:
        parts.insert(0, torch.full((n_seqs, 1), int(bos_id), dtype=torch.long))
    return torch.cat(parts, dim=1)  # [N, (1) + 2n]


def in_context_gain(model: Transformer, tokens: torch.Tensor, half_len: int, *, bos: bool,
                    ablate: Iterable[tuple[int, int]] = (), method: str = "zero", reference: Any = None,
                    values: dict[int, torch.Tensor] | None = None, per_position: bool = False,
                    seed: int = 0) -> dict[str, float]:
    """Loss on the first and on the repeated half, with the given heads ablated (:func:`ablate_heads`).

    Args:
        model: a causal decoder with an unembedding.
        tokens: ``[B, (1 if bos) + 2 * half_len]`` repeated sequences (random tokens or natural text).
        half_len: length of one half.
        bos: whether the sequences start with a BOS token.
        ablate: ``(layer, head)`` pairs to ablate.
        method: ``"zero"``, ``"mean"`` or ``"resample"``.
        reference: reference inputs for mean / resample (same distribution as ``tokens``, other samples).
        values: precomputed replacements (from :func:`head_z_means` / :func:`head_z_samples`).
        per_position: per-position means (mean-ablation).
        seed: the resample draw.

    Returns:
        ``{"first", "repeated", "gain"}`` in nats per token.

    Raises:
        ValueError: a head out of range, tokens of the wrong length, an unknown method or a missing reference.
    """
    f, r = (float(x) for x in _gain_losses(model, tokens, half_len, bos=bos, ablate=ablate, method=method,
                                            reference=reference, values=values, per_position=per_position,
                                            seed=seed).cpu())
    return {"first": f, "repeated": r, "gain": f - r}


def _gain_losses(model: Transformer, tokens: torch.Tensor, half_len: int, *, bos: bool,
                 ablate: Iterable[tuple[int, int]], method: str, reference: Any,
                 values: dict[int, torch.Tensor] | None, per_position: bool, seed: int) -> torch.Tensor:
    """:func:`in_context_gain`'s mean losses on the first and the repeated half, ``[2]`` on the model's device
    (loops over many ablations bring them back to the CPU once, not once per run)."""
    T = (1 if bos else 0) + 2 * half_len
    if tokens.dim() != 2 or tokens.shape[1] != T:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}, expected [B, {T}] for half_len={half_len}")
    heads = list(ablate)
    p = next(model.parameters())
    with torch.no_grad(), contextlib.ExitStack() as stack:
        if heads:
            stack.enter_context(ablate_heads(model, heads, method, reference=reference, values=values,
                                             per_position=per_position, seed=seed))
        else:
            _check_method(method)
        logits = model(tokens.to(p.device)).float()  # [B, T, V]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten().to(p.device), reduction="none")
    loss = loss.view(tokens.shape[0], T - 1)  # [B, T-1]: loss of predicting token t+1 at position t
    first, rep = first_occurrence_mask(tokens.shape[0], half_len, bos=bos)  # [B, T-1] each
    w = torch.stack([first, rep]).to(loss)  # [2, B, T-1]: the two halves as weights (no boolean index: no sync)
    return (w * loss).sum((1, 2)) / w.sum((1, 2))  # [2]


def _check_method(method: str) -> None:
    if method not in ABLATIONS:
        raise ValueError(f"method={method!r} is not one of {ABLATIONS}")


def ablation_table(model: Transformer, induction_heads: Iterable[tuple[int, int]], *, n_seqs: int = 64,
                   half_len: int = 25, seed: int = 1234, bos_id: int | None = None,
                   method: str = "zero") -> pd.DataFrame:
    """The gain with nothing ablated, with all ``induction_heads`` ablated, and with each head alone.

    Args:
        model: a causal decoder with an unembedding.
        induction_heads: the heads a classifier reported as induction heads.
        n_seqs, half_len, seed: the repeated random sequences used.
        bos_id: the model's BOS id (default: ``model.tokenizer.bos_id`` when present).
        method: ``"zero"``, ``"mean"`` or ``"resample"``; the reference distribution for the last two is
            ``n_seqs`` other repeated sequences (seed ``seed + 1``).

    Returns:
        DataFrame ``ablated, first, repeated, gain, gain_kept`` (``gain_kept`` = gain / unablated gain); the
        ``ablated`` column is ``"none"``, ``"induction heads"`` or ``"L{l}H{h}"``.

    Example:
        >>> from interp.analysis.ablate import ablation_table
        >>> from interp.examples import model
        >>> ablation_table(model, [(1, 0), (1, 1), (1, 2), (1, 3)])
    """
    if bos_id is None:
        bos_id = getattr(getattr(model, "tokenizer", None), "bos_id", None)
    toks = repeated_sequences(n_seqs, half_len, model.cfg.d_vocab, seed=seed, bos_id=bos_id)
    bos = bos_id is not None
    _check_method(method)
    ref = None if method == "zero" else repeated_sequences(n_seqs, half_len, model.cfg.d_vocab, seed=seed + 1,
                                                           bos_id=bos_id)
    ind = sorted(set(map(tuple, induction_heads)))
    runs: list[tuple[str, list]] = [("none", []), ("induction heads", ind)]
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):  # every head alone, the reported induction heads included
            runs.append((f"L{layer}H{head}", [(layer, head)]))
    losses = torch.stack([_gain_losses(model, toks, half_len, bos=bos, ablate=heads, method=method, reference=ref,
                                       values=None, per_position=False, seed=0) for _, heads in runs]).cpu()  # [R, 2]
    rows = []
    base = None
    for (name, _), (f, r) in zip(runs, losses.tolist()):
        base = f - r if base is None else base
        rows.append({"ablated": name, "first": f, "repeated": r, "gain": f - r, "gain_kept": (f - r) / base})
    return pd.DataFrame(rows)
