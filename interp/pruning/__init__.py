"""Head pruning: importance (Michel et al. 2019), L0 gates (Voita et al. 2019), a random baseline, pruning curves,
and ``remove_heads`` for a physically smaller model.

Example:
    >>> from interp.examples import model, batches
    >>> from interp.pruning import importance_curve, random_curve, LanguageModelObjective, remove_heads
    >>> obj = LanguageModelObjective()
    >>> imp = importance_curve(model, batches, obj, step=0.5)
    >>> imp.figure(random_curve(model, batches, obj, seeds=(0,), step=0.5)).show()
    >>> small = remove_heads(model, imp.points[1].mask)
"""

from ..interventions import head_mask
from .baseline import average_curves, random_curve
from .curve import CurvePoint, PruningCurve, auc_table, common_range
from .experiment import load_config, run_experiment, write_results
from .gates import LOUIZOS_TEMPERATURE, VOITA_TEMPERATURE, HardConcreteGate
from .importance import head_importance, importance_curve, masked_metric, prune_counts
from .l0 import L0Result, gated_metric, l0_curve, train_l0_gates
from .objectives import LanguageModelObjective, SentenceSimilarityObjective, mean_pool, sentence_batches, ud_sentences
from .surgery import heads_to_sets, kv_cache_savings, n_parameters, remove_heads
from .task import PruningTask, build_task

__all__ = [
    "CurvePoint", "HardConcreteGate", "L0Result", "LOUIZOS_TEMPERATURE", "LanguageModelObjective", "PruningCurve",
    "PruningTask", "SentenceSimilarityObjective", "VOITA_TEMPERATURE", "auc_table", "average_curves", "build_task",
    "common_range", "gated_metric", "head_importance",
    "head_mask", "heads_to_sets", "importance_curve", "kv_cache_savings", "l0_curve", "load_config",
    "masked_metric", "mean_pool", "n_parameters", "prune_counts", "random_curve", "remove_heads", "run_experiment",
    "sentence_batches", "train_l0_gates", "ud_sentences", "write_results",
]
