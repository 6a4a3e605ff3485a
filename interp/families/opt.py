"""OPT (pre-LayerNorm sizes): learned positions past OPT's offset of 2, counted over real tokens only
(``positions_from_mask``: a left-padded row starts at 0), ReLU MLP; ``project_in`` / ``project_out`` and
post-LayerNorm OPT-350m refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import Activation, ModelConfig
from ._base import StateDict, _activation, _decoder_checks, _need, _refuse
from ._family import CompatConfig, Family
from ._tensors import (
    _lm_head,
    _Source,
)

#: The ``activation_function`` values this family's transformers code accepts, as our activations.
_ACTIVATIONS: dict[str, Activation] = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_new", "silu": "silu"}


def opt_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an OPT decoder (pre-LayerNorm variants: OPT-125m, 1.3b and up): learned positions
    whose table starts 2 rows in (the converter drops the offset rows), ReLU MLP, biases (``enable_bias``).

    Raises:
        ValueError: ``word_embed_proj_dim`` other than ``hidden_size`` (``project_in`` / ``project_out``, OPT-350m),
            ``do_layer_norm_before=False``, ``_remove_final_layer_norm``, an unsupported activation, or a missing key.

    Example:
        >>> from interp.families.opt import opt_config
        >>> cfg = opt_config({"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "ffn_dim": 96,
        ...                   "num_hidden_layers": 2, "vocab_size": 50, "max_position_embeddings": 64,
        ...                   "word_embed_proj_dim": 64})
        >>> cfg.positional, cfg.activation, cfg.tie_embeddings
        ('learned', 'relu', True)
    """
    arch = "opt"
    _decoder_checks(hf_cfg, arch)
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    _refuse(arch, hf_cfg, (("word_embed_proj_dim", d_model, d_model), ("do_layer_norm_before", True, True),
                           ("_remove_final_layer_norm", False, False)))
    activation = _activation(hf_cfg, "activation_function", "relu", arch, _ACTIVATIONS)
    bias = bool(hf_cfg.get("enable_bias", True))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_mlp=_need(hf_cfg, "ffn_dim", arch), activation=activation, d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "max_position_embeddings", arch), normalization="pre", norm_eps=1e-5,
        positional="learned", positions_from_mask=True, attn_bias=bias, out_bias=bias, mlp_bias=bias, unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", True)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def opt_state_dict_for(hf_cfg: Mapping[str, Any]) -> Callable[[StateDict, ModelConfig], dict[str, torch.Tensor]]:
    """The state-dict function of an OPT config: positions from row 2 of ``embed_positions`` (OPT's offset);
    LayerNorms without weights (``layer_norm_elementwise_affine=False``) get weight 1 and bias 0.

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    affine = bool(hf_cfg.get("layer_norm_elementwise_affine", True))

    def convert(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
        src = _Source(hf_sd, ("model.decoder.", "decoder."), "OPT")
        embed = src("embed_tokens.weight")
        one, zero = torch.ones(cfg.d_model, dtype=embed.dtype), torch.zeros(cfg.d_model, dtype=embed.dtype)

        def norm(ours: str, theirs: str) -> dict[str, torch.Tensor]:
            if not affine:
                return {f"{ours}.weight": one.clone(), f"{ours}.bias": zero.clone()}
            return {f"{ours}.{kind}": src(f"{theirs}.{kind}") for kind in ("weight", "bias")}

        out = {"W_E.weight": embed, "W_pos.weight": src("embed_positions.weight")[2:2 + cfg.n_ctx],
               **norm("ln_final", "final_layer_norm")}
        kinds = ("weight", "bias") if cfg.attn_bias else ("weight",)
        for i in range(cfg.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            for kind in kinds:
                out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                    [src(h + f"self_attn.{n}_proj.{kind}") for n in ("q", "k", "v")])  # [3 H D(, M)]
                out[b + f"attn.W_O.{kind}"] = src(h + f"self_attn.out_proj.{kind}")
                out[b + f"mlp.W_in.{kind}"] = src(h + f"fc1.{kind}")
                out[b + f"mlp.W_out.{kind}"] = src(h + f"fc2.{kind}")
            out.update(norm(b + "ln1", h + "self_attn_layer_norm"))
            out.update(norm(b + "ln2", h + "final_layer_norm"))
        out.update(_lm_head(hf_sd, src, cfg, "OPT"))
        return out

    return convert


#: Random tiny test configs of :mod:`interp.zoo.compat` (row -> HF model_type and config), chosen so that each
#: feature changes the logits.
TESTS = {
    "opt": CompatConfig("opt", dict(hidden_size=80, ffn_dim=96, num_attention_heads=5, word_embed_proj_dim=80)),
}


FAMILY = Family("opt", ("opt",), opt_config, opt_state_dict_for, tests=TESTS)
