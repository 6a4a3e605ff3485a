"""Direct logit attribution: how much each head, MLP and embedding writes directly into a logit difference.

For a pre-norm model the final residual is a sum of parts (embeddings, every head's write ``z_h W_O[h]``,
each layer's ``b_O``, each MLP's output). The final norm is linear once its per-token scale is frozen at the
value it had in the run (TransformerLens' convention), so each part ``c`` contributes
``(w * (c - mean c) / scale) @ (W_U[:, correct] - W_U[:, wrong])`` (no centring for RMSNorm); the norm's bias
and the unembedding bias are two more parts. The parts then sum to the model's logit difference exactly (up
to float rounding), on MHA, GQA, MQA and MLA alike, since every variant writes per head through ``hook_result``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import nn

from ..trace_views import norm_scale

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["direct_logit_attribution", "logit_direction"]


def _unembedding(model: Transformer) -> nn.Linear:
    """The model's unembedding, refused by name when it has none."""
    unembed = model.unembed
    if unembed is None:
        raise ValueError(f"model {model.name!r} has no unembedding (cfg.unembed=False): there are no logits")
    return unembed


def _check_model(model: Transformer) -> None:
    cfg = model.cfg
    _unembedding(model)
    if cfg.normalization == "post":
        raise ValueError("direct logit attribution needs a pre-norm (or norm-free) model: with post-norm "
                         "(BERT) the final residual is not a sum of the layers' outputs")
    if cfg.cross_attention:
        raise ValueError("direct logit attribution does not cover cross-attention models")
    if cfg.sublayer_norm != "input":
        raise ValueError(f"direct logit attribution needs each head's write to be part of the residual: "
                         f"sublayer_norm={cfg.sublayer_norm!r} normalises the summed attention output first")
    if cfg.final_softcap is not None:
        raise ValueError(f"direct logit attribution needs logits linear in the final residual: "
                         f"final_softcap={cfg.final_softcap!r} is not")


def _answers(answer_tokens: torch.Tensor, B: int, d_vocab: int) -> torch.Tensor:
    if not isinstance(answer_tokens, torch.Tensor):
        answer_tokens = torch.as_tensor(answer_tokens)
    if answer_tokens.dtype.is_floating_point:
        raise TypeError(f"answer_tokens must be integer ids, got dtype {answer_tokens.dtype}")
    if answer_tokens.dim() == 1 and answer_tokens.shape[0] == 2:
        answer_tokens = answer_tokens[None].expand(B, 2)  # one (correct, wrong) pair for the whole batch
    if answer_tokens.shape != (B, 2):
        raise ValueError(f"answer_tokens must be [batch, 2] (correct, wrong) ids, got shape "
                         f"{tuple(answer_tokens.shape)} for batch {B}")
    lo, hi = int(answer_tokens.min()), int(answer_tokens.max())
    if lo < 0 or hi >= d_vocab:
        raise ValueError(f"answer_tokens must be in [0, {d_vocab}), got min {lo} and max {hi}")
    return answer_tokens.long()


def logit_direction(model: Transformer, answer_tokens: torch.Tensor) -> torch.Tensor:
    """The residual directions ``W_U[:, correct] - W_U[:, wrong]``: ``[B, M]``.

    Args:
        model: a model with an unembedding.
        answer_tokens: ``[B, 2]`` (correct, wrong) ids.

    Example:
        >>> import torch
        >>> from interp.analysis.attribution import logit_direction
        >>> from interp.examples import model
        >>> logit_direction(model, torch.tensor([[5, 7]])).shape   # [1, d_model]
    """
    W = _unembedding(model).weight.detach()  # [V, M]
    return W[answer_tokens[:, 0]] - W[answer_tokens[:, 1]]  # [B, M]


