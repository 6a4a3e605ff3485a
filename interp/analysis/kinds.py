"""The head-kind registry: every kind :func:`~interp.analysis.classify_heads` can report is one :class:`HeadKind`.

A kind says which data it needs (one of :data:`DATA`), how to build the reducers that fold that data's streamed
pass (kinds fed by the same pass share it; kinds that share a reducer factory share its reducers), how to turn
the folded state into report rows, and its threshold with the reason for it. Adding a kind is one module that
calls :func:`register_kind`; the report, the figure legend (:func:`interp.viz.head_map`) and ``interp heads
--kinds`` read this registry.

Example:
    >>> from interp.analysis.kinds import head_kinds
    >>> sorted(head_kinds())[:3]
    ['copy-suppression', 'coreference', 'duplicate-token']
    >>> head_kinds()["induction"].data
    'repeats'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd
import torch

from ..streaming import Reducer

if TYPE_CHECKING:
    from ..model import Transformer

T = TypeVar("T")

__all__ = ["BUILTIN_DATA", "DATA", "HeadKind", "KindRun", "head_kinds", "kind_of_label", "register_kind", "resolve_kinds",
           "sampled_rows"]

#: The data a kind can be measured on: each is one streamed pass (or none, for weight circuits).
DATA = {
    "text": "the text pass: tokens / texts / the treebank's sentences / uniform random tokens",
    "repeats": "repeated sequences [bos] x x (random tokens unless induction_tokens is given)",
    "treebank": "the sentences of a CoNLL-U treebank (conllu=)",
    "coref": "coreference data (coref=): GAP / CorefUD",
    "weights": "the weights alone (OV / QK circuits), no forward pass over data",
    "needles": "generated needle-in-a-haystack prompts (interp.data.needle)",
    "natural-repeats": "the given texts repeated once, [bos] x x (texts=)",
    "icl": "few-shot in-context-learning prompts and their shuffled-label versions (interp.data.icl)",
    "ioi": "indirect-object identification prompts (interp.data.circuit_tasks.ioi_prompts)",
}
#: The data classify_heads itself knows how to stream; any other data name is built by its kinds' data_builder.
BUILTIN_DATA = ("text", "repeats", "treebank", "coref", "weights")


@dataclass
class KindRun:
    """What a kind's reducer factory and row builder read during one :func:`classify_heads` call.

    Attributes:
        model: the model being classified.
        options: every keyword of :func:`classify_heads` (thresholds, data, sizes), by name.
        show: progress bars on.
        details: the raw score tables computed so far (a kind adds its own under its name).
        probes: ``{kind name: the probe data it was measured on}`` (a kind may refine its entry).
        passes: per data name, what its pass returned (for example the number of sequences streamed).
    """

    model: Transformer
    options: dict[str, Any]
    show: bool = False
    details: dict[str, pd.DataFrame] = field(default_factory=dict)
    probes: dict[str, str] = field(default_factory=dict)
    passes: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.options[name]

    def given(self, name: str, kind: type[T], builder: str) -> T | None:
        """The option ``name`` if the user gave it (None if not), refused unless it is a ``kind``.

        Args:
            name: the option (``"ioi_prompts"``).
            kind: the type it must have.
            builder: what builds one, for the error.

        Returns:
            The given value, or None.

        Raises:
            ValueError: a value of another type, naming the option, its type and ``builder``.

        Example:
            >>> from interp.analysis.kinds import KindRun
            >>> from interp.data.icl import ICLPrompts
            >>> from interp.examples import model
            >>> run = KindRun(model, {"icl_prompts": None, "ioi_prompts": [1, 2]})
            >>> run.given("icl_prompts", ICLPrompts, "interp.data.icl.icl_prompts") is None
            True
            >>> run.given("ioi_prompts", ICLPrompts, "interp.data.icl.icl_prompts")
            Traceback (most recent call last):
            ValueError: ioi_prompts=list: give an interp.data.icl.ICLPrompts (interp.data.icl.icl_prompts builds one)
        """
        value = self.options[name]
        if value is not None and not isinstance(value, kind):  # interp's own types: "an interp..."
            raise ValueError(f"{name}={type(value).__name__}: give an {kind.__module__}.{kind.__qualname__} "
                             f"({builder} builds one)")
        return value


ReducerFactory = Callable[[KindRun], list[Reducer]]
RowBuilder = Callable[[KindRun, list[Reducer]], list[dict[str, Any]]]


@dataclass(frozen=True)
class HeadKind:
    """One kind of head: its data, its streamed pieces, its rows and its threshold.

    Attributes:
        name: the registry key (``classify_heads(kinds=[name])``).
        labels: the ``kind`` values its report rows carry; one ending in ``":"`` is a family prefix
            (``"positional:"`` covers ``positional:-1``, ``positional:first``...).
        data: one of :data:`DATA`.
        reducers: ``factory(run) -> [Reducer]`` for the pass of ``data`` (None: the kind reads no pass, or runs
            its own, as coreference does). Kinds whose factory is the same function share its reducers.
        rows: ``rows(run, reducers) -> [{"layer", "head", "kind", "score", "evidence", ...}]``.
        threshold: the default threshold, as text (the keyword of :func:`classify_heads` that sets it).
        reason: why that threshold.
        source: the paper the score comes from.
        default: run when ``kinds`` is not given (new kinds are opt-in so that a default report stays what
            it was).
        colour: the kind's fixed colour in :func:`interp.viz.head_map` (None: the next free colour).
        defaults: the settings the kind reads beyond :func:`classify_heads`' keywords, with their defaults
            (override them with ``classify_heads(options={...})``).
        supersedes: labels of other kinds this one replaces on a head it finds (a sink head's
            ``positional:first`` row says less than its ``sink`` row, and is dropped).
        data_builder: ``builder(run) -> batches`` for data that :func:`classify_heads` does not stream itself
            (not in :data:`BUILTIN_DATA`); kinds of the same data share the first one's batches and one pass.
        needs: keywords of :func:`classify_heads` that must be given (not None) for the kind to run: it is
            skipped without them by default and refused when asked for by name.
    """

    name: str
    labels: tuple[str, ...]
    data: str
    reducers: ReducerFactory | None
    rows: RowBuilder
    threshold: str
    reason: str
    source: str
    default: bool = True
    colour: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    supersedes: tuple[str, ...] = ()
    data_builder: Callable[[KindRun], Any] | None = None
    needs: tuple[str, ...] = ()


_REGISTRY: dict[str, HeadKind] = {}


def sampled_rows(kind: str, samples: torch.Tensor, layer_heads: Iterable[int], threshold: float,
                 evidence: Callable[[torch.Tensor, float], str]) -> list[dict[str, Any]]:
    """One report row per head of a kind scored as the mean of per-item samples (the bootstrap interval's rows).

    Args:
        kind: the label of the rows.
        samples: ``[L, H_max, n]`` one value per item and head.
        layer_heads: each layer's head count (a pruned model's differ).
        threshold: a head passes when its mean is at least this.
        evidence: ``(the head's samples [n], its mean) -> the words of the report``.

    Returns:
        Rows with ``layer, head, kind, score, evidence, samples, threshold, passed``; none for a head whose
        samples are all NaN (a layer another pipeline rank holds and scores: no evidence to word, and such a row
        could never pass).

    Example:
        >>> import torch
        >>> from interp.analysis.kinds import sampled_rows
        >>> rows = sampled_rows("demo", torch.tensor([[[1.0, 0.0], [1.0, 1.0]]]), [2], 0.9, lambda s, m: f"{m:.1f}")
        >>> [(r["head"], r["score"], r["passed"]) for r in rows]
        [(0, 0.5, False), (1, 1.0, True)]
    """
    rows = []
    for layer, n_heads in enumerate(layer_heads):
        for head in range(n_heads):
            s = samples[layer, head]
            if len(s) and bool(s.isnan().all()):
                continue
            score = float(s.mean())
            rows.append({"layer": layer, "head": head, "kind": kind, "score": score, "evidence": evidence(s, score),
                         "samples": s, "threshold": threshold, "passed": score >= threshold})
    return rows


def not_measured(run: KindRun, kind: str, why: str) -> list[dict[str, Any]]:
    """No rows for ``kind``: its probe entry says ``"not measured: <why>"`` so that the report tells a kind that
    could not run from one that found no head.

    Args:
        run: the classification run.
        kind: the kind's name.
        why: what is missing (``"the model has no unembedding"``).

    Returns:
        ``[]``, the kind's rows.

    Example:
        >>> from interp.analysis.kinds import KindRun, not_measured
        >>> from interp.examples import model
        >>> run = KindRun(model, {})
        >>> not_measured(run, "name-mover", "no text tokenizer and no ioi_prompts"), run.probes["name-mover"]
        ([], 'not measured: no text tokenizer and no ioi_prompts')
    """
    run.probes[kind] = f"not measured: {why}"
    return []


def register_kind(kind: HeadKind) -> HeadKind:
    """Add ``kind`` to the registry (re-registering the same object is a no-op).

    Args:
        kind: the new kind.

    Returns:
        ``kind``.

    Raises:
        ValueError: another kind already has that name, or its ``data`` is not one of :data:`DATA`.

    Example:
        >>> from interp.analysis.kinds import head_kinds, register_kind
        >>> k = head_kinds()["induction"]
        >>> register_kind(k) is k
        True
    """
    if kind.data not in DATA:
        raise ValueError(f"head kind {kind.name!r}: data={kind.data!r} is not one of {sorted(DATA)}")
    if kind.data not in BUILTIN_DATA and kind.data_builder is None:
        raise ValueError(f"head kind {kind.name!r}: data={kind.data!r} needs a data_builder")
    old = _REGISTRY.get(kind.name)
    if old is not None and old is not kind:
        raise ValueError(f"a head kind named {kind.name!r} is already registered (source: {old.source})")
    _REGISTRY[kind.name] = kind
    return kind


def head_kinds() -> dict[str, HeadKind]:
    """Every registered kind, by name, in registration order (a copy).

    Returns:
        ``{name: HeadKind}``.

    Example:
        >>> from interp.analysis.kinds import head_kinds
        >>> "sink" in head_kinds()
        True
    """
    _load_builtin()
    return dict(_REGISTRY)


def resolve_kinds(names: str | Iterable[str] | None) -> list[HeadKind]:
    """The kinds to run, in registration order.

    Args:
        names: None (the default kinds), ``"all"``, one name, or a list of names.

    Returns:
        The selected kinds (a list of names: in its order; otherwise in registration order).

    Raises:
        ValueError: a name that is not registered (the message names it and lists the known ones), or an
            empty selection.

    Example:
        >>> from interp.analysis.kinds import resolve_kinds
        >>> [k.name for k in resolve_kinds(["induction", "sink"])]
        ['induction', 'sink']
    """
    known = head_kinds()
    if names is None:
        return [k for k in known.values() if k.default]
    if names == "all":
        return list(known.values())
    wanted = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown head kind(s) {unknown}; the known kinds are {list(known)}")
    if not wanted:
        raise ValueError("kinds=[] selects no head kind; pass None for the default kinds")
    return [known[n] for n in dict.fromkeys(wanted)]


def kind_of_label(label: str) -> HeadKind | None:
    """The registered kind a report row's ``kind`` label belongs to (None for a label no kind writes).

    Example:
        >>> from interp.analysis.kinds import kind_of_label
        >>> kind_of_label("positional:-1").name
        'positional'
    """
    for k in head_kinds().values():
        for lab in k.labels:
            if label == lab or (lab.endswith(":") and label.startswith(lab)):
                return k
    return None


def _load_builtin() -> None:
    """Import the modules that register the kinds shipped with interp (deferred: they import this module)."""
    from . import builtin_kinds, copy_suppression, function_vector, induction_natural, name_mover, retrieval, sink, successor  # noqa: F401
