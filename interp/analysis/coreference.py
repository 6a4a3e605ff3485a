"""Coreference heads: does a head attend from a mention to its antecedent? (Clark et al., 2019, section 5)

For every mention that has an antecedent, the candidates are earlier mentions (CorefUD: the distinct head
words of the mentions ending before it, inside the window; GAP: the two names A and B). A head predicts the
candidate whose tokens receive the most attention from the mention's head word: attention *to* a candidate is
the sum over its tokens and attention *from* a word the mean over its tokens, as in the syntactic scorer. A
tie for the top candidate counts as a miss (a flat head picks nothing). Accuracy per head is compared with
rule-based baselines computed on the same mentions (see :mod:`interp.data.coref`) and with a random candidate
(its exact expected accuracy, the mean of ``correct candidates / candidates``), each with a Wilson 95 % interval.

Bidirectional and causal models: the candidates precede the mention, so a causal head can see them all on
CorefUD; on GAP, where a name may follow the pronoun (cataphora), a causal model scores only the rows whose two
names both precede the pronoun (group ``backward``, reported for every model so the two kinds compare on the same
rows).

The folding is a streaming reducer (:class:`CorefReducer`): the batch's annotations prepare the source and
candidate weights (:meth:`CorefReducer.set_batch`), and the pattern hook of one forward pass folds them into
per-head hit counts, layer by layer and query chunk by query chunk, so it can share a forward pass with other
reducers. The counts stay on the model's device until :meth:`CorefReducer.result`.

Cost: one forward pass per batch of windows, stopped after the last layer's attention pattern. Windows are
batched by length; in a causal model each window is cut after its last scored mention, since no later token
changes the attention rows of the mentions (for GAP, the text after the pronoun is never run).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..data import Batch, align_words, bucket_by_length
from ..data.coref import (
    COREFUD_BASELINES,
    GAP_BASELINES,
    CorefWindow,
    corefud_windows,
    gap_windows,
    read_corefud,
    read_gap,
)
from ..streaming import Reducer, stream
from ._stream import PATTERN_HOOKS, layer_of

__all__ = ["CorefReducer", "coref_dataset_of", "coreference_kinds", "coreference_scores", "wilson_interval"]

_GROUPS = {"gap": ["all", "backward"], "corefud": ["all", "pronoun", "nominal"]}


def wilson_interval(hits: Any, n: Any, z: float = 1.96) -> tuple[Any, Any]:
    """Wilson score interval of a binomial proportion (NaN where ``n == 0``).

    Args:
        hits, n: successes and trials (floats, arrays or tensors of the same shape).
        z: the normal quantile; 1.96 gives 95 %.

    Returns:
        ``(low, high)`` of the same type as ``hits``.

    Example:
        >>> from interp.analysis.coreference import wilson_interval
        >>> wilson_interval(65.0, 100.0)   # (0.553..., 0.736...)
    """
    if isinstance(hits, torch.Tensor) or isinstance(n, torch.Tensor):
        hits, n = torch.as_tensor(hits, dtype=torch.float64), torch.as_tensor(n, dtype=torch.float64)
        nn = n.clamp(min=1)
        p = hits / nn
        centre = (p + z * z / (2 * nn)) / (1 + z * z / nn)
        half = z * torch.sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn)) / (1 + z * z / nn)
        nan = torch.full_like(p, math.nan)
        return torch.where(n > 0, centre - half, nan), torch.where(n > 0, centre + half, nan)
    if n <= 0:
        return math.nan, math.nan
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


class CorefReducer(Reducer):
    """Folds, per head, how often the most-attended candidate is a correct antecedent.

    Each batch brings its weights in ``batch.annotations["coref"]`` (or call :meth:`set_batch` before the
    forward pass); the pattern hooks then fold the batch. Query rows may
    arrive in chunks (``model.set_query_chunk``): a layer is judged when its last chunk has arrived.

    Args:
        n_layers, n_heads: the model's shape.
        groups: names of the query groups counted separately (a query may belong to several).
        tie_tol: the top candidate must beat the runner-up by more than this to count as a prediction.
        keep_queries: also keep every query's hit per head (``[N, L, H]`` bool, in the order queries were
            given), for paired comparisons with baselines; off, the state is ``O(groups x L x H)``.
    """

    names = PATTERN_HOOKS
    reads_query_chunks = True

    def __init__(self, n_layers: int, n_heads: int, groups: list[str], *, tie_tol: float = 1e-6,
                 keep_queries: bool = False) -> None:
        super().__init__()
        self.groups = list(groups)
        self.keep_queries = keep_queries
        self._per_query: list[tuple[torch.Tensor, torch.Tensor]] = []  # per batch: (hits [B, Q, L, H], real [B, Q])
        self._batch_hits: torch.Tensor | None = None
        self.tie_tol = tie_tol
        # sums and counts in the mergeable state (:meth:`Reducer.merge`); per-query hits are kept outside it
        self.state["hits"] = torch.zeros(len(groups), n_layers, n_heads, dtype=torch.float64)
        self.state["n"] = torch.zeros(len(groups), dtype=torch.float64)
        self._acc: dict[int, torch.Tensor] = {}

    def set_batch(self, source: torch.Tensor, units: torch.Tensor, cand: torch.Tensor, gold: torch.Tensor,
                  member: torch.Tensor) -> None:
        """Prepare the next batch.

        Args:
            source: ``[B, Q, T]`` weights of each query's source tokens (mean: rows sum to 1; 0 for padding).
            units: ``[B, U, T]`` 1 where token t belongs to candidate unit u.
            cand: ``[B, Q, K]`` long, the unit of each query's k-th candidate (-1: no candidate).
            gold: ``[B, Q, K]`` bool, the candidate is a correct antecedent.
            member: ``[B, Q, G]`` bool, the query counts in group g (all False for padding queries).

        Raises:
            ValueError: shapes that do not match.
        """
        B, Q, T = source.shape
        if units.shape[0] != B or units.shape[2] != T or cand.shape[:2] != (B, Q) or gold.shape != cand.shape \
                or tuple(member.shape) != (B, Q, len(self.groups)):
            raise ValueError(f"set_batch: shapes do not match: source {tuple(source.shape)}, units "
                             f"{tuple(units.shape)}, cand {tuple(cand.shape)}, gold {tuple(gold.shape)}, member "
                             f"{tuple(member.shape)} ({len(self.groups)} groups)")
        self._flush_queries()  # the previous batch's per-query hits, under its own query mask
        self.source, self.units, self.cand, self.gold, self.member = source, units, cand, gold, member
        self._on_device = False  # moved to the patterns' device at the batch's first update
        self.state["n"] += member.sum((0, 1)).double().to(self.state["n"].device)
        self._acc = {}
        if self.keep_queries:
            self._batch_hits = torch.zeros(B, Q, *self.hits.shape[1:], dtype=torch.bool,
                                           device=self.hits.device)  # [B, Q, L, H]

    def begin_batch(self, batch: Batch) -> None:
        """Take the batch's prepared weights from ``batch.annotations["coref"]`` (the arguments of
        :meth:`set_batch`) when it carries them; a batch without that key was prepared by :meth:`set_batch`."""
        prepared = batch.annotations.get("coref")
        if prepared is not None:
            self.set_batch(*prepared)

    def _flush_queries(self) -> None:
        if self._batch_hits is not None:
            # Indexed by the real queries only in result(): a boolean index here would sync a GPU every batch.
            self._per_query.append((self._batch_hits, self.member.any(-1)))  # [B, Q, L, H], [B, Q]
            self._batch_hits = None

    def _to(self, device: torch.device) -> None:
        """Move the state and the current batch's weights to ``device`` (once per batch, not per layer)."""
        if self.state["hits"].device != device:
            self.state = {k: v.to(device) for k, v in self.state.items()}
            if self._batch_hits is not None:
                self._batch_hits = self._batch_hits.to(device)
        self.source, self.units, self.cand, self.gold, self.member = (
            t.to(device) for t in (self.source, self.units, self.cand, self.gold, self.member))
        self._member_f = self.member.double()  # [B, Q, G]
        self._on_device = True

    @property
    def hits(self) -> torch.Tensor:
        """``[G, L, H]`` float64: queries per group whose most-attended candidate is correct."""
        return self.state["hits"]

    @property
    def n(self) -> torch.Tensor:
        """``[G]`` float64: queries per group."""
        return self.state["n"]

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = layer_of(name)
        q0 = q_start
        p = tensor.detach().float()  # [B, H, Tc, S]
        if not self._on_device or self.source.device != p.device:
            self._to(p.device)
        Tc = p.shape[2]
        src = self.source[:, :, q0:q0 + Tc]  # [B, Q, Tc]
        # Source rows first (Q is a few mentions, Tc the whole window), then the candidates' keys.
        part = torch.einsum("bqt,bhts->bhqs", src, p) @ self.units.transpose(1, 2)[:, None]  # [B, H, Q, U]
        self._acc[layer] = part if layer not in self._acc else self._acc[layer] + part
        if q0 + Tc == self.source.shape[2]:
            self._judge(layer, self._acc.pop(layer))

    def _judge(self, layer: int, scores: torch.Tensor) -> None:
        B, H, Q, _ = scores.shape
        valid = self.cand >= 0  # [B, Q, K]
        idx = self.cand.clamp(min=0)[:, None].expand(B, H, Q, self.cand.shape[-1])  # [B, H, Q, K]
        s = scores.gather(-1, idx).masked_fill(~valid[:, None], float("-inf"))  # [B, H, Q, K]
        top = s.topk(min(2, s.shape[-1]), dim=-1)
        pred = top.indices[..., 0]  # [B, H, Q]
        if s.shape[-1] > 1:
            second = top.values[..., 1]
            unique = (top.values[..., 0] - second > self.tie_tol) | torch.isinf(second)  # one candidate: unique
        else:
            unique = torch.ones_like(pred, dtype=torch.bool)
        hit = self.gold[:, None].expand(B, H, Q, -1).gather(-1, pred[..., None]).squeeze(-1) & unique  # [B, H, Q]
        self.hits[:, layer] += torch.einsum("bhq,bqg->gh", hit.double(), self._member_f)
        if self._batch_hits is not None:
            self._batch_hits[:, :, layer] = hit.transpose(1, 2)  # [B, Q, H]

    def result(self) -> dict[str, torch.Tensor]:
        """``hits [G, L, H]``, ``n [G]`` (queries per group) and, with ``keep_queries``, ``per_query [N, L, H]``."""
        out = {"hits": self.hits.cpu().clone(), "n": self.n.cpu().clone()}
        if self.keep_queries:
            self._flush_queries()
            L, H = self.hits.shape[1:]
            out["per_query"] = (torch.cat([hits[real.to(hits.device)].cpu() for hits, real in self._per_query])
                                if self._per_query else torch.zeros(0, L, H, dtype=torch.bool))  # [N, L, H]
        return out


