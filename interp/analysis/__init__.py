"""Head analyzers: positional, induction-family, syntactic and coreference scores, and the taxonomy that names heads.

Example:
    >>> from interp.analysis import classify_heads
    >>> report = classify_heads(model)          # HeadReport: .df, .figure(), Jupyter table
"""

from .ablation import ablation_table, in_context_gain
from .coreference import coreference_scores
from .induction import induction_scores, repeated_tokens_for
from .positional import positional_scores
from .syntactic import syntactic_scores
from .taxonomy import HeadReport, classify_heads
from .toy import HAND_BUILT_KINDS, hand_built_model
from .treebank import Sentence, parse_text_with_spacy, read_conllu

__all__ = [
    "HAND_BUILT_KINDS", "HeadReport", "Sentence", "ablation_table", "classify_heads", "coreference_scores",
    "hand_built_model",
    "in_context_gain", "induction_scores", "parse_text_with_spacy", "positional_scores", "read_conllu",
    "repeated_tokens_for", "syntactic_scores",
]
