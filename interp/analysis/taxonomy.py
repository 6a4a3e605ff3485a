"""The head taxonomy: run the positional, induction and syntactic analyzers and name what each head does.

``classify_heads(model, ...)`` returns a :class:`HeadReport`: one row per (head, kind) with a score and the
evidence in words. A head may carry several kinds (a previous-token head is usually also ``positional:-1``);
a head with no row did not pass any threshold.

Kinds and their default thresholds (all are parameters of :func:`classify_heads`):

==========================  ==============================================================  =========
kind                        criterion                                                        default
==========================  ==============================================================  =========
``positional:{o}``          argmax at relative offset ``o`` in at least this share of rows   0.9 (Voita et al. 2019)
``positional:first``        argmax on the first token ([CLS]/BOS), same share                0.9
``positional:delimiter``    argmax on a delimiter ([SEP], end punctuation), same share       0.9
``previous-token``          mean attention mass on ``q - 1``                                  0.5
``duplicate-token``         mean attention mass on earlier copies of the current token        0.5
``induction``               prefix-matching mass on repeated random sequences, and, for       0.4 / 0.7
                            models with an unembedding, a copying score of at least 0.7
``syntactic:{rel}``         accuracy beats the best fixed-offset baseline of the relation     margin 0.1,
                            by the margin, in either direction, over at least ``min_count``   100 arcs
                            arcs
``coreference:{dataset}``   mention->antecedent accuracy beats the best baseline (nearest,    margin 0.1,
                            head/string match, random...; :mod:`.coreference`) by the margin  50 mentions
==========================  ==============================================================  =========
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..data import TreebankStats, random_tokens_for, repeated_tokens_for, text_batches, treebank_batches
from ..progress import enabled as progress_enabled
from ..streaming import Reducer, stream
from ._stream import head_counts
from .coreference import coref_dataset_of, coreference_kinds, coreference_scores
from .induction import induction_reducers, induction_table
from .positional import PositionalReducer, offset_label
from .syntactic import SyntacticReducer, run_treebank

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from ..model import Transformer

__all__ = ["HeadReport", "classify_heads"]

_COLUMNS = ["layer", "head", "kind", "score", "evidence"]


@dataclass
class HeadReport:
    """What :func:`classify_heads` found.

    Attributes:
        df: DataFrame ``layer, head, kind, score, evidence``, one row per (head, kind).
        n_layers, n_heads: the model's shape (for the figure); ``n_heads`` is the widest layer's count.
        model_name: the model's name.
        details: the raw score tables (``"positional"``, ``"induction"``, ``"syntactic"``) that were computed.
        thresholds: the thresholds used.

    Example:
        >>> report = classify_heads(model)
        >>> report.df[report.df.kind == "induction"]
        >>> report.figure().show()
    """

    df: pd.DataFrame
    n_layers: int
    n_heads: int
    model_name: str = "model"
    details: dict[str, pd.DataFrame] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    layer_heads: list[int] | None = None  # heads per layer when layers differ (a pruned model); None: n_heads each

    def __post_init__(self) -> None:
        if self.layer_heads is None:
            self.layer_heads = [self.n_heads] * self.n_layers

    def kinds(self, layer: int, head: int) -> set[str]:
        """The kinds of one head (empty set for an unclassified head)."""
        sel = self.df[(self.df["layer"] == layer) & (self.df["head"] == head)]
        return set(sel.kind)

    def heads(self, kind: str) -> list[tuple[int, int]]:
        """``(layer, head)`` pairs carrying ``kind`` (exact name, or a prefix ending in ``:`` such as
        ``"syntactic:"``)."""
        sel = self.df[self.df.kind.str.startswith(kind)] if kind.endswith(":") else self.df[self.df.kind == kind]
        return sorted({(int(r.layer), int(r.head)) for r in sel.itertuples()})

    def as_dict(self) -> dict[tuple[int, int], set[str]]:
        """``{(layer, head): {kinds}}`` for every classified head."""
        out: dict[tuple[int, int], set[str]] = {}
        for r in self.df.itertuples():
            out.setdefault((int(r.layer), int(r.head)), set()).add(r.kind)
        return out

    def figure(self) -> go.Figure:
        """The layer x head map of :func:`interp.viz.head_map` (requires plotly)."""
        from ..viz import head_map

        return head_map(self, title=f"Head taxonomy of {self.model_name}")

    def __len__(self) -> int:
        return len(self.df)

    def __repr__(self) -> str:
        n_heads = self.df[["layer", "head"]].drop_duplicates().shape[0] if len(self.df) else 0
        head = (f"HeadReport({self.model_name!r}: {len(self.df)} kinds on {n_heads} of "
                f"{sum(self.layer_heads)} heads)")
        if not len(self.df):
            return head
        return head + "\n" + self.df.to_string(index=False, float_format=lambda x: f"{x:.3f}")

    def _repr_html_(self) -> str:
        title = (f"<b>HeadReport</b> of {html.escape(self.model_name)}: {len(self.df)} kinds on "
                 f"{self.n_layers} x {self.n_heads} heads")
        return title + self.df.to_html(index=False, float_format=lambda x: f"{x:.3f}")


def _signed(offset: Any) -> str:
    """A baseline offset as ``+1`` / ``-2``; a pooled relation's per-subtype offsets (a string) unchanged."""
    return f"{offset:+d}" if isinstance(offset, int) else str(offset)


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """A shallow copy of ``df`` without its ``attrs``, to read from: pandas deep-copies ``attrs`` into every frame
    and column derived from a frame (a syntactic table's attrs hold a record per relation)."""
    plain = df.copy(deep=False)
    plain.attrs = {}
    return plain


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def classify_heads(
    model: Transformer,
    *,
    tokens: Any = None,
    texts: list[str] | None = None,
    conllu: Any = None,
    induction_tokens: Any = None,
    definition: str = "interp",
    window: int = 3,
    positional_threshold: float = 0.9,
    previous_token_threshold: float = 0.5,
    duplicate_token_threshold: float = 0.5,
    induction_threshold: float = 0.4,
    copying_threshold: float = 0.7,
    copying_rows: int | None = None,
    copying_comparisons: int | None = 256,
    syntactic_margin: float = 0.1,
    syntactic_min_count: int = 100,
    coref: Any = None,
    coref_margin: float = 0.1,
    coref_min_count: int = 50,
    max_sentences: int | None = None,
    n_seqs: int = 32,
    half_len: int | None = None,
    seed: int = 0,
    batch_size: int = 32,
    extra_reducers: list[Reducer] = (),
    progress: bool | None = None,
) -> HeadReport:
    """Classify every head of ``model`` (see the module docstring for the kinds and default thresholds).

    Data: the positional analysis runs on ``tokens`` if given, else on ``texts`` (tokenized), else on the
    sentences of ``conllu``, else on uniform random tokens. The induction analysis runs on
    ``induction_tokens`` if given, else on repeated random sequences (``n_seqs``, ``half_len``, ``seed``). The
    syntactic analysis runs only when ``conllu`` is given.

    Every scorer that reads the treebank is fed from the same forward pass over each batch (sentences
    bucketed by length): with ``conllu`` and no ``tokens``/``texts`` the model runs once over the treebank
    and once over the induction data. A pruned model (per-layer head counts, from
    :func:`~interp.pruning.remove_heads`) is classified head by head as it is.

    Args:
        model: an interp Transformer.
        tokens: token ids for the positional analysis (a tensor or an iterable of batches).
        texts: raw texts for the positional analysis (needs a tokenizer).
        conllu: a CoNLL-U path (or iterable of Sentence) for the syntactic analysis.
        induction_tokens: token ids for the induction analysis.
        definition: ``"interp"`` or ``"transformer_lens"`` attention scores (see :func:`induction_scores`).
        window: relative offsets ``-window..+window`` are tested.
        positional_threshold: Voita et al.'s argmax share for ``positional:*``.
        previous_token_threshold, duplicate_token_threshold, induction_threshold: attention-mass thresholds.
        copying_threshold: minimum copying score of an induction head (models with an unembedding).
        copying_rows: score copying on at most this many random rows per induction batch (None: all).
        copying_comparisons: vocabulary tokens each row's attended token is ranked against (an unbiased
            estimate of its rank in the whole vocabulary, :class:`~interp.analysis.CopyingReducer`); None:
            the whole vocabulary (exact; ~7.6 GFLOP a row for SmolLM2's 270 heads and 49k tokens).
        syntactic_margin: accuracy above the offset baseline needed for ``syntactic:{rel}``.
        syntactic_min_count: arcs of a relation (in that direction) needed before it is judged.
        coref: coreference data for ``coreference:{dataset}``: a GAP ``.tsv`` / CorefUD ``.conllu`` path (the
            kind is named ``gap`` / ``corefud``), a list of them, or a dict ``{dataset name: path}``.
        coref_margin, coref_min_count: accuracy above the best baseline, and mentions needed to judge.
        max_sentences: cap on treebank sentences.
        n_seqs, half_len, seed: the default random data.
        batch_size: sequences (or sentences) per forward pass.
        extra_reducers: more reducers fed from the text pass (the treebank's when ``conllu`` is given), for
            scorers added later; read their results yourself afterwards.
        progress: a per-batch progress bar for each stage on stderr (None: on in terminals and notebooks).

    Returns:
        A :class:`HeadReport`.

    Raises:
        ValueError: empty data, bad thresholds, ``texts`` without a tokenizer, or the errors of the analyzers.

    Example:
        >>> report = classify_heads(interp.load("minilm-l6"), conllu="../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu", max_sentences=20)
        >>> report
        >>> report.heads("syntactic:")
    """
    for name, v in (("positional_threshold", positional_threshold), ("previous_token_threshold",
                    previous_token_threshold), ("duplicate_token_threshold", duplicate_token_threshold),
                    ("induction_threshold", induction_threshold), ("copying_threshold", copying_threshold)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
            raise ValueError(f"{name}={v!r} must be a number in [0, 1]")
    cfg = model.cfg
    rows: list[dict[str, Any]] = []
    details: dict[str, pd.DataFrame] = {}
    show = progress_enabled(progress)
    pos_red = PositionalReducer(model, window=window)
    ind_reds = induction_reducers(model, definition=definition, copying_rows=copying_rows,
                                  copying_comparisons=copying_comparisons)
    syn_red = SyntacticReducer(model) if conllu is not None else None
    stats = TreebankStats()
    tree = (treebank_batches(model, conllu, batch_size=batch_size, max_sentences=max_sentences, stats=stats)
            if conllu is not None else None)

    # --- one pass over the text: positional (+ syntactic when the text is the treebank) ------------------
    text_reds: list[Reducer] = [pos_red, *extra_reducers]
    bars = dict(progress=show, desc="classify_heads: positional")
    tree_bars = dict(progress=show, desc="classify_heads: treebank")
    if tokens is not None or texts is not None:
        data = tokens if tokens is not None else text_batches(model, texts, batch_size=batch_size)
        stream(model, data, text_reds, batch_size=batch_size, **bars)
        if tree is not None:
            run_treebank(model, tree, [syn_red], stats, conllu, **tree_bars)
    elif tree is not None and getattr(model, "tokenizer", None) is not None:
        run_treebank(model, tree, [*text_reds, syn_red], stats, conllu, **tree_bars)
    else:
        stream(model, random_tokens_for(model, n_seqs, min(cfg.n_ctx, 64), seed=seed), text_reds,
               batch_size=batch_size, **bars)
        if tree is not None:
            run_treebank(model, tree, [syn_red], stats, conllu, **tree_bars)
    pos = pos_red.table()
    details["positional"] = pos
    targets = [(offset_label(o), f"at offset {offset_label(o)}") for o in range(-window, window + 1)]
    targets += [(cat, f"on the {cat} token") for cat in ("first", "delimiter")]
    n_rows = pos.attrs["rows"]
    for r in _plain(pos).to_dict("records"):
        for lab, where in targets:
            share = r[f"argmax_{lab}"]
            if share == share and share >= positional_threshold:  # share != share: NaN, no valid rows
                rows.append({"layer": r["layer"], "head": r["head"], "kind": f"positional:{lab}", "score": share,
                             "evidence": f"argmax {where} in {_pct(share)} of {n_rows[lab]} queries; mean "
                                         f"weight there {r[f'mass_{lab}']:.2f}"})

    # --- the induction family: its own synthetic batches ---------------------------------------------------
    ind_data = induction_tokens if induction_tokens is not None else repeated_tokens_for(
        model, n_seqs, half_len, seed=seed)
    ind = induction_table(model, ind_reds, stream(model, ind_data, ind_reds, batch_size=batch_size,
                                                  progress=show, desc="classify_heads: induction"))
    details["induction"] = ind
    for r in _plain(ind).itertuples():
        if r.previous_token >= previous_token_threshold:
            rows.append({"layer": r.layer, "head": r.head, "kind": "previous-token", "score": r.previous_token,
                         "evidence": f"mean attention {r.previous_token:.2f} on the previous token"})
        if r.duplicate_token >= duplicate_token_threshold:
            rows.append({"layer": r.layer, "head": r.head, "kind": "duplicate-token", "score": r.duplicate_token,
                         "evidence": f"mean attention {r.duplicate_token:.2f} on earlier copies of the token"})
        copies = math.isnan(r.copying) or r.copying >= copying_threshold
        if r.induction >= induction_threshold and copies:
            copy_txt = "no unembedding" if math.isnan(r.copying) else f"copying score {r.copying:.2f}"
            rows.append({"layer": r.layer, "head": r.head, "kind": "induction", "score": r.induction,
                         "evidence": f"prefix-matching attention {r.induction:.2f} on repeated sequences; "
                                     f"{copy_txt}"})

    # --- syntactic ------------------------------------------------------------------------------------
    if syn_red is not None:
        syn = syn_red.table(n_skipped=stats.skipped, n_untokenized=stats.untokenized)
        details["syntactic"] = syn
        plain = _plain(syn)
        good = plain[(plain.gain >= syntactic_margin) & (plain.n >= syntactic_min_count)]
        # One row per (head, relation): the direction with the larger gain.
        good = good.sort_values("gain", ascending=False).drop_duplicates(["layer", "head", "relation"])
        for r in good.itertuples():
            rows.append({"layer": r.layer, "head": r.head, "kind": f"syntactic:{r.relation}", "score": r.accuracy,
                         "evidence": f"{r.direction} accuracy {r.accuracy:.2f} vs offset {_signed(r.baseline_offset)} "
                                     f"baseline {r.baseline_accuracy:.2f} (+{r.gain:.2f}, n={r.n})"})

    # --- coreference ----------------------------------------------------------------------------------
    if coref is not None:
        sources = coref if isinstance(coref, dict) else {
            coref_dataset_of(c): c for c in (coref if isinstance(coref, (list, tuple)) else [coref])}
        for name, src in sources.items():
            cor = coreference_scores(model, src, batch_size=max(1, batch_size // 4), progress=show)
            details[f"coreference:{name}"] = cor
            rows += coreference_kinds(cor, name, margin=coref_margin, min_count=coref_min_count)

    df = pd.DataFrame(rows, columns=_COLUMNS)
    if len(df):
        df = df.astype({"layer": int, "head": int, "score": float})
        df = df.sort_values(["layer", "head", "kind"], kind="stable").reset_index(drop=True)
    thresholds = dict(window=window, positional_threshold=positional_threshold,
                      previous_token_threshold=previous_token_threshold,
                      duplicate_token_threshold=duplicate_token_threshold, induction_threshold=induction_threshold,
                      copying_threshold=copying_threshold, syntactic_margin=syntactic_margin,
                      syntactic_min_count=syntactic_min_count, definition=definition, coref_margin=coref_margin,
                      coref_min_count=coref_min_count)
    heads = head_counts(model)
    return HeadReport(df, cfg.n_layers, max(heads, default=0), getattr(model, "name", "model"), details, thresholds,
                      layer_heads=heads)
