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
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..data import Batch, Sentence, TreebankStats, treebank_batches
from ..trace import Reducer, stream
from ._stream import PATTERN_HOOKS, head_counts, heads_of, layer_of

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["syntactic_scores", "DIRECTIONS", "SyntacticReducer"]

#: The two directions scored per relation.
DIRECTIONS = ("dep->head", "head->dep")


class SyntacticReducer(Reducer):
    """The streaming piece of :func:`syntactic_scores`: folds token patterns into word-to-word attention
    and scores each gold arc of the batch's sentences.

    Reads ``batch.annotations["sentences"]`` (``list[Sentence]``) and ``["member"]`` (``[B, W, T]``), as made
    by :func:`~interp.data.treebank_batches`; a batch without them is skipped. State, per relation and
    direction (``{rel}|{d}``, d = 0 for dep->head, 1 for head->dep): ``correct|{rel}|{d}`` ``[L, H_max]``
    (arcs whose most-attended other word is the gold partner), ``count|{rel}|{d}`` (arcs) and
    ``offset|{rel}|{d}`` ``[2 n_ctx + 1]`` (arcs per relative word offset, for the baseline).

    Args:
        model: the model whose patterns are folded.
        strip_subtypes: fold ``obl:tmod`` into ``obl``.
    """

    names = PATTERN_HOOKS

    def __init__(self, model: Transformer, *, strip_subtypes: bool = True) -> None:
        super().__init__()
        self.model = model
        self.strip_subtypes = strip_subtypes
        self._L, self._H = model.cfg.n_layers, max(head_counts(model), default=0)
        self._n_ctx = model.cfg.n_ctx
        self.state["n_sentences"] = torch.zeros((), dtype=torch.float64)
        self._member: torch.Tensor | None = None

    def begin_batch(self, batch: Batch) -> None:
        member = batch.annotations.get("member")
        self._sents: list[Sentence] = batch.annotations.get("sentences") or []
        self._member = member
        if member is None:
            return
        self._to_word = member  # attention to a word: sum over its tokens
        self._from_word = member / member.sum(-1, keepdim=True).clamp(min=1)  # from a word: mean over its tokens
        B, W = member.shape[:2]
        self._words = torch.zeros(self._L, B, self._H, W, W)  # [L, B, H, W, W]

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        if self._member is None:
            return
        p = tensor.detach().float()  # [B, H, Tc, S]
        B, H, Tc, S = p.shape
        frm = self._from_word[:, None, :, q_start:q_start + Tc].to(p)  # [B, 1, W, Tc]
        # Keys to words with the heads folded into the rows (one large matmul per sequence), then queries to
        # words: word attention [B, H, W, W].
        to_words = (p.reshape(B, H * Tc, S) @ self._to_word.transpose(1, 2).to(p)).view(B, H, Tc, -1)  # [B, H, Tc, W]
        part = frm @ to_words  # [B, H, W, W]
        self._words[layer_of(name), :, :p.shape[1]] += part.cpu()

    def end_batch(self) -> None:
        if self._member is None:
            return
        words = self._words
        W = words.shape[-1]
        n_words = torch.tensor([len(s.words) for s in self._sents])  # [B]
        exists = torch.arange(W)[None, :] < n_words[:, None]  # [B, W]
        invalid = ~exists[:, None, :] | torch.eye(W, dtype=torch.bool)[None]  # [B, W, W]: no self, no padding
        words = words.masked_fill(invalid[None, :, None], float("-inf"))
        pred = words.argmax(-1).permute(1, 3, 0, 2)  # [B, W, L, H]: most-attended other word of each word
        # Every arc in both directions, grouped by (relation, direction): one gather per group, not per arc.
        groups: dict[str, list[tuple[int, int, int]]] = {}
        for b, s in enumerate(self._sents):
            for d, (h, r) in enumerate(zip(s.heads, s.deprels)):
                if h < 0:
                    continue
                rel = r.split(":")[0] if self.strip_subtypes else r
                groups.setdefault(f"{rel}|0", []).append((b, d, h))
                groups.setdefault(f"{rel}|1", []).append((b, h, d))
        st = self.state
        for key, arcs in groups.items():
            if f"count|{key}" not in st:
                st[f"correct|{key}"] = torch.zeros(self._L, self._H, dtype=torch.float64)
                st[f"count|{key}"] = torch.zeros((), dtype=torch.float64)
                st[f"offset|{key}"] = torch.zeros(2 * self._n_ctx + 1, dtype=torch.float64)
            b, src, dst = torch.tensor(arcs).T  # [N] each
            hit = pred[b, src] == dst[:, None, None]  # [N, L, H]
            st[f"correct|{key}"] += hit.sum(0).double()
            st[f"count|{key}"] += len(arcs)
            st[f"offset|{key}"] += torch.bincount(dst - src + self._n_ctx, minlength=2 * self._n_ctx + 1).double()
        st["n_sentences"] += len(self._sents)
        self._member = None

    def result(self) -> dict[tuple[str, int], dict[str, Any]]:
        """``{(relation, direction index): {"correct": [L, H_max], "n", "baseline_offset",
        "baseline_hits"}}``; the baseline offset is the most frequent one (ties: the smallest offset)."""
        out = {}
        keys = [k[len("count|"):] for k in self.state if k.startswith("count|")]
        for key in sorted(keys, key=lambda k: (k.rsplit("|", 1)[0], int(k.rsplit("|", 1)[1]))):
            rel, d = key.rsplit("|", 1)
            counts = self.state[f"offset|{key}"]
            best = int(torch.argmax(counts))  # first maximum: the smallest offset among ties
            out[(rel, int(d))] = {"correct": self.state[f"correct|{key}"], "n": int(self.state[f"count|{key}"]),
                                  "baseline_offset": best - self._n_ctx, "baseline_hits": int(counts[best])}
        return out

    def table(self, *, n_skipped: int = 0) -> pd.DataFrame:
        """The :func:`syntactic_scores` table of what was folded so far."""
        res = self.result()
        base_rows, rows = [], []
        for (rel, direction), r in res.items():
            n, off, hits = r["n"], r["baseline_offset"], r["baseline_hits"]
            base_rows.append({"relation": rel, "direction": DIRECTIONS[direction], "n": n,
                              "baseline_offset": off, "baseline_accuracy": hits / n})
            for layer, head in heads_of(self.model):
                a = float(r["correct"][layer, head]) / n
                rows.append({"layer": layer, "head": head, "relation": rel, "direction": DIRECTIONS[direction],
                             "n": n, "accuracy": a, "baseline_offset": off, "baseline_accuracy": hits / n,
                             "gain": a - hits / n})
        df = pd.DataFrame(rows, columns=["layer", "head", "relation", "direction", "n", "accuracy",
                                         "baseline_offset", "baseline_accuracy", "gain"])
        df.attrs.update(baseline=base_rows, n_sentences=int(self.state["n_sentences"]),
                        n_skipped_too_long=n_skipped, n_arcs=sum(r["n"] for r in res.values()) // 2)
        return df


def syntactic_scores(
    model: Transformer,
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
        conllu: a CoNLL-U file (any treebank) or an iterable of :class:`~interp.data.Sentence`
            (for example from :func:`~interp.data.parse_text_with_spacy`).
        tokenizer: anything with ``encode_words(words) -> (ids, word_index)`` and ``pad_token_id``;
            default ``model.tokenizer``.
        batch_size: sentences per forward pass (sentences of similar length are batched together).
        max_sentences: use only the first sentences.
        strip_subtypes: fold ``obl:tmod`` into ``obl`` (universal relations only).
        progress: show a tqdm progress bar.

    Returns:
        DataFrame with columns ``layer, head, relation, direction, n, accuracy, baseline_offset,
        baseline_accuracy, gain`` (``gain = accuracy - baseline_accuracy``). ``df.attrs``: ``baseline``
        (records ``relation, direction, n, baseline_offset, baseline_accuracy``; ``pd.DataFrame(...)`` them),
        ``n_sentences`` (scored), ``n_skipped_too_long`` (sentences with more tokens than the model's
        ``n_ctx``, skipped), ``n_arcs``.

    Raises:
        ValueError: a malformed CoNLL-U line (``file:line`` in the message), an empty treebank, no sentence
            that fits the model's context, or a model without tokenizer and no ``tokenizer`` given.
        FileNotFoundError: the file does not exist.

    Example:
        >>> df = syntactic_scores(model, "en_ewt-ud-dev.conllu", max_sentences=500)
        >>> df[df.gain > 0.1].sort_values("gain", ascending=False).head()
    """
    red = SyntacticReducer(model, strip_subtypes=strip_subtypes)
    stats = TreebankStats()
    batches = treebank_batches(model, conllu, tokenizer=tokenizer, batch_size=batch_size,
                               max_sentences=max_sentences, stats=stats)
    run_treebank(model, batches, [red], stats, conllu, progress=progress)
    return red.table(n_skipped=stats.skipped)


def run_treebank(model: Transformer, batches: Iterable[Batch], reducers: list[Reducer], stats: TreebankStats,
                 conllu: Any, *, progress: bool = False) -> None:
    """Stream treebank ``batches`` through ``reducers`` and check that something was scored.

    Raises:
        ValueError: the treebank holds no sentence, or none fits the model's context.
    """
    it = iter(batches)
    first = next(it, None)
    if first is None:
        if stats.seen == 0:
            raise ValueError(f"empty dataset: {conllu!s} holds no sentence")
        raise ValueError(f"all {stats.seen} sentences are longer than the model's n_ctx={model.cfg.n_ctx}; "
                         "nothing scored")
    stream(model, itertools.chain([first], it), reducers, name="conllu", progress=progress)
