"""Tensor readers and layout transforms the families' weight mappings share: a prefix-stripping reader that
names a missing tensor, fused-projection splits, rotary-row reorders, the standard Llama attention / MLP / expert
blocks and the untied unembedding.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import torch

from ..config import ModelConfig
from ._base import StateDict


class _Source:
    """Reads HF tensors by name, stripping a model prefix, and names the missing one in its error."""

    def __init__(self, sd: StateDict, prefixes: tuple[str, ...], arch: str) -> None:
        self.arch = arch
        self.prefix = ""
        for p in prefixes:
            if any(k.startswith(p) for k in sd):
                self.prefix = p
                break
        self.sd = sd

    def __call__(self, key: str) -> torch.Tensor:
        full = self.prefix + key
        if full not in self.sd:
            raise ValueError(f"{self.arch} state dict has no tensor {full!r} (found e.g. {list(self.sd)[:4]})")
        return self.sd[full]

    def has(self, key: str) -> bool:
        return self.prefix + key in self.sd


class Renamed(Mapping[str, torch.Tensor]):
    """A state dict seen under other names (each ``(pattern, replacement)`` of ``renames`` applied in turn to
    every key); reading a key reads the original tensor, so the weight check sees it read.

    Example:
        >>> import re, torch
        >>> from interp.families._tensors import Renamed
        >>> sd = Renamed({"mlp.router.weight": torch.ones(2)}, ((re.compile(r"router\\.weight$"), "gate.weight"),))
        >>> list(sd), sd["mlp.gate.weight"].tolist()
        (['mlp.gate.weight'], [1.0, 1.0])
    """

    def __init__(self, sd: StateDict, renames: tuple[tuple[re.Pattern[str], str], ...]) -> None:
        self.sd = sd
        self.names: dict[str, str] = {}
        for key in sd:
            new = key
            for pattern, repl in renames:
                new = pattern.sub(repl, new)
            self.names[new] = key

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.sd[self.names[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _shaped(src: _Source, key: str, shape: tuple[int, ...]) -> torch.Tensor:
    """``src(key)`` after checking its shape (a fused tensor is split by the config's sizes)."""
    t = src(key)
    if tuple(t.shape) != shape:
        raise ValueError(f"{src.arch} tensor {src.prefix + key!r} has shape {tuple(t.shape)}, the config "
                         f"implies {shape}")
    return t


def _shape_check(arch: str, key: str, tensor: torch.Tensor, want: tuple[int, ...], why: str) -> None:
    if tuple(tensor.shape) != want:
        raise ValueError(f"{arch}: {key!r} has shape {tuple(tensor.shape)}, but the config's {why} "
                         f"need {want}")


def _per_head_qkv(w: torch.Tensor, H: int, D: int) -> torch.Tensor:
    """Rows grouped per head ``[q_h, k_h, v_h]`` (GPT-NeoX, BigCode MHA, Falcon MHA) -> ``[q | k | v]``."""
    rest = w.shape[1:]
    return w.reshape(H, 3, D, *rest).transpose(0, 1).reshape(3 * H * D, *rest)  # [H, 3, D, ..] -> [3HD, ..]


def _deinterleave(w: torch.Tensor, heads: int, width: int, rope: int) -> torch.Tensor:
    """Rows ``[heads * width, .]`` whose last ``rope`` rows per head hold interleaved rotary pairs
    ``(x0, x1), (x2, x3), ...`` -> the half-split layout ``(x0, x2, ..), (x1, x3, ..)`` our RoPE rotates.

    Applied to the query and to the shared key alike, it permutes both sides of every rotary dot product the
    same way: scores do not change, and the rotated values equal DeepSeek's (its interleaved rotation writes
    them out half-split too).
    """
    perm = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])  # [R]
    rows = w.reshape(heads, width, *w.shape[1:])  # [heads, width, ...]
    rows = torch.cat([rows[:, :width - rope], rows[:, width - rope:][:, perm]], dim=1)
    return rows.reshape(w.shape)


