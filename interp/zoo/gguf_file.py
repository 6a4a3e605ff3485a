"""A bounded reader of the GGUF container format: metadata and the tensor table, every size checked.

The ``gguf`` package's own reader trusts the file: a count of 10**18 metadata entries or array items makes
it loop for hours, a string length past the end gives an IndexError, and a 200-dimension tensor is read as
declared. GGUF files are shared widely and parsers of them have a public record of memory-safety bugs, so
this module reads the header itself. Every count and length is checked against the bytes that are left
before anything is built, every tensor's byte range is checked against the file, and every error is a
:class:`GGUFError` that names the file and the key or tensor concerned. The tensors' bytes stay in the
memory map (nothing is copied); dequantising is the ``gguf`` package's job (:mod:`interp.zoo.gguf`).

Layout (little-endian): ``b"GGUF"``, version ``u32`` (2 or 3), tensor count ``u64``, metadata count
``u64``, the metadata entries (key string, value type ``u32``, value), the tensor table (name, dimension
count ``u32``, dimensions ``u64`` fastest first, type ``u32``, offset ``u64``), padding to
``general.alignment`` (32 by default), then the tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..families._gguf import GGUFError

_GGUF_EXTRA = "pip install interp[gguf]"


def _gguf() -> Any:
    """The ``gguf`` package (llama.cpp's reader and quantisation code).

    Raises:
        ImportError: it is not installed (naming the extra that installs it).
    """
    try:
        import gguf
    except ImportError as e:
        raise ImportError(f"reading GGUF files needs the gguf package: {_GGUF_EXTRA}") from e
    return gguf

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 2  # arrays of arrays: llama.cpp writes none; one level is allowed, deeper is refused
DEFAULT_ALIGNMENT = 32

# value type -> (struct code, size); 8 = string, 9 = array
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
            7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "u1", 10: "<u8", 11: "<i8",
          12: "<f8"}
_STRING, _ARRAY = 8, 9
_MIN_VALUE = {**{k: s for k, (_, s) in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}
_MIN_KV = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # name length, dimension count, type, offset


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of the tensor table.

    ``shape`` lists the dimensions fastest first, as GGUF does (a ``[576, 49152]`` tensor is a
    ``[49152, 576]`` matrix); ``data`` is a read-only view of the file's bytes in the layout
    ``gguf.quants.dequantize`` takes (elements for float types, bytes for quantised ones).
    """

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


@dataclass
class GGUFFile:
    """A parsed GGUF file: ``metadata`` (key -> Python value) and ``tensors`` (the table, in file order)."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]
    alignment: int
    data_offset: int
    size: int


class _Cursor:
    """Reads little-endian values from a buffer, refusing any read past its end with the file named."""

    def __init__(self, buf, where: str) -> None:
        self.buf, self.pos, self.size, self.where = buf, 0, len(buf), where

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.where}: {what}")

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        if n < 0 or n > self.left():
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos}, but the file has only {self.left()} "
                            f"left (truncated or corrupt)")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, code: str, size: int, what: str):
        return struct.unpack_from("<" + code, self.buf, self.take(size, what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("Q", 8, f"the length of {what}")
        start = self.take(n, f"{what} ({n} bytes declared)")
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 (byte {e.start} of the string at offset {start})") from None


def _value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype in _SCALARS:
        value = cur.scalar(*_SCALARS[vtype], f"the value of {key!r}")
        return bool(value) if vtype == 7 else value
    if vtype == _STRING:
        return cur.string(f"the value of {key!r}")
    if vtype != _ARRAY:
        raise cur.fail(f"key {key!r} has unknown value type {vtype}")
    if depth >= MAX_NESTING:
        raise cur.fail(f"key {key!r}: arrays nested deeper than {MAX_NESTING} levels are not supported")
    itype = cur.scalar("I", 4, f"the item type of {key!r}")
    count = cur.scalar("Q", 8, f"the item count of {key!r}")
    if itype not in _MIN_VALUE:
        raise cur.fail(f"key {key!r} is an array of unknown value type {itype}")
    if count * _MIN_VALUE[itype] > cur.left():
        raise cur.fail(f"key {key!r} declares {count} items, more than the {cur.left()} bytes left can hold")
    if itype in _NUMPY:  # numbers in one read, not one struct call per item
        start = cur.take(count * _SCALARS[itype][1], f"the items of {key!r}")
        items = np.frombuffer(cur.buf, dtype=_NUMPY[itype], count=count, offset=start)
        return [bool(v) for v in items] if itype == 7 else items.tolist()
    return [_value(cur, itype, f"{key}[{i}]", depth + 1) for i in range(count)]


def _quant_types():
    g = _gguf()
    return g.GGMLQuantizationType, g.GGML_QUANT_SIZES, g.quants.quant_shape_to_byte_shape


_ITEM_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64}


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF file's metadata and tensor table, checking every size against the file.

    Args:
        path: the ``.gguf`` file.

    Returns:
        A :class:`GGUFFile`; tensor data stays memory-mapped (nothing is dequantised).

    Raises:
        FileNotFoundError: no file at ``path``.
        TypeError: ``path`` is not a str or Path.
        GGUFError: (a ValueError) not GGUF, an unsupported version or byte order, a count, length or
            shape that the file cannot hold, invalid UTF-8, a duplicate key or tensor, or a tensor whose
            bytes lie outside the file; the message names the file and the key or tensor.

    Example:
        >>> from interp.zoo.gguf_file import read_gguf
        >>> import gguf, numpy as np, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "t.gguf")
        >>> w = gguf.GGUFWriter(p, "llama"); w.add_block_count(1)
        >>> w.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
        >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        >>> f = read_gguf(p)
        >>> f.metadata["llama.block_count"], f.tensors[0].name, f.tensors[0].shape.tolist()
        (1, 'output_norm.weight', [4])
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or Path to a .gguf file, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    where = str(path)
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size < 4 + 4 + 8 + 8:
            head = f.read(4)
            raise GGUFError(f"{where} is not a readable GGUF file: {size} bytes, too short for a GGUF header"
                            + ("" if head == MAGIC[:len(head)] else f" (starts with {head!r})"))
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return _parse(buf, path, size)


def _parse(buf, path: Path, size: int) -> GGUFFile:
    where = str(path)
    cur = _Cursor(buf, where)
    magic = bytes(buf[:4])
    if magic != MAGIC:
        raise GGUFError(f"{where} is not a readable GGUF file: magic {magic!r}, expected {MAGIC!r}")
    cur.pos = 4
    version = cur.scalar("I", 4, "GGUF.version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in VERSIONS:
            raise GGUFError(f"{where}: GGUF.version reads as big-endian {swapped}; big-endian GGUF files are "
                            f"not supported (convert with llama.cpp's gguf tools)")
        raise GGUFError(f"{where}: GGUF.version {version} is not supported; this reader reads {list(VERSIONS)}")
    n_tensors = cur.scalar("Q", 8, "GGUF.tensor_count")
    n_kv = cur.scalar("Q", 8, "GGUF.kv_count")
    if n_kv * _MIN_KV > cur.left():
        raise GGUFError(f"{where}: GGUF.kv_count = {n_kv} metadata entries cannot fit in the {cur.left()} bytes "
                        f"left")
    if n_tensors * _MIN_TENSOR_INFO > cur.left():
        raise GGUFError(f"{where}: GGUF.tensor_count = {n_tensors} tensors cannot fit in the {cur.left()} bytes "
                        f"left")
    meta: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        vtype = cur.scalar("I", 4, f"the value type of {key!r}")
        if key in meta:
            raise GGUFError(f"{where}: metadata key {key!r} appears twice")
        meta[key] = _value(cur, vtype, key)
        if n_tensors * _MIN_TENSOR_INFO > cur.left():
            raise GGUFError(f"{where}: GGUF.tensor_count = {n_tensors} tensors cannot fit in the {cur.left()} "
                            f"bytes left after {key!r}")
    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
            or alignment & (alignment - 1):
        raise GGUFError(f"{where}: general.alignment = {alignment!r} must be a power of two")

    qtype, qsizes, byte_shape = _quant_types()
    table = []
    for i in range(n_tensors):
        name = cur.string(f"the name of tensor #{i}")
        n_dims = cur.scalar("I", 4, f"the dimension count of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{where}: tensor {name!r} declares {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
        start = cur.take(8 * n_dims, f"the dimensions of tensor {name!r}")
        dims = np.frombuffer(buf, dtype="<u8", count=n_dims, offset=start).copy()
        raw_type = cur.scalar("I", 4, f"the type of tensor {name!r}")
        offset = cur.scalar("Q", 8, f"the data offset of tensor {name!r}")
        table.append((name, dims, raw_type, offset))
    data_offset = -(-cur.pos // alignment) * alignment

    tensors, seen, ranges = [], set(), []
    for name, dims, raw_type, offset in table:
        if name in seen:
            raise GGUFError(f"{where}: tensor {name!r} appears twice in the tensor table")
        seen.add(name)
        try:
            ttype = qtype(raw_type)
            block, type_size = qsizes[ttype]
        except (ValueError, KeyError):
            raise GGUFError(f"{where}: tensor {name!r} has unknown type {raw_type}") from None
        shape = [int(d) for d in dims]  # Python ints: no overflow whatever the file declares
        if min(shape) < 1:
            raise GGUFError(f"{where}: tensor {name!r} has shape {shape} with an empty dimension")
        if shape[0] % block:
            raise GGUFError(f"{where}: tensor {name!r} ({ttype.name}) has a first dimension {shape[0]} that is not "
                            f"a multiple of its block of {block}")
        n_elements = int(np.prod(shape, dtype=object))
        n_bytes = n_elements // block * type_size
        begin = data_offset + offset
        if offset % alignment or begin + n_bytes > size:
            raise GGUFError(f"{where}: tensor {name!r} ({ttype.name}, shape {shape}) declares {n_bytes} bytes at "
                            f"offset {begin}, outside the file's {size} bytes or misaligned")
        ranges.append((begin, begin + n_bytes, name))
        np_shape = tuple(reversed(shape))
        if ttype.name in _ITEM_DTYPES:
            data = np.frombuffer(buf, dtype=np.dtype(_ITEM_DTYPES[ttype.name]).newbyteorder("<"),
                                 count=n_elements, offset=begin).reshape(np_shape)
        else:
            data = np.frombuffer(buf, dtype=np.uint8, count=n_bytes, offset=begin).reshape(
                byte_shape(np_shape, ttype))
        tensors.append(GGUFTensor(name, ttype, dims, n_elements, n_bytes, begin, data))
    ranges.sort()
    for (_, end, a), (begin, _, b) in zip(ranges, ranges[1:]):
        if begin < end:
            raise GGUFError(f"{where}: tensors {a!r} and {b!r} overlap in the file")
    return GGUFFile(path, version, meta, tensors, alignment, data_offset, size)


__all__ = ["GGUFError", "GGUFFile", "GGUFTensor", "read_gguf"]
