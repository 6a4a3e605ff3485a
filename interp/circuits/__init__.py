"""Circuits: which edges between heads, MLPs, the embedding and the logits carry a task.

A :class:`~interp.circuits.graph.Graph` holds a model's nodes and edges; :mod:`~interp.circuits.patch` runs the
model with chosen edges patched; :mod:`~interp.circuits.scores` scores every edge (EAP, EAP-IG, exact patching);
:mod:`~interp.circuits.search` finds circuits (top-n, ACDC, Edge Pruning) as a
:class:`~interp.circuits.circuit.Circuit`; :mod:`~interp.circuits.evaluate` measures their faithfulness.

The layer sits beside analysis: it imports core, data, trace, analysis and pruning (the Hard-Concrete gates);
only viz, the CLI and the app import it.
"""

from .graph import Graph, build_graph, check_decomposable
from .patch import EdgePass, edge_pass, node_writes

__all__ = ["EdgePass", "Graph", "build_graph", "check_decomposable", "edge_pass", "node_writes"]
