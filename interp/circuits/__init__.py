"""Circuits: which edges between heads, MLPs, the embedding and the logits carry a task.

A :class:`~interp.circuits.graph.Graph` holds a model's nodes and edges; :mod:`~interp.circuits.patch` runs the
model with chosen edges patched; :mod:`~interp.circuits.scores` scores every edge (EAP, EAP-IG, exact patching);
:mod:`~interp.circuits.search` finds circuits (top-n, ACDC, Edge Pruning) as a
:class:`~interp.circuits.circuit.Circuit`; :mod:`~interp.circuits.evaluate` measures their faithfulness;
:func:`~interp.circuits.find.find_circuit` is one whole run (method, faithfulness, curve), as the CLI and the
dashboard do it.

The layer sits beside analysis: it imports core, data, trace, analysis and pruning (the Hard-Concrete gates);
only viz, the CLI and the app import it.
"""

from .circuit import Circuit
from .evaluate import ablation_source, circuit_metrics, faithfulness, faithfulness_curve, kind_overlap
from .find import CircuitRun, find_circuit
from .graph import Graph, build_graph, check_decomposable
from .patch import EdgePass, edge_pass, node_writes
from .scores import EdgeScores, eap, eap_ig, exact_scores, exact_scores_naive
from .search import acdc, edge_pruning, top_n

__all__ = ["Circuit", "CircuitRun", "EdgePass", "EdgeScores", "Graph", "ablation_source", "acdc", "build_graph",
           "check_decomposable", "circuit_metrics", "eap", "eap_ig", "edge_pass", "edge_pruning", "exact_scores",
           "exact_scores_naive", "faithfulness", "faithfulness_curve", "find_circuit", "kind_overlap", "node_writes",
           "top_n"]