def coref_dataset_of(source: Any) -> str:
    """``"gap"`` for a ``.tsv`` file, ``"corefud"`` for ``.conllu``.

    Raises:
        ValueError: another suffix.
    """
    suffix = Path(str(source)).suffix.lower()
    if suffix == ".tsv":
        return "gap"
    if suffix in (".conllu", ".conll"):
        return "corefud"
    raise ValueError(f"cannot tell the coreference format of {str(source)!r}: expected a GAP .tsv or a CorefUD "
                     ".conllu file (or pass dataset='gap' / 'corefud')")


def _windows(source: Any, dataset: str | None, tok: Any, max_tokens: int, max_items: int | None,
             stats: dict[str, int]) -> tuple[str, Iterable[CorefWindow]]:
    if isinstance(source, (str, Path)):
        dataset = dataset or coref_dataset_of(source)
        if dataset == "gap":
            return dataset, gap_windows(read_gap(source, max_rows=max_items), tok, max_tokens=max_tokens, stats=stats)
        if dataset == "corefud":
            return dataset, corefud_windows(read_corefud(source, max_documents=max_items), tok,
                                            max_tokens=max_tokens, stats=stats)
        raise ValueError(f"dataset={dataset!r} must be 'gap' or 'corefud'")
    if isinstance(source, Iterable):
        return dataset or "windows", source
    raise TypeError(f"source must be a path or an iterable of CorefWindow, got {type(source).__name__}")


