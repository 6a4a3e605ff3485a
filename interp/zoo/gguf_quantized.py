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

from ..families import converter
from ..families._gguf_experts import join_split_tensors
from ..quantized import QUANT_TYPES, QuantizedWeight, row_bytes
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


def _tags(index: int, rows: int, cols: int, odd: bool, narrow: bool) -> torch.Tensor:
    t = (index << _ROW_BITS) + torch.arange(rows, dtype=torch.int64)
    t = (2 * t + 1 if odd else t)[:, None]  # [rows, 1]
    return t if narrow else t.expand(rows, cols)  # [rows, cols], one value per row (stride 0 along columns)


def _read_rows(reader: GGUFFile, t: GGUFTensor) -> torch.Tensor:
    """A tensor's bytes ``[rows, bytes per row]``, read from the file into memory of our own (the memory map is
    not touched, so the file's pages are not counted twice while the model holds its copy)."""
    rows, cols = int(t.shape[1]), int(t.shape[0])  # GGUF dims fastest first
    out = torch.empty(rows, row_bytes(t.tensor_type.name, cols), dtype=torch.uint8)  # [R, bytes per row]
    with open(reader.path, "rb") as f:
        f.seek(t.data_offset)
        got = f.readinto(out.numpy().data.cast("B"))
    if got != t.n_bytes:
        raise GGUFError(f"{reader.path}: tensor {t.name!r} declares {t.n_bytes} bytes, read {got}")
    return out


#: Tags as wide as the weights (for converters that check every dimension) cost 8 bytes per weight while the
#: converter runs; above this many bytes keep_quantized is refused for such a converter.
WIDE_TAG_LIMIT = 2 * 2**30


def _row_sources(reader: GGUFFile, tagged: list[GGUFTensor], floats: dict[str, torch.Tensor], make_sd, cfg,
                 hf_tensors, hf_cfg: Mapping[str, Any], dtype: torch.dtype, source: str):
    """Run the converter on tags: ``(float tensors by interp key, {interp key: (tensor ids, rows)})``."""
    error: Exception | None = None
    for narrow in (True, False):
        if not narrow:
            wide = sum(int(t.shape[0]) * int(t.shape[1]) * 8 for t in tagged)
            if wide > WIDE_TAG_LIMIT:
                raise GGUFError(f"{source}: the {hf_cfg.get('model_type')!r} converter checks the width of every "
                                f"weight, and tagging {wide:,} bytes of rows exceeds keep_quantized's "
                                f"{WIDE_TAG_LIMIT:,}-byte limit ({error}); load with keep_quantized=False")
        try:
            runs = []
            for odd in (False, True):
                hf_sd = dict(floats)
                for i, t in enumerate(tagged):
                    hf_sd.update(hf_tensors(t.name, _tags(i, int(t.shape[1]), int(t.shape[0]), odd, narrow)))
                join_split_tensors(hf_sd)
                runs.append(make_sd(hf_sd, cfg))
            break
        except (ValueError, RuntimeError) as e:  # a shape check or a cat that needs the real width
            if not narrow:
                raise GGUFError(f"{source}: keep_quantized cannot map the rows of the quantised tensors through "
                                f"the {hf_cfg.get('model_type')!r} converter: {e}") from e
            error = e
    plain, odd_run = runs
    ours: dict[str, torch.Tensor] = {}
    sources: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, value in plain.items():
        other = odd_run[key]
        if value.dtype != torch.int64:
            # float arithmetic on the tags (a folded scalar: Granite, Cohere); a size-only plan's meta tensors hold
            # no values to compare (the real load checks them)
            if not value.is_meta and not torch.equal(value, other):
                raise GGUFError(f"{source}: the {hf_cfg.get('model_type')!r} converter computes {key!r} from the "
                                f"file's weight matrices with more than a reordering of rows (it scales them); "
                                f"keep_quantized cannot keep it in blocks. Load with keep_quantized=False")
            ours[key] = value
            continue
        if not value.any() and not other.any():  # zeros shaped or typed after a weight (a bias lm_head lacks)
            ours[key] = torch.zeros(value.shape, dtype=dtype)
            continue
        col = value[:, :1] if value.dim() == 2 else value
        if (value.dim() != 2 or not torch.equal(value, col.expand_as(value))
                or not torch.equal(other[:, :1], 2 * col + 1)):
            raise GGUFError(f"{source}: the {hf_cfg.get('model_type')!r} converter computes {key!r} from the file's "
                            f"weight matrices with more than a reordering of rows; keep_quantized cannot keep it in "
                            f"blocks. Load with keep_quantized=False")
        flat = col[:, 0]
        sources[key] = (flat >> _ROW_BITS, flat & ((1 << _ROW_BITS) - 1))
    return ours, sources


