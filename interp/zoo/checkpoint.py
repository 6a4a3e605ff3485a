"""Local checkpoints: a strict weight loader and a self-describing safetensors format.

A checkpoint is one ``.safetensors`` file holding the model's weights; its metadata header carries the
:class:`~interp.config.ModelConfig` as JSON (and, when the model has one, its tokenizer as JSON), so
:func:`load_checkpoint` needs nothing but the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from .._io import atomic_path, check_tensor_record, tensor_record, write_safetensors
from ..config import ModelConfig
from ..model import Transformer
from ..moe import float32_names
from ..placement import build, check_dtype
from ..quantized import refuse_quantized

CHECKPOINT_FORMAT = "interp.model/1"
# Header entry with each tensor's dtype, shape and sha256 (interp._io.tensor_record): a checkpoint damaged
# on disk is refused by name instead of loading with garbage weights. Older checkpoints load unchecked.
INTEGRITY_KEY = "tensor_record"
_RESERVED = ("format", "config", "name", "tokenizer", INTEGRITY_KEY)
_BLOCK_RX = re.compile(r"^blocks\.(\d+)\.")


def _config_from_header(header: Mapping[str, str], where: str) -> ModelConfig:
    """The ModelConfig stored in a checkpoint header, with errors that name the file."""
    if "config" not in header:
        raise ValueError(f"{where} is an interp checkpoint without a 'config' entry in its header")
    try:
        data = json.loads(header["config"])
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: the stored config is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{where}: the stored config must be a JSON object of ModelConfig fields, "
                         f"got a JSON {type(data).__name__}")
    try:
        return ModelConfig.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: invalid config: {e}") from e


def _aliases(model: nn.Module) -> dict[str, str]:
    """Keys of ``model.state_dict()`` that share storage with an earlier key (tied weights) -> that key."""
    first: dict[tuple[int, tuple[int, ...]], str] = {}
    alias: dict[str, str] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        # Meta tensors (a model built only to check shapes) have no storage: tied ones are the same object.
        ident = (id(t) if t.is_meta else t.data_ptr(), tuple(t.shape))
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
        >>> from interp import Transformer
        >>> from interp.zoo.checkpoint import load_state_dict_strict
        >>> from interp.examples import model
        >>> fresh = Transformer(model.cfg)
        >>> load_state_dict_strict(fresh, model.state_dict(), source="weights.pt")
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of name -> Tensor, got {type(state_dict).__name__}")
    bad_types = [k for k, v in state_dict.items() if not isinstance(v, torch.Tensor)]
    if bad_types:
        raise TypeError(f"{source}: entries {bad_types[:5]} are not tensors")
    own = model.state_dict()
    check_fits(model, {k: tuple(v.shape) for k, v in state_dict.items()}, source=source)
    with torch.no_grad():
        for key, target in own.items():
            if key in state_dict:
                target.copy_(state_dict[key].to(dtype=target.dtype, device=target.device))
            # A tied key that is absent keeps the value copied into the weight it is tied to.
    return model


def check_fits(model: nn.Module, shapes: Mapping[str, tuple[int, ...]], *, source: str = "checkpoint") -> None:
    """Check that tensors of these ``shapes`` fill ``model`` exactly (it may live on the meta device).

    Args:
        model: the module the tensors are meant for.
        shapes: tensor name -> shape.
        source: what the tensors came from, quoted in errors.

    Raises:
        ValueError: missing keys, unexpected keys, or shape mismatches; all of them are listed.

    Example:
        >>> from interp.zoo.checkpoint import check_fits
        >>> from interp.examples import model
        >>> check_fits(model, {k: tuple(v.shape) for k, v in model.state_dict().items()}, source="weights.pt")
    """
    own = model.state_dict()
    aliases = _aliases(model)
    missing = [k for k in own if k not in shapes and k not in aliases]
    unexpected = [k for k in shapes if k not in own]
    mismatched = [f"{k}: {source} has {tuple(shapes[k])}, model expects {tuple(own[k].shape)}"
                  for k in own if k in shapes and tuple(shapes[k]) != tuple(own[k].shape)]
    if missing or unexpected or mismatched:
        parts = []
        if mismatched:
            parts.append("shape mismatch: " + "; ".join(mismatched))
        if missing:
            parts.append(f"missing keys: {missing}")
        if unexpected:
            parts.append(f"unexpected keys: {unexpected}")
        raise ValueError(f"{source} does not fit the model: " + " | ".join(parts))


def check_finite(tensor: torch.Tensor, name: str, source: str) -> None:
    """Refuse a weight holding NaN or infinite values, naming it and the count: the one non-finite-weight policy
    of every converting loader (Hugging Face models and folders, GGUF files).

    Args:
        tensor: the weight as read (a floating tensor).
        name: its name in the source, quoted in the error.
        source: the file or model it came from.

    Raises:
        ValueError: the tensor holds NaN or infinite values.

    Example:
        >>> import torch
        >>> from interp.zoo.checkpoint import check_finite
        >>> check_finite(torch.tensor([1.0, float("nan"), float("inf")]), "model.norm.weight", "my-folder")
        Traceback (most recent call last):
        ...
        ValueError: my-folder: tensor 'model.norm.weight' holds 2 NaN or infinite value(s) of 3 (torch.float32); the weights are corrupt
    """
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return
    # Fast path: NaN and inf propagate through a sum (inf - inf is NaN), so a finite sum means every value is
    # finite; only a non-finite sum (a bad value, or a float16 overflow) pays for the exact check. A sum in the
    # tensor's own dtype allocates nothing (torch.isfinite on bf16 makes a bool copy and runs at ~60 M values/s
    # on one core: 10 s for a 1.2 GB model).
    if bool(torch.isfinite(tensor.sum())):
        return
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise ValueError(f"{source}: tensor {name!r} holds {bad} NaN or infinite value(s) of {tensor.numel()} "
                         f"({tensor.dtype}); the weights are corrupt")


def assign_weights(model: nn.Module, weights: Mapping[str, torch.Tensor], *, dtype: torch.dtype,
                   device: torch.device | str, source: str, copy: bool = False, check: bool = True) -> nn.Module:
    """Make ``weights`` the parameters of ``model`` (built with them on the meta device), each tensor once.

    The tensors are moved to ``dtype`` on ``device`` (no copy when they already are, unless ``copy``) and
    assigned, not copied into a second set of weights: a conversion peaks at the weights plus what it
    concatenates, not twice the weights. Tied parameters are tied again to the one loaded.

    Args:
        model: a module whose parameters are on the meta device (``build(cfg, meta_weights=True)``).
        weights: name -> tensor, checked against ``model`` with :func:`check_fits`.
        dtype: the parameters' dtype.
        device: where they go.
        source: named in errors.
        copy: copy every tensor even when it already has the dtype and device (the weights belong to someone
            else, a Hugging Face model object, and must not share storage with ours).
        check: run :func:`check_fits` first (False: the caller checked the whole model before it put modules of
            its own in, as a GGUF file that keeps quantised blocks does).

    Returns:
        ``model``.

    Raises:
        ValueError: the weights do not fit (:func:`check_fits`), or a parameter got no weight.

    Example:
        >>> import torch
        >>> from interp.zoo.checkpoint import assign_weights
        >>> from interp.examples import model
        >>> from interp.placement import build
        >>> fresh = assign_weights(build(model.cfg, meta_weights=True), model.state_dict(), dtype=torch.float32,
        ...                        device="cpu", source="a copy", copy=True)
    """
    if check:
        check_fits(model, {k: tuple(v.shape) for k, v in weights.items()}, source=source)
    shared: dict[int, list[str]] = {}
    for key, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(key)
    own = model.state_dict(keep_vars=True)
    kept = float32_names(model)  # a router the family's precision policy keeps in float32
    placed = {}
    for key, t in weights.items():
        target = own[key]
        # integer buffers keep their own dtype, and the float32 ones the policy keeps
        want = dtype if target.is_floating_point() and key not in kept else target.dtype
        t = t.to(device=device, dtype=want, copy=copy).contiguous()
        if t.data_ptr() % _ALIGN:
            # A tensor cut from a shared buffer (safetensors' get_tensor) may start anywhere; kernels pick other
            # code paths for unaligned data, and the same weights would give logits a rounding apart.
            t = t.clone()
        placed[key] = t
    model.load_state_dict(placed, strict=False, assign=True)
    modules = dict(model.named_modules())  # by name: a model's W_E / W_U attributes may be views
    for keys in shared.values():  # assignment unties tied weights: tie them again to the loaded one
        loaded = next((k for k in keys if k in placed), None)
        for key in keys:
            if loaded is not None and key != loaded:
                owner, attr = key.rsplit(".", 1) if "." in key else ("", key)
                src_owner, src_attr = loaded.rsplit(".", 1) if "." in loaded else ("", loaded)
                setattr(modules[owner], attr, getattr(modules[src_owner], src_attr))
    left = [k for k, p in model.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"{source}: no weights for {left[:8]}")
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
        ValueError: ``metadata`` uses a reserved key, or ``model`` keeps quantised weights (a GGUF loaded with
            ``keep_quantized=True``): the checkpoint format holds float tensors, so the blocks are refused by name
            rather than written as bytes no loader would read back.

    Example:
        >>> from interp.zoo.checkpoint import save_checkpoint
        >>> from interp.examples import model, tmp
        >>> save_checkpoint(model, tmp / "ckpt" / "induction.safetensors", metadata={"steps": "2000"})
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"save_checkpoint takes an interp.Transformer, got {type(model).__name__}")
    refuse_quantized(model, "save_checkpoint")
    header: dict[str, str] = {"format": CHECKPOINT_FORMAT, "config": model.cfg.to_json(), "name": model.name}
    tok = getattr(model, "tokenizer", None)
    if tok is not None and hasattr(tok, "to_json"):
        header["tokenizer"] = tok.to_json()
    for k, v in (metadata or {}).items():
        if k in _RESERVED:
            raise ValueError(f"metadata key {k!r} is reserved (reserved: {', '.join(_RESERVED)})")
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str -> str, got {k!r}: {type(v).__name__}")
        header[k] = v
    aliases = _aliases(model)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in aliases}
    header[INTEGRITY_KEY] = tensor_record(tensors)
    path = Path(path)
    with atomic_path(path) as tmp:  # a killed save leaves the previous checkpoint, never half of one
        write_safetensors(tensors, tmp, metadata=header)  # no second temporary
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
    _check_format(header, path)
    return header


def _check_format(header: Mapping[str, str], path: Path) -> None:
    if header.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not an interp checkpoint (format={header.get('format')!r}, "
                         f"expected {CHECKPOINT_FORMAT!r}); write one with interp.zoo.save_checkpoint")


def _file_index(path: Path) -> tuple[dict[str, str], dict[str, tuple[str, list[int], list[int]]], int]:
    """A safetensors file's metadata, its tensors ``name -> (dtype, shape, [begin, end])`` and where their bytes
    start, read from the header alone: no memory map of the file, whose size would count against a rank's
    memory cap (``RLIMIT_AS`` / ``RLIMIT_DATA``) although a pipeline rank reads only its own layers' bytes."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")  # safetensors: an 8-byte header length, then JSON
            if not 0 < n <= path.stat().st_size - 8:
                raise ValueError(f"header length {n} does not fit the file")
            index = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise ValueError(f"{str(path)!r} is not a readable safetensors file: {e}") from e
    metadata = index.pop("__metadata__", None) or {}
    _check_format(metadata, path)
    return metadata, {k: (v["dtype"], v["shape"], v["data_offsets"]) for k, v in index.items()}, 8 + n