def _leading_pairs_to_halves(w: torch.Tensor, heads: int, width: int, rope: int) -> torch.Tensor:
    """Rows ``[heads * width, ..]`` whose first ``rope`` rows per head hold interleaved rotary pairs
    ``(x0, x1), (x2, x3), ..`` -> the half-split layout ``(x0, x2, ..), (x1, x3, ..)`` our RoPE rotates.
    Applied to queries and keys alike, it permutes both sides of every dot product the same way: the scores
    are unchanged."""
    perm = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2), torch.arange(rope, width)])  # [width]
    return w.reshape(heads, width, *w.shape[1:])[:, perm].reshape(w.shape)  # [heads, width, ..] -> [heads * width, ..]


def _qk_pairs_to_halves(out: dict[str, torch.Tensor], b: str, cfg: ModelConfig, rope: int) -> None:
    """In place: the query and key rows of ``out[b + "attn.W_qkv.*"]`` (weight, and bias when ``attn_bias``) from
    interleaved rotary pairs (their first ``rope`` rows per head) to halves (:func:`_leading_pairs_to_halves`);
    the value rows are kept."""
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    for kind in ("weight", "bias") if cfg.attn_bias else ("weight",):
        key = b + f"attn.W_qkv.{kind}"
        q, k, v = out[key].split([H * D, K * D, K * D], dim=0)
        out[key] = torch.cat([_leading_pairs_to_halves(q, H, D, rope), _leading_pairs_to_halves(k, K, D, rope),
                              v])  # [(H+2K)*D(, M)]


def _llama_ends(src: _Source) -> dict[str, torch.Tensor]:
    """A Llama-layout model's embedding and final RMSNorm (``embed_tokens`` and ``norm``)."""
    return {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}


def _llama_layer(src: _Source, cfg: ModelConfig, i: int) -> tuple[str, str, dict[str, torch.Tensor]]:
    """Layer ``i`` of a Llama-layout decoder: ``(HF prefix, our prefix, its attention and its two RMSNorms)``
    (``input_layernorm`` / ``post_attention_layernorm``); the caller adds what else the family's layer holds."""
    h, b = f"layers.{i}.", f"blocks.{i}."
    out = _llama_attention(src, h, b, cfg)
    out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
    out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
    return h, b, out


def _lm_head(hf_sd: StateDict, src: _Source, cfg: ModelConfig, arch: str, key: str = "lm_head.weight",
             bias: str | None = None) -> dict[str, torch.Tensor]:
    """The untied unembedding (and its bias: zeros when the HF head has none)."""
    if cfg.tie_embeddings:
        return {}
    if key not in hf_sd:
        raise ValueError(f"{arch} state dict has no {key!r} and the config does not tie the embeddings "
                         "(pass a *ForCausalLM model, not the bare *Model)")
    out = {"W_U.weight": hf_sd[key]}
    out["W_U.bias"] = hf_sd[bias] if bias is not None else torch.zeros(cfg.d_vocab, dtype=hf_sd[key].dtype)
    return out


