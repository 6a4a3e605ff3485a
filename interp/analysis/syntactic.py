"""Syntactic heads: does a head's most-attended word follow gold dependency arcs? (Clark et al., 2019)

Words are aligned to subword tokens; attention *to* a word is the sum over its tokens and attention *from* a
word the mean over its tokens (Clark et al.). Special tokens belong to no word and are dropped. For every
dependency relation and direction (dependent -> head, head -> dependent) a head's accuracy is how often the
most-attended *other* word is the gold partner. The baseline per relation and direction is the best fixed
relative offset (always predict the word ``o`` positions away), whose accuracy is simply the frequency of the
most common offset. Sentences are streamed batch by batch; word-level attention is folded inside the pattern
hook, so no token-level pattern outlives its forward pass.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..hooks import HookPoint
from ..trace import Reducer
from ._stream import PATTERN_HOOKS, layer_of, run_reducer
from .treebank import Sentence, align_words, check_max_sentences, read_conllu

__all__ = ["syntactic_scores", "DIRECTIONS"]

#: The two directions scored per relation.
DIRECTIONS = ("dep->head", "head->dep")


class _WordAttention(Reducer):
    """Folds token patterns into word-to-word attention ``[L, B, H, W, W]`` for the current batch."""

    names = PATTERN_HOOKS

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers

    def set_batch(self, member: torch.Tensor) -> None:
        """member: ``[B, W, T]`` 1 where token t belongs to word w."""
        self.to_word = member  # attention to a word: sum over its tokens
        self.from_word = member / member.sum(-1, keepdim=True).clamp(min=1)  # from a word: mean over its tokens
        self.words: list[torch.Tensor | None] = [None] * self.n_layers

    def update(self, name: str, tensor: torch.Tensor, hook: HookPoint) -> None:
        layer = layer_of(name)
        q0 = hook.ctx.get("q_start", 0) or 0
        p = tensor.detach().float()  # [B, H, Tc, S]
        frm = self.from_word[:, :, q0:q0 + p.shape[2]].to(p)  # [B, W, Tc]
        part = torch.einsum("bwt,bhts,bvs->bhwv", frm, p, self.to_word.to(p)).cpu()  # [B, H, W, W]
        self.words[layer] = part if self.words[layer] is None else self.words[layer] + part

    def result(self) -> list[torch.Tensor | None]:
        return self.words


def _sentences(conllu: Any, max_sentences: int | None) -> Iterable[Sentence]:
    if isinstance(conllu, (str, Path)):
        return read_conllu(conllu, max_sentences=max_sentences)
    if isinstance(conllu, Iterable):
        check_max_sentences(max_sentences)
        # islice stops reading at the cap: an endless source must not be consumed to its end.
        return itertools.islice(conllu, max_sentences)
    raise TypeError(f"conllu must be a path or an iterable of Sentence, got {type(conllu).__name__}")


def syntactic_scores(
    model: Any,
    conllu: str | Path | Iterable[Sentence],
    *,
    tokenizer: Any = None,
    batch_size: int = 16,
    max_sentences: int | None = None,
    strip_subtypes: bool = True,
    progress: bool = False,
) -> pd.DataFrame:
    """Per head, relation and direction: accuracy of the most-attended other word, and the offset baseline.

    Args:
        model: an interp Transformer.
        conllu: a CoNLL-U file (any treebank) or an iterable of :class:`~interp.analysis.treebank.Sentence`
            (for example from :func:`~interp.analysis.treebank.parse_text_with_spacy`).
        tokenizer: anything with ``encode_words(words) -> (ids, word_index)`` and ``pad_token_id``;
            default ``model.tokenizer``.
        batch_size: sentences per forward pass.
        max_sentences: use only the first sentences.
        strip_subtypes: fold ``obl:tmod`` into ``obl`` (universal relations only).
        progress: show a tqdm progress bar.

    Returns:
        DataFrame with columns ``layer, head, relation, direction, n, accuracy, baseline_offset,
        baseline_accuracy, gain`` (``gain = accuracy - baseline_accuracy``). ``df.attrs``: ``baseline``
        (records ``relation, direction, n, baseline_offset, baseline_accuracy``; ``pd.DataFrame(...)`` them), ``n_sentences`` (scored),
        ``n_skipped_too_long`` (sentences with more tokens than the model's ``n_ctx``, skipped), ``n_arcs``.

    Raises:
        ValueError: a malformed CoNLL-U line (``file:line`` in the message), an empty treebank, no sentence
            that fits the model's context, or a model without tokenizer and no ``tokenizer`` given.
        FileNotFoundError: the file does not exist.

    Example:
        >>> df = syntactic_scores(model, "en_ewt-ud-dev.conllu", max_sentences=500)
        >>> df[df.gain > 0.1].sort_values("gain", ascending=False).head()
    """
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is None or not hasattr(tok, "encode_words"):
        raise ValueError(f"model {getattr(model, 'name', '?')!r} has no tokenizer with encode_words; pass tokenizer=")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    pad = getattr(tok, "pad_token_id", None) or 0
    red = _WordAttention(L)
    correct: dict[tuple[str, int], torch.Tensor] = defaultdict(lambda: torch.zeros(L, H, dtype=torch.float64))
    counts: Counter = Counter()
    offsets: dict[tuple[str, int], Counter] = defaultdict(Counter)
    n_seen = n_skipped = n_scored = n_untokenized = 0

    def rel_name(r: str) -> str:
        return r.split(":")[0] if strip_subtypes else r

    def flush(batch: list[tuple[Sentence, torch.Tensor, torch.Tensor]]) -> None:
        B = len(batch)
        T = max(len(ids) for _, ids, _ in batch)
        W = max(len(s.words) for s, _, _ in batch)
        tokens = torch.full((B, T), pad, dtype=torch.long)
        mask = torch.zeros(B, T, dtype=torch.long)
        member = torch.zeros(B, W, T)
        for b, (s, ids, mem) in enumerate(batch):
            tokens[b, :len(ids)] = ids
            mask[b, :len(ids)] = 1
            member[b, :mem.shape[0], :mem.shape[1]] = mem
        red.set_batch(member)
        run_reducer(model, tokens, None if bool(mask.all()) else mask, [red])
        words = torch.stack(red.result())  # [L, B, H, W, W]
        n_words = torch.tensor([len(s.words) for s, _, _ in batch])  # [B]
        exists = torch.arange(W)[None, :] < n_words[:, None]  # [B, W]
        invalid = ~exists[:, None, :] | torch.eye(W, dtype=torch.bool)[None]  # [B, W, W]: no self, no padding
        words = words.masked_fill(invalid[None, :, None], float("-inf"))
        pred = words.argmax(-1)  # [L, B, H, W]: most-attended other word of each word
        for b, (s, _, _) in enumerate(batch):
            for d, (h, r) in enumerate(zip(s.heads, s.deprels)):
                if h < 0:
                    continue
                rel = rel_name(r)
                for direction, (src, dst) in enumerate(((d, h), (h, d))):
                    correct[(rel, direction)] += (pred[:, b, :, src] == dst).double()
                    counts[(rel, direction)] += 1
                    offsets[(rel, direction)][dst - src] += 1

    batch: list[tuple[Sentence, torch.Tensor, torch.Tensor]] = []
    sents = _sentences(conllu, max_sentences)
    if progress:
        from tqdm.auto import tqdm

        sents = tqdm(sents, desc="sentences")
    for s in sents:
        if not isinstance(s, Sentence):
            raise TypeError(f"conllu items must be Sentence objects, got {type(s).__name__}")
        n_seen += 1
        ids, word_index = tok.encode_words(s.words)
        if len(ids) > cfg.n_ctx:
            n_skipped += 1
            continue
        try:
            member = align_words(list(word_index), len(s.words))
        except ValueError:
            n_untokenized += 1  # a word whose form tokenizes to nothing: skip the sentence, count it
            continue
        batch.append((s, torch.as_tensor(ids, dtype=torch.long), member))
        if len(batch) == batch_size:
            flush(batch)
            n_scored += len(batch)
            batch = []
    if batch:
        flush(batch)
        n_scored += len(batch)
    if n_seen == 0:
        raise ValueError(f"empty dataset: {conllu!s} holds no sentence")
    if n_scored == 0:
        raise ValueError(f"none of the {n_seen} sentences could be scored ({n_skipped} longer than the model's "
                         f"n_ctx={cfg.n_ctx}, {n_untokenized} with a word that tokenizes to nothing)")
    base_rows = []
    for (rel, direction), c in sorted(offsets.items()):
        off, hits = c.most_common(1)[0]
        base_rows.append({"relation": rel, "direction": DIRECTIONS[direction], "n": counts[(rel, direction)],
                          "baseline_offset": off, "baseline_accuracy": hits / counts[(rel, direction)]})
    baseline = pd.DataFrame(base_rows)
    rows = []
    for (rel, direction), acc in sorted(correct.items()):
        n = counts[(rel, direction)]
        off, hits = offsets[(rel, direction)].most_common(1)[0]
        for layer in range(L):
            for head in range(H):
                a = float(acc[layer, head]) / n
                rows.append({"layer": layer, "head": head, "relation": rel, "direction": DIRECTIONS[direction],
                             "n": n, "accuracy": a, "baseline_offset": off, "baseline_accuracy": hits / n,
                             "gain": a - hits / n})
    df = pd.DataFrame(rows, columns=["layer", "head", "relation", "direction", "n", "accuracy", "baseline_offset",
                                     "baseline_accuracy", "gain"])
    df.attrs.update(baseline=baseline.to_dict("records"), n_sentences=n_scored, n_skipped_too_long=n_skipped,
                    n_skipped_untokenizable=n_untokenized,
                    n_arcs=sum(counts.values()) // 2)
    return df
