"""Head analyzers: positional, induction-family, syntactic and coreference scores, and the taxonomy that names heads.

Example:
    >>> from interp.examples import model
    >>> from interp.analysis import classify_heads
    >>> report = classify_heads(model)          # HeadReport: .df, .figure(), Jupyter table
"""

from ..data import Sentence, parse_text_with_spacy, read_conllu, repeated_tokens_for
from .ablate import ablate_heads, ablation_table, compare_with_random, head_z_means, in_context_gain, random_head_sets
from .attribution import direct_logit_attribution
from .composition import composition_baseline, composition_scores, composition_table
from .coreference import CorefReducer, coreference_scores
from .induction import CopyingReducer, InductionReducer, TLHeadDetectorReducer, induction_scores
from .patching import activation_patching, attribution_patching, corrupt_repeats, in_context_metric, logit_diff_metric, patch_heads_together
from .positional import PositionalReducer, positional_scores
from .syntactic import SyntacticReducer, syntactic_scores
from .taxonomy import HeadReport, classify_heads

__all__ = [
    "activation_patching", "attribution_patching", "composition_baseline", "composition_scores",
    "composition_table", "corrupt_repeats", "coreference_scores", "direct_logit_attribution", "in_context_metric",
    "logit_diff_metric", "patch_heads_together",
    "CopyingReducer", "CorefReducer", "HeadReport", "InductionReducer", "PositionalReducer",
    "Sentence", "SyntacticReducer", "TLHeadDetectorReducer", "ablate_heads", "ablation_table", "compare_with_random",
    "head_z_means", "random_head_sets", "classify_heads",
    "in_context_gain", "induction_scores", "parse_text_with_spacy", "positional_scores", "read_conllu",
    "repeated_tokens_for", "syntactic_scores",
]
