"""Hugging Face weights read straight from a model folder, checked before anything is allocated.

``transformers``' ``from_pretrained`` builds the model from its config first and fills any tensor the files lack
with a random initialisation (it only warns), drops or casts what does not fit, and allocates a model of any size
a config declares. The folder loader of :func:`interp.zoo.hf.from_hf` reads the files itself instead:

1. :func:`open_weights` finds the weight files (``model.safetensors``, a sharded
   ``model.safetensors.index.json``, or ``pytorch_model.bin`` / its index), refuses a file that resolves outside
   the folder (a symlink to another model's file), and reads only their headers: each tensor's name, dtype,
   shape and byte range, checked against the file's size.
2. :func:`check_weights` runs the converter on meta-device tensors of those shapes and dtypes and refuses, by
   name, every missing, unexpected, mis-shaped or non-floating tensor and a layer count that disagrees with the
   weights. A ``num_hidden_layers: 1000000`` or a million experts over a few kilobytes of weights costs nothing.
3. Only then is the model built, its parameters on the meta device, and each tensor read once, when the
   converter asks for it (:class:`StoredWeights`), into memory of its own (no memory map stays behind), and
   checked for NaN / infinite values (:func:`interp.zoo.checkpoint.check_finite`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import torch

from .checkpoint import check_finite

# safetensors dtype names -> torch dtypes (the format's full list that torch can hold).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
# The floating dtypes a weight may be stored in (float8 needs a scale interp does not read: refused).
WEIGHT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# A header larger than this is not a weight file's (safetensors itself caps it at 100 MB).
_MAX_HEADER = 100_000_000

# HF tensors a conversion leaves out by design: rotary caches, GPT-2's causal-mask buffers, BERT's pooler and
# task heads, position-id buffers.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.attn\.(masked_)?bias|(^|\.)position_ids)$|^(bert\.)?pooler\.|^cls\.")
# The index of a transformer layer in a HF tensor name (``model.layers.3.``, ``transformer.h.3.``,
# ``encoder.layer.3.``).
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are: its file, dtype, shape and absolute byte range."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def read_safetensors_header(path: str | Path) -> dict[str, StoredTensor]:
    """Every tensor of a safetensors file, from its header alone (no tensor data is read).

    Args:
        path: the ``.safetensors`` file.

    Returns:
        ``{name: StoredTensor}``.

    Raises:
        ValueError: a header that is not a safetensors one (too short, too long, not JSON), an unknown dtype, or
            a tensor whose byte range does not match its shape or lies past the end of the file (each named).

    Example:
        >>> import torch
        >>> from interp.zoo.hf_weights import read_safetensors_header
        >>> from interp.examples import tmp
        >>> from safetensors.torch import save_file
        >>> save_file({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, str(tmp / "w.safetensors"))
        >>> t = read_safetensors_header(tmp / "w.safetensors")["w"]
        >>> t.dtype, t.shape, t.end - t.start
        (torch.bfloat16, (2, 3), 12)
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(_MAX_HEADER, size - 8):
            raise ValueError(f"{path}: not a safetensors file (header length {n} in a file of {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: the safetensors header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header must be a JSON object, got {type(header).__name__}")
    out: dict[str, StoredTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            kind, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"{path}: tensor {name!r} has a malformed header entry {info!r}") from e
        if kind not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {kind!r}, which interp cannot read "
                             f"(known: {sorted(SAFETENSORS_DTYPES)})")
        dtype = SAFETENSORS_DTYPES[kind]
        if not all(isinstance(d, int) and d >= 0 for d in shape) or not (isinstance(begin, int) and isinstance(end, int)):
            raise ValueError(f"{path}: tensor {name!r} has a malformed shape {list(shape)} or offsets {[begin, end]}")
        numel = 1
        for d in shape:
            numel *= d
        want = numel * torch.empty((), dtype=dtype, device="meta").element_size()
        if end - begin != want or begin < 0 or 8 + n + end > size:
            raise ValueError(f"{path}: tensor {name!r} ({kind} {list(shape)}, {want} bytes) has byte range "
                             f"[{begin}, {end}) in a data section of {size - 8 - n} bytes")
        out[name] = StoredTensor(path, dtype, shape, 8 + n + begin, 8 + n + end)
    return out