def coreference_scores(
    model: Any,
    source: str | Path | Iterable[CorefWindow],
    *,
    dataset: str | None = None,
    tokenizer: Any = None,
    batch_size: int = 8,
    max_tokens: int | None = None,
    max_items: int | None = None,
    tie_tol: float = 1e-6,
    n_boot: int = 1000,
    seed: int = 0,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Per head and query group: antecedent accuracy with a Wilson 95 % interval, against the best baseline.

    Args:
        model: an interp Transformer (bidirectional or causal).
        source: a GAP ``.tsv`` or CorefUD ``.conllu`` file, or an iterable of
            :class:`~interp.data.coref.CorefWindow` (e.g. from :func:`~interp.data.coref.gap_windows`).
        dataset: ``"gap"`` or ``"corefud"``; default from the file's suffix.
        tokenizer: anything with ``encode_words``; default ``model.tokenizer``.
        batch_size: windows per forward pass.
        max_tokens: window length in tokens; default the model's ``n_ctx`` (at most 512).
        max_items: only the first GAP rows / CorefUD documents.
        tie_tol: a head's top candidate must beat the runner-up by more than this (else a miss).
        n_boot: resamples of the paired bootstrap of each head's gain over the best baseline (0: none, NaN
            interval). Heads and baseline are resampled together, mention by mention, since they answer the same
            mentions; this keeps one bit per mention and head.
        seed: seed of the bootstrap.
        progress: a per-batch progress bar on stderr (None: on in terminals and notebooks).

    Returns:
        DataFrame ``layer, head, group, n, accuracy, ci_low, ci_high, best_baseline, baseline_accuracy, gain,
        gain_ci_low, gain_ci_high`` (``gain = accuracy - baseline_accuracy``, the best rule-based or random
        baseline of the group; ``ci_*`` Wilson 95 %, ``gain_ci_*`` paired bootstrap 95 %). Groups:
        GAP ``all`` and ``backward`` (both names before the pronoun); CorefUD ``all``, ``pronoun``, ``nominal``.
        ``df.attrs``: ``dataset``, ``baselines`` (records ``group, baseline, n, accuracy, ci_low, ci_high``),
        ``stats`` (counts from the window builder), ``n_windows``, ``not_scorable_causal`` (queries with a
        candidate after the mention, dropped for causal models).

    Raises:
        ValueError: no query to score, a bad ``batch_size``, a model without tokenizer, or the readers' errors.
        FileNotFoundError: the file does not exist.

    Example:
        >>> import interp
        >>> from interp.analysis.coreference import coreference_scores
        >>> df = coreference_scores(interp.load("minilm-l6"), "../shared/data/gap/gap-development.tsv", max_items=10, n_boot=0)
        >>> df[df.group == "all"].sort_values("gain", ascending=False).head()
    """
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is None or not hasattr(tok, "encode_words"):
        raise ValueError(f"model {getattr(model, 'name', '?')!r} has no tokenizer with encode_words; pass tokenizer=")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    max_tokens = min(cfg.n_ctx, 512) if max_tokens is None else max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 0 < max_tokens <= cfg.n_ctx:
        raise ValueError(f"max_tokens={max_tokens!r} must be a positive int <= the model's n_ctx={cfg.n_ctx}")
    stats: dict[str, int] = {}
    dataset, windows = _windows(source, dataset, tok, max_tokens, max_items, stats)
    if dataset in _GROUPS:
        groups = _GROUPS[dataset]
    else:
        windows = list(windows)
        groups = ["all"] + sorted({q.group for w in windows for q in w.queries} - {"all"})
    baseline_names: Sequence[str] | None = {"gap": GAP_BASELINES, "corefud": COREFUD_BASELINES}.get(dataset)
    causal = bool(cfg.causal)
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise ValueError(f"n_boot={n_boot!r} must be a non-negative int")
    if baseline_names is None:
        windows = list(windows)
        baseline_names = sorted({b for w in windows for q in w.queries for b in q.baselines})
    bnames = [*baseline_names, "random"]
    red = CorefReducer(L, H, groups, tie_tol=tie_tol, keep_queries=n_boot > 0)
    q_member: list[list[bool]] = []  # per scored query, in the order of the windows
    q_base: list[list[float]] = []  # per scored query: each baseline's correctness (random: its expectation)
    pad = getattr(tok, "pad_token_id", None) or 0
    not_scorable = 0

    def in_group(q, backward: bool) -> list[bool]:
        return [g == "all" or g == q.group or (g == "backward" and backward) for g in groups]

    # (window, [(query, its groups)], index of its first query, tokens run: the window, or in a causal model up
    # to its last scored mention, since later tokens change no attention row of a scored mention)
    items: list[tuple[CorefWindow, list, int, int]] = []
    for w in windows:
        if not isinstance(w, CorefWindow):
            raise TypeError(f"coreference windows must be CorefWindow objects, got {type(w).__name__}")
        if len(w.ids) > cfg.n_ctx:
            raise ValueError(f"window {w.doc_id!r} has {len(w.ids)} tokens, more than the model's n_ctx={cfg.n_ctx}")
        qs = []
        first = len(q_member)
        for q in w.queries:
            backward = all(max(c) < min(q.source) for c in q.candidates)
            if causal and not backward:
                not_scorable += 1  # a causal head cannot attend to a later name
                continue
            q_groups = in_group(q, backward)
            qs.append((q, q_groups))
            q_member.append(q_groups)
            q_base.append([float(q.gold[q.baselines[b]]) for b in baseline_names] + [sum(q.gold) / len(q.gold)])
        if qs:
            items.append((w, qs, first, _run_length(w, qs) if causal else len(w.ids)))
    n_windows = len(items)
    # Windows of similar length share a batch (less padding), as the treebank's sentences do; every batch's
    # weights are built before the pass, so the loop over forward passes does no per-window work.
    groups_of = bucket_by_length([n for *_, n in items], batch_size, window=max(1, n_windows))
    batches = [_coref_batch([items[i] for i in group], len(groups), pad) for group in groups_of]
    if batches:
        stream(model, batches, [red], name="coreference windows", progress=progress, desc="coreference_scores")
    # The reducer saw the queries batch by batch; the tables below read them in window order.
    seen = [items[i][2] + k for group in groups_of for i in group for k in range(len(items[i][1]))]
    res = red.result()
    if float(res["n"].sum()) == 0:
        raise ValueError(f"no coreference query to score in {source!s} (stats {stats}, {not_scorable} not scorable "
                         f"by a causal model)")
    member = torch.tensor(q_member, dtype=torch.bool)  # [N, G]
    base = torch.tensor(q_base, dtype=torch.float64)  # [N, baselines]
    base_rows = []
    best: dict[str, int] = {}
    for gi, g in enumerate(groups):
        sel = base[member[:, gi]]  # [n, baselines]
        n = sel.shape[0]
        for bi, bname in enumerate(bnames):
            h = float(sel[:, bi].sum())
            lo, hi = wilson_interval(h, float(n))
            acc = h / n if n else math.nan
            base_rows.append({"group": g, "baseline": bname, "n": n, "accuracy": acc, "ci_low": lo, "ci_high": hi})
            if n and (g not in best or acc > float(sel[:, best[g]].mean())):
                best[g] = bi
    per_query = res.get("per_query")
    if per_query is not None:  # back to window order, so the bootstrap draws the same mentions as before
        per_query = torch.empty_like(per_query).index_copy_(0, torch.tensor(seen, dtype=torch.long), per_query)
    gain_ci = _paired_bootstrap(per_query, base, member, groups, best, n_boot, seed)  # {group: ([L, H], [L, H])}
    lo, hi = wilson_interval(res["hits"], res["n"][:, None, None])
    rows = []
    for gi, g in enumerate(groups):
        n = int(res["n"][gi])
        if n == 0:
            continue
        bname = bnames[best[g]]
        bacc = float(base[member[:, gi], best[g]].mean())
        glo, ghi = gain_ci.get(g, (torch.full((L, H), math.nan), torch.full((L, H), math.nan)))
        for layer in range(L):
            for head in range(H):
                acc = float(res["hits"][gi, layer, head]) / n
                rows.append({"layer": layer, "head": head, "group": g, "n": n, "accuracy": acc,
                             "ci_low": float(lo[gi, layer, head]), "ci_high": float(hi[gi, layer, head]),
                             "best_baseline": bname, "baseline_accuracy": bacc, "gain": acc - bacc,
                             "gain_ci_low": float(glo[layer, head]), "gain_ci_high": float(ghi[layer, head])})
    df = pd.DataFrame(rows, columns=["layer", "head", "group", "n", "accuracy", "ci_low", "ci_high", "best_baseline",
                                     "baseline_accuracy", "gain", "gain_ci_low", "gain_ci_high"])
    df.attrs.update(dataset=dataset, baselines=base_rows, stats=dict(stats), n_windows=n_windows,
                    not_scorable_causal=not_scorable)
    return df


def _run_length(w: CorefWindow, qs: list) -> int:
    """Tokens of ``w`` up to the last token of its queries' mentions (in a causal model nothing after them
    changes their attention rows; the candidates of a scored query precede it)."""
    words = {i for q, _ in qs for i in q.source}
    return 1 + max(t for t, word in enumerate(w.word_index) if word in words)


def _coref_batch(rows: list[tuple[CorefWindow, list, int, int]], n_groups: int, pad: int) -> Batch:
    """One padded batch of windows (each cut to its run length) with :class:`CorefReducer`'s weights in
    ``annotations["coref"]``."""
    B = len(rows)
    T = max(n for *_, n in rows)
    Q = max(len(qs) for _, qs, _, _ in rows)
    units_per = []
    for _w, qs, _, _ in rows:
        seen: dict[tuple[int, ...], int] = {}
        for q, _ in qs:
            for c in q.candidates:
                seen.setdefault(tuple(c), len(seen))
        units_per.append(seen)
    U = max(1, max(len(u) for u in units_per))
    K = max(len(q.candidates) for _, qs, _, _ in rows for q, _ in qs)
    tokens = torch.full((B, T), pad, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    source = torch.zeros(B, Q, T)
    units = torch.zeros(B, U, T)
    cand = torch.full((B, Q, K), -1, dtype=torch.long)
    gold = torch.zeros(B, Q, K, dtype=torch.bool)
    member = torch.zeros(B, Q, n_groups, dtype=torch.bool)
    for b, ((w, qs, _, n), seen) in enumerate(zip(rows, units_per)):
        tokens[b, :n] = torch.as_tensor(w.ids[:n])
        mask[b, :n] = 1
        word_tok = align_words(w.word_index, len(w.words))[:, :n]  # [W, n]: the run tokens of each word
        for c, u in seen.items():
            units[b, u, :n] = word_tok[list(c)].sum(0)  # to a candidate: sum over its tokens
        for i, (q, groups_of) in enumerate(qs):
            frm = word_tok[list(q.source)].sum(0)  # [n]
            source[b, i, :n] = frm / frm.sum()  # from a mention: mean over its tokens
            for k, (c, g) in enumerate(zip(q.candidates, q.gold)):
                cand[b, i, k] = seen[tuple(c)]
                gold[b, i, k] = g
            member[b, i] = torch.tensor(groups_of)
    return Batch(tokens, None if bool(mask.all()) else mask,
                 {"coref": (source, units, cand, gold, member)})


def _paired_bootstrap(per_query: torch.Tensor | None, base: torch.Tensor, member: torch.Tensor, groups: list[str],
                      best: dict[str, int], n_boot: int, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per group: the 2.5 and 97.5 percentiles ``[L, H]`` of the gain over the best baseline, resampling mentions."""
    if per_query is None or n_boot == 0:
        return {}
    g = torch.Generator().manual_seed(seed)
    out = {}
    for gi, name in enumerate(groups):
        sel = member[:, gi]
        n = int(sel.sum())
        if n == 0 or name not in best:
            continue
        L, H = per_query.shape[1:]
        diff = per_query[sel].double().reshape(n, L * H) - base[sel, best[name]][:, None]  # [n, L*H]
        idx = torch.randint(0, n, (n_boot, n), generator=g)
        weights = torch.zeros(n_boot, n, dtype=torch.float64).scatter_add_(
            1, idx, torch.ones(n_boot, n, dtype=torch.float64))  # [n_boot, n]: times each mention is drawn
        gains = weights @ diff / n  # [n_boot, L*H]
        q = torch.quantile(gains, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)  # [2, L*H]
        out[name] = (q[0].reshape(L, H), q[1].reshape(L, H))  # [L, H] each
    return out


