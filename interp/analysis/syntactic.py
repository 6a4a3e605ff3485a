"""Syntactic heads: does a head's most-attended word follow gold dependency arcs? (Clark et al., 2019)

Words are aligned to subword tokens; attention *to* a word is the sum over its tokens and attention *from* a
word the mean over its tokens (Clark et al.). Special tokens belong to no word and are dropped. For every
dependency relation, a head predicts each dependent's head word in two ways, Clark et al.'s two directions:

* ``dep->head``: the word the dependent attends to most (the row argmax of the word-level map);
* ``head<-dep``: the word that attends most *to* the dependent (the argmax of the transposed map, Clark et al.'s
  ``mode="transpose"``), which lets a head word with k dependents be right for all k.

interp's older ``head->dep`` (is the head word's own argmax the dependent? right at most once per head word) is
still available on request (``directions=``). A word never predicts itself.

Baseline (Clark et al.'s ``offset_predictor``): always predict the word at a fixed offset ``o`` from the
dependent, for each offset in ``offsets`` (Clark's ``range(-3, 3)``, i.e. -3..+2, the default), clamped to the
sentence as Clark did: ``max(0, min(i + o + 1, n_words))`` in 1-based positions with 0 = ROOT, so an offset past
the start predicts ROOT (always wrong here) and one past the end predicts the last word. The best offset per
relation is the baseline. Arcs to ROOT are not scored (no word to attend to), and Clark's special case for
``poss`` ('s tokens) is not applied.

Subtypes (``nmod:poss``, ``obl:tmod``) are kept by default: pooling ``nmod:poss`` (head usually at +1) with
``nmod`` (head usually at -2) makes one offset fit both badly. With ``strip_subtypes=True`` the pooled
baseline is the per-subtype mixture: every subtype keeps its own best offset, and the hits are summed.

Causal models: a decoder's word can attend only to itself and earlier words, so ``dep->head`` can be right only
when the head precedes the dependent and ``head<-dep`` only when it follows it; ``n_scorable`` counts those arcs
(``n`` counts all; accuracies and baselines are over all ``n`` arcs, so they stay comparable).

Sentences are streamed batch by batch; word-level attention is folded inside the pattern hook, so no token-level
pattern outlives its forward pass.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..hooks import HookPoint
from ..trace import Reducer
from ._stream import PATTERN_HOOKS, layer_of, run_reducer
from .treebank import Sentence, align_words, check_max_sentences, read_conllu

__all__ = ["syntactic_scores", "DIRECTIONS", "CLARK_OFFSETS"]

#: Every direction that can be scored; the first two are Clark et al.'s (the default).
DIRECTIONS = ("dep->head", "head<-dep", "head->dep")
#: Clark et al.'s baseline offsets, ``range(-3, 3)``.
CLARK_OFFSETS = tuple(range(-3, 3))


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


def _check_options(directions: Any, offsets: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if isinstance(directions, str):
        directions = (directions,)
    directions = tuple(directions)
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad or not directions:
        raise ValueError(f"directions={directions!r}: each must be one of {DIRECTIONS}")
    offsets = tuple(offsets)
    if not offsets or any(isinstance(o, bool) or not isinstance(o, int) for o in offsets):
        raise ValueError(f"offsets={offsets!r} must be a non-empty sequence of ints (Clark et al.: -3..+2)")
    return directions, offsets


def syntactic_scores(
    model: Any,
    conllu: str | Path | Iterable[Sentence],
    *,
    tokenizer: Any = None,
    batch_size: int = 16,
    max_sentences: int | None = None,
    strip_subtypes: bool = False,
    directions: Sequence[str] = ("dep->head", "head<-dep"),
    offsets: Sequence[int] = CLARK_OFFSETS,
    progress: bool = False,
) -> pd.DataFrame:
    """Per head, relation and direction: how often the attention-predicted head word is the gold head, beside
    Clark et al.'s fixed-offset baseline (see the module docstring for the exact definitions).

    Args:
        model: an interp Transformer.
        conllu: a CoNLL-U file (any treebank) or an iterable of :class:`~interp.analysis.treebank.Sentence`
            (for example from :func:`~interp.analysis.treebank.parse_text_with_spacy`).
        tokenizer: anything with ``encode_words(words) -> (ids, word_index)`` and ``pad_token_id``;
            default ``model.tokenizer``.
        batch_size: sentences per forward pass.
        max_sentences: use only the first sentences.
        strip_subtypes: pool ``obl:tmod`` into ``obl`` (default False: subtypes kept); the pooled baseline is the
            mixture of each subtype's own best offset.
        directions: any of ``"dep->head"``, ``"head<-dep"`` (Clark et al.'s two, the default) and ``"head->dep"``.
        offsets: baseline offsets from the dependent (default Clark's -3..+2).
        progress: show a tqdm progress bar.

    Returns:
        DataFrame with columns ``layer, head, relation, direction, n, n_scorable, accuracy, baseline_offset,
        baseline_accuracy, gain`` (``gain = accuracy - baseline_accuracy``; ``baseline_offset`` is an int, or
        with pooling a string like ``"nmod:-2 nmod:poss:+1"`` when the subtypes' best offsets differ).
        ``df.attrs``: ``baseline`` (records ``relation, direction, n, n_scorable, baseline_offset,
        baseline_accuracy``), ``offsets``, ``causal``, ``strip_subtypes``, ``n_sentences`` (scored),
        ``n_skipped_too_long`` (sentences with more tokens than the model's ``n_ctx``, skipped), ``n_arcs``.

    Raises:
        ValueError: a malformed CoNLL-U line (``file:line`` in the message), an empty treebank, no sentence
            that fits the model's context, a model without tokenizer and no ``tokenizer`` given, an unknown
            direction or bad offsets.
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
    directions, offsets = _check_options(directions, offsets)
    cfg = model.cfg
    causal = bool(cfg.causal)
    L, H = cfg.n_layers, cfg.n_heads
    pad = getattr(tok, "pad_token_id", None) or 0
    red = _WordAttention(L)
    # keyed by (full relation, direction); pooling happens at the end so baselines can mix per subtype
    correct: dict[tuple[str, str], torch.Tensor] = defaultdict(lambda: torch.zeros(L, H, dtype=torch.float64))
    counts: Counter = Counter()
    scorable: Counter = Counter()
    offset_hits: dict[tuple[str, str], Counter] = defaultdict(Counter)
    n_seen = n_skipped = n_scored = n_untokenized = 0

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
        words = torch.stack(red.result())  # [L, B, H, W, W]: [.., i, j] attention from word i to word j
        n_words = torch.tensor([len(s.words) for s, _, _ in batch])  # [B]
        exists = torch.arange(W)[None, :] < n_words[:, None]  # [B, W]
        invalid = ~exists[:, None, :] | ~exists[:, :, None] | torch.eye(W, dtype=torch.bool)[None]  # [B, W, W]
        if causal:  # a word sees only earlier words: attention to later ones is 0, not evidence
            invalid = invalid | torch.ones(W, W, dtype=torch.bool).triu(1)[None]
        words = words.masked_fill(invalid[None, :, None], float("-inf"))

        def argmax_or_none(x: torch.Tensor) -> torch.Tensor:
            best, idx = x.max(-1)
            return torch.where(torch.isfinite(best), idx, torch.full_like(idx, -1))  # -1: nothing to attend

        pred = {"dep->head": argmax_or_none(words), "head->dep": argmax_or_none(words)}  # [L, B, H, W] by row
        pred["head<-dep"] = argmax_or_none(words.transpose(-1, -2))  # by column: who attends most to word j
        for b, (s, _, _) in enumerate(batch):
            n = len(s.words)
            for d, (h, r) in enumerate(zip(s.heads, s.deprels)):
                if h < 0:
                    continue
                for direction in directions:
                    src, dst = (h, d) if direction == "head->dep" else (d, h)
                    key = (r, direction)
                    correct[key] += (pred[direction][:, b, :, src] == dst).double()
                    counts[key] += 1
                    # which arcs a causal model can get right at all
                    ok = not causal or (h < d if direction == "dep->head" else h > d if direction == "head<-dep"
                                        else d < h)
                    scorable[key] += int(ok)
                    for o in offsets:  # Clark: max(0, min(i + o + 1, n)) 1-based, 0 = ROOT -> 0-based [-1, n-1]
                        guess = max(-1, min(src + o, n - 1))
                        offset_hits[key][o] += int(guess == dst)

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

    # group full relations under the reported name (themselves, or their universal relation when pooling)
    groups: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for rel, direction in counts:
        groups[(rel.split(":")[0] if strip_subtypes else rel, direction)].append((rel, direction))
    base_rows, rows = [], []
    for (name, direction), keys in sorted(groups.items(), key=lambda kv: (kv[0][0], DIRECTIONS.index(kv[0][1]))):
        n = sum(counts[k] for k in keys)
        n_ok = sum(scorable[k] for k in keys)
        best = {k: max(offsets, key=lambda o, k=k: (offset_hits[k][o], -abs(o))) for k in sorted(keys)}
        hits = sum(offset_hits[k][best[k]] for k in keys)
        offs = set(best.values())
        off: int | str = offs.pop() if len(offs) == 1 else " ".join(f"{k[0]}:{best[k]:+d}" for k in sorted(keys))
        base_acc = hits / n
        base_rows.append({"relation": name, "direction": direction, "n": n, "n_scorable": n_ok,
                          "baseline_offset": off, "baseline_accuracy": base_acc})
        acc = sum(correct[k] for k in keys) / n
        for layer in range(L):
            for head in range(H):
                a = float(acc[layer, head])
                rows.append({"layer": layer, "head": head, "relation": name, "direction": direction, "n": n,
                             "n_scorable": n_ok, "accuracy": a, "baseline_offset": off,
                             "baseline_accuracy": base_acc, "gain": a - base_acc})
    df = pd.DataFrame(rows, columns=["layer", "head", "relation", "direction", "n", "n_scorable", "accuracy",
                                     "baseline_offset", "baseline_accuracy", "gain"])
    n_arcs = sum(c for (_, direction), c in counts.items() if direction == directions[0])
    df.attrs.update(baseline=base_rows, offsets=list(offsets), causal=causal, strip_subtypes=strip_subtypes,
                    n_sentences=n_scored, n_skipped_too_long=n_skipped,
                    n_skipped_untokenizable=n_untokenized, n_arcs=n_arcs)
    return df