def _inside(folder: Path, file: Path) -> Path:
    """``file`` resolved, refused when it lies outside ``folder`` (a symlink to another model's file). A hub
    cache's snapshot links into its own ``blobs/``, which is allowed."""
    real, root = file.resolve(), folder.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":  # huggingface_hub's cache: snapshots/<rev>/file -> ../../blobs/<sha>
        allowed.append(root.parent.parent / "blobs")
    if not any(real.is_relative_to(a) for a in allowed):
        raise ValueError(f"{file}: the weight file resolves to {real}, outside the model folder {root}; "
                         "refusing to load weights from another place (copy the file into the folder)")
    return real


def _index_files(index: Path) -> dict[str, str]:
    """``weight_map`` of a sharded checkpoint's index: tensor name -> shard file name."""
    try:
        data = json.loads(index.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{index}: cannot be read as JSON: {e}") from e
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: key 'weight_map' must map tensor names to shard file names")
    for shard in set(weight_map.values()):
        if Path(shard).name != shard:
            raise ValueError(f"{index}: 'weight_map' names the shard {shard!r}, which is not a file in the folder")
    return weight_map


class StoredWeights(Mapping[str, torch.Tensor]):
    """A folder's tensors by HF name, read from disk when asked for (never all at once).

    Each ``weights[name]`` is a fresh tensor in the stored dtype, read with plain file reads (no memory map
    stays mapped, so resident memory is the tensors the caller keeps) and refused when it holds NaN or infinite
    values. :attr:`read` records the names asked for, :meth:`meta` gives every tensor as a meta-device tensor of
    its shape and dtype, for checks that allocate nothing.
    """

    def __init__(self, entries: Mapping[str, StoredTensor], source: str,
                 loader: Callable[[str], torch.Tensor] | None = None) -> None:
        self.entries = dict(entries)
        self.source = source
        self.read: set[str] = set()
        self._loader = loader
        self._open: tuple[Path, IO[bytes]] | None = None  # one shard open at a time

    def __getitem__(self, name: str) -> torch.Tensor:
        entry = self.entries[name]
        self.read.add(name)
        tensor = self._loader(name) if self._loader is not None else self._read(entry)
        if tensor.is_floating_point():
            check_finite(tensor, name, f"{self.source} ({entry.file.name})")
        return tensor

    def _read(self, entry: StoredTensor) -> torch.Tensor:
        if self._open is None or self._open[0] != entry.file:
            self.close()
            self._open = (entry.file, open(entry.file, "rb"))
        f = self._open[1]
        raw = torch.empty(entry.end - entry.start, dtype=torch.uint8)  # [bytes]
        f.seek(entry.start)
        if cast(Any, f).readinto(memoryview(cast(Any, raw.numpy()))) != raw.numel():  # into the tensor's memory
            raise ValueError(f"{entry.file}: the file ends inside a tensor's data (truncated file)")
        return raw.view(entry.dtype).reshape(entry.shape)  # [bytes] -> the stored shape

    def close(self) -> None:
        """Close the open shard (reading again reopens it)."""
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def meta(self) -> dict[str, torch.Tensor]:
        """Every tensor as an empty meta-device tensor of its shape and dtype."""
        return {k: torch.empty(e.shape, dtype=e.dtype, device="meta") for k, e in self.entries.items()}


def open_weights(folder: str | Path) -> StoredWeights:
    """The weights of a Hugging Face model folder, headers read, tensors not.

    Args:
        folder: a folder holding ``model.safetensors``, ``model.safetensors.index.json`` with its shards,
            ``pytorch_model.bin`` or ``pytorch_model.bin.index.json`` with its shards (tried in that order).

    Returns:
        A :class:`StoredWeights`.

    Raises:
        FileNotFoundError: none of those files, or a shard the index names is missing.
        ValueError: a weight file that resolves outside the folder, a corrupt header or index, a tensor stored
            twice, or a pickle that torch's safe loader refuses (named with the file).

    Example:
        >>> import torch
        >>> from interp.zoo.hf_weights import open_weights
        >>> from interp.examples import tmp
        >>> from safetensors.torch import save_file
        >>> save_file({"w": torch.ones(2)}, str(tmp / "model.safetensors"))
        >>> weights = open_weights(tmp)
        >>> list(weights), weights["w"].tolist()
        (['w'], [1.0, 1.0])
    """
    folder = Path(folder)
    names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    found = next((folder / n for n in names if (folder / n).is_file()), None)
    if found is None:
        raise FileNotFoundError(f"{folder}: no weights (looked for {', '.join(names)})")
    if found.name.endswith(".index.json"):
        weight_map = _index_files(_inside(folder, found))
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = {}, [found.name]
    for shard in files:
        if not (folder / shard).is_file():
            raise FileNotFoundError(f"{folder / shard}: a weight file {found.name} names is missing")
    if "safetensors" in found.name:
        entries: dict[str, StoredTensor] = {}
        for shard in files:
            for name, entry in read_safetensors_header(_inside(folder, folder / shard)).items():
                if name in entries:
                    raise ValueError(f"{folder}: tensor {name!r} is stored twice ({entries[name].file.name} and "
                                     f"{shard})")
                entries[name] = entry
        unlisted = sorted(k for k in entries if weight_map and weight_map.get(k) != entries[k].file.name
                          and k in weight_map)
        if unlisted:
            raise ValueError(f"{found}: the index places {unlisted[:4]} in other shards than the ones holding them")
        return StoredWeights(entries, str(folder))
    return _torch_weights(folder, [_inside(folder, folder / s) for s in files])


def _torch_weights(folder: Path, files: list[Path]) -> StoredWeights:
    """``pytorch_model.bin`` files, memory-mapped with torch's weights-only (no code) unpickler: shapes and
    dtypes come without reading the data, and each tensor is copied out when asked for."""
    import pickle

    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            try:
                sd = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # the legacy (non-zip) format cannot be memory-mapped
                if "mmap" not in str(e):
                    raise
                sd = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            # torch refuses to unpickle arbitrary objects (weights_only): say so instead of a pickle traceback.
            first = re.sub(r"\x1b\[[0-9;]*m", "", str(e).splitlines()[0])
            raise ValueError(f"{folder}: its weights are a pickle file that cannot be loaded safely; convert them "
                             f"to model.safetensors first ({first})") from e
        if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise ValueError(f"{file}: not a state dict of tensors")
        tensors.update(sd)
    entries = {k: StoredTensor(files[0], t.dtype, tuple(t.shape), 0, 0) for k, t in tensors.items()}
    return StoredWeights(entries, str(folder), loader=lambda name: tensors[name].clone())


def layer_indices(names: Mapping[str, Any] | set[str]) -> set[int]:
    """The transformer layer indices that HF tensor names hold weights for.

    Example:
        >>> from interp.zoo.hf_weights import layer_indices
        >>> sorted(layer_indices({"model.layers.0.mlp.up_proj.weight", "model.layers.2.x", "model.norm.weight"}))
        [0, 2]
    """
    return {int(m.group(1)) for n in names if (m := _LAYER.search(n))}


def check_layers(hf_cfg: Mapping[str, Any], n_layers: int, names: Mapping[str, Any] | set[str], *,
                 source: str) -> None:
    """Refuse a config whose layer count disagrees with the layers the weights hold (more or fewer): checked
    first, since it is cheap and bounds what the config can make anything allocate or loop over.

    Args:
        hf_cfg: the HF config dict (DeepSeek-V3's ``num_nextn_predict_layers`` extra layers are allowed).
        n_layers: the layer count the config declares.
        names: the HF tensor names.
        source: the folder or model, named in errors.

    Raises:
        ValueError: the layer counts disagree (both named).

    Example:
        >>> from interp.zoo.hf_weights import check_layers
        >>> check_layers({}, 1000000, {"h.0.ln_1.weight"}, source="my-folder")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: my-folder: config.json declares 1000000 layers ..., but the weights hold layers 0..0 (1 layer(s))
    """
    extra = int(hf_cfg.get("num_nextn_predict_layers") or 0)  # DeepSeek-V3's multi-token-prediction layers
    found = layer_indices(names)
    # Counted, not compared as sets: the declared count may be 10^6 or more.
    if sum(1 for i in found if i < n_layers) != n_layers or max(found, default=-1) >= n_layers + extra:
        span = f"{min(found)}..{max(found)} ({len(found)} layer(s))" if found else "none"
        raise ValueError(f"{source}: config.json declares {n_layers} layers (num_hidden_layers / n_layer), but the "
                         f"weights hold layers {span}")


def check_weights(hf_cfg: Mapping[str, Any], cfg: Any, make_sd: Callable, meta: Mapping[str, torch.Tensor],
                  *, dtype: torch.dtype, source: str, allow_unused: bool = False,
                  wrap_converter_errors: bool = True) -> dict[str, tuple[int, ...]]:
    """Refuse HF weights that do not fill the model ``hf_cfg`` declares, allocating nothing (call
    :func:`check_layers` first).

    Args:
        hf_cfg: the HF config dict.
        cfg: the :class:`~interp.config.ModelConfig` made from it.
        make_sd: the family's state-dict converter.
        meta: the HF tensors as meta-device tensors of their stored shapes and dtypes.
        dtype: the dtype the model will have (named in errors).
        source: the folder or model, named in errors.
        allow_unused: accept tensors the converter does not read.
        wrap_converter_errors: put ``source`` before the converter's own refusals (which name the
            ``model_type`` and the tensor already); False passes them on as they are.

    Returns:
        The shapes of the converted tensors, by interp name, for
        :func:`interp.zoo.checkpoint.check_fits` against the model built on the meta device (the converter's own
        checks run first, so a config declaring 10^6 experts over 4 is refused before any model is built).

    Raises:
        ValueError: a non-floating tensor (named with its dtype and the model's), a tensor the converter needs
            and the weights lack, a tensor the model has no place for, or shapes the converter finds at odds
            (each tensor named with both shapes).

    Example:
        >>> import torch
        >>> from interp.zoo.hf_weights import check_weights
        >>> from interp.zoo.hf import converter
        >>> hf_cfg = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 10, "n_positions": 4}
        >>> make_cfg, make_sd = converter(hf_cfg)
        >>> cfg = make_cfg(hf_cfg)
        >>> check_weights(hf_cfg, cfg, make_sd, {"wte.weight": torch.empty(10, 8, dtype=torch.int32, device="meta")},
        ...               dtype=torch.float32, source="my-folder")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: my-folder: non-floating weights: wte.weight is stored as torch.int32 [10, 8], the model expects ...
    """
    n_layers = cfg.n_layers
    extra = int(hf_cfg.get("num_nextn_predict_layers") or 0)
    ignored = {k for k in meta if _IGNORED.search(k) or _is_extra_layer(k, n_layers, extra)}
    if cfg.unembed and cfg.tie_embeddings:
        ignored |= {k for k in meta if k.endswith("lm_head.weight")}  # a tied copy some checkpoints store
    if (hf_cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4":
        # MXFP4 experts (gpt-oss): uint8 codes and exponents the converter decodes (interp.families.gpt_oss).
        packed = {k for k, t in meta.items() if t.dtype == torch.uint8 and k.endswith(("_blocks", "_scales"))}
    else:
        packed = set()
    wrong = [f"{k} is stored as {t.dtype} {list(t.shape)}, the model expects a floating dtype ({dtype})"
             for k, t in meta.items() if k not in ignored | packed and t.dtype not in WEIGHT_DTYPES]
    if wrong:
        raise ValueError(f"{source}: non-floating weights: " + "; ".join(wrong[:8]))
    recording = _Recording(meta)
    try:
        with torch.device("meta"):  # tensors the converter makes itself (zero biases) stay shapes too
            ours = make_sd(recording, cfg)
    except (ValueError, RuntimeError, KeyError) as e:  # a missing tensor, or a torch.cat of mismatched shapes
        if wrap_converter_errors:
            raise ValueError(f"{source}: the weights do not fit the model config.json declares: {e}") from e
        if isinstance(e, ValueError):
            raise
        raise ValueError(str(e)) from e
    # An empty tensor holds no weight (transformers builds a zero-width shared expert for n_shared_experts=0):
    # leaving it out changes nothing.
    unused = sorted(k for k in meta if k not in recording.read and k not in ignored and meta[k].numel())
    if unused and not allow_unused:
        raise ValueError(f"{source}: unexpected tensors the model config.json declares has no place for: "
                         + ", ".join(f"{k} {list(meta[k].shape)}" for k in unused[:8])
                         + (f" ... ({len(unused)} in all)" if len(unused) > 8 else ""))
    return {k: tuple(v.shape) for k, v in ours.items()}


def _is_extra_layer(name: str, n_layers: int, extra: int) -> bool:
    """A tensor of a multi-token-prediction layer (index >= n_layers), which interp leaves out."""
    m = _LAYER.search(name)
    return bool(extra and m and int(m.group(1)) >= n_layers)


class _Recording(dict):
    """A state dict that remembers which tensors the converter read (the rest are unexpected tensors)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        self.read.add(key)
        return super().__getitem__(key)


__all__ = ["SAFETENSORS_DTYPES", "StoredTensor", "StoredWeights", "WEIGHT_DTYPES", "check_layers", "check_weights",
           "layer_indices", "open_weights", "read_safetensors_header"]
