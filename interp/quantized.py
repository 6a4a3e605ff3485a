"""Weights that stay quantised: GGUF blocks kept as bytes, dequantised by a layer when it uses them.

A quantised GGUF file stores each weight matrix row by row in fixed-size blocks (32 or 256 values, each block a
few bytes of scales and packed integers). :class:`QuantizedWeight` keeps those bytes as ``uint8`` buffers, and
:class:`QuantizedLinear` / :class:`QuantizedEmbedding` take the place of ``nn.Linear`` / ``nn.Embedding``:
their ``weight`` is a property that dequantises on access, their forward dequantises a few rows at a time. The
model's forward, hooks, caches and every analysis are unchanged; only where a weight comes from differs.

Supported block types (llama.cpp's names): ``Q8_0``, ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q4_K``,
``Q5_K``, ``Q6_K``. Dequantisation is vectorised torch on the buffers' device (CPU or GPU), operation for
operation as the ``gguf`` package's numpy reference does it, so the values are the same floats.

The blocks are buffers, not parameters: ``model.parameters()`` and so every optimiser see only the float
tensors (norms, biases), and gradients flow through a quantised layer to its input, never into its blocks.
Assigning a new ``weight`` to a quantised layer, and edits that rewrite weights (physical head removal,
:func:`interp.pruning.remove_heads`), are refused by name (:func:`refuse_quantized`); :func:`dequantize_model`
turns a model back into float layers for them.

Shapes: R rows (output features), C columns (input features), N blocks, Q bytes per block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

QK_K = 256  # values per block of the K-quants

#: block type -> (values per block, bytes per block), as ggml defines them.
QUANT_TYPES: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 2 + 16),
    "Q4_1": (32, 2 + 2 + 16),
    "Q5_0": (32, 2 + 4 + 16),
    "Q5_1": (32, 2 + 2 + 4 + 16),
    "Q8_0": (32, 2 + 32),
    "Q4_K": (QK_K, 2 + 2 + 12 + QK_K // 2),
    "Q5_K": (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    "Q6_K": (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}

#: Float types a part of a weight may also be stored in: a fused weight (W_qkv) whose Q is Q4_K and whose V is
#: F16 keeps each part as the file stores it.
FLOAT_TYPES: dict[str, torch.dtype] = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

#: Dequantise at most this many float bytes of a weight at once (the rest of the rows wait their turn), so a
#: [128256, 4096] unembedding never exists in float32 all at once. Dequantising makes a few temporaries of a
#: chunk's size; 16 MB chunks keep them small, and SmolLM2's forward takes the same time in chunks of 4-64 MB.
CHUNK_BYTES = 16 * 2**20


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes per row ``[N, 2]`` -> their float16 value as float32 ``[N, 1]``."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """Packed 4-bit values ``[N, groups * width]`` -> ``[N, groups, 2, width]``: the low nibbles of a group of
    ``width`` bytes, then its high nibbles (ggml's order)."""
    qs = qs.reshape(qs.shape[0], groups, 1, width)  # [N, g, 1, w]
    return torch.cat([qs & 0x0F, qs >> 4], dim=2)  # [N, g, 2, w]


def _bits(b: torch.Tensor, shifts: Sequence[int], mask: int) -> torch.Tensor:
    """``[N, g, w]`` bytes -> ``[N, g, len(shifts), w]``: each byte shifted right by each shift, masked."""
    return torch.stack([(b >> s) & mask for s in shifts], dim=2)


def _q4_k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 6-bit scales and mins of a Q4_K / Q5_K block, 12 bytes ``[N, 12]`` -> two ``[N, 8]``."""
    s = scales.reshape(-1, 3, 4)  # [N, 3, 4]
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)  # [N, 8]
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)  # [N, 8]
    return sc, mn


def _dequantize_blocks(b: torch.Tensor, kind: str) -> torch.Tensor:
    """Blocks ``[N, Q]`` (uint8) -> values ``[N, block]`` (float32), as ``gguf.quants`` computes them."""
    n = b.shape[0]
    if kind == "Q8_0":
        return b[:, 2:].view(torch.int8).float() * _f16(b[:, :2])
    if kind in ("Q4_0", "Q4_1"):
        start = 2 if kind == "Q4_0" else 4
        qs = b[:, start:]  # [N, 16]
        # Written into one float buffer, low nibbles then high ones (half the passes of unpack-then-convert;
        # q - 8 is exact in float32, so the values are the reference's).
        q = torch.empty(n, 32, dtype=torch.float32, device=b.device)  # [N, 32]
        q[:, :16] = qs & 0x0F
        q[:, 16:] = qs >> 4
        if kind == "Q4_0":
            return q.sub_(8).mul_(_f16(b[:, :2]))
        return q.mul_(_f16(b[:, :2])).add_(_f16(b[:, 2:4]))
    if kind in ("Q5_0", "Q5_1"):
        start = 2 if kind == "Q5_0" else 4
        qh = _bits(b[:, start:start + 4].reshape(n, 4, 1), range(8), 1)  # [N, 4, 8, 1]: bit k of byte j
        ql = _nibbles(b[:, start + 4:], 1, 16).reshape(n, 32)  # [N, 32]
        q = ql | (qh.reshape(n, 32) << 4)  # [N, 32]
        if kind == "Q5_0":
            return _f16(b[:, :2]) * (q.to(torch.int8) - 16).float()
        return _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])
    if kind in ("Q4_K", "Q5_K"):
        sc, mn = _q4_k_scales(b[:, 4:16])
        d = (_f16(b[:, :2]) * sc.float()).reshape(n, 8, 1)  # [N, 8, 1]
        dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)  # [N, 8, 1]
        if kind == "Q4_K":
            q = _nibbles(b[:, 16:], 4, 32).reshape(n, 8, 32)  # [N, 8, 32]
        else:
            qh = _bits(b[:, 16:48].reshape(n, 1, 32), range(8), 1).reshape(n, 8, 32)  # [N, 8, 32]
            q = _nibbles(b[:, 48:], 4, 32).reshape(n, 8, 32) | (qh << 4)  # [N, 8, 32]
        return (d * q.float() - dm).reshape(n, QK_K)
    if kind == "Q6_K":
        ql = _nibbles(b[:, :128], 2, 64).reshape(n, 8, 32)  # [N, 8, 32]
        qh = _bits(b[:, 128:192].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 8, 32)  # [N, 8, 32]
        scales = b[:, 192:208].view(torch.int8).float()  # [N, 16]
        d = (_f16(b[:, 208:210]) * scales).reshape(n, 16, 1)  # [N, 16, 1]
        q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()  # [N, 16, 16]
        return (d * q).reshape(n, QK_K)
    raise ValueError(f"block type {kind!r} is not supported; supported: {sorted(QUANT_TYPES)}")


def row_bytes(kind: str, cols: int) -> int:
    """Bytes of one row of ``cols`` values stored in block type ``kind``.

    Raises:
        ValueError: an unknown type, or ``cols`` not a multiple of the type's block (both named).

    Example:
        >>> from interp.quantized import row_bytes
        >>> row_bytes("Q4_0", 64)
        36
    """
    if kind in FLOAT_TYPES:
        return cols * torch.empty((), dtype=FLOAT_TYPES[kind]).element_size()
    if kind not in QUANT_TYPES:
        raise ValueError(f"block type {kind!r} is not supported; supported: {sorted(QUANT_TYPES)} "
                         f"(and {sorted(FLOAT_TYPES)})")
    block, size = QUANT_TYPES[kind]
    if cols <= 0 or cols % block:
        raise ValueError(f"a {kind} row holds whole blocks of {block} values; {cols} columns is not a multiple")
    return cols // block * size


def dequantize(blocks: torch.Tensor, kind: str, cols: int) -> torch.Tensor:
    """Rows of blocks ``[R, bytes per row]`` (uint8) -> ``[R, cols]`` float32, on the blocks' device.

    Args:
        blocks: the raw bytes, one row of the matrix per row.
        kind: the block type (a key of :data:`QUANT_TYPES` or :data:`FLOAT_TYPES`).
        cols: values per row.

    Returns:
        The float32 matrix, value for value what ``gguf.quants.dequantize`` gives.

    Raises:
        ValueError: an unknown type, or a row length that is not whole blocks of ``kind`` (named with sizes).
        TypeError: ``blocks`` is not uint8.

    Example:
        >>> import torch
        >>> from interp.quantized import dequantize
        >>> b = torch.zeros(1, 34, dtype=torch.uint8); b[0, 1] = 0x3C; b[0, 2] = 3  # d = 1.0, q[0] = 3
        >>> dequantize(b, "Q8_0", 32)[0, :3]
        tensor([3., 0., 0.])
    """
    if blocks.dtype != torch.uint8:
        raise TypeError(f"quantised blocks must be uint8 bytes, got {blocks.dtype}")
    want = row_bytes(kind, cols)
    if blocks.dim() != 2 or blocks.shape[1] != want:
        raise ValueError(f"{kind} rows of {cols} values take {want} bytes each; got blocks of shape "
                         f"{tuple(blocks.shape)}")
    rows = blocks.shape[0]
    if kind in FLOAT_TYPES:
        return blocks.contiguous().view(FLOAT_TYPES[kind]).float()  # [R, C * size] bytes -> [R, C]
    size = QUANT_TYPES[kind][1]
    values = _dequantize_blocks(blocks.reshape(-1, size), kind)  # [N, block]
    return values.reshape(rows, cols)  # [N, block] -> [R, C]


class QuantizedWeight(nn.Module):
    """A ``[rows, cols]`` weight stored as quantised blocks: one or more row ranges (segments), each in its own
    block type (llama.cpp may store Q, K and V in different types; fused here they stay as stored).

    The bytes are buffers (``part0``, ``part1``, ...): ``.to(device)`` moves them, dtype casts leave them alone.

    Args:
        parts: ``[(block type, uint8 tensor [rows_i, bytes per row])]``, top to bottom.
        cols: values per row.
        dtype: the dtype dequantised values are returned in (the model's compute dtype).

    Raises:
        ValueError: no parts, an unknown block type, or a part whose row length does not match ``cols``.

    Example:
        >>> import torch
        >>> from interp.quantized import QuantizedWeight
        >>> w = QuantizedWeight([("Q8_0", torch.zeros(3, 34, dtype=torch.uint8))], cols=32)
        >>> w.shape, w.nbytes, w.dequantize().shape
        ((3, 32), 102, torch.Size([3, 32]))
    """

    def __init__(self, parts: Sequence[tuple[str, torch.Tensor]], *, cols: int,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if not parts:
            raise ValueError("a quantised weight needs at least one part")
        self.kinds: list[str] = []
        self.cols = cols
        # An empty float buffer: module casts (model.to(torch.bfloat16)) change its dtype, and with it the dtype
        # the weight is dequantised to; the blocks themselves are uint8 and stay as they are.
        self.register_buffer("compute", torch.empty(0, dtype=dtype))
        for i, (kind, blocks) in enumerate(parts):
            want = row_bytes(kind, cols)
            if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != want:
                raise ValueError(f"part {i}: {kind} rows of {cols} values take {want} bytes each; got a "
                                 f"{blocks.dtype} tensor of shape {tuple(blocks.shape)}")
            self.kinds.append(kind)
            self.register_buffer(f"part{i}", blocks)
        self.rows = sum(int(b.shape[0]) for _, b in parts)

    def parts(self) -> list[tuple[str, torch.Tensor]]:
        """``[(block type, bytes [rows_i, bytes per row])]``, top to bottom."""
        return [(k, getattr(self, f"part{i}")) for i, k in enumerate(self.kinds)]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        """Bytes stored (the blocks), against ``rows * cols * 4`` in float32."""
        return sum(b.numel() for _, b in self.parts())

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weight is dequantised to (follows the model's casts)."""
        return self._buffers["compute"].dtype  # type: ignore[union-attr]

    @property
    def device(self) -> torch.device:
        return self._buffers["compute"].device  # type: ignore[union-attr]

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The whole matrix ``[rows, cols]`` in ``dtype`` (default: :attr:`dtype`)."""
        return torch.cat([w for _, _, w in self.row_chunks(dtype, max_bytes=None)], dim=0)  # [R, C]

    def row_chunks(self, dtype: torch.dtype | None = None, *,
                   max_bytes: int | None = CHUNK_BYTES) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(first row, end row, rows dequantised [end - first, cols])``, top to bottom, each at most
        ``max_bytes`` of float32 (one row at least; None: one chunk per part)."""
        dtype = dtype or self.dtype
        per = None if max_bytes is None else max(1, max_bytes // (4 * self.cols))
        start = 0
        for kind, blocks in self.parts():
            n = blocks.shape[0]
            step = n if per is None else per
            for r in range(0, n, step):
                chunk = blocks[r:r + step]
                yield start + r, start + r + chunk.shape[0], dequantize(chunk, kind, self.cols).to(dtype)
            start += n

    def rows_at(self, index: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Only the rows ``index`` (any shape of row ids) -> ``[*index.shape, cols]``: an embedding lookup
        dequantises the tokens it reads, never the whole table."""
        dtype = dtype or self.dtype
        flat = index.reshape(-1)
        out = torch.empty(flat.shape[0], self.cols, dtype=dtype, device=self.device)  # [n, C]
        start = 0
        for kind, blocks in self.parts():
            n = blocks.shape[0]
            inside = (flat >= start) & (flat < start + n)
            if bool(inside.any()):
                out[inside] = dequantize(blocks[flat[inside] - start], kind, self.cols).to(dtype)
            start += n
        return out.reshape(*index.shape, self.cols)  # [n, C] -> [..., C]

    def describe(self) -> str:
        kinds = "+".join(dict.fromkeys(self.kinds))
        return f"{kinds}, {self.nbytes:,} bytes stored ({self.rows * self.cols * 4:,} in float32)"

    def extra_repr(self) -> str:
        return f"shape={self.shape}, {self.describe()}"


def _refuse_weight_assignment(module: nn.Module, name: str) -> None:
    q = module._modules.get("q")
    if name == "weight" and isinstance(q, QuantizedWeight):
        raise ValueError(f"{type(module).__name__}.weight is dequantised from its blocks on each read and cannot be "
                         f"assigned ({q.describe()}); call interp.quantized.dequantize_model(model) for float "
                         f"weights to train or edit")


class _Dequantizing(nn.Module):
    """A module whose ``weight`` lives in quantised blocks (``self.q``): reading ``weight`` dequantises the whole
    matrix (a fresh tensor on each read, what the weight views and analyses read); assigning it is refused."""

    q: QuantizedWeight

    @property
    def weight(self) -> torch.Tensor:
        return self.q.dequantize()

    def __setattr__(self, name: str, value: Any) -> None:
        _refuse_weight_assignment(self, name)
        super().__setattr__(name, value)


class QuantizedLinear(_Dequantizing):
    """``nn.Linear`` whose weight stays in quantised blocks; ``y = x W^T + b`` with W dequantised at use.

    ``weight`` is a property: reading it dequantises the whole matrix (what the weight views and analyses
    read); the forward dequantises :data:`CHUNK_BYTES` of rows at a time. Gradients flow to the input, never
    into the blocks.

    Args:
        weight: the stored blocks.
        bias: an ``[out_features]`` parameter, or None.

    Example:
        >>> import torch
        >>> from interp.quantized import QuantizedLinear, QuantizedWeight
        >>> q = QuantizedWeight([("Q8_0", torch.zeros(3, 34, dtype=torch.uint8))], cols=32)
        >>> QuantizedLinear(q, None)(torch.ones(2, 32)).shape
        torch.Size([2, 3])
    """

    def __init__(self, weight: QuantizedWeight, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.q = weight
        self.bias = bias
        self.in_features, self.out_features = weight.cols, weight.rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.bias
        if self.q.rows * self.q.cols * 4 <= CHUNK_BYTES:  # one product, as nn.Linear computes it
            return F.linear(x, self.q.dequantize(x.dtype), b)
        chunks = [F.linear(x, w.to(x.dtype), None if b is None else b[r0:r1])  # each [..., rows of the chunk]
                  for r0, r1, w in self.q.row_chunks()]
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=-1)  # [..., out_features]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class QuantizedEmbedding(_Dequantizing):
    """``nn.Embedding`` whose table stays in quantised blocks; a lookup dequantises only the rows it reads.

    Args:
        weight: the stored table ``[num_embeddings, embedding_dim]``.

    Example:
        >>> import torch
        >>> from interp.quantized import QuantizedEmbedding, QuantizedWeight
        >>> q = QuantizedWeight([("Q8_0", torch.zeros(5, 34, dtype=torch.uint8))], cols=32)
        >>> QuantizedEmbedding(q)(torch.tensor([[1, 4]])).shape
        torch.Size([1, 2, 32])
    """

    def __init__(self, weight: QuantizedWeight) -> None:
        super().__init__()
        self.q = weight
        self.num_embeddings, self.embedding_dim = weight.rows, weight.cols

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.q.rows_at(tokens)  # [..., embedding_dim]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


def unembed_rows(module: nn.Module, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of a linear or embedding layer's weight ``[*index.shape, in]``: for a quantised layer
    only those rows are dequantised.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from interp.quantized import unembed_rows
        >>> unembed_rows(nn.Linear(4, 10), torch.tensor([2, 7])).shape
        torch.Size([2, 4])
    """
    q = module._modules.get("q")
    if isinstance(q, QuantizedWeight):
        return q.rows_at(index)
    return cast(torch.Tensor, module.weight)[index]


def quantized_weights(model: nn.Module) -> list[tuple[str, QuantizedWeight]]:
    """Every distinct quantised weight of ``model`` with its module path (a tied one once).

    Example:
        >>> from torch import nn
        >>> from interp.quantized import quantized_weights
        >>> quantized_weights(nn.Linear(2, 2))
        []
    """
    seen: set[int] = set()
    out = []
    for name, m in model.named_modules():
        if isinstance(m, QuantizedWeight) and id(m) not in seen:
            seen.add(id(m))
            out.append((name, m))
    return out


def has_quantized(model: nn.Module) -> bool:
    """True when any of ``model``'s weights stays quantised.

    Example:
        >>> from torch import nn
        >>> from interp.quantized import has_quantized
        >>> has_quantized(nn.Linear(2, 2))
        False
    """
    return bool(quantized_weights(model))


def refuse_quantized(model: nn.Module, what: str) -> None:
    """Raise when ``model`` keeps quantised weights and ``what`` would have to rewrite or train them.

    Args:
        model: the model.
        what: the operation, named in the message (``"remove_heads"``, ``"training"``, ...).

    Raises:
        ValueError: ``model`` has quantised weights (the first is named, with how to get a float model).

    Example:
        >>> from torch import nn
        >>> from interp.quantized import refuse_quantized
        >>> refuse_quantized(nn.Linear(2, 2), "training")  # a float model passes
    """
    found = quantized_weights(model)
    if found:
        name, w = found[0]
        raise ValueError(f"{what} needs float weights, but {len(found)} weight(s) of this model stay quantised "
                         f"(e.g. {name or 'the model'}: {w.describe()}); call interp.quantized.dequantize_model("
                         f"model) first, or load with keep_quantized=False")


def dequantize_model(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Replace every quantised layer of ``model`` by its float ``nn.Linear`` / ``nn.Embedding`` (in place).

    Tied weights stay tied (one float tensor for the embedding and unembedding).

    Args:
        model: the model.
        dtype: the float weights' dtype (default: each weight's compute dtype).

    Returns:
        ``model``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from interp.quantized import QuantizedLinear, QuantizedWeight, dequantize_model
        >>> q = QuantizedWeight([("Q8_0", torch.zeros(3, 34, dtype=torch.uint8))], cols=32)
        >>> m = nn.Sequential(QuantizedLinear(q, None)); type(dequantize_model(m)[0]).__name__
        'Linear'
    """
    floats: dict[int, nn.Parameter] = {}
    for name, m in list(model.named_modules()):
        if not isinstance(m, (QuantizedLinear, QuantizedEmbedding)):
            continue
        key = id(m.q)
        if key not in floats:
            floats[key] = nn.Parameter(m.q.dequantize(dtype), requires_grad=True)
        w = floats[key]
        new: nn.Module
        if isinstance(m, QuantizedLinear):
            new = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
            new.weight = w
            if m.bias is not None:
                new.bias = m.bias
        else:
            new = nn.Embedding(m.num_embeddings, m.embedding_dim, device="meta")
            new.weight = w
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, attr, new)
    return model


__all__ = ["CHUNK_BYTES", "FLOAT_TYPES", "QUANT_TYPES", "QuantizedEmbedding", "QuantizedLinear", "QuantizedWeight", "dequantize",
           "dequantize_model", "has_quantized", "quantized_weights", "refuse_quantized", "row_bytes", "unembed_rows"]
