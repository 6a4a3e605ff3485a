"""The strict weight-mapping driver: a family's declarative tensor table, run over a source state dict.

A table is a tuple of :class:`Rule`: "our tensor(s) <- their tensor(s), through this transform". Names hold
``{i}`` for the layer index (the rule then runs once per layer). :func:`map_tensors` runs a table and

* refuses a missing source tensor, naming the full key (prefix included) and a few that exist;
* refuses a source tensor two rules consume (each is used exactly once);
* refuses a source whose shape is not the one the rule's ``shape`` derives from the config, naming both;
* returns which source keys it consumed, so the caller (:func:`interp.zoo.hf.convert` through
  :func:`interp.zoo.hf_weights.check_weights`, for Hugging Face folders, model objects and GGUF files alike)
  refuses the leftovers by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from ..config import ModelConfig
from ._base import StateDict
from ._tensors import _lm_head, _per_head_qkv, _Source

#: ``(source tensors, config) -> our tensor`` (or several, for a rule with several ``ours`` names).
Transform = Callable[[Sequence[torch.Tensor], ModelConfig], torch.Tensor | Sequence[torch.Tensor]]
#: Which suffixes a rule maps: fixed, or read off the config (``("weight", "bias")`` when a family has biases).
Kinds = tuple[str, ...] | Callable[[ModelConfig], tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One line of a tensor table: ``ours`` <- ``transform(theirs)``, for each suffix of ``kinds``.

    Attributes:
        ours: our name(s) without the suffix (``"blocks.{i}.attn.W_qkv"``); several when the transform splits.
        theirs: the source name(s) without the suffix and the model prefix (``"layers.{i}.self_attn.q_proj"``).
        kinds: the suffixes mapped (``"weight"``, ``"bias"``), or a function of the config giving them.
        transform: how the source tensors become ours (default: the single source as it is).
        when: the rule applies only where this is true of the config.
        shape: the shape each source must have, from the config (checked before the transform).
    """

    ours: str | tuple[str, ...]
    theirs: str | tuple[str, ...]
    kinds: Kinds = ("weight",)
    transform: Transform | None = None
    when: Callable[[ModelConfig], bool] | None = None
    shape: Callable[[ModelConfig, str], tuple[int, ...]] | None = None


def both(cfg: ModelConfig) -> tuple[str, ...]:
    """``("weight", "bias")``: LayerNorms and biased projections."""
    return ("weight", "bias")


