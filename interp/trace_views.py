"""TransformerLens-style views of a :class:`~interp.trace.Trace`: short hook names and residual-stream stacks.

``trace["pattern", 0]`` is ``trace["blocks.0.attn.hook_pattern"]`` (TL's ``utils.get_act_name`` short names,
negative layers count from the end). The stacks follow TL's ``ActivationCache`` (same labels, same order):

- :func:`stack_head_results`: every head's residual write ``z_h W_O[h]``, ``[n_heads_total, B, T, M]``,
  labels ``"L3H5"``.
- :func:`decompose_resid`: the pieces that add up to a residual stream (``embed``, ``pos_embed``,
  ``"{l}_attn_out"``, ``"{l}_mlp_out"``).
- :func:`accumulated_resid`: the residual stream at each layer's input (``"{l}_pre"``, ``"{l}_mid"``,
  ``"final_post"``).
- :func:`apply_ln_to_stack`: the stack as the next norm sees it, with the norm's scale frozen at its value in
  the recorded run (TL reads it from ``ln_final.hook_scale``; interp recomputes it from the recorded
  residual and the model's norm type and epsilon, which is the same number). Like TL, it centres (LayerNorm)
  and divides by the scale but applies neither the norm's weight nor its bias; ``weight=True`` also
  multiplies by the weight (what direct logit attribution needs when the weights are not folded).

Kept out of trace.py so the Trace class only gains thin accessor methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .model import Transformer
    from .trace import Trace

#: The positions a view keeps: an int (drops the position axis, as TransformerLens' Slice does), a slice, a list
#: or a tensor of positions, or None (all).
PosSlice = int | slice | Sequence[int] | torch.Tensor | None
#: A stack ``[C, B, T, M]``, with its ``C`` labels when ``return_labels=True``.
Stack = torch.Tensor | tuple[torch.Tensor, list[str]]

__all__ = [
    "ATTN_NAMES",
    "BLOCK_NAMES",
    "accumulated_resid",
    "act_name",
    "apply_ln_to_stack",
    "decompose_resid",
    "stack_head_results",
]

# TransformerLens' short names (utils.get_act_name) and where interp keeps each hook.
ATTN_NAMES = ("q", "k", "v", "z", "result", "attn_scores", "pattern", "q_latent", "kv_latent")
BLOCK_NAMES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
MLP_NAMES = {"post": "mlp.hook_post"}
GLOBAL_NAMES = ("embed", "pos_embed")
_ALIASES = {"attn": "pattern", "scores": "attn_scores", "rot_q": "q", "rot_k": "k"}


def _n_layers(trace: Trace) -> int:
    n = trace.meta.get("n_layers")
    if n is None:
        layers = trace.layers
        if not layers:
            raise ValueError("the trace holds no layer and its meta has no 'n_layers'")
        n = max(layers) + 1
    return int(n)


def _layer(trace: Trace, layer: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int, got {layer!r}")
    n = _n_layers(trace)
    if not -n <= layer < n:
        raise ValueError(f"layer {layer} out of range for a trace of a {n}-layer model")
    return layer % n


def act_name(trace: Trace, key: tuple) -> str:
    """The full hook name for a TL-style key: ``("pattern", 0)``, ``("z", -1)``, ``("embed",)``.

    Args:
        trace: the trace (its ``meta["n_layers"]`` resolves negative layers).
        key: ``(short_name, layer)``; a short name may also be the full suffix (``"hook_z"``).

    Returns:
        The hook name, e.g. ``"blocks.0.attn.hook_pattern"``.

    Raises:
        ValueError: an unknown short name, or a layer out of range.
        TypeError: the key is not a 1- or 2-tuple of (str, int).

    Example:
        >>> from interp.trace_views import act_name
        >>> from interp.examples import trace
        >>> act_name(trace, ("resid_post", -1))
        'blocks.1.hook_resid_post'
    """
    if not 1 <= len(key) <= 2 or not isinstance(key[0], str):
        raise TypeError(f"a TL-style key is (name, layer) or (name,), got {key!r}")
    short = key[0].removeprefix("hook_")
    short = _ALIASES.get(short, short)
    if short in GLOBAL_NAMES:
        if len(key) == 2 and key[1] is not None:
            raise ValueError(f"{key[0]!r} has no layer, got layer {key[1]!r}")
        return f"hook_{short}"
    if len(key) != 2:
        raise ValueError(f"{key[0]!r} needs a layer: trace[{key[0]!r}, 0]")
    layer = _layer(trace, key[1])
    if short in ATTN_NAMES:
        return f"blocks.{layer}.attn.hook_{short}"
    if short in BLOCK_NAMES:
        return f"blocks.{layer}.hook_{short}"
    if short in MLP_NAMES:
        return f"blocks.{layer}.{MLP_NAMES[short]}"
    known = ATTN_NAMES + BLOCK_NAMES + tuple(MLP_NAMES) + GLOBAL_NAMES
    raise ValueError(f"unknown short hook name {key[0]!r}; known: {known}")


def _pos(t: torch.Tensor, pos_slice: Any) -> torch.Tensor:
    """Apply a position index/slice to the position axis of ``[..., T, M]`` (an int drops the axis, as TL's Slice)."""
    if pos_slice is None:
        return t
    if isinstance(pos_slice, int):
        return t[..., pos_slice, :]
    if isinstance(pos_slice, (list, tuple)):
        pos_slice = torch.tensor(pos_slice, dtype=torch.long)
    if isinstance(pos_slice, slice):
        return t[..., pos_slice, :]
    if isinstance(pos_slice, torch.Tensor):
        return t.index_select(-2, pos_slice.to(t.device))
    raise TypeError(f"pos_slice must be None, an int, a slice, a list or a tensor, got {pos_slice!r}")


def _upto(trace: Trace, layer: int | None) -> int:
    """TL's ``layer`` argument: components before this layer; None or -1 means all layers."""
    n = _n_layers(trace)
    if layer is None or layer == -1:
        return n
    if not 0 <= layer <= n:
        raise ValueError(f"layer {layer} out of range: 0..{n} (or None / -1 for all layers)")
    return layer


def _finish(trace, stack, labels, *, apply_ln, model, layer, mlp_input, pos_slice, return_labels):
    stack = _pos(stack, pos_slice)
    if apply_ln:
        if model is None:
            raise ValueError("apply_ln=True needs the model (its norm type and epsilon): pass model=...")
        stack = apply_ln_to_stack(trace, stack, model, layer=layer, mlp_input=mlp_input, pos_slice=pos_slice)
    return (stack, labels) if return_labels else stack


def stack_head_results(trace: Trace, layer: int | None = None, *, pos_slice: PosSlice = None,
                       apply_ln: bool = False, model: Transformer | None = None,
                       return_labels: bool = False) -> Stack:
    """Every head's write ``z_h W_O[h]``, stacked: ``[n_heads_total, B, T, M]`` (TL's ``stack_head_results``).

    With a norm after attention (``sublayer_norm`` ``"sandwich"`` / ``"output"``) these are the heads' shares of
    the sum that norm reads (``hook_attn_out_pre_norm``), not of the residual.

    Args:
        trace: recorded with ``*hook_result`` (or ``*hook_z`` plus ``hook_result``) for the layers wanted.
        layer: heads of layers strictly before this one; ``None`` / ``-1``: every layer.
        pos_slice: an int (drops the position axis, as TL's Slice does), slice, list or tensor of positions.
        apply_ln: divide by the scale of the norm that reads layer ``layer``'s input (final norm for all layers).
        model: needed with ``apply_ln``.
        return_labels: also return ``["L0H0", "L0H1", ...]``.

    Returns:
        The stack, or ``(stack, labels)``.

    Raises:
        KeyError: a layer's ``hook_result`` was not recorded.

    Example:
        >>> from interp.examples import trace
        >>> heads, labels = trace.stack_head_results(return_labels=True)
    """
    upto = _upto(trace, layer)
    parts, labels = [], []
    for lay in range(upto):
        res = trace[f"blocks.{lay}.attn.hook_result"]  # [B, T, H, M]
        parts.append(res.permute(2, 0, 1, 3))  # [H, B, T, M]
        labels += [f"L{lay}H{h}" for h in range(res.shape[2])]
    if not parts:
        raise ValueError(f"layer={layer} selects no heads")
    return _finish(trace, torch.cat(parts), labels, apply_ln=apply_ln, model=model, layer=upto, mlp_input=False,
                   pos_slice=pos_slice, return_labels=return_labels)  # [sum H, B, T, M]


def decompose_resid(trace: Trace, layer: int | None = None, *, mlp_input: bool = False, mode: str = "all",
                    incl_embeds: bool = True, pos_slice: PosSlice = None, apply_ln: bool = False,
                    model: Transformer | None = None, return_labels: bool = False) -> Stack:
    """The residual stream split into the outputs that were added to it (TL's ``decompose_resid``).

    Stacks ``hook_embed``, ``hook_pos_embed`` (when recorded), then ``attn_out`` and ``mlp_out`` of each layer
    before ``layer``. For a pre-norm model without embedding norm or token types, the parts plus the
    attention/MLP biases folded in their outputs sum to ``resid_pre`` of ``layer``.

    Args:
        trace: recorded with the hooks above.
        layer: components before this layer's input; ``None`` / ``-1``: the final residual.
        mlp_input: also include ``layer``'s attention output (the MLP's input).
        mode: ``"all"``, ``"attn"`` or ``"mlp"``.
        incl_embeds: include the embeddings.
        pos_slice, apply_ln, model, return_labels: as :func:`stack_head_results`.

    Returns:
        ``[n_components, B, T, M]``, or ``(stack, labels)``.

    Raises:
        ValueError: an unknown mode.

    Example:
        >>> from interp.examples import trace
        >>> parts, labels = trace.decompose_resid(return_labels=True)
    """
    if mode not in ("all", "attn", "mlp"):
        raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
    upto = _upto(trace, layer)
    parts, labels = [], []
    if incl_embeds:
        for name in ("embed", "pos_embed"):
            if f"hook_{name}" in trace:
                parts.append(trace[f"hook_{name}"])
                labels.append(name)
    for lay in range(upto + (1 if mlp_input else 0)):
        if mode in ("all", "attn"):
            parts.append(trace[f"blocks.{lay}.hook_attn_out"])
            labels.append(f"{lay}_attn_out")
        if mode in ("all", "mlp") and lay < upto and f"blocks.{lay}.hook_mlp_out" in trace:
            parts.append(trace[f"blocks.{lay}.hook_mlp_out"])
            labels.append(f"{lay}_mlp_out")
    if not parts:
        raise ValueError(f"nothing to stack for layer={layer}, mode={mode!r}, incl_embeds={incl_embeds}")
    # hook_pos_embed is [T, M] when every sequence shares positions: broadcast it over the batch.
    parts = [p if p.dim() == 3 else p[None] for p in parts]  # [B or 1, T, M]
    B = max(p.shape[0] for p in parts)
    stack = torch.stack([p.expand(B, *p.shape[1:]) for p in parts])  # [C, B, T, M]
    return _finish(trace, stack, labels, apply_ln=apply_ln, model=model, layer=upto, mlp_input=mlp_input,
                   pos_slice=pos_slice, return_labels=return_labels)


def accumulated_resid(trace: Trace, layer: int | None = None, *, incl_mid: bool = False, pos_slice: PosSlice = None,
                      apply_ln: bool = False, model: Transformer | None = None,
                      return_labels: bool = False) -> Stack:
    """The residual stream at the input of each layer up to ``layer`` (TL's ``accumulated_resid``).

    Args:
        trace: recorded with ``*hook_resid_pre`` (and ``*hook_resid_mid`` for ``incl_mid``; the last layer's
            ``hook_resid_post`` for the final stream).
        layer: up to and including this layer's input; ``None`` / ``-1`` adds ``"final_post"``.
        incl_mid: also each layer's ``resid_mid``.
        pos_slice, model, return_labels: as :func:`stack_head_results`.
        apply_ln: pass every entry through the model's final norm with its own statistics (the logit lens;
            TL's ``recompute_ln``), weight and bias included. A post-norm model's final norm is its last
            block's last LayerNorm.

    Returns:
        ``[n, B, T, M]``, or ``(stack, labels)``.

    Example:
        >>> from interp.examples import trace
        >>> resids, labels = trace.accumulated_resid(return_labels=True)   # logit lens: apply_ln=True, model=model
    """
    n = _n_layers(trace)
    upto = _upto(trace, layer)
    parts, labels = [], []
    for lay in range(upto + 1):
        if lay == n:
            parts.append(trace[f"blocks.{n - 1}.hook_resid_post"])
            labels.append("final_post")
            continue
        parts.append(trace[f"blocks.{lay}.hook_resid_pre"])
        labels.append(f"{lay}_pre")
        if incl_mid:
            if model is not None and model.cfg.parallel_block != "none":
                raise ValueError(f"incl_mid: a parallel block (parallel_block={model.cfg.parallel_block!r}) has "
                                 "no resid_mid")
            parts.append(trace[f"blocks.{lay}.hook_resid_mid"])
            labels.append(f"{lay}_mid")
    stack = _pos(torch.stack(parts), pos_slice)  # [C, B, T, M]
    if apply_ln:
        # Logit lens, as TL does here: each entry goes through the final norm with its own statistics.
        if model is None:
            raise ValueError("apply_ln=True needs the model (its final norm): pass model=...")
        norm, _ = _norm_for(model, None, False)
        with torch.no_grad():
            stack = norm(stack)
    return (stack, labels) if return_labels else stack


def _norm_for(model: Transformer, layer: int | None, mlp_input: bool) -> tuple[Any, tuple[str, ...]]:
    """The norm that reads the residual at (layer, mlp_input), and the hooks whose sum is what it reads.

    Pre-norm models: ``ln_final`` reads the last ``resid_post``, ``ln1`` / ``ln2`` read ``resid_pre`` /
    ``resid_mid``. Post-norm models (BERT) end every sublayer on a norm, so the only norm that reads a whole
    residual stream with nothing after it is the last block's last norm (``ln2``, or ``ln1`` without an MLP):
    TransformerLens takes it as the final norm too. It reads the sublayer's input plus its output
    (``resid_mid + mlp_out``). No norm reads a post-norm block's input, so mid-model norms are refused.
    """
    n = model.cfg.n_layers
    final = layer is None or layer == -1 or layer == n
    if model.cfg.normalization == "post":
        if not final:
            raise ValueError(f"a post-norm model (normalization='post') has no norm reading layer {layer}'s "
                             f"{'MLP input' if mlp_input else 'input'}: only the final norm (layer=None) is defined")
        last = model.blocks[n - 1]
        if last.mlp is not None:
            return last.ln2, (f"blocks.{n - 1}.hook_resid_mid", f"blocks.{n - 1}.hook_mlp_out")
        return last.ln1, (f"blocks.{n - 1}.hook_resid_pre", f"blocks.{n - 1}.hook_attn_out")
    if model.cfg.normalization not in ("pre", "rms"):
        raise ValueError(f"apply_ln needs a normalised model (normalization 'pre', 'rms' or 'post'), got "
                         f"normalization={model.cfg.normalization!r}")
    if final or layer is None:
        return model.ln_final, (f"blocks.{n - 1}.hook_resid_post",)
    block = model.blocks[layer]
    if model.cfg.sublayer_norm == "output":
        raise ValueError(f"layer {layer} has no input norm (sublayer_norm='output'): nothing to apply")
    if mlp_input and model.cfg.parallel_block != "none":  # the MLP reads resid_pre, through ln2 or the shared ln1
        return getattr(block, "ln2", block.ln1), (f"blocks.{layer}.hook_resid_pre",)
    if mlp_input:
        return block.ln2, (f"blocks.{layer}.hook_resid_mid",)
    return block.ln1, (f"blocks.{layer}.hook_resid_pre",)


def norm_scale(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """The per-token scale a LayerNorm / RMSNorm divides ``x`` ``[..., M]`` by: ``[..., 1]``."""
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    if isinstance(norm, torch.nn.RMSNorm):
        return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()


def apply_ln_to_stack(trace: Trace, stack: torch.Tensor, model: Transformer, *, layer: int | None = None,
                      mlp_input: bool = False, pos_slice: PosSlice = None, weight: bool = False) -> torch.Tensor:
    """Normalise a stack of residual components with the norm's scale frozen at the recorded run.

    Each component ``c`` becomes ``(c - mean(c)) / scale`` (LayerNorm) or ``c / scale`` (RMSNorm), where
    ``scale`` is the norm's per-token scale on the whole recorded residual; so the transformed parts sum to
    the normalised residual minus the norm's bias (times its weight with ``weight=True``).

    Args:
        trace: holds the residual the norm read (``resid_post`` of the last layer for the final norm; for a
            post-norm model, the last layer's ``resid_mid`` and ``mlp_out``).
        stack: ``[..., B, T', M]`` where T' matches ``pos_slice`` applied to the recorded positions
            (``[..., B, M]`` for an int position).
        model: the model that made the trace (its norm type, epsilon and weight).
        layer: which norm: ``None`` / ``-1`` / ``n_layers`` the final one (a post-norm model's: the last
            block's last norm, as TransformerLens defines it), else layer's ``ln1`` (``ln2`` with ``mlp_input``).
        pos_slice: the positions ``stack`` holds.
        weight: also multiply by the norm's elementwise weight (TL leaves it folded into the next weights).

    Returns:
        A tensor shaped like ``stack``.

    Raises:
        ValueError: a norm-free model, a mid-model norm of a post-norm model, or shapes that do not match.

    Example:
        >>> from interp.examples import model, trace
        >>> parts = trace.apply_ln_to_stack(trace.decompose_resid(), model)
    """
    norm, hooks = _norm_for(model, layer, mlp_input)
    resid = trace[hooks[0]]
    for h in hooks[1:]:  # a post-norm final norm reads the last sublayer's input plus its output
        resid = resid + trace[h]
    resid = _pos(resid, pos_slice)  # [B, T', M] ([B, M] for an int position)
    if stack.shape[-resid.dim():] != resid.shape:
        raise ValueError(f"stack ends in {tuple(stack.shape[-resid.dim():])}, the recorded residual (after "
                         f"pos_slice={pos_slice!r}) is {tuple(resid.shape)}")
    scale = norm_scale(resid.to(stack.dtype), norm)  # [B, T', 1]: broadcasts over the leading stack axes
    out = stack - stack.mean(-1, keepdim=True) if isinstance(norm, torch.nn.LayerNorm) else stack
    out = out / scale
    if weight and getattr(norm, "weight", None) is not None:
        out = out * norm.weight.detach().to(out.dtype)
    return out