def _check_stored(where: str, cfg: ModelConfig, shapes: Mapping[str, tuple[int, ...]],
                  dtypes: Mapping[str, str]) -> None:
    """Check the declared sizes against the tensors in the file before allocating anything: a header may
    declare d_vocab=10**9 or a million layers over a file of a few kilobytes."""
    layers = {int(m.group(1)) for k in shapes if (m := _BLOCK_RX.match(k))}
    if layers != set(range(cfg.n_layers)):
        raise ValueError(f"{where} does not fit its config: the config declares n_layers={cfg.n_layers}, "
                         f"the file holds weights for {len(layers)} layer(s)")
    skeleton = build(cfg, device="meta")
    check_fits(skeleton, shapes, source=where)
    own = skeleton.state_dict()
    wrong = [f"{k} is stored as {d} {list(shapes[k])}, the model expects {own[k].dtype}"
             for k, d in dtypes.items() if own[k].is_floating_point() and d not in _FLOAT_NAMES]
    if wrong:
        raise ValueError(f"{where}: non-floating weights: " + "; ".join(wrong[:8]))


def _read_tensors(where: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    with safe_open(where, framework="pt") as f:
        stored = {k: f.get_slice(k) for k in f.keys()}
        _check_stored(where, cfg, {k: tuple(s.get_shape()) for k, s in stored.items()},
                      {k: s.get_dtype() for k, s in stored.items()})
        return {k: f.get_tensor(k) for k in f.keys()}


#: safetensors' dtype names -> torch dtypes (what a checkpoint holds: floating weights, integer buffers).
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def _read_some_tensors(path: Path, cfg: ModelConfig | None, keep: Callable[[str], bool]
                       ) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The header and the tensors ``keep`` accepts, every shape checked first, each read with plain file reads
    into its own buffer (the rest of the file is never read nor mapped)."""
    where = str(path)
    header, index, start = _file_index(path)
    cfg = _config_from_header(header, where) if cfg is None else cfg
    _check_stored(where, cfg, {k: tuple(v[1]) for k, v in index.items()}, {k: v[0] for k, v in index.items()})
    tensors = {}
    with open(path, "rb") as f:
        for k, (dtype, shape, (begin, end)) in index.items():
            if not keep(k):
                continue
            if dtype not in _DTYPES:
                raise ValueError(f"{where}: tensor {k!r} has dtype {dtype}, which interp checkpoints do not hold")
            t = torch.empty(shape, dtype=_DTYPES[dtype])
            if t.numel() * t.element_size() != end - begin:
                raise ValueError(f"{where}: tensor {k!r} declares {dtype} {shape} over {end - begin} bytes")
            f.seek(start + begin)
            if f.readinto(t.reshape(-1).view(torch.uint8).numpy().data) != end - begin:  # into t's memory
                raise ValueError(f"{where}: tensor {k!r} is cut short: the file ends inside its bytes")
            tensors[k] = t
    return header, tensors


# The alignment (bytes) of every assigned weight: what torch's own allocator gives.
_ALIGN = 64

# safetensors' names of the floating dtypes a weight may be stored in.
_FLOAT_NAMES = ("F64", "F32", "F16", "BF16")


def load_checkpoint(path: str | Path, *, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> Transformer:
    """Load a model written by :func:`save_checkpoint`.

    Args:
        path: the ``.safetensors`` file.
        device: where to build the model (default: the current default device, usually CPU).
        dtype: the parameters' dtype, built in it (default: as stored; float32 for a file of mixed dtypes).

    Returns:
        The :class:`interp.Transformer` in eval mode, with ``name`` and (when stored) ``tokenizer`` set: a
        stored tokenizer JSON, or the token-id tokenizer of a :func:`interp.zoo.induction.save_induction_model`
        checkpoint (header ``tokenizer_kind`` ``"token-id"``).

    Raises:
        TypeError: ``dtype`` is not a floating-point torch.dtype (checked before the file is read).
        FileNotFoundError: no file at ``path``.
        ValueError: not an interp checkpoint, a bad config, weights that do not fit the config (the
            message names the tensor and both shapes), a non-floating weight (named with both dtypes), or
            tensors whose bytes differ from the sha256
            record written with them (``model.checkpoint_verified`` says whether there was a record).

    Example:
        >>> from interp.examples import model
        >>> from interp.zoo.checkpoint import load_checkpoint, save_checkpoint
        >>> from interp.examples import tmp
        >>> model = load_checkpoint(save_checkpoint(model, tmp / "induction.safetensors"))
    """
    check_dtype(dtype)
    header = read_checkpoint_metadata(path)
    where = str(path)
    cfg = _config_from_header(header, where)
    try:
        tensors = _read_tensors(where, cfg)
    except ValueError:
        raise
    except Exception as e:  # safetensors raises its own error types for corrupt tensor data
        raise ValueError(f"{where}: the tensors cannot be read: {e}") from e
    verified = INTEGRITY_KEY in header
    if verified:
        check_tensor_record(header[INTEGRITY_KEY], tensors, where)
    kept = float32_names(build(cfg, device="meta"))  # float32 by policy whatever the model's dtype
    stored = {t.dtype for k, t in tensors.items() if t.dtype.is_floating_point and k not in kept}
    if dtype is None:  # "as stored": a bf16 / fp16 checkpoint stays bf16 / fp16
        dtype = stored.pop() if len(stored) == 1 else torch.float32
    # Parameters on the meta device, then the tensors read are assigned: the weights are held once, not twice.
    target = torch.device(device) if device is not None else torch.device("cpu")
    model = build(cfg, device=target, dtype=dtype, meta_weights=True)
    assign_weights(model, tensors, dtype=dtype, device=target, source=where)
    del tensors
    _name_and_tokenizer(model, header, Path(path), where)
    model.checkpoint_metadata = {k: v for k, v in header.items() if k not in ("config", "tokenizer", INTEGRITY_KEY)}
    model.checkpoint_verified = verified
    return model.eval()


def _name_and_tokenizer(model: Transformer, header: dict[str, Any], path: Path, where: str) -> None:
    """Set ``model.name`` and, when the header stores one, ``model.tokenizer`` (a whole model or a pipeline's stage)."""
    model.name = header.get("name", path.stem)
    if header.get("tokenizer_kind") == "token-id":
        from .token_ids import token_id_tokenizer  # a token-id model: its tokenizer is rebuilt from the header

        model.tokenizer = token_id_tokenizer(header, model.cfg.d_vocab, where)
    elif "tokenizer" in header:
        from .tokenizer import Tokenizer

        try:
            model.tokenizer = Tokenizer.from_json(header["tokenizer"])
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises a plain Exception
            raise ValueError(f"{where}: the tokenizer stored in the checkpoint cannot be read: {e}") from e


def _checkpoint_file(path: str | Path) -> Path:
    """``path`` as a Path, checked to be a file.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {str(path)!r}")
    return path


def load_checkpoint_stage(path: str | Path, *, rank: int | None = None, world: int | None = None,
                          device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Transformer:
    """This rank's slice of a checkpoint for :class:`interp.pipeline.Pipeline`: its blocks (and the embedding on
    rank 0, the final norm and unembedding on the last rank), the rest left on the meta device, never read.

    The model is built on the meta device (:func:`~interp.placement.build` with ``meta_weights``), every shape
    in the file is checked against the config, and only the tensors of the modules this rank holds
    (:func:`interp.pipeline.stage_prefixes`) are read and assigned (:func:`assign_weights`), module by module.

    Args:
        path: a checkpoint written by :func:`save_checkpoint`.
        rank: this rank (default: :func:`interp.distributed.rank`).
        world: the ranks (default: :func:`interp.distributed.world_size`).
        device: where the slice goes (default: :func:`interp.distributed.rank_device`, else CPU).
        dtype: the parameters' dtype (default: as stored; float32 for a file of mixed dtypes).

    Returns:
        A :class:`~interp.model.Transformer` whose held modules have weights and the others are on ``meta``.

    Raises:
        ValueError: as :func:`load_checkpoint` (bad header, shapes, damaged bytes), or more ranks than layers.

    Example:
        >>> from interp.zoo.checkpoint import load_checkpoint_stage, save_checkpoint
        >>> from interp.examples import model, tmp
        >>> path = save_checkpoint(model, tmp / "m.safetensors")
        >>> stage = load_checkpoint_stage(path, rank=1, world=2)
        >>> stage.blocks[0].attn.W_O.weight.is_meta, stage.blocks[1].attn.W_O.weight.is_meta
        (True, False)
    """
    from .. import distributed
    from ..pipeline import stage_prefixes

    check_dtype(dtype)
    rank, world = distributed.rank_and_world(rank, world)
    path = _checkpoint_file(path)
    where = str(path)
    header, _, _ = _file_index(path)
    cfg = _config_from_header(header, where)
    held = stage_prefixes(build(cfg, device="meta"), rank, world)
    _, tensors = _read_some_tensors(path, cfg, lambda key: any(key.startswith(p + ".") for p in held))
    if INTEGRITY_KEY in header:
        check_tensor_record(header[INTEGRITY_KEY], tensors, where, partial=True)
    kept = float32_names(build(cfg, device="meta"))  # float32 by policy whatever the model's dtype
    stored = {t.dtype for k, t in tensors.items() if t.dtype.is_floating_point and k not in kept}
    if dtype is None:
        dtype = stored.pop() if len(stored) == 1 else torch.float32
    target = torch.device(device) if device is not None else (distributed.rank_device() or torch.device("cpu"))
    model = build(cfg, device=target, dtype=dtype, meta_weights=True)
    tied = cfg.tie_embeddings and model.unembed is not None
    modules = dict(model.named_modules())  # by name: the model's W_E / W_U attributes are tensors, not modules
    for prefix in held:
        if prefix == "W_U" and tied:
            continue  # the embedding's weight, tied again below
        mine = {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
        assign_weights(modules[prefix], mine, dtype=dtype, device=target, source=where)
    unembed = model.unembed
    if tied and "W_U" in held and unembed is not None:
        unembed.weight = model.embed.weight
    del tensors
    _name_and_tokenizer(model, header, path, where)  # a text analysis over the pipeline tokenizes on every rank
    return model.eval()


def _read_slice(f: Any, start: int, key: str, dtype: str, shape: list[int], span: tuple[int, int], dim: int,
                index: torch.Tensor, where: str) -> torch.Tensor:
    """The part ``index`` along ``dim`` (0, or 1 of a matrix) of one stored tensor, read with plain file reads:
    one read per contiguous run of rows, or per row and run of columns; the rest of the tensor is never read."""
    begin, end = span
    item = torch.empty((), dtype=_DTYPES[dtype]).element_size()
    if torch.Size(shape).numel() * item != end - begin:
        raise ValueError(f"{where}: tensor {key!r} declares {dtype} {shape} over {end - begin} bytes")
    idx = index.tolist()
    runs: list[tuple[int, int]] = []  # maximal contiguous runs [a, b) of the index
    for i in idx:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    out_shape = list(shape)
    out_shape[dim] = len(idx)
    out = torch.empty(out_shape, dtype=_DTYPES[dtype])
    raw = out.reshape(-1).view(torch.uint8).numpy()
    if dim == 0:
        row = item * (torch.Size(shape[1:]).numel())  # bytes of one row [shape[1:]]
        pieces = [(begin + a * row, (b - a) * row) for a, b in runs]
    elif dim == 1 and len(shape) == 2:
        row = item * shape[1]
        pieces = [(begin + r * row + a * item, (b - a) * item) for r in range(shape[0]) for a, b in runs]
    else:
        raise ValueError(f"{where}: tensor {key!r}: a slice along dim {dim} of shape {shape} is not supported")
    at = 0
    for offset, size in pieces:  # in the order of the output's bytes (row-major)
        f.seek(start + offset)
        if f.readinto(raw[at:at + size].data) != size:
            raise ValueError(f"{where}: tensor {key!r} is cut short: the file ends inside its bytes")
        at += size
    return out


def load_checkpoint_heads(path: str | Path, *, rank: int | None = None, world: int | None = None,
                          device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Transformer:
    """This rank's head-parallel shard (:func:`interp.tensor_parallel.shard_heads`) read straight from a checkpoint:
    the shard is built on the meta device and each weight it cuts is read as the rows / columns of this rank's
    heads and MLP share (:func:`interp.tensor_parallel.shard_slices`); the other ranks' slices are never read.

    The result equals ``shard_heads(load_checkpoint(path), rank, world)`` without ever holding the whole model:
    a rank's peak memory is its shard (the replicated embeddings, norms and unembedding included). Reads are plain
    file reads (as :func:`load_checkpoint_stage`: no memory map of the whole file). The checkpoint's tensor record
    (sha256) is checked for every tensor read whole; a sliced tensor cannot be hashed without reading it all.

    Args:
        path: a checkpoint written by :func:`save_checkpoint`.
        rank: this rank (default: :func:`interp.distributed.rank`).
        world: the ranks (default: :func:`interp.distributed.world_size`).
        device: where the shard goes (default: :func:`interp.distributed.rank_device`, else CPU).
        dtype: the parameters' dtype (default: as stored; float32 for a file of mixed dtypes).

    Returns:
        The shard, ready for :class:`interp.tensor_parallel.HeadParallel`.

    Raises:
        ValueError: as :func:`load_checkpoint` (bad header, shapes, damaged bytes), a rank outside ``0 ..
            world - 1``, or the errors of :func:`~interp.tensor_parallel.shard_heads` (a ``d_mlp`` that ``world``
            does not divide, ``qk_norm="full"``, cross-attention).

    Example:
        >>> import torch
        >>> from interp.zoo.checkpoint import load_checkpoint_heads, save_checkpoint
        >>> from interp.tensor_parallel import shard_heads
        >>> from interp.examples import model, tmp
        >>> path = save_checkpoint(model, tmp / "heads.safetensors")
        >>> shard = load_checkpoint_heads(path, rank=1, world=2)
        >>> torch.equal(shard.blocks[0].attn.W_O.weight, shard_heads(model, 1, 2).blocks[0].attn.W_O.weight)
        True
    """
    from .. import distributed
    from ..tensor_parallel import shard_heads, shard_slices, zero_output_biases

    check_dtype(dtype)
    rank, world = distributed.rank_and_world(rank, world)
    path = _checkpoint_file(path)
    where = str(path)
    header, index, start = _file_index(path)
    cfg = _config_from_header(header, where)
    _check_stored(where, cfg, {k: tuple(v[1]) for k, v in index.items()}, {k: v[0] for k, v in index.items()})
    skeleton = build(cfg, device="meta")
    plan = shard_slices(skeleton, rank, world)
    layout = shard_heads(skeleton, rank, world)  # the shard's config (head counts, K/V maps, MLP width), on meta
    stored_dtypes = {_DTYPES[v[0]] for v in index.values() if v[0] in _DTYPES and _DTYPES[v[0]].is_floating_point}
    if dtype is None:
        dtype = stored_dtypes.pop() if len(stored_dtypes) == 1 else torch.float32
    target = torch.device(device) if device is not None else (distributed.rank_device() or torch.device("cpu"))
    shard = build(layout.cfg, device=target, dtype=dtype, meta_weights=True)  # buffers real, weights to come
    for attr in ("tp_heads", "tp_layout", "tp_rank", "tp_world"):
        setattr(shard, attr, getattr(layout, attr))
    whole: dict[str, torch.Tensor] = {}
    sliced: dict[str, torch.Tensor] = {}
    with open(path, "rb") as f:
        for key, (stored, shape, (begin, end)) in index.items():
            if stored not in _DTYPES:
                raise ValueError(f"{where}: tensor {key!r} has dtype {stored}, which interp checkpoints do not hold")
            if key in plan:
                sliced[key] = _read_slice(f, start, key, stored, shape, (begin, end), *plan[key], where)
                continue
            t = torch.empty(shape, dtype=_DTYPES[stored])
            if t.numel() * t.element_size() != end - begin:
                raise ValueError(f"{where}: tensor {key!r} declares {stored} {shape} over {end - begin} bytes")
            f.seek(start + begin)
            if f.readinto(t.reshape(-1).view(torch.uint8).numpy().data) != end - begin:
                raise ValueError(f"{where}: tensor {key!r} is cut short: the file ends inside its bytes")
            whole[key] = t
    if INTEGRITY_KEY in header:
        check_tensor_record(header[INTEGRITY_KEY], whole, where, partial=True)
    tensors = {**whole, **sliced}
    assign_weights(shard, tensors, dtype=dtype, device=target, source=where)
    del tensors, whole, sliced
    if rank != 0:
        zero_output_biases(shard)  # every rank adds its partial write; the biases once, on rank 0
    _name_and_tokenizer(shard, header, path, where)
    return shard.eval()
