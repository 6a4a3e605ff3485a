"""A model's config and weight sizes from its files' headers, for planning (``interp plan``): nothing is loaded.

A ``.gguf`` file gives its config and its tensor table (quantised blocks counted as stored, see
:func:`interp.zoo.gguf.stored_sizes`); a Hugging Face ``config.json`` (or a folder holding one) gives the config,
whose weights are then counted in the requested dtype on the meta device.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import ModelConfig


def model_sizes(path: str | Path, *, dtype: torch.dtype = torch.float32, keep_quantized: bool = True
                ) -> tuple[ModelConfig, tuple[int, list[int], int] | None, str]:
    """``(config, stored sizes or None, label)`` of the model at ``path``, from headers alone.

    Args:
        path: a ``.gguf`` file, a Hugging Face ``config.json``, or a folder holding one.
        dtype: the float weights' dtype.
        keep_quantized: a GGUF file's quantised matrices counted as their blocks (else as ``dtype`` floats).

    Returns:
        The interp config; ``(embedding bytes, [bytes per block], head bytes)`` for a GGUF file (None for a
        config, whose weights are all ``dtype``); what the weights are stored as.

    Raises:
        FileNotFoundError: nothing at ``path``, or a folder without ``config.json``.
        ValueError: a config or file interp cannot convert (the key and value named), or JSON that is not an
            object.

    Example:
        >>> from interp.zoo.sizes import model_sizes
        >>> import json, os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "config.json")
        >>> _ = open(p, "w").write(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        ...     "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128}))
        >>> cfg, sizes, label = model_sizes(p)
        >>> cfg.n_layers, sizes, label
        (2, None, 'float32')
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"no model config or GGUF file at {str(path)!r} (give a .gguf file, a config.json "
                                f"or a folder holding one)")
    if p.suffix == ".gguf":
        from .gguf import stored_sizes

        cfg, sizes, label = stored_sizes(p, dtype=dtype, keep_quantized=keep_quantized)
        return cfg, sizes, label
    try:
        hf_cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    if not isinstance(hf_cfg, dict):
        raise ValueError(f"{p}: a config.json holds a JSON object, got {type(hf_cfg).__name__}")
    from .hf import converter

    return converter(hf_cfg)[0](hf_cfg), None, str(dtype).removeprefix("torch.")


__all__ = ["model_sizes"]
