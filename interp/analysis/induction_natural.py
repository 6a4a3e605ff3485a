"""Induction heads scored on natural repeats too: ``[bos] x x`` with ``x`` a run of the given texts' tokens, beside
the random repeats of the ``induction`` kind, and the disagreement between the two.

Which heads are induction heads depends on the probe data: on SmolLM2 the strongest prefix matcher on random
repeats fails the copying gate there, while natural sentences give another set. This kind runs the same scorers
(:func:`~interp.analysis.induction.induction_reducers`, the same thresholds) on natural repeats built from
``texts`` (:func:`~interp.analysis.ablate.repeated_text_sequences`) and labels its heads ``induction:natural``;
``report.details["induction:disagreement"]`` lists every head that is an induction head on one probe and not on
the other, with both scores. Source: Olsson et al. 2022 (natural-text induction).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from ..streaming import Reducer
from .ablate import repeated_text_sequences
from .builtin_kinds import plain
from .induction import induction_reducers, induction_table
from .kinds import HeadKind, KindRun, register_kind


def _data(run: KindRun) -> torch.Tensor:
    model, texts = run.model, run["texts"]
    half = run["half_len"] or 20
    total = sum(len(model.to_tokens(t)[0]) for t in texts)  # an upper bound: special tokens are dropped later
    n = max(1, min(run["n_seqs"], total // half))
    while True:  # the special tokens dropped may leave a run short: one run fewer until it fits
        try:
            return repeated_text_sequences(model, texts, n, half)
        except ValueError:
            if n == 1:
                raise
            n -= 1


def _reducers(run: KindRun) -> list[Reducer]:
    return induction_reducers(run.model, definition=run["definition"], copying_rows=run["copying_rows"],
                              copying_comparisons=run["copying_comparisons"])


def _passes(r: Any, run: KindRun) -> bool:
    copies = r.copying != r.copying or r.copying >= run["copying_threshold"]  # NaN: no unembedding
    return bool(r.induction >= run["induction_threshold"] and copies)


def _rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    table = induction_table(run.model, reducers, run.passes["natural-repeats"])
    run.details["induction:natural"] = table
    rows = []
    for r in plain(table).itertuples():
        if _passes(r, run):
            copy_txt = "no unembedding" if r.copying != r.copying else f"copying score {r.copying:.2f}"
            rows.append({"layer": r.layer, "head": r.head, "kind": "induction:natural", "score": r.induction,
                         "evidence": f"prefix-matching attention {r.induction:.2f} on repeated natural text; "
                                     f"{copy_txt}"})
    random = run.details.get("induction")
    if random is not None:  # the disagreement with the random repeats (when the induction kind ran too)
        a, b = plain(random).set_index(["layer", "head"]), plain(table).set_index(["layer", "head"])
        diff = []
        for key in a.index:
            on_random, on_text = _passes(a.loc[key], run), _passes(b.loc[key], run)
            if on_random != on_text:
                diff.append({"layer": key[0], "head": key[1], "induction_random": a.loc[key, "induction"],
                             "copying_random": a.loc[key, "copying"], "induction_natural": b.loc[key, "induction"],
                             "copying_natural": b.loc[key, "copying"],
                             "induction_on": "random repeats" if on_random else "natural repeats"})
        run.details["induction:disagreement"] = pd.DataFrame(diff, columns=[
            "layer", "head", "induction_random", "copying_random", "induction_natural", "copying_natural",
            "induction_on"])
    run.probes["induction:natural"] = f"{len(run['texts'])} given texts, repeated once in runs of {run['half_len'] or 20}"
    return rows


register_kind(HeadKind(
    "induction:natural", ("induction:natural",), "natural-repeats", _reducers, _rows,
    threshold="induction_threshold=0.4, copying_threshold=0.7 (as induction)",
    reason="the induction kind's thresholds, on natural instead of random repeats",
    source="Olsson et al. 2022, In-context learning and induction heads", default=False, colour="#ff9896",
    data_builder=_data, needs=("texts",)))
