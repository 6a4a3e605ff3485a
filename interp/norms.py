"""RMSNorm with the rounding order of the family a model comes from, in half precision.

In float32 (and float64) every RMSNorm is ``w * x / sqrt(mean(x^2) + eps)``, computed by PyTorch's kernel. In
bf16 / fp16 the families round differently, and exactness to transformers needs the family's order:

* Llama, Mistral, Qwen 2/3, Phi-3 (``LlamaRMSNorm``): normalise in float32, round to the model's dtype, then
  multiply by the weight in that dtype (two roundings);
* Gemma, OLMo 2: normalise and multiply by the weight in float32, round once. This is what
  ``torch.nn.RMSNorm`` computes for a half-precision input, so these norms use it as it is.

``ModelConfig.precision`` (:mod:`interp.precision`) says which a model uses. LayerNorm needs no such choice: every family
supported here calls ``torch.nn.LayerNorm``, which computes its statistics in float32 and rounds once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Half-precision dtypes: their norms follow the family's rounding order, and attention scores and softmax run
#: in float32 (interp.attention).
HALF_DTYPES = (torch.bfloat16, torch.float16)


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` that, in half precision, can round before its weight as Llama does.

    Args:
        dim: the normalised width.
        eps: added to the mean square.
        weight_float32: in bf16 / fp16, multiply by the weight in float32 and round once (Gemma, OLMo 2: PyTorch's
            own kernel) instead of rounding the normalised input to the model's dtype first (Llama). Ignored in
            float32, where both orders are the same numbers.

    Example:
        >>> import torch
        >>> from interp.norms import RMSNorm
        >>> x = torch.randn(2, 8).bfloat16()
        >>> norm = RMSNorm(8, eps=1e-6).bfloat16()
        >>> xf = x.float()
        >>> llama = norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
        >>> torch.equal(norm(x), llama)
        True
    """

    def __init__(self, dim: int, eps: float | None = None, *, weight_float32: bool = False) -> None:
        super().__init__(dim, eps=eps)
        self.weight_float32 = weight_float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_float32 or self.weight is None or x.dtype not in HALF_DTYPES:
            return super().forward(x)  # float32: PyTorch's kernel, no cast
        # Llama's order: float32 statistics, rounded to the input's dtype, then the weight in that dtype.
        return F.rms_norm(x.float(), self.normalized_shape, eps=self.eps).to(x.dtype) * self.weight

    def extra_repr(self) -> str:
        return super().extra_repr() + (", weight_float32=True" if self.weight_float32 else "")
