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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..data import Batch, Sentence, TreebankStats, treebank_batches
from ..streaming import Reducer, stream
from ._stream import PATTERN_HOOKS, head_grid, heads_of, layer_of, state_device, zeros64

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["syntactic_scores", "DIRECTIONS", "CLARK_OFFSETS", "SyntacticReducer"]

#: Every direction that can be scored; the first two are Clark et al.'s (the default).
DIRECTIONS = ("dep->head", "head<-dep", "head->dep")
#: Clark et al.'s baseline offsets, ``range(-3, 3)``.
CLARK_OFFSETS = tuple(range(-3, 3))


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


def _argmax_or_none(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    best, idx = x.max(dim)
    return torch.where(torch.isfinite(best), idx, torch.full_like(idx, -1))  # -1: nothing to attend


def _best_offset(hits: Sequence[float] | torch.Tensor, offsets: Sequence[int]) -> int:
    """The index of the offset with the most ``hits``, ties to the smaller ``|offset|`` (then the first listed)."""
    return max(range(len(offsets)), key=lambda i: (float(hits[i]), -abs(offsets[i])))


class SyntacticReducer(Reducer):
    """The streaming piece of :func:`syntactic_scores`: folds token patterns into word-to-word attention
    and scores each gold arc of the batch's sentences.

    Reads ``batch.annotations["sentences"]`` (``list[Sentence]``) and ``["member"]`` (``[B, W, T]``), as made
    by :func:`~interp.data.treebank_batches`; a batch without them is skipped. State, per full relation (subtypes
    kept; pooling happens in :meth:`table`) and direction, key ``{rel}|{direction}``: ``correct|{key}``
    ``[L, H_max]`` (arcs whose predicted word is the gold partner), ``count|{key}`` (arcs), ``scorable|{key}``
    (arcs a causal model can get right at all) and ``offset|{key}`` ``[len(offsets)]`` (hits of each baseline
    offset).

    Precision and place: patterns are read in float32 (a bf16 pattern is upcast before the word maps are
    summed), and the counts are float64 on the model's device; only :meth:`result` copies them to the host.

    Args:
        model: the model whose patterns are folded.
        strip_subtypes: pool ``obl:tmod`` into ``obl`` in :meth:`table` (the baseline is the per-subtype mixture).
        directions: any of :data:`DIRECTIONS` (default Clark et al.'s two).
        offsets: baseline offsets from the dependent (default Clark's -3..+2).

    Raises:
        ValueError: an unknown direction or bad offsets.
    """

    names = PATTERN_HOOKS
    reads_query_chunks = True

    def __init__(self, model: Transformer, *, strip_subtypes: bool = False,
                 directions: Sequence[str] = ("dep->head", "head<-dep"),
                 offsets: Sequence[int] = CLARK_OFFSETS) -> None:
        super().__init__()
        self.model = model
        self.strip_subtypes = strip_subtypes
        self.directions, self.offsets = _check_options(directions, offsets)
        self.causal = bool(model.cfg.causal)
        self._L, self._H = head_grid(model)
        self._dev = state_device(model)
        self.state["n_sentences"] = zeros64(device=self._dev)
        self._member: torch.Tensor | None = None

    def begin_batch(self, batch: Batch) -> None:
        member = batch.annotations.get("member")
        self._sents: list[Sentence] = batch.annotations.get("sentences") or []
        self._member = member
        if member is None:
            return
        self._to_word = member  # attention to a word: sum over its tokens
        self._from_word = member / member.sum(-1, keepdim=True).clamp(min=1)  # from a word: mean over its tokens
        W = member.shape[1]
        n_words = torch.tensor([len(s.words) for s in self._sents])  # [B]
        exists = torch.arange(W)[None, :] < n_words[:, None]  # [B, W]
        self._invalid = None  # an encoder masks only the diagonal (see update)
        if self.causal:  # a word sees only earlier words: attention to later ones is 0, not evidence
            invalid = ~exists[:, None, :] | ~exists[:, :, None] | torch.ones(W, W, dtype=torch.bool).triu()[None]
            self._invalid = invalid[:, None]  # [B, 1, W, W]: padding, the word itself and later words
        # Every arc of the batch at once (arcs to ROOT have no word to attend to): flat [N] index tensors; each
        # layer scores them with one gather per direction and sums per relation with index_add, so Python
        # touches relations, not arcs, and no word map outlives its layer.
        arc_b = torch.tensor([b for b, s in enumerate(self._sents) for _ in s.heads], dtype=torch.long)  # [N_all]
        arc_d = torch.tensor([d for s in self._sents for d in range(len(s.heads))], dtype=torch.long)  # [N_all]
        arc_h = torch.tensor([h for s in self._sents for h in s.heads], dtype=torch.long)  # [N_all]
        keep = arc_h >= 0
        rels = [r for s in self._sents for r in s.deprels]
        rels = [r for r, k in zip(rels, keep.tolist()) if k]  # [N]: the relations of the kept arcs
        rel_index = {r: i for i, r in enumerate(dict.fromkeys(rels))}  # first-seen order
        self._rel_names = list(rel_index)
        self._arc_b, self._arc_d, self._arc_h = arc_b[keep], arc_d[keep], arc_h[keep]  # [N]
        self._arc_r = torch.tensor([rel_index[r] for r in rels], dtype=torch.long)  # [N]
        R = len(self._rel_names)
        self._correct = {d: zeros64(R, self._L, self._H, device=self._dev) for d in self.directions}
        self._arcs_on = {k: v.to(self._dev) for k, v in (("b", self._arc_b), ("r", self._arc_r))}  # once a batch
        self._src_dst_on = {d: tuple(t.to(self._dev) for t in self._src_dst(d)) for d in self.directions}
        self._n_words = n_words
        self._chunks: dict[int, torch.Tensor] = {}  # layer -> word map summed over the query chunks so far

    def _src_dst(self, direction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(source word, gold partner)`` of every arc: the prediction read at the source must be the partner."""
        return (self._arc_h, self._arc_d) if direction == "head->dep" else (self._arc_d, self._arc_h)

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        if self._member is None:
            return
        layer = layer_of(name)
        p = tensor.detach().float()  # [B, H, Tc, S]
        B, H, Tc, S = p.shape
        frm = self._from_word[:, None, :, q_start:q_start + Tc].to(p)  # [B, 1, W, Tc]
        # Keys to words with the heads folded into the rows (one large matmul per sequence), then queries to
        # words: word attention [B, H, W, W].
        to_words = (p.reshape(B, H * Tc, S) @ self._to_word.transpose(1, 2).to(p)).view(B, H, Tc, -1)  # [B, H, Tc, W]
        words = frm @ to_words  # [B, H, W, W]: [.., i, j] attention from word i to word j
        if q_start > 0 or Tc < S:  # query chunks: sum the word maps until the last chunk has arrived
            if layer in self._chunks:
                words = self._chunks.pop(layer) + words
            if q_start + Tc < S:
                self._chunks[layer] = words
                return
        # A word never predicts itself. Padding words need no mask in an encoder: their rows and columns hold
        # exact zeros after every real word (attention weights are >= 0, and the argmax takes the first of
        # equal values), and a sentence with a scored arc has a second word. A decoder's zeros above the
        # diagonal come before the real candidates of a column, so there the whole mask is applied.
        if self.causal and self._invalid is not None:  # (begin_batch sets it for a decoder)
            words.masked_fill_(self._invalid.to(words.device), float("-inf"))  # in place: the map is ours
        else:
            words.diagonal(dim1=-2, dim2=-1).fill_(float("-inf"))  # [B, H, W] view
        pred = {"dep->head": _argmax_or_none(words)}  # [B, H, W]: the word each word attends to most
        pred["head->dep"] = pred["dep->head"]
        if "head<-dep" in self.directions:  # by column: the word that attends most to word j
            pred["head<-dep"] = _argmax_or_none(words, dim=-2)  # [B, H, W]
        dev = words.device
        arc_b, arc_r = self._arcs_on["b"].to(dev), self._arcs_on["r"]
        for direction in self.directions:
            src, dst = (t.to(dev) for t in self._src_dst_on[direction])
            hit = pred[direction][arc_b, :, src] == dst[:, None]  # [N, H]
            acc = self._correct[direction]
            acc[:, layer, :H].index_add_(0, arc_r, hit.to(acc))  # on the state's device: no host sync

    def end_batch(self) -> None:
        if self._member is None:
            return
        arc_b, arc_r = self._arc_b, self._arc_r
        n = self._n_words[arc_b]  # [N]
        R, n_offsets = len(self._rel_names), len(self.offsets)
        st = self.state
        offs = torch.tensor(self.offsets)  # [O]
        sums = {}
        for direction in self.directions:
            src, dst = self._src_dst(direction)
            arc_h, arc_d = self._arc_h, self._arc_d
            # which arcs a causal model can get right at all
            ok = (torch.ones_like(arc_h, dtype=torch.bool) if not self.causal else arc_h < arc_d if direction == "dep->head"
                  else arc_h > arc_d if direction == "head<-dep" else arc_d < arc_h)  # [N]
            # Clark: max(0, min(i + o + 1, n)) 1-based, 0 = ROOT -> 0-based [-1, n-1]
            guess = torch.maximum(torch.minimum(src[:, None] + offs[None], n[:, None] - 1),
                                  torch.full_like(src[:, None], -1))  # [N, O]
            counts = (  # on the host (from the batch's annotations), moved to the state's device once a batch
                torch.bincount(arc_r, minlength=R).double(),
                torch.zeros(R, dtype=torch.float64).index_add_(0, arc_r, ok.double()),
                torch.zeros(R, n_offsets, dtype=torch.float64).index_add_(0, arc_r, (guess == dst[:, None]).double()))
            acc = self._correct[direction]
            sums[direction] = (acc, *(c.to(acc) for c in counts))
        for i, r in enumerate(self._rel_names):  # state keys appear in the order the arcs first show them
            for direction in self.directions:
                key = f"{r}|{direction}"
                if f"count|{key}" not in st:
                    st[f"correct|{key}"] = zeros64(self._L, self._H, device=self._dev)
                    st[f"count|{key}"] = zeros64(device=self._dev)
                    st[f"scorable|{key}"] = zeros64(device=self._dev)
                    st[f"offset|{key}"] = zeros64(n_offsets, device=self._dev)
                correct, count, scorable, offset_hits = sums[direction]
                st[f"correct|{key}"] += correct[i]
                st[f"count|{key}"] += count[i]
                st[f"scorable|{key}"] += scorable[i]
                st[f"offset|{key}"] += offset_hits[i]
        st["n_sentences"] += len(self._sents)
        self._member = None

    def result(self) -> dict[tuple[str, str], dict[str, Any]]:
        """``{(full relation, direction): {"correct": [L, H_max], "n", "n_scorable", "offset_hits": [O]}}``, on the
        host (the state is copied there once)."""
        out = {}
        st = {k: v.cpu() for k, v in self.state.items()}
        for k in st:
            if k.startswith("count|"):
                key = k[len("count|"):]
                rel, direction = key.rsplit("|", 1)
                out[(rel, direction)] = {"correct": st[f"correct|{key}"], "n": int(st[f"count|{key}"]),
                                         "n_scorable": int(st[f"scorable|{key}"]),
                                         "offset_hits": st[f"offset|{key}"]}
        return out

    def table(self, *, n_skipped: int = 0, n_untokenized: int = 0) -> pd.DataFrame:
        """The :func:`syntactic_scores` table of what was folded so far.

        Raises:
            ValueError: no sentence was folded yet (no treebank batch reached the reducer), instead of an empty
                table.
        """
        if int(self.state["n_sentences"]) == 0:
            raise ValueError("SyntacticReducer.table(): no sentence was folded (n_sentences=0); run "
                             "stream(model, treebank_batches(model, conllu_path), [reducer]) first")
        res = self.result()
        offsets = self.offsets
        # group full relations under the reported name (themselves, or their universal relation when pooling)
        groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for rel, direction in res:
            groups.setdefault((rel.split(":")[0] if self.strip_subtypes else rel, direction), []).append(
                (rel, direction))
        base_rows, rows = [], []
        for (name, direction), keys in sorted(groups.items(), key=lambda kv: (kv[0][0], DIRECTIONS.index(kv[0][1]))):
            n = sum(res[k]["n"] for k in keys)
            n_ok = sum(res[k]["n_scorable"] for k in keys)
            # best offset per full relation: most hits, ties to the smaller |offset| (then the first listed)
            best = {k: _best_offset(res[k]["offset_hits"], offsets) for k in sorted(keys)}
            hits = sum(float(res[k]["offset_hits"][best[k]]) for k in keys)
            offs = {offsets[i] for i in best.values()}
            off: int | str = offs.pop() if len(offs) == 1 else " ".join(
                f"{k[0]}:{offsets[best[k]]:+d}" for k in sorted(keys))
            base_acc = hits / n
            base_rows.append({"relation": name, "direction": direction, "n": n, "n_scorable": n_ok,
                              "baseline_offset": off, "baseline_accuracy": base_acc})
            acc = sum(res[k]["correct"] for k in keys) / n  # [L, H_max]
            for layer, head in heads_of(self.model):
                a = float(acc[layer, head])
                rows.append({"layer": layer, "head": head, "relation": name, "direction": direction, "n": n,
                             "n_scorable": n_ok, "accuracy": a, "baseline_offset": off,
                             "baseline_accuracy": base_acc, "gain": a - base_acc})
        df = pd.DataFrame(rows, columns=["layer", "head", "relation", "direction", "n", "n_scorable", "accuracy",
                                         "baseline_offset", "baseline_accuracy", "gain"])
        n_arcs = sum(r["n"] for (_, direction), r in res.items() if direction == self.directions[0])
        df.attrs.update(baseline=base_rows, offsets=list(offsets), causal=self.causal,
                        strip_subtypes=self.strip_subtypes, n_sentences=int(self.state["n_sentences"]),
                        n_skipped_too_long=n_skipped, n_skipped_untokenizable=n_untokenized, n_arcs=n_arcs)
        return df


def syntactic_scores(
    model: Transformer,
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
        conllu: a CoNLL-U file (any treebank) or an iterable of :class:`~interp.data.Sentence`
            (for example from :func:`~interp.data.parse_text_with_spacy`).
        tokenizer: anything with ``encode_words(words) -> (ids, word_index)`` and ``pad_token_id``;
            default ``model.tokenizer``.
        batch_size: sentences per forward pass (sentences of similar length are batched together).
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
        ``n_skipped_too_long`` (sentences with more tokens than the model's ``n_ctx``, skipped),
        ``n_skipped_untokenizable``, ``n_arcs``.

    Raises:
        ValueError: a malformed CoNLL-U line (``file:line`` in the message), an empty treebank, no sentence
            that fits the model's context (or none that tokenizes), a model without tokenizer and no
            ``tokenizer`` given, an unknown direction or bad offsets.
        FileNotFoundError: the file does not exist.

    Example:
        >>> import interp
        >>> from interp.analysis.syntactic import syntactic_scores
        >>> df = syntactic_scores(interp.load("minilm-l6"), "../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu", max_sentences=20)
        >>> df[df.gain > 0.1].sort_values("gain", ascending=False).head()
    """
    directions, offsets = _check_options(directions, offsets)
    red = SyntacticReducer(model, strip_subtypes=strip_subtypes, directions=directions, offsets=offsets)
    stats = TreebankStats()
    batches = treebank_batches(model, conllu, tokenizer=tokenizer, batch_size=batch_size,
                               max_sentences=max_sentences, stats=stats)
    run_treebank(model, batches, [red], stats, conllu, progress=progress)
    return red.table(n_skipped=stats.skipped, n_untokenized=stats.untokenized)


def run_treebank(model: Transformer, batches: Iterable[Batch], reducers: list[Reducer], stats: TreebankStats,
                 conllu: Any, *, progress: bool | None = False, desc: str = "treebank") -> None:
    """Stream treebank ``batches`` through ``reducers`` and check that something was scored.

    Raises:
        ValueError: the treebank holds no sentence, or none fits the model's context (or tokenizes).
    """
    it = iter(batches)
    first = next(it, None)
    if first is None:
        if stats.seen == 0:
            what = f"the treebank {str(conllu)!r}" if isinstance(conllu, (str, Path)) else "the treebank"
            raise ValueError(f"empty dataset: {what} holds no sentence")
        raise ValueError(f"none of the {stats.seen} sentences could be scored ({stats.skipped} longer than the "
                         f"model's n_ctx={model.cfg.n_ctx}, {stats.untokenized} with a word that tokenizes to "
                         "nothing)")
    stream(model, itertools.chain([first], it), reducers, name="conllu", progress=progress, desc=desc)
