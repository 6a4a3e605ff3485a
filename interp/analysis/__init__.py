"""Head analyzers: positional, induction-family, syntactic and coreference scores, and the taxonomy that names heads.

Example:
    >>> from interp.analysis import classify_heads
    >>> report = classify_heads(model)          # HeadReport: .df, .figure(), Jupyter table
"""

from .ablate import ablate_heads, compare_with_random, head_z_means, random_head_sets
from .ablation import ablation_table, in_context_gain
gguf = ["gguf>=0.17"]
png = ["kaleido>=1.0"]  # static figure export (PNG/SVG/PDF); kaleido also needs Chrome/Chromium
dev = ["pytest>=8", "hypothesis>=6.100", "playwright>=1.40", "nbclient>=0.9", "nbformat>=5.9", "ipykernel>=6.25"]
all = ["interp[hf,tl,app,gguf,dev]"]
from .induction import induction_scores, repeated_tokens_for
from .patching import (activation_patching, attribution_patching, corrupt_repeats, in_context_metric,
                       logit_diff_metric, patch_heads_together)
from .positional import positional_scores
from .syntactic import syntactic_scores
from .taxonomy import HeadReport, classify_heads
from .toy import HAND_BUILT_KINDS, hand_built_model
from .treebank import Sentence, parse_text_with_spacy, read_conllu

__all__ = [
    "activation_patching", "attribution_patching", "composition_baseline", "composition_scores",
    "composition_table", "corrupt_repeats", "coreference_scores", "direct_logit_attribution", "in_context_metric",
    "logit_diff_metric", "patch_heads_together",
    "HAND_BUILT_KINDS", "HeadReport", "Sentence", "ablate_heads", "ablation_table", "compare_with_random",
    "head_z_means", "random_head_sets", "classify_heads", "hand_built_model",
    "in_context_gain", "induction_scores", "parse_text_with_spacy", "positional_scores", "read_conllu",
    "repeated_tokens_for", "syntactic_scores",
]
