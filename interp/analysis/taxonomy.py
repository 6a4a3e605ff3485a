"""The head taxonomy: run the registered head kinds and name what each head does.

``classify_heads(model, ...)`` returns a :class:`HeadReport`: one row per (head, kind) with a score and the
evidence in words. A head may carry several kinds (a previous-token head is usually also ``positional:-1``);
a head with no row did not pass any threshold. Every kind is an entry of the registry in :mod:`.kinds`
(:func:`~interp.analysis.kinds.head_kinds`): its data, its streamed reducers, its rows and its threshold with the
reason for it; ``classify_heads(kinds=[...])`` runs any subset, and kinds that read the same data share one pass.

Kinds and their default thresholds (the first six run by default; the others with ``kinds=[...]`` or ``"all"``):

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
``sink``                    mean attention on the first token, whose value norm is small      0.3 / 0.5
                            (:mod:`.sink`; Xiao et al. 2023, Gu et al. 2024, Guo et al. 2024)
``copy-suppression``        negative copying score of the effective OV circuit               0.9
                            (:mod:`.copy_suppression`; McDougall et al. 2023)
``successor``               succession score of the effective OV circuit on ordinal tokens   0.5
                            (:mod:`.successor`; Gould et al. 2023)
``function-vector``         average indirect effect of the head's task-mean output on        0.01
                            shuffled-label ICL prompts (:mod:`.function_vector`; Todd et al.
                            2024)
``name-mover``,             attention from END to the indirect object on IOI prompts, with   0.3 / 0.9
``negative-name-mover``     a positive / negative OV copying score on the names
                            (:mod:`.name_mover`; Wang et al. 2022)
==========================  ==============================================================  =========

With ``bootstrap=N`` every score that keeps per-row values (sink: per sequence; copy suppression and successor:
per token; function vector: per ICL prompt; name movers: per IOI prompt) gets an interval, and a head whose
interval straddles the threshold is reported with ``uncertain=True`` (:mod:`.uncertainty`). ``report.probes``
says which data each kind was measured on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..data import TreebankStats, random_tokens_for, repeated_tokens_for, text_batches, treebank_batches
from ..pipeline import Pipeline
from ..progress import enabled as progress_enabled
from ..streaming import Reducer, stream
from ..tensor_parallel import HeadParallel
from ._stream import head_counts
from .kinds import BUILTIN_DATA, DATA, KindRun, head_kinds, resolve_kinds
from .syntactic import run_treebank
from .uncertainty import with_intervals

if TYPE_CHECKING:
    from pathlib import Path

    import plotly.graph_objects as go

    from ..data import Sentence
    from ..data.batches import TokenData
    from ..model import Transformer

__all__ = ["PIPELINE_KINDS", "HeadReport", "classify_heads"]

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
        layer_heads: heads per layer (they differ on a pruned model).
        probes: ``{kind name: the probe data it was measured on}`` for every kind run.
        kinds_run: the registered kinds that were run (a kind with no row found no head).
        extra: the results of ``extra_reducers``.

    Example:
        >>> from interp import classify_heads
        >>> from interp.examples import model
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
    # Heads per layer (they differ on a pruned model); None (the default) resolves to n_heads each in __post_init__,
    # so every reader sees a list (typed as what it holds after construction, as ModelConfig's derived fields).
    layer_heads: list[int] = None  # type: ignore[assignment]
    probes: dict[str, str] = field(default_factory=dict)  # kind name -> the probe data it was measured on
    kinds_run: list[str] = field(default_factory=list)  # the registered kinds that were run
    extra: dict[str, Any] = field(default_factory=dict)  # extra_reducers' results, "{index}:{class name}"

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


def classify_heads(
    model: Transformer | HeadParallel | Pipeline,
    *,
    tokens: TokenData | None = None,
    texts: list[str] | None = None,
    conllu: str | Path | Iterable[Sentence] | None = None,
    induction_tokens: TokenData | None = None,
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
    coref: str | Path | Sequence[str | Path] | Mapping[str, str | Path] | None = None,
    coref_margin: float = 0.1,
    coref_min_count: int = 50,
    max_sentences: int | None = None,
    n_seqs: int = 32,
    half_len: int | None = None,
    seed: int = 0,
    batch_size: int = 32,
    extra_reducers: Sequence[Reducer] = (),
    kinds: str | Sequence[str] | None = None,
    bootstrap: int = 0,
    options: dict[str, Any] | None = None,
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
        model: an interp Transformer, or a :class:`~interp.tensor_parallel.HeadParallel` shard under torchrun:
            every rank then runs every batch, classifies its own heads, and receives the whole model's report;
            or a :class:`~interp.pipeline.Pipeline` under torchrun, every rank calling with the same arguments:
            rank 0's data runs through the pipeline, each rank scores the heads of its own layers, and every
            rank receives the whole model's report (the kinds of :data:`PIPELINE_KINDS`).
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
            estimate of its rank in the whole vocabulary, :class:`~interp.analysis.CopyingReducer`; a batch of
            more than 1,024 rows draws fewer a row, its head scores' standard error staying <= 0.001); None:
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
            scorers added later; their ``result()`` values are in ``report.extra`` (``"{index}:{class name}"``).
        kinds: the registered kinds to run (:func:`~interp.analysis.kinds.head_kinds`): None runs the default
            ones (positional, previous-token, duplicate-token, induction, and syntactic / coreference when their
            data is given), ``"all"`` every kind, or a list of names.
        bootstrap: resamples of the bootstrap interval of every score that has per-row values (0: none). With
            intervals the report gains ``low, high, uncertain`` columns, and a head whose interval straddles
            its kind's threshold is reported with ``uncertain=True`` (also when its score is just below).
        options: settings of the registered kinds beyond these keywords (``sink_threshold``,
            ``copy_suppression_threshold``, ``ordinal_tokens``...: each kind's ``defaults``).
        progress: a per-batch progress bar for each stage on stderr (None: on in terminals and notebooks).

    Returns:
        A :class:`HeadReport`.

    Raises:
        ValueError: empty data, bad thresholds, ``texts`` without a tokenizer, an unknown kind name or option, a
            kind asked for by name without its data (``syntactic`` without ``conllu``), or the errors of the
            analyzers.

    Example:
        >>> import interp
        >>> from interp import classify_heads
        >>> report = classify_heads(interp.load("minilm-l6"), conllu="../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu", max_sentences=20)
        >>> report
        >>> report.heads("syntactic:")
    """
    if isinstance(model, (HeadParallel, Pipeline)):  # each rank classifies its own heads, then they are joined
        settings = {k: v for k, v in locals().items() if k != "model"}
        if isinstance(model, Pipeline):
            return _classify_over_stages(model, settings)
        return _classify_across_ranks(model, settings)
    for name, v in (("positional_threshold", positional_threshold), ("previous_token_threshold",
                    previous_token_threshold), ("duplicate_token_threshold", duplicate_token_threshold),
                    ("induction_threshold", induction_threshold), ("copying_threshold", copying_threshold)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
            raise ValueError(f"{name}={v!r} must be a number in [0, 1]")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise ValueError(f"bootstrap={bootstrap!r} must be an int >= 0 (0: no intervals)")
    if bootstrap and _ranks() > 1:  # per-sequence rows stay on their rank: an interval would see a shard only
        raise ValueError(f"bootstrap={bootstrap} needs one process; under torchrun ({_ranks()} ranks) run without it")
    selected = resolve_kinds(kinds)
    explicit = kinds is not None and kinds != "all"  # "all": every kind whose data is given
    keywords = dict(tokens=tokens, texts=texts, conllu=conllu, induction_tokens=induction_tokens,
                    definition=definition, window=window, positional_threshold=positional_threshold,
                    previous_token_threshold=previous_token_threshold,
                    duplicate_token_threshold=duplicate_token_threshold, induction_threshold=induction_threshold,
                    copying_threshold=copying_threshold, copying_rows=copying_rows,
                    copying_comparisons=copying_comparisons, syntactic_margin=syntactic_margin,
                    syntactic_min_count=syntactic_min_count, coref=coref, coref_margin=coref_margin,
                    coref_min_count=coref_min_count, max_sentences=max_sentences, n_seqs=n_seqs, half_len=half_len,
                    seed=seed, batch_size=batch_size, bootstrap=bootstrap)
    defaults = {k: v for kind in head_kinds().values() for k, v in kind.defaults.items()}
    unknown = sorted(set(options or {}) - set(defaults))
    if unknown:
        raise ValueError(f"options {unknown} are not settings of any head kind; the settings are {sorted(defaults)}")
    # Kinds whose data was not given: skipped by default, refused when asked for by name.
    given = dict(tokens=tokens, texts=texts, conllu=conllu, coref=coref, induction_tokens=induction_tokens)
    needs = {k.name: [n for n in (*k.needs, *{"treebank": ("conllu",), "coref": ("coref",)}.get(k.data, ()))
                      if given.get(n) is None] for k in selected}
    missing = [name for name, lack in needs.items() if lack]
    if explicit and missing:
        raise ValueError("; ".join(f"head kind {k.name!r} needs {', '.join(n + '=' for n in needs[k.name])} (its "
                                   f"data: {DATA[k.data]})" for k in selected if k.name in missing))
    selected = [k for k in selected if k.name not in missing]
    run = KindRun(model, {**defaults, **(options or {}), **keywords}, progress_enabled(progress))
    for kind in selected:
        for name, default in kind.defaults.items():
            _check_setting(kind.name, name, run.options[name], default)

    # --- each data's reducers, built once per factory (kinds sharing a factory share its reducers) -----------
    built: dict[Any, list[Reducer]] = {}
    for kind in selected:
        if kind.reducers is not None and kind.reducers not in built:
            built[kind.reducers] = kind.reducers(run)

    def reducers_of(data: str) -> list[Reducer]:
        factories = dict.fromkeys(k.reducers for k in selected if k.data == data and k.reducers is not None)
        return [r for f in factories for r in built[f]]

    cfg = model.cfg
    text_reds = [*reducers_of("text"), *extra_reducers]
    syn_reds = reducers_of("treebank")
    stats = TreebankStats()
    tree = (treebank_batches(model, conllu, batch_size=batch_size, max_sentences=max_sentences, stats=stats)
            if conllu is not None and (syn_reds or (text_reds and tokens is None and texts is None)) else None)
    run.passes["treebank_stats"] = stats

    # --- one pass over the text (+ the treebank's sentences when the text is the treebank) --------------------
    bars: dict[str, Any] = dict(progress=run.show, desc="classify_heads: positional")
    tree_bars: dict[str, Any] = dict(progress=run.show, desc="classify_heads: treebank")
    if tokens is not None or texts is not None:
        if text_reds:
            data = tokens if tokens is not None else text_batches(model, texts or [], batch_size=batch_size)
            run.passes["text"] = stream(model, data, text_reds, batch_size=batch_size, **bars)
        text_probe = "the given tokens" if tokens is not None else f"{len(texts or [])} given texts"
        if tree is not None and syn_reds:
            run_treebank(model, tree, syn_reds, stats, conllu, **tree_bars)
    elif tree is not None and getattr(model, "tokenizer", None) is not None:
        run_treebank(model, tree, [*text_reds, *syn_reds], stats, conllu, **tree_bars)
        text_probe = f"the sentences of the treebank {str(conllu)!r}"
    else:
        T = min(cfg.n_ctx, 64)
        if text_reds:
            run.passes["text"] = stream(model, random_tokens_for(model, n_seqs, T, seed=seed), text_reds,
                                        batch_size=batch_size, **bars)
        text_probe = f"{n_seqs} sequences of {T} uniform random tokens (seed {seed})"
        if tree is not None and syn_reds:
            run_treebank(model, tree, syn_reds, stats, conllu, **tree_bars)

    # --- the repeated sequences of the induction family ------------------------------------------------------
    rep_reds = reducers_of("repeats")
    rep_probe = ("the given induction_tokens" if induction_tokens is not None else
                 f"{n_seqs} random sequences repeated once (half_len {half_len or 'default'}, seed {seed})")
    if rep_reds:
        ind_data = induction_tokens if induction_tokens is not None else repeated_tokens_for(
            model, n_seqs, half_len, seed=seed)
        run.passes["repeats"] = stream(model, ind_data, rep_reds, batch_size=batch_size, progress=run.show,
                                       desc="classify_heads: induction")

    # --- data the kinds build themselves (needle-in-a-haystack...): one pass per data, shared -------------------
    for data in dict.fromkeys(k.data for k in selected if k.data not in BUILTIN_DATA):
        builder = next(k.data_builder for k in selected if k.data == data)
        reds = reducers_of(data)
        batches = builder(run) if reds and builder is not None else []
        # An empty list: the kinds cannot build their data (no tokenizer), and their rows say so.
        if not (isinstance(batches, (list, tuple)) and not batches):
            run.passes[data] = stream(model, batches, reds, batch_size=batch_size, progress=run.show,
                                      desc=f"classify_heads: {data}")

    # --- every kind's rows, with its probe data ---------------------------------------------------------------
    probe_of = {"text": text_probe, "repeats": rep_probe, "treebank": f"the treebank {str(conllu)!r}",
                "coref": "coreference data", "weights": "the weights (no data)"}
    rows: list[dict[str, Any]] = []
    order = list(head_kinds())  # registration order: a kind may read what an earlier one computed
    for kind in sorted(selected, key=lambda k: order.index(k.name)):
        run.probes[kind.name] = probe_of.get(kind.data, DATA[kind.data])
        found = kind.rows(run, built.get(kind.reducers, []) if kind.reducers is not None else [])
        rows += with_intervals(found, bootstrap, seed=seed)
    # A kind's sure find replaces the labels it supersedes on that head (a sink is no first-token reader).
    for kind in selected:
        sure = {(r["layer"], r["head"]) for r in rows if r["kind"] in kind.labels and not r.get("uncertain")}
        rows = [r for r in rows if r["kind"] not in kind.supersedes or (r["layer"], r["head"]) not in sure]
    extra = {f"{i}:{type(r).__name__}": r.result() for i, r in enumerate(extra_reducers)}

    columns = _COLUMNS + (["low", "high", "uncertain"] if bootstrap else [])
    df = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=columns)
    if len(df):
        df = df.astype({"layer": int, "head": int, "score": float})
        df = df.sort_values(["layer", "head", "kind"], kind="stable").reset_index(drop=True)
    thresholds = dict(window=window, positional_threshold=positional_threshold,
                      previous_token_threshold=previous_token_threshold,
                      duplicate_token_threshold=duplicate_token_threshold, induction_threshold=induction_threshold,
                      copying_threshold=copying_threshold, syntactic_margin=syntactic_margin,
                      syntactic_min_count=syntactic_min_count, definition=definition, coref_margin=coref_margin,
                      coref_min_count=coref_min_count)
    thresholds.update({k: run.options[k] for kind in selected for k in kind.defaults})
    heads = head_counts(model)
    return HeadReport(df, cfg.n_layers, max(heads, default=0), getattr(model, "name", "model"), run.details,
                      thresholds, layer_heads=heads, probes=run.probes, kinds_run=[k.name for k in selected],
                      extra=extra)


