"""Head analyzers: positional, induction-family and syntactic scores, and the taxonomy that names heads.

Example:
    >>> from interp.analysis import classify_heads
    >>> report = classify_heads(model)          # HeadReport: .df, .figure(), Jupyter table
"""

from ..data import Sentence, parse_text_with_spacy, read_conllu, repeated_tokens_for
from .ablation import ablation_table, in_context_gain
from .induction import CopyingReducer, InductionReducer, TLHeadDetectorReducer, induction_scores
from .positional import PositionalReducer, positional_scores
from .syntactic import SyntacticReducer, syntactic_scores
from .taxonomy import HeadReport, classify_heads
from .toy import HAND_BUILT_KINDS, hand_built_model

__all__ = [
    "CopyingReducer", "HAND_BUILT_KINDS", "HeadReport", "InductionReducer", "PositionalReducer", "Sentence",
    "SyntacticReducer", "TLHeadDetectorReducer", "ablation_table", "classify_heads", "hand_built_model",
    "in_context_gain", "induction_scores", "parse_text_with_spacy", "positional_scores", "read_conllu",
    "repeated_tokens_for", "syntactic_scores",
]