def stored_bytes(reader: GGUFFile, hf_cfg: Mapping[str, Any], floats: dict[str, torch.Tensor],
                 hf_tensors: Callable[[str, torch.Tensor], dict[str, torch.Tensor]], *, dtype: torch.dtype,
                 source: str) -> dict[str, tuple[int, int]]:
    """What each weight built from the file's matrices takes under keep_quantized, from the header alone:
    ``{interp key: (bytes held, bytes as dtype floats)}`` (the same row mapping as :func:`quantized_state_dict`;
    ``floats`` may be meta tensors).

    Raises:
        GGUFError: as :func:`quantized_state_dict`.
    """
    check_keepable(reader, source)
    tagged = [t for t in reader.tensors if len(t.shape) == 2]
    make_cfg, make_sd = converter(hf_cfg)
    _, sources = _row_sources(reader, tagged, dict(floats), make_sd, make_cfg(hf_cfg), hf_tensors, hf_cfg, dtype,
                              source)
    element = torch.empty((), dtype=dtype).element_size()
    out = {}
    for key, (ids, _) in sources.items():
        counts = torch.bincount(ids)
        used = [(tagged[i], int(n)) for i, n in enumerate(counts.tolist()) if n]
        as_float = sum(n * int(t.shape[0]) * element for t, n in used)
        kept = any(is_kept(t) for t, _ in used)
        out[key] = (sum(n * row_bytes(t.tensor_type.name, int(t.shape[0])) for t, n in used) if kept else as_float,
                    as_float)
    return out


def quantized_state_dict(reader: GGUFFile, hf_cfg: Mapping[str, Any], floats: dict[str, torch.Tensor],
                         hf_tensors: Callable[[str, torch.Tensor], dict[str, torch.Tensor]],
                         read_float: Callable[[GGUFTensor], torch.Tensor], *, dtype: torch.dtype,
                         device: torch.device | str | None,
                         source: str) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
    """interp's state dict of a GGUF file whose quantised tensors stay quantised.

    Every weight matrix (2-D tensor) goes through the converter as tags. A parameter built only from float
    matrices becomes a float tensor as on the float path; one built from quantised rows (alone, or fused with
    float rows) becomes a :class:`~interp.quantized.QuantizedWeight` whose parts keep each source's bytes.

    Args:
        reader: the parsed file.
        hf_cfg: :func:`interp.zoo.gguf.hf_config_from_gguf` output.
        floats: the Hugging Face state dict of the file's other tensors (1-D: norms, biases), dequantised,
            transforms undone; it is emptied on the way.
        hf_tensors: ``(GGUF name, tensor) -> {HF name: tensor}``, the float path's renaming and transforms.
        read_float: a float-typed tensor of the file as ``[rows, cols]`` in ``dtype`` on ``device``.
        dtype: the compute dtype of the quantised weights.
        device: where their bytes go.
        source: named in errors.

    Returns:
        ``(float tensors by interp key, quantised weights by interp key)``.

    Raises:
        GGUFError: a block type or tensor that cannot stay quantised (:func:`check_keepable`), a converter that
            does more than reorder the rows of a weight matrix, or a parameter whose rows come from tensors of
            different widths (each named).
    """
    check_keepable(reader, source)
    tagged = [t for t in reader.tensors if len(t.shape) == 2]
    make_cfg, make_sd = converter(hf_cfg)
    cfg = make_cfg(hf_cfg)
    ours, sources = _row_sources(reader, tagged, floats, make_sd, cfg, hf_tensors, hf_cfg, dtype, source)
    floats.clear()
    segments: dict[str, list[tuple[int, torch.Tensor]]] = {}  # key -> [(tensor index, its rows)], top to bottom
    users: dict[int, int] = {}
    for key, (ids, rows) in sources.items():
        change = torch.nonzero(ids[1:] != ids[:-1]).flatten().add(1).tolist()
        segments[key] = [(int(ids[a]), rows[a:b]) for a, b in zip([0, *change], [*change, ids.shape[0]])]
        for i, _ in segments[key]:
            users[i] = users.get(i, 0) + 1
    loaded: dict[int, torch.Tensor] = {}
    quantized: dict[str, QuantizedWeight] = {}
    for key, segs in segments.items():
        cols = {int(tagged[i].shape[0]) for i, _ in segs}
        if len(cols) != 1:
            raise GGUFError(f"{source}: {key!r} joins weight matrices of different widths {sorted(cols)}")
        as_float = not any(is_kept(tagged[i]) for i, _ in segs)  # no quantised rows: a float parameter
        parts = []
        for i, sel in segs:
            t = tagged[i]
            if i not in loaded:
                loaded[i] = read_float(t) if as_float else _read_rows(reader, t)
            whole = sel.shape[0] == loaded[i].shape[0] and torch.equal(sel, torch.arange(sel.shape[0]))
            rows_of = loaded[i] if whole else loaded[i].index_select(0, sel.to(loaded[i].device))
            parts.append((t.tensor_type.name, rows_of))
            users[i] -= 1
            if users[i] == 0:
                del loaded[i]  # read once, freed once the last parameter built from it has its rows
        if as_float:
            ours[key] = parts[0][1] if len(parts) == 1 else torch.cat([p for _, p in parts])  # [R, C]
            continue
        weight = QuantizedWeight(parts, cols=cols.pop(), dtype=dtype)
        quantized[key] = weight.to(device) if device is not None else weight
    return ours, quantized


__all__ = ["WIDE_TAG_LIMIT", "check_keepable", "is_kept", "quantized_state_dict", "stored_bytes"]