def _llama_attention(src: _Source, h: str, b: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Separate q/k/v/o projections (``self_attn.{q,k,v,o}_proj``) stacked into our ``W_qkv`` and ``W_O``."""
    out = {}
    for kind in ("weight", "bias") if cfg.attn_bias else ("weight",):
        # q_proj [H*D, M], k_proj / v_proj [K*D, M]; K/V head j serves query heads j*G..(j+1)*G-1, as ours.
        out[b + f"attn.W_qkv.{kind}"] = torch.cat(
            [src(h + f"self_attn.{n}_proj.{kind}") for n in ("q", "k", "v")], dim=0)  # [(H+2K)*D(, M)]
    out[b + "attn.W_O.weight"] = src(h + "self_attn.o_proj.weight")
    if cfg.out_bias:
        out[b + "attn.W_O.bias"] = src(h + "self_attn.o_proj.bias")
    return out


def _mlp_weights(src: _Source, h: str, b: str, cfg: ModelConfig, layer: int) -> dict[str, torch.Tensor]:
    """Layer ``layer``'s MLP: a dense SwiGLU MLP (``mlp.gate_proj/up_proj/down_proj``) or the experts."""
    if cfg.is_moe_layer(layer):
        return _moe_weights(src, h, b, cfg, layer)
    return _dense_weights(src, h + "mlp.", b, cfg)


def _dense_weights(src: _Source, h: str, b: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A SwiGLU MLP's ``{h}gate_proj/up_proj/down_proj`` (with biases when ``cfg.mlp_bias``) as ``{b}W_gate/W_in/W_out``."""
    out = {}
    for ours, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"), ("W_out", "down_proj")):
        for kind in (("weight", "bias") if cfg.mlp_bias else ("weight",)):
            out[b + f"{ours}.{kind}"] = src(h + f"{theirs}.{kind}")
    return out


def _expert_count_check(arch: str, key: str, tensor: torch.Tensor, axis: int, want: int, what: str) -> None:
    if tensor.shape[axis] != want:
        raise ValueError(f"{arch}: the config says {what}={want}, but {key!r} has shape {tuple(tensor.shape)} "
                         f"({tensor.shape[axis]} along axis {axis})")


def _moe_weights(src: _Source, h: str, b: str, cfg: ModelConfig, layer: int) -> dict[str, torch.Tensor]:
    """The router, experts and shared expert of one MoE layer.

    Reads the stacked layout of transformers 5 (``mlp.experts.gate_up_proj`` ``[E, 2F, M]``, gate rows first;
    ``mlp.experts.down_proj`` ``[E, M, F]``) or per-expert tensors as checkpoints store them
    (``mlp.experts.{e}.gate_proj/up_proj/down_proj``; Mixtral's ``block_sparse_moe.experts.{e}.w1/w3/w2``).
    """
    E, F_ = cfg.n_experts, cfg.d_expert
    if F_ is None:
        raise ValueError(f"{src.arch}: an expert layer needs d_expert, but the config has d_expert=None")
    arch = src.arch
    mlp = h + ("block_sparse_moe." if src.has(h + "block_sparse_moe.gate.weight") else "mlp.")
    router = src(mlp + "gate.weight")  # [E, M]
    _expert_count_check(arch, src.prefix + mlp + "gate.weight", router, 0, E, "n_experts")
    out = {b + "W_router": router}
    if src.has(mlp + "experts.gate_up_proj"):
        gate_up, down = src(mlp + "experts.gate_up_proj"), src(mlp + "experts.down_proj")  # [E, 2F, M], [E, M, F]
        _expert_count_check(arch, src.prefix + mlp + "experts.gate_up_proj", gate_up, 0, E, "n_experts")
        _expert_count_check(arch, src.prefix + mlp + "experts.gate_up_proj", gate_up, 1, 2 * F_, "2 x d_expert")
        _expert_count_check(arch, src.prefix + mlp + "experts.down_proj", down, 0, E, "n_experts")
        out[b + "W_gate"], out[b + "W_in"] = gate_up[:, :F_], gate_up[:, F_:]  # [E, F, M] each
        out[b + "W_out"] = down
    else:
        names = ("w1", "w3", "w2") if mlp.endswith("block_sparse_moe.") else ("gate_proj", "up_proj", "down_proj")
        stored = sum(1 for e in range(E + 1) if src.has(mlp + f"experts.{e}.{names[0]}.weight"))
        if stored != E:
            raise ValueError(f"{arch}: the config says n_experts={E}, but layer {layer} stores {stored} experts "
                             f"({src.prefix + mlp}experts.*.{names[0]}.weight)")
        for ours, theirs in zip(("W_gate", "W_in", "W_out"), names):
            out[b + ours] = torch.stack([src(mlp + f"experts.{e}.{theirs}.weight") for e in range(E)])  # [E, ., .]
    if cfg.router_choice_bias:
        out[b + "router_bias"] = src(mlp + "gate.e_score_correction_bias")
    if cfg.d_shared_expert:
        shared = mlp + ("shared_expert." if src.has(mlp + "shared_expert.up_proj.weight") else "shared_experts.")
        out.update(_dense_weights(src, shared, b + "shared.", cfg))
        if cfg.shared_expert_gate:
            out[b + "shared_gate.weight"] = src(mlp + "shared_expert_gate.weight")
    return out
