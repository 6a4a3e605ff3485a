"""Keep a GGUF file's quantised weights in their blocks (``load_gguf(path, keep_quantized=True)``).

The float path (:mod:`interp.zoo.gguf`) dequantises each tensor, undoes llama.cpp's changes to it (Q/K row
permutations, ...) and hands the Hugging Face state dict to the converter of :mod:`interp.zoo.hf`, which fuses
Q, K and V into ``W_qkv`` and so on. Blocks cannot go through that arithmetic, and a second table of where
each GGUF tensor lands would duplicate the converter. So the same transforms and converter run on *row tags*
instead of weights: each quantised tensor becomes an int64 column ``[rows, 1]`` holding ``(tensor id, row)``.
Whatever the converter builds from tags says which stored row becomes which row of which parameter; those
rows' bytes are then gathered from the file into a :class:`~interp.quantized.QuantizedWeight`.

The run is made twice with two encodings (``t`` and ``2t + 1``): a converter that only selects, reorders and
concatenates rows gives the same answer from both; one that does arithmetic on a weight (a scale, an offset,
a sum) does not, and that tensor is refused by name, as is anything but a 2-D tensor of a block type
:data:`interp.quantized.QUANT_TYPES` lists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..quantized import QUANT_TYPES, QuantizedWeight, row_bytes
from . import gguf_experts
from .gguf_file import GGUFError, GGUFFile, GGUFTensor

_ROW_BITS = 32  # tag = tensor index << 32 | row
_FLOAT_TYPES = ("F32", "F16", "BF16")


def is_kept(t: GGUFTensor) -> bool:
    """Whether a tensor stays in its blocks (everything not stored as a float type)."""
    return t.tensor_type.name not in _FLOAT_TYPES


def check_keepable(reader: GGUFFile, source: str) -> list[GGUFTensor]:
    """The tensors that will stay quantised, each checked: a supported block type, two dimensions.

    Raises:
        GGUFError: a block type interp cannot keep, or a quantised tensor of 1 or 3+ dimensions (experts),
            named with its type and shape.
    """
    kept = [t for t in reader.tensors if is_kept(t)]
    for t in kept:
        kind = t.tensor_type.name
        if kind not in QUANT_TYPES:
            raise GGUFError(f"{source}: tensor {t.name!r} is {kind}; keep_quantized keeps {sorted(QUANT_TYPES)} "
                            f"in their blocks. Load with keep_quantized=False to dequantise every tensor")
        if len(t.shape) != 2:
            raise GGUFError(f"{source}: tensor {t.name!r} ({kind}) has {len(t.shape)} dimensions "
                            f"{[int(d) for d in t.shape]}; keep_quantized keeps 2-D weight matrices only "
                            f"(stacked experts are not supported). Load with keep_quantized=False")
    return kept


def _tags(index: int, rows: int, odd: bool) -> torch.Tensor:
    t = (index << _ROW_BITS) + torch.arange(rows, dtype=torch.int64)
    return (2 * t + 1 if odd else t)[:, None]  # [rows, 1]


def _read_rows(reader: GGUFFile, t: GGUFTensor) -> torch.Tensor:
    """A tensor's bytes ``[rows, bytes per row]``, read from the file into memory of our own (the memory map is
    not touched, so the file's pages are not counted twice while the model holds its copy)."""
    rows, cols = int(t.shape[1]), int(t.shape[0])  # GGUF dims fastest first
    out = torch.empty(rows, row_bytes(t.tensor_type.name, cols), dtype=torch.uint8)  # [R, bytes per row]
    with open(reader.path, "rb") as f:
        f.seek(t.data_offset)
        got = f.readinto(memoryview(out.numpy()).cast("B"))
    if got != t.n_bytes:
        raise GGUFError(f"{reader.path}: tensor {t.name!r} declares {t.n_bytes} bytes, read {got}")
    return out