def coreference_kinds(df: pd.DataFrame, name: str, *, margin: float = 0.1, min_count: int = 50) -> list[dict[str, Any]]:
    """The ``coreference:{name}`` rows of a head taxonomy from a :func:`coreference_scores` table.

    A head qualifies when, on the group ``all``, its accuracy beats the best baseline by at least ``margin``
    over at least ``min_count`` mentions.

    Args:
        df: from :func:`coreference_scores`.
        name: the dataset's name in the kind (``"gap"``, ``"corefud"``...).
        margin: accuracy above the best baseline.
        min_count: mentions needed before a head is judged.

    Returns:
        Records ``layer, head, kind, score, evidence`` (score: the accuracy).

    Raises:
        ValueError: ``margin`` or ``min_count`` out of range.

    Example:
        >>> import interp
        >>> from interp.analysis.coreference import coreference_kinds, coreference_scores
        >>> df = coreference_scores(interp.load("minilm-l6"), "../shared/data/gap/gap-development.tsv", max_items=10, n_boot=0)
        >>> coreference_kinds(df, "gap", min_count=1, margin=0)[0]["kind"]
        'coreference:gap'
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not -1 <= margin <= 1:
        raise ValueError(f"coref margin={margin!r} must be a number in [-1, 1]")
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 0:
        raise ValueError(f"coref min_count={min_count!r} must be a non-negative int")
    good = df[(df.group == "all") & (df.gain >= margin) & (df.n >= min_count)]
    return [{"layer": int(r.layer), "head": int(r.head), "kind": f"coreference:{name}", "score": float(r.accuracy),
             "evidence": f"mention->antecedent accuracy {r.accuracy:.2f} (95% CI {r.ci_low:.2f}-{r.ci_high:.2f}) vs "
                         f"{r.best_baseline} baseline {r.baseline_accuracy:.2f} (+{r.gain:.2f}, paired 95% CI "
                         f"{r.gain_ci_low:+.2f} to {r.gain_ci_high:+.2f}; n={r.n})"}
            for r in good.itertuples()]