@torch.no_grad()
def direct_logit_attribution(model: Transformer, tokens: torch.Tensor, answer_tokens: torch.Tensor, *,
                             pos: int | torch.Tensor = -1, attention_mask: torch.Tensor | None = None,
                             split_experts: bool = False) -> pd.DataFrame:
    """Each component's direct contribution to ``logit[correct] - logit[wrong]`` at one position.

    Args:
        model: a pre-norm (or norm-free) decoder or encoder with an unembedding.
        tokens: ``[B, T]`` ids.
        answer_tokens: ``[B, 2]`` (correct, wrong) ids, or one pair ``[2]`` for every sequence.
        pos: the position read (default the last); an int or ``[B]`` positions (for padded batches).
        attention_mask: ``[B, T]`` padding mask.
        split_experts: on a mixture-of-experts layer, give each routed expert its own part (``"L1E5"``, kind
            ``expert``, ``head`` holding the expert id: its routing-weighted output, 0 where the token did not
            choose it) and the shared expert one (``"L1 shared"``, kind ``mlp``) instead of one ``"L1 mlp"``.

    Returns:
        DataFrame, one row per part, columns ``component`` (``"embed"``, ``"pos_embed"``, ``"L1H3"``,
        ``"L1 b_O"``, ``"L1 mlp"``, ``"ln_final bias"``, ``"unembed bias"``), ``kind`` (``embed``, ``head``,
        ``attn_bias``, ``mlp``, ``bias``), ``layer`` / ``head`` (-1 where not applicable) and ``attribution``
        (mean over the batch). ``df.attrs["logit_diff"]`` is the model's mean logit difference, which the
        ``attribution`` column sums to; ``df.attrs["per_sequence"]`` is the ``[parts, B]`` tensor.

    Raises:
        ValueError: no unembedding, a post-norm model, bad answer tokens or positions.

    Example:
        >>> import torch
        >>> from interp.analysis.attribution import direct_logit_attribution
        >>> from interp.examples import model, tokens
        >>> df = direct_logit_attribution(model, tokens, torch.tensor([[5, 7], [5, 7]]))
        >>> df.sort_values("attribution").tail()
    """
    _check_model(model)
    tokens = model._check_tokens(tokens)
    B, T = tokens.shape
    answers = _answers(answer_tokens, B, model.cfg.d_vocab).to(tokens.device)
    if isinstance(pos, int):
        if not -T <= pos < T:
            raise ValueError(f"pos {pos} out of range for sequences of length {T}")
        pos_idx = torch.full((B,), pos % T, device=tokens.device)
    else:
        pos_idx = torch.as_tensor(pos, device=tokens.device).long()
        if pos_idx.shape != (B,) or int(pos_idx.min()) < 0 or int(pos_idx.max()) >= T:
            raise ValueError(f"pos must be an int or [B] positions in [0, {T}), got {pos_idx.tolist()}")
    L = model.cfg.n_layers
    last = f"blocks.{L - 1}.hook_resid_post"
    names = ["blocks.0.hook_resid_pre", "blocks.*.attn.hook_result", last]
    if model.W_pos is not None and model.embed_ln is None:
        names.append("hook_pos_embed")
    if not model.cfg.attn_only:
        names.append("blocks.*.hook_mlp_out")
    if split_experts:
        for layer, block in enumerate(model.blocks):
            if block.mlp is not None and model.cfg.is_moe_layer(layer):
                hooks: tuple[str, ...] = ("hook_expert_out", "hook_expert_weights", "hook_expert_ids")
                hooks += ("hook_shared_out",) if block.mlp.shared is not None else ()
                names += [f"blocks.{layer}.mlp.{h}" for h in hooks]
    logits, trace = model.run_with_cache(tokens, attention_mask=attention_mask, names_filter=names)
    rows = torch.arange(B, device=tokens.device)

    def at(t: torch.Tensor) -> torch.Tensor:  # [B, T, M] -> [B, M] at each sequence's position
        return t[rows, pos_idx]

    parts: list[torch.Tensor] = []  # each [B, M]
    meta: list[tuple[str, str, int, int]] = []
    embed = at(trace["blocks.0.hook_resid_pre"])
    if "hook_pos_embed" in trace:
        pe = at(trace["hook_pos_embed"].expand(B, T, -1))
        parts += [embed - pe, pe]  # token (and token-type) embedding, then position embedding
        meta += [("embed", "embed", -1, -1), ("pos_embed", "embed", -1, -1)]
    else:
        parts.append(embed)  # with an embedding norm the embeddings are not separable
        meta.append(("embed", "embed", -1, -1))
    for layer, block in enumerate(model.blocks):
        result = trace[f"blocks.{layer}.attn.hook_result"]  # [B, T, H, M]
        for h in range(result.shape[2]):
            parts.append(at(result[:, :, h]))
            meta.append((f"L{layer}H{h}", "head", layer, h))
        if block.attn.W_O.bias is not None:
            parts.append(block.attn.W_O.bias.detach().expand(B, -1))
            meta.append((f"L{layer} b_O", "attn_bias", layer, -1))
        if block.mlp is not None and split_experts and model.cfg.is_moe_layer(layer):
            pre = f"blocks.{layer}.mlp."
            weights = trace[pre + "hook_expert_weights"]  # [B, T, k]
            if model.cfg.expert_input_weighting:  # each expert already read its weighted input
                weights = torch.ones_like(weights)
            weighted = at(trace[pre + "hook_expert_out"] * weights[..., None])  # [B, k, M]
            chosen = at(trace[pre + "hook_expert_ids"])  # [B, k]
            for e in range(model.cfg.n_experts):
                parts.append((weighted * (chosen == e)[..., None]).sum(1))  # [B, M]
                meta.append((f"L{layer}E{e}", "expert", layer, e))
            if block.mlp.shared is not None:
                parts.append(at(trace[pre + "hook_shared_out"]))
                meta.append((f"L{layer} shared", "mlp", layer, -1))
        elif block.mlp is not None:
            parts.append(at(trace[f"blocks.{layer}.hook_mlp_out"]))
            meta.append((f"L{layer} mlp", "mlp", layer, -1))
    stack = torch.stack(parts)  # [C, B, M]
    direction = logit_direction(model, answers).to(stack.dtype)  # [B, M]
    norm = model.ln_final
    if norm is not None:
        scale = norm_scale(at(trace[last]).to(stack.dtype), norm)  # [B, 1]
        if isinstance(norm, torch.nn.LayerNorm):
            stack = stack - stack.mean(-1, keepdim=True)
        stack = stack / scale
        norm_weight = getattr(norm, "weight", None)  # an RMSNorm / LayerNorm's, None without a weight
        if norm_weight is not None:
            stack = stack * norm_weight.detach()
    attr = (stack * direction).sum(-1)  # [C, B]
    extra = []
    norm_bias = getattr(norm, "bias", None)
    if norm_bias is not None:
        extra.append(((norm_bias.detach() * direction).sum(-1), ("ln_final bias", "bias", -1, -1)))
    unembed_bias = _unembedding(model).bias
    if unembed_bias is not None:
        b = unembed_bias.detach()
        extra.append((b[answers[:, 0]] - b[answers[:, 1]], ("unembed bias", "bias", -1, -1)))
    if extra:
        attr = torch.cat([attr, torch.stack([e[0] for e in extra])])  # [C', B]
        meta += [e[1] for e in extra]
    lg = logits[rows, pos_idx]  # [B, V]
    diff = lg.gather(1, answers[:, :1]) - lg.gather(1, answers[:, 1:])  # [B, 1]
    df = pd.DataFrame(meta, columns=["component", "kind", "layer", "head"])
    df["attribution"] = attr.mean(1).double().cpu().numpy()
    df.attrs["logit_diff"] = float(diff.mean())
    df.attrs["per_sequence"] = attr.cpu()
    return df
