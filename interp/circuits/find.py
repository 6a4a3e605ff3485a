"""One circuit run, as the CLI's ``interp circuit`` and the dashboard's Circuits page both do it: score or search
with a method, measure the circuit's faithfulness, and its curve beside random circuits, all under the task's own
ablation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .circuit import Circuit
from .evaluate import faithfulness, faithfulness_curve
from .graph import build_graph
from .scores import eap, eap_ig
from .search import acdc, edge_pruning, top_n

if TYPE_CHECKING:
    import pandas as pd

    from ..model import Transformer
    from .tasks import CircuitTask

__all__ = ["CURVE_FRACTIONS", "METHODS", "CircuitRun", "find_circuit"]

#: The methods, by their CLI names.
METHODS = ("eap", "eap-ig", "acdc", "edge-pruning")
#: Fractions of all edges the curve is measured at (beside the circuit's own size).
CURVE_FRACTIONS = (0.01, 0.03, 0.1, 0.3, 1.0)


@dataclass
class CircuitRun:
    """What :func:`find_circuit` found.

    Attributes:
        circuit: the circuit (``info`` holds the task, the method's settings and the ablation).
        faithfulness: :func:`~interp.circuits.evaluate.faithfulness` of the circuit (empty for an empty one).
        curve: :func:`~interp.circuits.evaluate.faithfulness_curve` rows (the method beside random circuits).
        n_edges_total: the edges of the model's graph.
    """

    circuit: Circuit
    faithfulness: dict[str, Any]
    curve: pd.DataFrame
    n_edges_total: int


def find_circuit(model: Transformer, task: CircuitTask, method: str, *, n_keep: int, steps: int = 5,
                 threshold: float = 0.05, train_steps: int = 100, n_random: int = 20,
                 progress: bool | None = False) -> CircuitRun:
    """Find ``task``'s circuit with ``method`` and measure it, under the task's ablation (``task.ablation``).

    Args:
        model: the model.
        task: a :class:`~interp.circuits.tasks.CircuitTask` (:func:`~interp.circuits.tasks.circuit_task`, or your
            own clean / corrupted pair and metric).
        method: one of :data:`METHODS`.
        n_keep: edges to keep (EAP, EAP-IG: the top ``n_keep``; Edge Pruning: its target size); ACDC keeps what
            its threshold keeps.
        steps: EAP-IG's integration steps.
        threshold: ACDC's largest metric change of a removed edge.
        train_steps: Edge Pruning's gate training steps.
        n_random: random circuits per size on the curve.
        progress: progress bars (None: on in terminals and notebooks).

    Returns:
        A :class:`CircuitRun`.

    Raises:
        ValueError: an unknown method, ``n_keep`` outside ``[1, edges]`` (naming the model's edge count), or what
            the scores and searches refuse.

    Example:
        >>> import interp
        >>> from interp.circuits.find import find_circuit
        >>> from interp.circuits.tasks import circuit_task
        >>> model = interp.load("random-tiny")
        >>> run = find_circuit(model, circuit_task(model, "induction", n=8), "eap", n_keep=5, n_random=2)
        >>> len(run.circuit), sorted(run.curve.method.unique())
        (5, ['eap', 'random'])
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    c, x, m, ablation = task.clean, task.corrupted, task.metric, task.ablation
    graph = build_graph(model)
    if not 1 <= n_keep <= graph.n_edges:
        raise ValueError(f"n_keep={n_keep} must be in [1, {graph.n_edges}] (the edges of "
                         f"{getattr(model, 'name', 'the model')})")
    scores = None
    if method in ("eap", "eap-ig"):
        scores = (eap(model, c, x, m, graph=graph) if method == "eap"
                  else eap_ig(model, c, x, m, steps=steps, graph=graph, progress=progress))
        found = top_n(scores, n_keep)
    elif method == "acdc":
        found = acdc(model, c, x, m, threshold=threshold, graph=graph, progress=progress, ablation=ablation)
    else:
        found = edge_pruning(model, c, x, m, target=1 - n_keep / graph.n_edges, steps=train_steps, graph=graph,
                             progress=progress, ablation=ablation)
    found.info.update({"model": getattr(model, "name", "model"), "task": task.name, "ablation": ablation})
    faith = faithfulness(model, found, c, x, m, graph=graph, ablation=ablation) if len(found) else {}
    sizes = sorted({max(1, round(graph.n_edges * f)) for f in CURVE_FRACTIONS} | {len(found) or 1})
    extra = {method: {len(found): found}} if scores is None and len(found) else None
    curve = faithfulness_curve(model, [scores] if scores is not None else [], c, x, m, sizes=sizes,
                               n_random=n_random, extra=extra, progress=progress, ablation=ablation)
    return CircuitRun(found, faith, curve, graph.n_edges)