def transpose(ts: Sequence[torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    """A ``Conv1D`` weight ``[in, out]`` as ``nn.Linear``'s ``[out, in]`` (a bias passes through)."""
    return ts[0].T.contiguous() if ts[0].dim() == 2 else ts[0]


def concat(ts: Sequence[torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    """Separate q / k / v projections stacked into one ``W_qkv``: ``[(H + 2K) * D, ...]``."""
    return torch.cat(list(ts), dim=0)


def per_head_qkv(ts: Sequence[torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    """A fused QKV whose rows are grouped per head (``[q_h, k_h, v_h]``) reordered to ``[q | k | v]``."""
    return _per_head_qkv(ts[0], cfg.n_heads, cfg.d_head)


def halves(ts: Sequence[torch.Tensor], cfg: ModelConfig) -> Sequence[torch.Tensor]:
    """A fused ``[gate | up]`` projection split into its two halves (rows)."""
    return ts[0].chunk(2, dim=0)


def map_tensors(table: Sequence[Rule], hf_sd: StateDict, cfg: ModelConfig, *, prefixes: tuple[str, ...],
                arch: str) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Run a tensor table over a state dict.

    Args:
        table: the family's rules.
        hf_sd: the source state dict (Hugging Face names; a GGUF file's tensors renamed to them).
        cfg: our config (layer count, sizes, which optional tensors exist).
        prefixes: model prefixes to strip, the first one any key starts with (``("model.",)``).
        arch: the family named in errors.

    Returns:
        ``(our state dict, the source keys consumed)``.

    Raises:
        ValueError: a missing source tensor, a source consumed twice or one of the wrong shape (each named).

    Example:
        >>> import torch
        >>> from interp import ModelConfig
        >>> from interp.families._mapping import Rule, map_tensors
        >>> cfg = ModelConfig(n_layers=1, d_model=4, n_heads=2, d_mlp=8, d_vocab=5, n_ctx=8)
        >>> sd = {"model.norm.weight": torch.ones(4), "model.extra": torch.ones(1)}
        >>> out, used = map_tensors((Rule("ln_final", "norm"),), sd, cfg, prefixes=("model.",), arch="toy")
        >>> sorted(out), sorted(set(sd) - used)
        (['ln_final.weight'], ['model.extra'])
        >>> map_tensors((Rule("ln_final", "norm"), Rule("ln1", "norm")), sd, cfg, prefixes=("model.",), arch="toy")
        Traceback (most recent call last):
        ...
        ValueError: toy tensor 'model.norm.weight' is consumed twice by the mapping (by ln_final and ln1)
    """
    src = _Source(hf_sd, prefixes, arch)
    out: dict[str, torch.Tensor] = {}
    by: dict[str, str] = {}
    for rule in table:
        if rule.when is not None and not rule.when(cfg):
            continue
        ours = (rule.ours,) if isinstance(rule.ours, str) else rule.ours
        theirs = (rule.theirs,) if isinstance(rule.theirs, str) else rule.theirs
        kinds = rule.kinds(cfg) if callable(rule.kinds) else rule.kinds
        layers: Sequence[int | None] = range(cfg.n_layers) if "{i}" in "".join(ours + theirs) else (None,)
        for i in layers:
            for kind in kinds:
                names = [f"{t.format(i=i)}.{kind}" for t in theirs]
                tensors = []
                for name in names:
                    key = src.prefix + name
                    first = ours[0].format(i=i)
                    if key in by:
                        raise ValueError(f"{arch} tensor {key!r} is consumed twice by the mapping (by {by[key]} and "
                                         f"{first})")
                    t = src(name)
                    if rule.shape is not None and tuple(t.shape) != rule.shape(cfg, kind):
                        raise ValueError(f"{arch} tensor {key!r} has shape {tuple(t.shape)}, the config implies "
                                         f"{rule.shape(cfg, kind)}")
                    by[key] = first
                    tensors.append(t)
                made = rule.transform(tensors, cfg) if rule.transform is not None else tensors[0]
                made_all = (made,) if isinstance(made, torch.Tensor) else tuple(made)
                if len(made_all) != len(ours):
                    raise RuntimeError(f"{arch} mapping rule for {ours} made {len(made_all)} tensors")
                for name, t in zip(ours, made_all):
                    out[f"{name.format(i=i)}.{kind}"] = t
    return out, set(by)


def with_head(table: Sequence[Rule], hf_sd: StateDict, cfg: ModelConfig, *, arch: str,
              prefixes: tuple[str, ...] = ("model.",)) -> dict[str, torch.Tensor]:
    """Our state dict of a family whose weights are ``table`` plus the unembedding (``lm_head``, unless tied):
    :func:`map_tensors`, then the head.

    Raises:
        ValueError: as :func:`map_tensors`, or no ``lm_head.weight`` when the config does not tie the embeddings.

    Example:
        >>> import torch
        >>> from interp import ModelConfig
        >>> from interp.families._mapping import Rule, with_head
        >>> cfg = ModelConfig(n_layers=1, d_model=4, n_heads=2, d_mlp=8, d_vocab=5, n_ctx=8, tie_embeddings=False)
        >>> sd = {"model.norm.weight": torch.ones(4), "lm_head.weight": torch.zeros(5, 4)}
        >>> sorted(with_head((Rule("ln_final", "norm"),), sd, cfg, arch="toy"))
        ['W_U.bias', 'W_U.weight', 'ln_final.weight']
    """
    out, _ = map_tensors(table, hf_sd, cfg, prefixes=prefixes, arch=arch)
    out.update(_lm_head(hf_sd, _Source(hf_sd, prefixes, arch), cfg, arch))
    return out


# --- sub-tables several families share ----------------------------------------------------------------------
def biased_if(flag: str) -> Callable[[ModelConfig], tuple[str, ...]]:
    """``kinds`` for a projection biased where the config flag ``flag`` is true (``"attn_bias"``, ``"mlp_bias"``)."""
    return lambda cfg: ("weight", "bias") if getattr(cfg, flag) else ("weight",)


#: Separate ``self_attn.{q,k,v,o}_proj`` stacked into ``W_qkv`` / ``W_O`` (K/V head j serves query heads
#: j*G..(j+1)*G-1, as ours), biases where the config has them.
LLAMA_ATTENTION: tuple[Rule, ...] = (
    Rule("blocks.{i}.attn.W_qkv", tuple(f"layers.{{i}}.self_attn.{n}_proj" for n in "qkv"),
         kinds=biased_if("attn_bias"), transform=concat),
    Rule("blocks.{i}.attn.W_O", "layers.{i}.self_attn.o_proj", kinds=biased_if("out_bias")),
)


#: A gated MLP's ``mlp.{gate,up,down}_proj`` as ``W_gate`` / ``W_in`` / ``W_out``, biases where ``mlp_bias``.
SWIGLU_MLP: tuple[Rule, ...] = tuple(
    Rule(f"blocks.{{i}}.mlp.{ours}", f"layers.{{i}}.mlp.{theirs}", kinds=biased_if("mlp_bias"))
    for ours, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"), ("W_out", "down_proj")))
