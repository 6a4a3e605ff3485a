"""The registry entries of the kinds interp has long known: positional, previous-token, duplicate-token,
induction, syntactic and coreference (their scorers live in :mod:`.positional`, :mod:`.induction`,
:mod:`.syntactic` and :mod:`.coreference`; this module only says how each becomes report rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from ..streaming import Reducer
from .coreference import coref_dataset_of, coreference_kinds, coreference_scores
from .induction import induction_reducers, induction_table, induction_targets
from .kinds import HeadKind, KindRun, register_kind
from .per_sequence import PerSequenceMass
from .positional import PositionalReducer, offset_label
from .syntactic import SyntacticReducer


def plain(df: pd.DataFrame) -> pd.DataFrame:
    """A shallow copy of ``df`` without its ``attrs``, to read from: pandas deep-copies ``attrs`` into every frame
    and column derived from a frame (a syntactic table's attrs hold a record per relation)."""
    out = df.copy(deep=False)
    out.attrs = {}
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _signed(offset: Any) -> str:
    """A baseline offset as ``+1`` / ``-2``; a pooled relation's per-subtype offsets (a string) unchanged."""
    return f"{offset:+d}" if isinstance(offset, int) else str(offset)


# --- positional ---------------------------------------------------------------------------------------------
def _positional_reducers(run: KindRun) -> list[Reducer]:
    return [PositionalReducer(run.model, window=run["window"])]


def _positional_rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    pos = reducers[0].table()  # type: ignore[attr-defined]
    run.details["positional"] = pos
    window, threshold = run["window"], run["positional_threshold"]
    targets = [(offset_label(o), f"at offset {offset_label(o)}") for o in range(-window, window + 1)]
    targets += [(cat, f"on the {cat} token") for cat in ("first", "delimiter")]
    n_rows = pos.attrs["rows"]
    rows = []
    for r in plain(pos).to_dict("records"):
        for lab, where in targets:
            share = r[f"argmax_{lab}"]
            if share == share and share >= threshold:  # share != share: NaN, no valid rows
                rows.append({"layer": r["layer"], "head": r["head"], "kind": f"positional:{lab}", "score": share,
                             "evidence": f"argmax {where} in {_pct(share)} of {n_rows[lab]} queries; mean "
                                         f"weight there {r[f'mass_{lab}']:.2f}"})
    return rows


register_kind(HeadKind(
    "positional", ("positional:",), "text", _positional_reducers, _positional_rows,
    threshold="positional_threshold=0.9",
    reason="Voita et al.'s criterion: the argmax lands on the same relative offset (or the first token, or a "
           "delimiter) in at least 90 % of the queries",
    source="Voita et al. 2019, Analyzing multi-head self-attention"))


# --- the induction family (one pass over repeated sequences, shared reducers) -----------------------------------
def _induction_reducers(run: KindRun) -> list[Reducer]:
    reds = induction_reducers(run.model, definition=run["definition"], copying_rows=run["copying_rows"],
                              copying_comparisons=run["copying_comparisons"])
    if run["bootstrap"] and run["definition"] == "interp":  # per-sequence masses: the rows of the intervals
        causal = run.model.cfg.causal
        reds.append(PerSequenceMass(run.model, list(_FAMILY), lambda b, rows: induction_targets(
            b.tokens, b.mask, causal, rows)))
    return reds


_FAMILY = ("previous_token", "duplicate_token", "induction")


def _induction_table(run: KindRun, reducers: list[Reducer]) -> pd.DataFrame:
    if "induction" not in run.details:
        scorers = [r for r in reducers if not isinstance(r, PerSequenceMass)]
        run.details["induction"] = induction_table(run.model, scorers, run.passes["repeats"])
    return run.details["induction"]


def _family_rows(run: KindRun, reducers: list[Reducer], column: str, kind: str, threshold: float,
                 evidence: Callable[[Any], str], gate: Callable[[Any], bool] = lambda r: True) -> list[dict[str, Any]]:
    """One row per head whose ``column`` passes ``threshold`` (and ``gate``); with per-sequence masses, every
    gated head, with its samples, so that a head whose interval reaches the threshold is reported uncertain."""
    per_seq = next((r.values()[column] for r in reducers if isinstance(r, PerSequenceMass)), None)
    rows = []
    for r in plain(_induction_table(run, reducers)).itertuples():
        score = getattr(r, column)
        passed = score >= threshold
        if not gate(r) or not (passed or per_seq is not None):
            continue
        row = {"layer": r.layer, "head": r.head, "kind": kind, "score": score, "evidence": evidence(r),
               "passed": passed, "threshold": threshold}
        if per_seq is not None:
            row["samples"] = per_seq[:, r.layer, r.head]
        rows.append(row)
    return rows


def _previous_rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    return _family_rows(run, reducers, "previous_token", "previous-token", run["previous_token_threshold"],
                        lambda r: f"mean attention {r.previous_token:.2f} on the previous token")


def _duplicate_rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    return _family_rows(run, reducers, "duplicate_token", "duplicate-token", run["duplicate_token_threshold"],
                        lambda r: f"mean attention {r.duplicate_token:.2f} on earlier copies of the token")


def _induction_rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    def evidence(r: Any) -> str:
        copy_txt = "no unembedding" if math.isnan(r.copying) else f"copying score {r.copying:.2f}"
        return f"prefix-matching attention {r.induction:.2f} on repeated sequences; {copy_txt}"

    # The copying score is a gate, not the score: a head that does not copy is no induction head.
    return _family_rows(run, reducers, "induction", "induction", run["induction_threshold"], evidence,
                        gate=lambda r: math.isnan(r.copying) or r.copying >= run["copying_threshold"])


_OLSSON = "Olsson et al. 2022, In-context learning and induction heads"
register_kind(HeadKind(
    "previous-token", ("previous-token",), "repeats", _induction_reducers, _previous_rows,
    threshold="previous_token_threshold=0.5",
    reason="more than half the attention on q - 1: the previous token is the head's main target", source=_OLSSON))
register_kind(HeadKind(
    "duplicate-token", ("duplicate-token",), "repeats", _induction_reducers, _duplicate_rows,
    threshold="duplicate_token_threshold=0.5",
    reason="more than half the attention on earlier copies of the current token",
    source="Wang et al. 2022, Interpretability in the wild (IOI)"))
register_kind(HeadKind(
    "induction", ("induction",), "repeats", _induction_reducers, _induction_rows,
    threshold="induction_threshold=0.4, copying_threshold=0.7",
    reason="0.4 prefix-matching mass is well above any non-induction head on random repeats (uniform attention "
           "over T keys puts ~1/T there); a copying score of 0.7 means the attended token outranks 70 % of the "
           "vocabulary in the head's direct logits (chance: 0.5)", source=_OLSSON))


# --- syntactic (the treebank's pass) -----------------------------------------------------------------------
def _syntactic_reducers(run: KindRun) -> list[Reducer]:
    return [SyntacticReducer(run.model)]


def _syntactic_rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    stats = run.passes["treebank_stats"]
    syn = reducers[0].table(n_skipped=stats.skipped, n_untokenized=stats.untokenized)  # type: ignore[attr-defined]
    run.details["syntactic"] = syn
    table = plain(syn)
    good = table[(table.gain >= run["syntactic_margin"]) & (table.n >= run["syntactic_min_count"])]
    # One row per (head, relation): the direction with the larger gain; a tie goes to the table's first (a stable
    # sort: the choice depends on the head's own rows, not on the other rows of the table).
    good = good.sort_values("gain", ascending=False, kind="stable").drop_duplicates(["layer", "head", "relation"])
    return [{"layer": r.layer, "head": r.head, "kind": f"syntactic:{r.relation}", "score": r.accuracy,
             "evidence": f"{r.direction} accuracy {r.accuracy:.2f} vs offset {_signed(r.baseline_offset)} "
                         f"baseline {r.baseline_accuracy:.2f} (+{r.gain:.2f}, n={r.n})"}
            for r in good.itertuples()]


register_kind(HeadKind(
    "syntactic", ("syntactic:",), "treebank", _syntactic_reducers, _syntactic_rows,
    threshold="syntactic_margin=0.1, syntactic_min_count=100",
    reason="the head must beat the best fixed-offset baseline of the relation by 10 points, on at least 100 arcs "
           "(a fixed offset already explains most short dependencies)",
    source="Clark et al. 2019, What does BERT look at?"))


# --- coreference (its own pass per data set) -----------------------------------------------------------------
def _coreference_rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    coref = run["coref"]
    sources = coref if isinstance(coref, dict) else {
        coref_dataset_of(c): c for c in (coref if isinstance(coref, (list, tuple)) else [coref])}
    rows: list[dict[str, Any]] = []
    for name, src in sources.items():
        cor = coreference_scores(run.model, src, batch_size=max(1, run["batch_size"] // 4), progress=run.show)
        run.details[f"coreference:{name}"] = cor
        rows += coreference_kinds(cor, name, margin=run["coref_margin"], min_count=run["coref_min_count"])
    run.probes["coreference"] = f"coreference data {sorted(sources)}"
    return rows


register_kind(HeadKind(
    "coreference", ("coreference:",), "coref", None, _coreference_rows,
    threshold="coref_margin=0.1, coref_min_count=50",
    reason="mention->antecedent accuracy must beat the best simple baseline (nearest, head/string match, random) "
           "by 10 points on at least 50 mentions",
    source="Clark et al. 2019; Webster et al. 2018 (GAP)"))
