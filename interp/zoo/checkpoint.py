"""Local checkpoints: a strict weight loader and a self-describing safetensors format.

A checkpoint is one ``.safetensors`` file holding the model's weights; its metadata header carries the
:class:`~interp.config.ModelConfig` as JSON (and, when the model has one, its tokenizer as JSON), so
:func:`load_checkpoint` needs nothing but the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..config import ModelConfig
from ..model import Transformer

CHECKPOINT_FORMAT = "interp.model/1"


def _aliases(model: nn.Module) -> dict[str, str]:
    """Keys of ``model.state_dict()`` that share storage with an earlier key (tied weights) -> that key."""
    first: dict[tuple[int, tuple[int, ...]], str] = {}
    alias: dict[str, str] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        ident = (t.data_ptr(), tuple(t.shape))
        if t.numel() and ident in first:
            alias[key] = first[ident]
        else:
            first.setdefault(ident, key)
    return alias


def load_state_dict_strict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *,
                           source: str = "checkpoint") -> nn.Module:
    """Copy ``state_dict`` into ``model``, refusing any mismatch with a message that names it.

    Unlike ``nn.Module.load_state_dict`` the error lists every missing and unexpected key together with
    every shape mismatch (tensor name and both shapes), and a tied weight (``W_U.weight`` when it is
    ``W_E.weight``) may be absent. Values are cast to the dtype of the model's parameter.

    Args:
        model: the module to fill (in place).
        state_dict: name -> tensor, with the names of ``model.state_dict()``.
        source: what the weights came from, quoted in errors (a file path, "Hugging Face BertModel" ...).

    Returns:
        ``model`` (for chaining).

    Raises:
        TypeError: ``state_dict`` is not a mapping of tensors.
        ValueError: missing keys, unexpected keys, or shape mismatches; all of them are listed.

    Example:
        >>> model = Transformer(cfg)
        >>> load_state_dict_strict(model, torch.load("weights.pt"), source="weights.pt")
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of name -> Tensor, got {type(state_dict).__name__}")
    bad_types = [k for k, v in state_dict.items() if not isinstance(v, torch.Tensor)]
    if bad_types:
        raise TypeError(f"{source}: entries {bad_types[:5]} are not tensors")
    own = model.state_dict()
    aliases = _aliases(model)
    missing = [k for k in own if k not in state_dict and k not in aliases]
    unexpected = [k for k in state_dict if k not in own]
    shapes = [f"{k}: {source} has {tuple(state_dict[k].shape)}, model expects {tuple(own[k].shape)}"
              for k in own if k in state_dict and tuple(state_dict[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            parts.append("shape mismatch: " + "; ".join(shapes))
        if missing:
            parts.append(f"missing keys: {missing}")
        if unexpected:
            parts.append(f"unexpected keys: {unexpected}")
        raise ValueError(f"{source} does not fit the model: " + " | ".join(parts))
    with torch.no_grad():
        for key, target in own.items():
            if key in state_dict:
                target.copy_(state_dict[key].to(dtype=target.dtype, device=target.device))
            # A tied key that is absent keeps the value copied into the weight it is tied to.
    return model


def save_checkpoint(model: Transformer, path: str | Path, *, metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``model`` to a ``.safetensors`` file that :func:`load_checkpoint` (and ``interp.load``) reads.

    The header stores the config as JSON, the model name and, when ``model.tokenizer`` is an
    :class:`interp.zoo.tokenizer.Tokenizer`, the tokenizer as JSON. Tied weights are stored once.

    Args:
        model: an :class:`interp.Transformer`.
        path: file to write (parent folders are created).
        metadata: extra string -> string entries for the header (training settings, ...).

    Returns:
        The path written.

    Raises:
        TypeError: ``model`` is not a Transformer, or metadata values are not strings.
        ValueError: ``metadata`` uses a reserved key.

    Example:
        >>> save_checkpoint(model, "ckpt/induction.safetensors", metadata={"steps": "2000"})
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"save_checkpoint takes an interp.Transformer, got {type(model).__name__}")
    header: dict[str, str] = {"format": CHECKPOINT_FORMAT, "config": model.cfg.to_json(), "name": model.name}
    tok = getattr(model, "tokenizer", None)
    if tok is not None and hasattr(tok, "to_json"):
        header["tokenizer"] = tok.to_json()
    for k, v in (metadata or {}).items():
        if k in header or k == "tokenizer":
            raise ValueError(f"metadata key {k!r} is reserved (reserved: format, config, name, tokenizer)")
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str -> str, got {k!r}: {type(v).__name__}")
        header[k] = v
    aliases = _aliases(model)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in aliases}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=header)
    return path


def read_checkpoint_metadata(path: str | Path) -> dict[str, str]:
    """The header metadata of a checkpoint (config JSON, name, ...), without reading the weights.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a readable safetensors file or not an interp checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {str(path)!r}")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{str(path)!r} is not a readable safetensors file: {e}") from e
    if header.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not an interp checkpoint (format={header.get('format')!r}, "
                         f"expected {CHECKPOINT_FORMAT!r}); write one with interp.zoo.save_checkpoint")
    return header


def load_checkpoint(path: str | Path, *, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> Transformer:
    """Load a model written by :func:`save_checkpoint`.

    Args:
        path: the ``.safetensors`` file.
        device: where to put the model (default CPU).
        dtype: cast parameters to this dtype (default: as stored).

    Returns:
        The :class:`interp.Transformer` in eval mode, with ``name`` and (when stored) ``tokenizer`` set.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not an interp checkpoint, a bad config, or weights that do not fit the config (the
            message names the tensor and both shapes).

    Example:
        >>> model = load_checkpoint("ckpt/induction.safetensors")
    """
    header = read_checkpoint_metadata(path)
    cfg = ModelConfig.from_dict(json.loads(header["config"]))
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    model = Transformer(cfg)
    load_state_dict_strict(model, tensors, source=str(path))
    model.name = header.get("name", Path(path).stem)
    if "tokenizer" in header:
        from .tokenizer import Tokenizer

        model.tokenizer = Tokenizer.from_json(header["tokenizer"])
    model.checkpoint_metadata = {k: v for k, v in header.items() if k not in ("config", "tokenizer")}
    if dtype is not None:
        model.to(dtype=dtype)
    if device is not None:
        model.to(device)
    return model.eval()