def _classify_across_ranks(tp: HeadParallel, settings: dict[str, Any]) -> HeadReport:
    """:func:`classify_heads` of a head-parallel shard: every rank runs every batch (its heads' passes need the
    others' partial sums) and scores its own heads; their rows are joined under global head indices."""
    from .. import distributed

    if settings.get("extra_reducers"):
        raise ValueError("classify_heads: extra_reducers are not joined across a HeadParallel's ranks (their state "
                         "is per rank); record them with HeadParallel.run_with_cache instead")
    with distributed.replicated():
        local = classify_heads(tp.model, **settings)
    joined = tp.gather_head_tables({"df": local.df, **{f"details.{k}": v for k, v in local.details.items()}})
    df = joined["df"]
    if len(df):
        df = df.sort_values(["layer", "head", "kind"], kind="stable").reset_index(drop=True)
    details = {k: joined[f"details.{k}"] for k in local.details}
    return dataclasses.replace(local, df=df, details=details, n_heads=max(tp.n_heads, default=0),
                               layer_heads=list(tp.n_heads))


#: The kinds :func:`classify_heads` runs over a :class:`~interp.pipeline.Pipeline`. The pattern kinds' scores are
#: per-head reducers of streamed passes, each fed on the rank that owns the head. The OV-circuit kinds (copy
#: suppression, successor, name movers: :mod:`.ov_circuit`) score each head from its own layer's weights on its
#: own rank; what they read beyond it is lent: the effective embeddings of the scored tokens are computed on rank
#: 0 (the embedding and block 0) and broadcast, the final norm and unembedding are the last rank's, broadcast
#: (:meth:`~interp.pipeline.Pipeline.output_head_everywhere`). The function-vector kind's model calls (the
#: task-mean z, the prefill into a KV cache, one patched decoding step per layer) run over the pipeline
#: (``model.call_route``, :meth:`~interp.pipeline.Pipeline._call`): each head is patched on its rank and the
#: answer's probability is computed on the last one. The other kinds (coreference, natural induction,
#: retrieval) stay refused: not shown equal there.
PIPELINE_KINDS = ("positional", "previous-token", "duplicate-token", "induction", "sink", "syntactic",
                  "copy-suppression", "successor", "name-mover", "function-vector")
