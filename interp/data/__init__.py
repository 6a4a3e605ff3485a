"""The data layer: token batches from tensors, texts, treebanks and repeated random sequences, and readers that
align annotations to tokens (:mod:`interp.data.coref`: CorefUD and GAP coreference).

It imports only the core (config, model) and is imported by :mod:`interp.trace`, :mod:`interp.analysis` and
:mod:`interp.pruning`.
"""

from .batches import (
                      Batch,
                      TreebankStats,
                      as_batch,
                      bucket_by_length,
                      check_length,
                      iter_batches,
                      pad,
                      sentences,
                      text_batches,
                      treebank_batches,
)
from .synthetic import (
                      first_occurrence_mask,
                      induction_training_batch,
                      random_tokens_for,
                      repeated_sequences,
                      repeated_tokens_for,
)
from .treebank import Sentence, align_words, parse_text_with_spacy, read_conllu

__all__ = [
    "Batch", "Sentence", "TreebankStats", "align_words", "as_batch", "bucket_by_length", "check_length",
    "first_occurrence_mask", "induction_training_batch", "iter_batches", "pad", "parse_text_with_spacy",
    "random_tokens_for", "read_conllu", "repeated_sequences", "repeated_tokens_for", "sentences", "text_batches",
    "treebank_batches",
]
