"""Datasets turned into model inputs: readers that align annotations to tokens (coreference so far)."""
