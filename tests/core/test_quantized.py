"""interp.quantized: torch dequantisation against the gguf package's numpy reference, and the quantised layers
against the float layers they replace."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from interp import quantized as qz
from interp.quantized import (
    QUANT_TYPES,
    QuantizedEmbedding,
    QuantizedLinear,
    QuantizedWeight,
    dequantize,
    dequantize_model,
    has_quantized,
    refuse_quantized,
    row_bytes,
)

gguf = pytest.importorskip("gguf")

LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # the gguf package quantises to these
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")  # it only dequantises these: random blocks with finite scales
K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # byte offsets of each block's float16 scales


def blocks_of(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """``[rows, bytes per row]`` uint8 of a random ``[rows, cols]`` matrix stored in ``kind``."""
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[kind]
    if kind in LEGACY:
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for off in K_SCALES[kind]:
        b[:, off:off + 2] = rng.uniform(-0.05, 0.05, b.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, -1)


def reference(kind: str, b: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(b, gguf.GGMLQuantizationType[kind]))


@pytest.mark.parametrize("kind", LEGACY + K_QUANTS)
def test_dequantize_matches_the_gguf_package_bit_for_bit(kind):
    b = blocks_of(kind, 5, 512)
    assert row_bytes(kind, 512) == b.shape[1] == 512 // QUANT_TYPES[kind][0] * QUANT_TYPES[kind][1]
    ours = dequantize(torch.from_numpy(b.copy()), kind, 512)
    assert ours.dtype == torch.float32 and ours.shape == (5, 512)
    assert torch.equal(ours, reference(kind, b))


def test_every_type_the_table_lists_is_tested():
    assert set(QUANT_TYPES) == set(LEGACY + K_QUANTS)


def test_bad_block_sizes_and_types_are_refused_by_name():
    with pytest.raises(ValueError, match=r"Q4_K.*256.*100 columns"):
        row_bytes("Q4_K", 100)
    with pytest.raises(ValueError, match=r"'Q3_K' is not supported"):
        row_bytes("Q3_K", 256)
    with pytest.raises(ValueError, match=r"Q8_0 rows of 64 values take 68 bytes.*\(3, 60\)"):
        dequantize(torch.zeros(3, 60, dtype=torch.uint8), "Q8_0", 64)
    with pytest.raises(TypeError, match="uint8"):
        dequantize(torch.zeros(3, 68), "Q8_0", 64)
    with pytest.raises(ValueError, match=r"part 1: Q4_0 rows of 64 values take 36 bytes.*\(2, 34\)"):
        QuantizedWeight([("Q4_0", torch.zeros(2, 36, dtype=torch.uint8)),
                         ("Q4_0", torch.zeros(2, 34, dtype=torch.uint8))], cols=64)


def mixed_weight() -> tuple[QuantizedWeight, torch.Tensor]:
    """A [12 + 7 + 5, 256] weight fused from three row ranges in three types (as a W_qkv of Q8_0 / Q6_K / F16)."""
    a, b = blocks_of("Q8_0", 12, 256, 1), blocks_of("Q6_K", 7, 256, 2)
    c = torch.randn(5, 256, generator=torch.Generator().manual_seed(3)).half()
    w = QuantizedWeight([("Q8_0", torch.from_numpy(a)), ("Q6_K", torch.from_numpy(b)),
                         ("F16", c.view(torch.uint8))], cols=256)
    return w, torch.cat([reference("Q8_0", a), reference("Q6_K", b), c.float()])


def test_mixed_parts_dequantize_and_report_their_bytes():
    w, dense = mixed_weight()
    assert torch.equal(w.dequantize(), dense)
    assert w.shape == (24, 256) and w.nbytes == 12 * 272 + 7 * 210 + 5 * 512
    assert "Q8_0+Q6_K+F16" in repr(w) and f"{w.nbytes:,} bytes stored" in repr(w)


def test_linear_forward_equals_f_linear_on_the_dequantised_weight(monkeypatch):
    w, dense = mixed_weight()
    bias = nn.Parameter(torch.randn(24))
    layer = QuantizedLinear(w, bias)
    x = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(4))
    want = F.linear(x, dense, bias)
    assert torch.equal(layer(x), want)
    monkeypatch.setattr(qz, "CHUNK_BYTES", 5 * 256 * 4)  # five rows at a time: chunks cross the parts
    assert len(list(w.row_chunks(max_bytes=qz.CHUNK_BYTES))) == 3 + 2 + 1
    scale = float((x.abs() @ dense.abs().T).max())  # float32 rounding of a sum grows with its terms' size
    torch.testing.assert_close(layer(x), want, rtol=0, atol=1e-6 * scale)


def test_gradients_reach_the_input_never_the_blocks():
    w, dense = mixed_weight()
    layer = QuantizedLinear(w, None)
    x = torch.randn(4, 256, requires_grad=True)
    layer(x).pow(2).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    F.linear(x2, dense).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    assert list(layer.parameters()) == [] and all(b.grad is None for b in layer.buffers())


def test_embedding_dequantizes_only_the_rows_it_reads():
    w, dense = mixed_weight()
    emb = QuantizedEmbedding(w)
    tokens = torch.tensor([[0, 23, 12, 12], [18, 19, 5, 11]])  # every part, and a repeat
    assert torch.equal(emb(tokens), F.embedding(tokens, dense))


def test_casts_change_the_compute_dtype_not_the_blocks():
    w, dense = mixed_weight()
    layer = QuantizedLinear(w, None).to(torch.bfloat16)
    assert w.part0.dtype == torch.uint8 and layer.weight.dtype == torch.bfloat16
    assert torch.equal(layer.weight, dense.to(torch.bfloat16))


def test_dequantize_model_gives_float_layers_and_keeps_ties():
    w, dense = mixed_weight()
    model = nn.Module()
    model.embed, model.unembed = QuantizedEmbedding(w), QuantizedLinear(w, None)
    assert has_quantized(model)
    with pytest.raises(ValueError, match=r"remove_heads needs float weights.*Q8_0\+Q6_K\+F16.*dequantize_model"):
        refuse_quantized(model, "remove_heads")
    dequantize_model(model)
    assert not has_quantized(model)
    assert isinstance(model.unembed, nn.Linear) and model.unembed.weight is model.embed.weight
    assert torch.equal(model.embed.weight, dense)


def test_assigning_a_weight_is_refused():
    w, _ = mixed_weight()
    layer = QuantizedLinear(w, None)
    with pytest.raises(ValueError, match=r"QuantizedLinear.weight is dequantised.*cannot be assigned"):
        layer.weight = nn.Parameter(torch.zeros(24, 256))
