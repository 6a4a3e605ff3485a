"""Synthetic token data for attention analysis: repeated random sequences and an induction training mixture.

Token ids are abstract (no tokenizer): a sequence is random ids from ``[0, d_vocab)``, optionally excluding a
BOS id. Repeating a random span makes the second occurrence predictable only by looking back at the first
one, which is what induction heads do (Olsson et al., 2022; TransformerLens' induction-loss test).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

import torch

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["repeated_sequences", "induction_training_batch", "first_occurrence_mask", "repeated_tokens_for",
           "random_tokens_for"]


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _make_generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator:
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        return generator
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed={seed!r} must be an int")
    return torch.Generator().manual_seed(seed)


def _random_tokens(shape: tuple[int, ...], d_vocab: int, bos_id: int | None, gen: torch.Generator) -> torch.Tensor:
    """Uniform ids in ``[0, d_vocab)`` that never equal ``bos_id`` (drawn from d_vocab - 1 ids, then shifted)."""
    if bos_id is None:
        return torch.randint(0, d_vocab, shape, generator=gen)
    ids = torch.randint(0, d_vocab - 1, shape, generator=gen)
    return ids + (ids >= bos_id).long()  # skip over the BOS id


def _check_vocab(d_vocab: int, bos_id: int | None) -> None:
    _check_int("d_vocab", d_vocab, 2)
    if bos_id is not None:
        _check_int("bos_id", bos_id, 0)
        if bos_id >= d_vocab:
            raise ValueError(f"bos_id={bos_id} is outside the vocabulary [0, {d_vocab})")


def repeated_sequences(
    n_seqs: int,
    half_len: int,
    d_vocab: int,
    *,
    seed: int = 0,
    bos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random token sequences repeated once: ``[bos] x_1 .. x_n x_1 .. x_n``.

    The first half is unpredictable (loss ~ log(d_vocab)); every token of the second half except its first
    can be predicted by an induction head (attend to the token after the previous occurrence of the current
    token, copy it).

    Args:
        n_seqs: number of sequences (batch size).
        half_len: length n of the random half.
        d_vocab: vocabulary size; ids are drawn uniformly from ``[0, d_vocab)`` minus ``bos_id``.
        seed: seed of a fresh ``torch.Generator`` (ignored when ``generator`` is given).
        bos_id: if given, every sequence starts with this id, which never appears elsewhere.
        generator: a ``torch.Generator`` to draw from (advances its state).

    Returns:
        LongTensor ``[n_seqs, (1 if bos_id is not None else 0) + 2 * half_len]``.

    Raises:
        TypeError: a size or seed is not an int, or ``generator`` is not a Generator.
        ValueError: a size is not positive, or ``bos_id`` is outside the vocabulary.

    Example:
        >>> from interp.data.synthetic import repeated_sequences
        >>> toks = repeated_sequences(2, 5, 50, seed=1, bos_id=0)
        >>> toks.shape
        torch.Size([2, 11])
        >>> bool((toks[:, 1:6] == toks[:, 6:]).all())
        True
    """
    _check_int("n_seqs", n_seqs, 1)
    _check_int("half_len", half_len, 1)
    _check_vocab(d_vocab, bos_id)
    gen = _make_generator(seed, generator)
    half = _random_tokens((n_seqs, half_len), d_vocab, bos_id, gen)  # [N, n]
    parts = [half, half]
    if bos_id is not None:
        parts.insert(0, torch.full((n_seqs, 1), bos_id, dtype=torch.long))
    return torch.cat(parts, dim=1)  # [N, (1) + 2n]


