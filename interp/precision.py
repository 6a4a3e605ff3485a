"""The precision policy: where a model in bf16 / fp16 computes in float32 before it rounds, per family.

In float32 (and float64) the rules below change nothing: every family computes the same numbers. In half
precision the families round at different points, and matching transformers exactly needs the family's order.
Two steps differ between families; everything else follows one rule for all of them:

* **per family** (a :class:`Precision`, ``ModelConfig.precision``):

  - ``norm_weight_float32``: an RMSNorm multiplies by its weight in float32 and rounds once (Gemma, OLMo 2,
    EXAONE 4, gpt-oss), instead of rounding the normalised input first and multiplying by the weight in the
    model's dtype (Llama, Mistral, Qwen, Phi-3: the default);
  - ``rotary_float32``: rotary embeddings rotate queries and keys in float32 with float32 angles and round once
    (OLMo 2, Cohere, ERNIE 4.5, Llama 4, DeepSeek-V2), instead of rotating in the model's dtype with rounded
    angles (Llama: the default);
  - ``router_float32``: a mixture of experts' router keeps its weight and choice bias in float32 and computes its
    logits from the float32 residual (DeepSeek-V2 / V3, GLM-4-MoE: transformers keeps their gate in float32),
    instead of a router in the model's dtype (the default);
  - ``expert_weights_float32``: the experts' mixing weights stay float32, so each expert's output times its
    weight is not rounded before the float32 sum (Mixtral, DeepSeek-V2 / V3, GLM-4-MoE: their routers return
    float32 weights), instead of weights rounded to the model's dtype and rounded products (Granite-MoE, Qwen-MoE,
    OLMoE, Phi-MoE: the default).

* **every family** (no setting): attention scores, mask, soft-cap and softmax in float32 with only the pattern
  rounded for the product with v (:mod:`interp.attention`, as the fused kernels keep them); a router's scores
  in float32, and the experts' weighted outputs summed in float32 before one rounding (:mod:`interp.moe`, as
  transformers' grouped / batched experts kernels sum them); LayerNorm statistics in float32
  (``torch.nn.LayerNorm``); rotary frequencies kept in float32.

A Gemma 3-style ``local_rotary_base`` is no rounding rule: it changes the angles in float32 too, so it stays a
mechanism field of :class:`interp.ModelConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Precision", "PRECISIONS", "LEGACY_FIELDS", "precision_from"]


@dataclass(frozen=True)
class Precision:
    """Which steps a half-precision model of a family computes in float32 before rounding once.

    Args:
        norm_weight_float32: RMSNorm multiplies by its weight in float32 and rounds once (Gemma, OLMo 2).
        rotary_float32: rotary embeddings rotate queries and keys in float32 and round once (OLMo 2, Cohere).
        router_float32: the MoE router's weight, choice bias and logits stay float32 (DeepSeek, GLM-4-MoE).
        expert_weights_float32: the experts' mixing weights stay float32 (Mixtral, DeepSeek, GLM-4-MoE).

    Example:
        >>> from interp.precision import Precision
        >>> Precision.named("olmo2")
        Precision.named('olmo2')
        >>> Precision(rotary_float32=True) == Precision.named("cohere")
        True
        >>> Precision()
        Precision.named('llama')
    """

    norm_weight_float32: bool = False
    rotary_float32: bool = False
    router_float32: bool = False
    expert_weights_float32: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise TypeError(f"Precision.{f.name}={value!r} must be True or False, got {type(value).__name__}")

    @classmethod
    def named(cls, name: str) -> Precision:
        """The policy of a family by name (:data:`PRECISIONS`).

        Args:
            name: ``"llama"`` (the default), ``"gemma"``, ``"olmo2"``, ``"cohere"``, ``"mixtral"``, ``"deepseek_v2"`` or
                ``"deepseek_v3"``.

        Returns:
            The :class:`Precision` that family uses.

        Raises:
            ValueError: ``name`` is no known policy (the known ones are listed).

        Example:
            >>> from interp.precision import Precision
            >>> Precision.named("gemma").norm_weight_float32
            True
        """
        if name not in PRECISIONS:
            raise ValueError(f"precision={name!r} is no known policy; known ones are {sorted(PRECISIONS)}")
        return PRECISIONS[name]

    @property
    def name(self) -> str | None:
        """The name of the family policy this equals, or None for a combination no family uses."""
        return next((n for n, p in PRECISIONS.items() if p == self), None)

    def __repr__(self) -> str:
        name = self.name
        if name is not None:
            return f"{type(self).__name__}.named({name!r})"
        values = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({values})"


#: The family policies: which family rounds what (see the module docstring for why each differs).
PRECISIONS: dict[str, Precision] = {
    "llama": Precision(),  # Llama, Mistral, Qwen, Phi-3, GPT-2 and every family not listed: the default
    "gemma": Precision(norm_weight_float32=True),  # Gemma 1/2/3, EXAONE 4, gpt-oss
    "olmo2": Precision(norm_weight_float32=True, rotary_float32=True),  # OLMo 2 / 3
    "cohere": Precision(rotary_float32=True),  # Cohere (Command R), ERNIE 4.5, Llama 4
    "mixtral": Precision(expert_weights_float32=True),  # Mixtral: float32 mixing weights
    # DeepSeek-V2 (complex rotary), V3 and GLM-4-MoE: a float32 gate and float32 mixing weights
    "deepseek_v2": Precision(rotary_float32=True, router_float32=True, expert_weights_float32=True),
    "deepseek_v3": Precision(router_float32=True, expert_weights_float32=True),
}

#: The ModelConfig keys that held these rules before the policy (checkpoints saved then still carry them).
LEGACY_FIELDS = ("norm_weight_float32", "rotary_float32")


def precision_from(value: Any, what: str = "precision") -> Precision:
    """A :class:`Precision` from what a config may hold: a policy, its name, or its fields as a dict (JSON).

    Args:
        value: a :class:`Precision`, a name of :data:`PRECISIONS`, or a mapping of its fields.
        what: how the error names the setting.

    Returns:
        The policy.

    Raises:
        ValueError: an unknown name or unknown keys (named, with the known ones).
        TypeError: any other type, or a field that is not a bool.

    Example:
        >>> from interp.precision import precision_from
        >>> precision_from({"norm_weight_float32": True, "rotary_float32": True})
        Precision.named('olmo2')
        >>> precision_from("gemma")
        Precision.named('gemma')
    """
    if isinstance(value, Precision):
        return value
    if isinstance(value, str):
        if value not in PRECISIONS:
            raise ValueError(f"{what}={value!r} is no known policy; known ones are {sorted(PRECISIONS)}")
        return PRECISIONS[value]
    if isinstance(value, Mapping):
        fields = [f.name for f in dataclasses.fields(Precision)]
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(f"{what}: unknown key(s) {unknown}; a Precision holds {fields}")
        policy = Precision(**value)
        return PRECISIONS.get(policy.name or "", policy)  # a family's policy object itself when it is one
    raise TypeError(f"{what}={value!r} must be a Precision, a policy name or a dict of its fields, "
                    f"got {type(value).__name__}")
