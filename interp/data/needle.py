"""Needle-in-a-haystack prompts for retrieval heads (Wu et al. 2024, "Retrieval head mechanistically explains
long-context factuality"), generated: nothing is downloaded.

Each sequence is ``[bos] haystack.. needle haystack.. needle`` of exactly ``context`` tokens: a needle of
``needle_len`` random tokens sits at a random depth of a haystack of random tokens (or of the given text's tokens),
and the sequence ends with the needle again, as the answer a model copies (teacher-forced). The needle's tokens
never occur in the haystack, so the needle token a head should retrieve is unique. Licence: generated (CC0).
"""

from __future__ import annotations

import torch

from .batches import Batch

__all__ = ["needle_batches"]


def needle_batches(d_vocab: int, n_seqs: int, context: int, needle_len: int, *, n_ctx: int | None = None,
                   bos_id: int | None = None, seed: int = 0, batch_size: int = 8) -> list[Batch]:
    """Needle-in-a-haystack batches, with where the needle and the answer start.

    Args:
        d_vocab: vocabulary size (ids are drawn from ``[0, d_vocab)`` minus ``bos_id``).
        n_seqs: sequences.
        context: tokens per sequence (BOS included).
        needle_len: tokens of the needle (>= 2: the first answer token is read from the needle's second).
        n_ctx: the model's context, checked against ``context`` when given.
        bos_id: the first token of every sequence (None: no BOS).
        seed: of the draws.
        batch_size: sequences per batch.

    Returns:
        Batches whose annotations hold ``needle`` and ``answer`` (``[B]`` long: the first position of the needle
        and of its copy at the end).

    Raises:
        ValueError: ``needle_len`` < 2, a needle (twice, plus one haystack token and BOS) longer than
            ``context``, a ``context`` over ``n_ctx``, or a vocabulary too small for a needle that never occurs in
            the haystack.

    Example:
        >>> from interp.data.needle import needle_batches
        >>> b = needle_batches(100, 4, 32, 6, seed=0)[0]
        >>> b.tokens.shape, b.annotations["answer"].tolist()
        (torch.Size([4, 32]), [26, 26, 26, 26])
    """
    for name, v, low in (("n_seqs", n_seqs, 1), ("needle_len", needle_len, 2), ("context", context, 1),
                         ("batch_size", batch_size, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name}={v!r} must be an int >= {low}")
    start = 0 if bos_id is None else 1
    haystack = context - start - 2 * needle_len
    if haystack < 1:
        raise ValueError(f"needle_len={needle_len} does not fit in context={context}: the needle and its copy take "
                         f"{2 * needle_len} tokens{' after BOS' if start else ''} and the haystack needs at least 1")
    if n_ctx is not None and context > n_ctx:
        raise ValueError(f"context={context} is longer than the model's n_ctx={n_ctx}")
    pool = torch.tensor([t for t in range(d_vocab) if t != bos_id])  # [V']
    if len(pool) < needle_len + 1:
        raise ValueError(f"d_vocab={d_vocab} is too small for a needle of {needle_len} distinct tokens plus a haystack")
    gen = torch.Generator().manual_seed(seed)
    rows, needles = [], []
    for _ in range(n_seqs):
        perm = pool[torch.randperm(len(pool), generator=gen)]
        needle, rest = perm[:needle_len], perm[needle_len:]  # the needle's tokens never occur in the haystack
        hay = rest[torch.randint(len(rest), (haystack,), generator=gen)]  # [haystack]
        depth = int(torch.randint(haystack + 1, (1,), generator=gen))  # haystack tokens before the needle
        parts = [torch.tensor([bos_id])] if bos_id is not None else []
        parts += [hay[:depth], needle, hay[depth:], needle]
        rows.append(torch.cat(parts))  # [context]
        needles.append(start + depth)
    tokens = torch.stack(rows)  # [n_seqs, context]
    needle_at = torch.tensor(needles)  # [n_seqs]
    answer_at = torch.full((n_seqs,), context - needle_len)
    return [Batch(tokens[i:i + batch_size], None, {"needle": needle_at[i:i + batch_size],
                                                   "answer": answer_at[i:i + batch_size]})
            for i in range(0, n_seqs, batch_size)]