@overload
def induction_training_batch(
    batch: int, seq_len: int, d_vocab: int, *, p_repeat: float = ..., min_span: int = ..., max_span: int | None = ...,
    bos_id: int | None = ..., seed: int = ..., generator: torch.Generator | None = ...,
    return_mask: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def induction_training_batch(
    batch: int, seq_len: int, d_vocab: int, *, p_repeat: float = ..., min_span: int = ..., max_span: int | None = ...,
    bos_id: int | None = ..., seed: int = ..., generator: torch.Generator | None = ...,
    return_mask: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


def induction_training_batch(
    batch: int,
    seq_len: int,
    d_vocab: int,
    *,
    p_repeat: float = 0.5,
    min_span: int = 4,
    max_span: int | None = None,
    bos_id: int | None = None,
    seed: int = 0,
    generator: torch.Generator | None = None,
    return_mask: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A training mixture: sequences in which a random span repeats later, mixed with plain random sequences.

    With probability ``p_repeat`` a sequence is random tokens in which a span of length ``L`` (uniform in
    ``[min_span, max_span]``) starting at a random position ``a`` is copied to a later random position
    ``b >= a + L`` (so the copy never overlaps its source). Otherwise the sequence is plain random tokens,
    so a model cannot assume that everything repeats. Span lengths and positions vary per sequence, which
    forces a general induction mechanism rather than a fixed-offset one.

    Args:
        batch: number of sequences.
        seq_len: tokens per sequence, including the BOS token if ``bos_id`` is given.
        d_vocab: vocabulary size.
        p_repeat: probability that a sequence contains a repeated span.
        min_span: shortest repeated span.
        max_span: longest repeated span; defaults to half the usable length (``(seq_len - bos) // 2``).
        bos_id: if given, every sequence starts with this id, which never appears elsewhere.
        seed: seed of a fresh ``torch.Generator`` (ignored when ``generator`` is given).
        generator: a ``torch.Generator`` to draw from (advances its state).
        return_mask: also return the mask of predictable positions (see Returns).

    Returns:
        LongTensor ``[batch, seq_len]``; with ``return_mask`` a tuple ``(tokens, predictable)`` where
        ``predictable[i, t]`` is True when token ``t`` is a copy whose preceding token is also in the copy
        (so an induction head can predict it from position ``t - 1``).

    Raises:
        TypeError: a size or seed is not an int.
        ValueError: sizes that do not fit (``seq_len`` too short for two spans of ``min_span``), a
            probability outside [0, 1], or ``bos_id`` outside the vocabulary.

    Example:
        >>> from interp.data.synthetic import induction_training_batch
        >>> toks, pred = induction_training_batch(4, 32, 64, p_repeat=1.0, seed=0, return_mask=True)
        >>> toks.shape, pred.shape
        (torch.Size([4, 32]), torch.Size([4, 32]))
        >>> int(pred.sum(1).min()) >= 3   # at least min_span - 1 predictable tokens per repeated sequence
        True
    """
    _check_int("batch", batch, 1)
    _check_int("seq_len", seq_len, 2)
    _check_vocab(d_vocab, bos_id)
    _check_int("min_span", min_span, 1)
    if not isinstance(p_repeat, (int, float)) or isinstance(p_repeat, bool) or not 0.0 <= p_repeat <= 1.0:
        raise ValueError(f"p_repeat={p_repeat!r} must be a number in [0, 1]")
    offset = 0 if bos_id is None else 1
    usable = seq_len - offset
    if max_span is None:
        max_span = usable // 2
    _check_int("max_span", max_span, 1)
    if min_span > max_span or 2 * max_span > usable:
        raise ValueError(
            f"min_span={min_span}, max_span={max_span} do not fit: need min_span <= max_span and "
            f"2 * max_span <= {usable} usable tokens (seq_len={seq_len}, bos={bos_id is not None})"
        )
    gen = _make_generator(seed, generator)
    toks = _random_tokens((batch, usable), d_vocab, bos_id, gen)  # [B, U]
    predictable = torch.zeros(batch, usable, dtype=torch.bool)
    # Draw every random choice as a tensor up front so the stream of draws does not depend on branch outcomes.
    repeat = torch.rand(batch, generator=gen) < p_repeat  # [B]
    span = torch.randint(min_span, max_span + 1, (batch,), generator=gen)  # [B]
    u_src = torch.rand(batch, generator=gen)  # [B]
    u_dst = torch.rand(batch, generator=gen)  # [B]
    for i in torch.nonzero(repeat).flatten().tolist():
        L = int(span[i])
        # Source start a in [0, usable - 2L]; destination start b in [a + L, usable - L].
        a = int(u_src[i] * (usable - 2 * L + 1))
        b = a + L + int(u_dst[i] * (usable - L - (a + L) + 1))
        toks[i, b:b + L] = toks[i, a:a + L]
        predictable[i, b + 1:b + L] = True
    if bos_id is not None:
        toks = torch.cat([torch.full((batch, 1), bos_id, dtype=torch.long), toks], dim=1)  # [B, T]
        predictable = torch.cat([torch.zeros(batch, 1, dtype=torch.bool), predictable], dim=1)  # [B, T]
    return (toks, predictable) if return_mask else toks


def first_occurrence_mask(n_seqs: int, half_len: int, *, bos: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks over the *predicted* positions of :func:`repeated_sequences` outputs (next-token targets).

    For logits at position ``t`` predicting token ``t + 1`` (``logits[:, :-1]`` against ``tokens[:, 1:]``),
    returns bool masks of shape ``[n_seqs, T - 1]``: ``first`` is True where the target lies in the first half
    (excluding its first token when there is no BOS, since nothing precedes it), ``repeated`` is True where
    the target lies in the second half and is not its first token (the first token of the copy is random
    with respect to the preceding context).

    Args:
        n_seqs: batch size.
        half_len: the ``half_len`` given to :func:`repeated_sequences`.
        bos: whether the sequences start with a BOS token.

    Returns:
        ``(first, repeated)`` bool masks ``[n_seqs, (1 if bos) + 2 * half_len - 1]``.

    Example:
        >>> from interp.data.synthetic import first_occurrence_mask
        >>> first, rep = first_occurrence_mask(1, 3)
        >>> first.int().tolist(), rep.int().tolist()
        ([[1, 1, 0, 0, 0]], [[0, 0, 0, 1, 1]])
    """
    _check_int("n_seqs", n_seqs, 1)
    _check_int("half_len", half_len, 1)
    off = 1 if bos else 0
    T = off + 2 * half_len
    target_pos = torch.arange(1, T)  # position of the predicted token
    first = (target_pos >= max(off, 1)) & (target_pos < off + half_len)
    repeated = target_pos > off + half_len  # skip the copy's first token
    return first.expand(n_seqs, -1).clone(), repeated.expand(n_seqs, -1).clone()


def _special_layout(model: Transformer) -> tuple[int, int | None, int | None]:
    """``(low, bos, sep)`` for random ids that suit ``model``: draw from ``[low, d_vocab)`` (above the
    tokenizer's special ids when they sit at the start of the vocabulary, as in BERT), with its BOS/[CLS] id
    and, for encoders, its [SEP] id (``None`` without tokenizer)."""
    cfg = model.cfg
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return 0, None, None
    bos = getattr(tok, "cls_token_id", None)
    if bos is None:
        bos = getattr(tok, "bos_id", None)
    sep = None if cfg.causal else getattr(tok, "sep_token_id", None)
    special = set(getattr(tok, "special_ids", set()) or set())
    low = max(special) + 1 if special and max(special) < cfg.d_vocab // 2 else 0
    return low, bos, sep


def repeated_tokens_for(model: Transformer, n_seqs: int = 32, half_len: int | None = None, *,
                        seed: int = 0) -> torch.Tensor:
    """Repeated random sequences that suit ``model``: its BOS/[CLS] in front, [SEP] at the end for encoders.

    Random ids avoid the tokenizer's special tokens (ids below the largest special id are skipped when
    the special ids sit at the start of the vocabulary, as in BERT).

    Args:
        model: an interp Transformer (with or without tokenizer).
        n_seqs: number of sequences.
        half_len: length of the repeated half; default ``min(25, (n_ctx - 2) // 2)``.
        seed: random seed.

    Returns:
        LongTensor ``[n_seqs, T]``.

    Example:
        >>> from interp.data.synthetic import repeated_tokens_for
        >>> from interp.examples import model
        >>> toks = repeated_tokens_for(model, 8, 10)
    """
    cfg = model.cfg
    if half_len is None:
        half_len = min(25, (cfg.n_ctx - 2) // 2)
    low, bos, sep = _special_layout(model)
    if low:
        body = repeated_sequences(n_seqs, half_len, cfg.d_vocab - low, seed=seed) + low  # [N, 2n]
        parts = [body]
        if bos is not None:
            parts.insert(0, torch.full((n_seqs, 1), bos, dtype=torch.long))
    else:
        parts = [repeated_sequences(n_seqs, half_len, cfg.d_vocab, seed=seed, bos_id=bos)]
    if sep is not None:
        parts.append(torch.full((n_seqs, 1), sep, dtype=torch.long))
    return torch.cat(parts, dim=1)  # [N, T]


def random_tokens_for(model: Transformer, n: int, T: int, *, seed: int = 0) -> torch.Tensor:
    """Uniform random ids that suit ``model`` (special ids avoided as in :func:`repeated_tokens_for`), with
    its BOS/[CLS] in front when it has one.

    Returns:
        LongTensor ``[n, T]``.

    Example:
        >>> from interp.data.synthetic import random_tokens_for
        >>> from interp.examples import model
        >>> random_tokens_for(model, 4, 16).shape
        torch.Size([4, 16])
    """
    _check_int("n", n, 1)
    _check_int("T", T, 1)
    low, bos, _ = _special_layout(model)
    d_vocab = model.cfg.d_vocab
    g = torch.Generator().manual_seed(seed)
    if bos is None:
        return torch.randint(low, d_vocab, (n, T), generator=g)
    skip = bos >= low  # the BOS id lies inside the drawn range: draw one id fewer and step over it
    body = torch.randint(low, d_vocab - int(skip), (n, T - 1), generator=g)  # [n, T-1]
    if skip:
        body = body + (body >= bos).long()
    return torch.cat([torch.full((n, 1), bos, dtype=torch.long), body], dim=1)  # [n, T]