def quantized_state_dict(reader: GGUFFile, hf_cfg: Mapping[str, Any], floats: dict[str, torch.Tensor],
                         hf_tensors: Callable[[str, torch.Tensor], dict[str, torch.Tensor]],
                         *, dtype: torch.dtype, device: torch.device | str | None,
                         source: str) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
    """interp's state dict of a GGUF file whose quantised tensors stay quantised.

    Args:
        reader: the parsed file.
        hf_cfg: :func:`interp.zoo.gguf.hf_config_from_gguf` output.
        floats: the Hugging Face state dict of the file's float tensors (already dequantised, transforms
            undone); it is emptied on the way.
        hf_tensors: ``(GGUF name, tensor) -> {HF name: tensor}``, the float path's renaming and transforms.
        dtype: the compute dtype of the quantised weights.
        device: where their bytes go.
        source: named in errors.

    Returns:
        ``(float tensors by interp key, quantised weights by interp key)``.

    Raises:
        GGUFError: a converter that does more than reorder the rows of a quantised tensor, or a parameter
            whose rows come from tensors of different widths (named).
    """
    from .hf import converter

    kept = check_keepable(reader, source)
    make_cfg, make_sd = converter(hf_cfg)
    cfg = make_cfg(hf_cfg)
    runs = []
    for odd in (False, True):
        hf_sd = dict(floats)
        for i, t in enumerate(kept):
            hf_sd.update(hf_tensors(t.name, _tags(i, int(t.shape[1]), odd)))
        gguf_experts.join_split_tensors(hf_sd)
        runs.append(make_sd(hf_sd, cfg))
    floats.clear()
    plain, odd_run = runs
    ours: dict[str, torch.Tensor] = {}
    kept_rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, value in plain.items():
        if value.dtype != torch.int64:
            ours[key] = value
            continue
        other = odd_run[key]
        if value.dim() != 2 or value.shape[1] != 1 or not torch.equal(other, 2 * value + 1):
            raise GGUFError(f"{source}: the {hf_cfg.get('model_type')!r} converter computes {key!r} from quantised "
                            f"tensors with more than a reordering of rows; keep_quantized cannot keep it in "
                            f"blocks. Load with keep_quantized=False")
        flat = value[:, 0]
        kept_rows[key] = (flat >> _ROW_BITS, flat & ((1 << _ROW_BITS) - 1))
    segments: dict[str, list[tuple[int, torch.Tensor]]] = {}  # key -> [(tensor index, its rows)], top to bottom
    users: dict[int, int] = {}
    for key, (ids, rows) in kept_rows.items():
        change = torch.nonzero(ids[1:] != ids[:-1]).flatten().add(1).tolist()
        segments[key] = [(int(ids[a]), rows[a:b]) for a, b in zip([0, *change], [*change, ids.shape[0]])]
        for i, _ in segments[key]:
            users[i] = users.get(i, 0) + 1
    raw: dict[int, torch.Tensor] = {}
    quantized: dict[str, QuantizedWeight] = {}
    for key, segs in segments.items():
        cols = {int(kept[i].shape[0]) for i, _ in segs}
        if len(cols) != 1:
            raise GGUFError(f"{source}: {key!r} joins quantised tensors of different widths {sorted(cols)}")
        parts = []
        for i, sel in segs:
            t = kept[i]
            if i not in raw:
                raw[i] = _read_rows(reader, t)
            whole = sel.shape[0] == raw[i].shape[0] and torch.equal(sel, torch.arange(sel.shape[0]))
            parts.append((t.tensor_type.name, raw[i] if whole else raw[i].index_select(0, sel)))
            users[i] -= 1
            if users[i] == 0:
                del raw[i]  # read once, freed once the last parameter built from it has its rows
        weight = QuantizedWeight(parts, cols=cols.pop(), dtype=dtype)
        quantized[key] = weight.to(device) if device is not None else weight
    return ours, quantized


__all__ = ["check_keepable", "is_kept", "quantized_state_dict"]