#: The kinds that read the unembedding on the rank that owns each head, besides the induction family's copying gate
#: (its data, the repeats): the OV-circuit kinds.
_READ_OUTPUT_HEAD = ("copy-suppression", "successor", "name-mover")


def _classify_over_stages(pipe: Pipeline, settings: dict[str, Any]) -> HeadReport:
    """:func:`classify_heads` over a pipeline: every rank runs the one engine on its stage with its passes routed
    through the pipeline (:meth:`Pipeline.routed`), so its reducers hold its own layers' scores; each rank's
    rows and per-head tables of its layers are joined, in layer order, on every rank."""
    from .. import distributed

    if settings.get("extra_reducers"):
        raise ValueError("classify_heads: extra_reducers are not joined across a Pipeline's ranks (each rank's "
                         "state holds its own layers); feed them with Pipeline.stream instead")
    explicit = settings["kinds"] not in (None, "all")  # by name: run (or refused by the engine without data)

    def runs(kind: Any) -> bool:  # as the engine selects: a kind not asked for by name runs when its data is given
        needs = (*kind.needs, *{"treebank": ("conllu",), "coref": ("coref",)}.get(kind.data, ()))
        return explicit or all(settings.get(n) is not None for n in needs)

    selected = [k for k in resolve_kinds(settings["kinds"]) if runs(k)]
    refused = [k.name for k in selected if k.name not in PIPELINE_KINDS]
    if refused:
        raise ValueError(f"classify_heads: head kinds {refused} do not run over a Pipeline's ranks (they read "
                         f"passes or weights that no route carries between the ranks); pass kinds= from "
                         f"{list(PIPELINE_KINDS)}, or classify those in one process")
    # The induction gate reads each head's write via W_U, the OV-circuit kinds each head's effective OV logits.
    copying = any(k.data == "repeats" or k.name in _READ_OUTPUT_HEAD for k in selected)
    with contextlib.ExitStack() as stack:
        stack.enter_context(distributed.replicated())  # every rank runs rank 0's batches: no data sharding
        if copying:
            stack.enter_context(pipe.output_head_everywhere())
        stack.enter_context(pipe.routed())
        local = classify_heads(pipe.model, **settings)
    own = range(pipe.first, pipe.stop)

    def mine(table: pd.DataFrame) -> pd.DataFrame:
        if "layer" not in table.columns:
            return table
        # Each rank's table has one process's rows in one process's order (the other ranks' layers with empty
        # scores): its own rows keep their place, so the joined table has one process's order (a syntactic table
        # runs over relations first, layers within each).
        return table.assign(_row=range(len(table)))[table["layer"].isin(own)]

    tables = {"df": local.df, **{f"details.{k}": v for k, v in local.details.items()}}
    everyone = pipe._gather_all({k: mine(v) for k, v in tables.items()}, "the pipeline's head tables")
    joined = {}
    for name, table in tables.items():
        if "layer" in table.columns:
            parts = pd.concat([rank_tables[name] for rank_tables in everyone])
            table_out = parts.sort_values("_row", kind="stable").drop(columns="_row").reset_index(drop=True)
            table_out.attrs = dict(everyone[0][name].attrs)  # per-table facts (row counts) agree over ranks
        else:
            table_out = everyone[0][name]
        joined[name] = table_out
    df = joined["df"]
    if len(df):
        df = df.sort_values(["layer", "head", "kind"], kind="stable").reset_index(drop=True)
    details = {k: joined[f"details.{k}"] for k in local.details}
    return dataclasses.replace(local, df=df, details=details)


def _ranks() -> int:
    """Processes that share the batches of a torchrun launch (1 outside one, or when the ranks split one model)."""
    import torch

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    from .. import distributed

    return distributed.world_size() if distributed.data_parallel() else 1


def _check_setting(kind: str, name: str, value: Any, default: Any) -> None:
    """A kind's setting must have its default's type (an int may stand for a float; None defaults take anything)."""
    if default is None or value is None and default is None:
        return
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) if isinstance(default, float) else \
        isinstance(value, type(default))
    if not ok:
        raise ValueError(f"head kind {kind!r}: setting {name}={value!r} must be a {type(default).__name__} "
                         f"like its default {default!r}")
