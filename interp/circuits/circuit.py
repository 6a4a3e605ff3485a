"""The :class:`Circuit` result type: the kept edges of a graph, their scores, save / load and comparison."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._io import atomic_write_text

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from .graph import Graph

__all__ = ["Circuit"]

_FORMAT = "interp.circuit/1"


@dataclass
class Circuit:
    """A set of edges of a model's graph that carries a task.

    Attributes:
        edges: ``(upstream, downstream)`` names (see :mod:`interp.circuits.graph`).
        scores: each edge's score (the method's: an EAP estimate, an exact patching effect, a gate's log-alpha).
        method: how it was found (``"eap"``, ``"eap-ig"``, ``"acdc"``, ``"edge-pruning"``, ``"random"``...).
        n_edges_total: the number of edges of the full graph.
        info: anything else (the model's name, the task, the metric of the full model...).

    Example:
        >>> from interp.circuits.circuit import Circuit
        >>> c = Circuit([("input", "a0.h0<v>"), ("a0.h0", "logits")], {("input", "a0.h0<v>"): -1.0,
        ...             ("a0.h0", "logits"): -2.0}, method="eap", n_edges_total=81)
        >>> c.nodes
        ['a0.h0', 'input', 'logits']
    """

    edges: list[tuple[str, str]]
    scores: dict[tuple[str, str], float] = field(default_factory=dict)
    method: str = ""
    n_edges_total: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.edges = [(str(u), str(d)) for u, d in self.edges]
        if len(set(self.edges)) != len(self.edges):
            raise ValueError(f"circuit lists an edge twice: {sorted(e for e in self.edges if self.edges.count(e) > 1)[0]}")

    def __len__(self) -> int:
        return len(self.edges)

    @property
    def nodes(self) -> list[str]:
        """Every node an edge touches (a downstream input counts as its node: ``"a1.h0<k>"`` is ``"a1.h0"``)."""
        return sorted({u for u, _ in self.edges} | {d.split("<")[0] for _, d in self.edges})

    @property
    def heads(self) -> set[tuple[int, int]]:
        """The heads ``(layer, head)`` among :attr:`nodes` (as writers or through a query, key or value input).

        Example:
            >>> from interp.circuits.circuit import Circuit
            >>> sorted(Circuit([("a0.h2", "a1.h1<k>"), ("input", "m0")]).heads)
            [(0, 2), (1, 1)]
        """
        return {(int(layer), int(head)) for n in self.nodes if n.startswith("a")
                for layer, head in [n[1:].split(".h")]}

    def check_nonempty(self) -> None:
        """Raise ValueError naming an empty circuit."""
        if not self.edges:
            raise ValueError(f"circuit (method={self.method!r}) is empty: 0 edges; a circuit needs at least one edge "
                             "(lower the threshold or raise n)")

    def mask(self, graph: Graph) -> torch.Tensor:
        """``[U, D]`` bool mask of the edges in ``graph``. Raises ValueError naming an edge that does not exist."""
        return graph.edge_mask(self.edges)

    def compare(self, other: Circuit) -> dict[str, float]:
        """Overlap with another circuit.

        Returns:
            ``edge_overlap`` and ``node_overlap`` (Jaccard: shared / either), ``shared_edges``, ``shared_nodes``.

        Example:
            >>> from interp.circuits.circuit import Circuit
            >>> a = Circuit([("input", "logits")]); b = Circuit([("input", "logits"), ("a0.h0", "logits")])
            >>> a.compare(b)["edge_overlap"]
            0.5
        """
        ea, eb = set(self.edges), set(other.edges)
        na, nb = set(self.nodes), set(other.nodes)
        return {"edge_overlap": len(ea & eb) / max(1, len(ea | eb)), "node_overlap": len(na & nb) / max(1, len(na | nb)),
                "shared_edges": float(len(ea & eb)), "shared_nodes": float(len(na & nb))}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"format": _FORMAT, "method": self.method, "n_edges_total": self.n_edges_total, "info": self.info,
                "edges": [[u, d, self.scores.get((u, d))] for u, d in self.edges]}

    def save(self, path: str | Path) -> Path:
        """Write the circuit as JSON (atomically: a crash leaves the old file or the new one).

        Example:
            >>> from interp.circuits.circuit import Circuit
            >>> from interp.examples import tmp
            >>> Circuit([("input", "logits")], method="eap").save(tmp / "c.json").name
            'c.json'
        """
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Circuit:
        """Read a circuit written by :meth:`save`.

        Raises:
            ValueError: a file that is not a saved circuit (naming the file and what is wrong).

        Example:
            >>> from interp.circuits.circuit import Circuit
            >>> from interp.examples import tmp
            >>> Circuit.load(Circuit([("input", "logits")]).save(tmp / "c.json")).edges
            [('input', 'logits')]
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a circuit file (invalid JSON: {e})") from e
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{path}: not a circuit file (format {found!r}, expected {_FORMAT!r})")
        edges, scores = [], {}
        for row in data["edges"]:
            if not (isinstance(row, list) and len(row) == 3):
                raise ValueError(f"{path}: an edge must be [upstream, downstream, score], got {row!r}")
            edges.append((row[0], row[1]))
            if row[2] is not None:
                scores[(row[0], row[1])] = float(row[2])
        return cls(edges, scores, method=data.get("method", ""), n_edges_total=int(data.get("n_edges_total", 0)),
                   info=data.get("info", {}))

    def figure(self, report: Any = None, **kwargs: Any) -> go.Figure:
        """A layered plotly graph of the edges (see :func:`interp.viz.circuits.circuit_figure`)."""
        from ..viz.circuits import circuit_figure

        return circuit_figure(self, report=report, **kwargs)
