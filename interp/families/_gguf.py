"""How a GGUF file (llama.cpp's format) maps onto the Hugging Face model it was converted from: the typed
metadata reader every family's GGUF mapping uses, the hyper-parameters every architecture shares, and
:class:`GGUFSpec`, the record a family file declares per llama.cpp ``general.architecture`` it reads.

A family's :attr:`~interp.families.Family.gguf` maps each architecture name to its :class:`GGUFSpec`: metadata ->
Hugging Face ``config.json`` dict, GGUF tensor names -> Hugging Face state-dict names, and the tensor transforms
that undo what llama.cpp's converter (``convert_hf_to_gguf.py``) did to the weights (Llama's Q/K row
permutation: :func:`unpermute_rotary`; Gemma's ``1 + w`` norms; Falcon's regrouped QKV; ...). The pair then goes
through the family's Hugging Face conversion: one weight mapping per family, whichever format the weights come
in. :mod:`interp.zoo.gguf` is the driver: it reads ``general.architecture``, looks it up in
:data:`interp.families.BY_GGUF_ARCH` and runs the spec it finds.

Refused by name, with the value (here, for every architecture): RoPE scaling other than ``linear`` (and
``rope_freqs`` / LongRoPE factor tensors); a sliding window on an architecture that has none in llama.cpp;
a ``sliding_window_pattern`` other than the architecture's fixed one; partial rotary where the architecture
has none; a tensor the architecture has no place for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

HFConfig = dict[str, Any]
#: ``(GGUF stem, HF name, tensor, HF config) -> tensor``: undoes the converter's change to one tensor (on any
#: device, the meta device included: the tensor-table check runs it on shapes only).
Transform = Callable[[str, str, torch.Tensor, Mapping[str, Any]], torch.Tensor]


class GGUFError(ValueError):
    """A GGUF file that cannot be read as declared; the message names the file and the key or tensor."""


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, with the entry count of a long array: an error message
    never echoes a 10^6-entry metadata array.

    Example:
        >>> from interp.families._gguf import shown
        >>> shown(list(range(10**6)))
        '[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, ... (1000000 entries)'
    """
    if isinstance(value, (list, tuple, np.ndarray)):
        head = repr(list(value[:limit // 2]))  # a bounded slice: never the repr of the whole array
        if len(head) <= limit and len(value) <= limit // 2:
            return head
        return head[:limit].rsplit(",", 1)[0] + f", ... ({len(value)} entries)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


class Meta:
    """Typed reads of one file's ``{arch}.*`` metadata; each bad value is refused naming the key and value.

    Example:
        >>> from interp.families._gguf import Meta
        >>> m = Meta({"llama.block_count": 2, "llama.rope.freq_base": 1e4}, "llama", "f.gguf")
        >>> m.count("block_count"), m.number("rope.freq_base", None), m.number("rope.scaling.factor", 1.0)
        (2, 10000.0, 1.0)
    """

    def __init__(self, meta: Mapping[str, Any], arch: str, source: str) -> None:
        self.meta, self.arch, self.source = meta, arch, source

    def key(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self.key(key) in self.meta

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(self.key(key), default)

    def fail(self, text: str) -> GGUFError:
        return GGUFError(f"{self.source}: {text}")

    def count(self, key: str, default: Any = None, *, low: int = 1) -> int:
        """A whole-number hyper-parameter, refused by name when absent, not an integer or below ``low``."""
        return self._count(key, self.get(key, default), low)

    def _count(self, key: str, value: Any, low: int = 1) -> int:
        if value is None:
            raise self.fail(f"metadata has no {self.key(key)!r}")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise self.fail(f"metadata {self.key(key)!r} = {shown(value)} must be an integer >= {low}")
        return int(value)

    def layer_count(self, key: str, default: Any, n_layers: int) -> int:
        """A whole-number hyper-parameter that llama.cpp may write per layer (an array, one entry a layer):
        a per-layer array with one value throughout is that value; different values, or an array that is not
        one entry per layer, are refused by name (with a shortened copy of the array).

        Example:
            >>> from interp.families._gguf import Meta
            >>> m = Meta({"llama.attention.head_count_kv": [1, 1]}, "llama", "f.gguf")
            >>> m.layer_count("attention.head_count_kv", 4, n_layers=2)
            1
        """
        value = self.get(key, default)
        if not isinstance(value, (list, tuple, np.ndarray)):
            return self._count(key, value)
        values = list(value)
        if len(values) != n_layers:
            raise self.fail(f"per-layer metadata {self.key(key)!r} has {len(values)} entries for "
                            f"{self.key('block_count')} = {n_layers} layers: {shown(values)}")
        counts = [self._count(key, v) for v in values]
        if len(set(counts)) != 1:
            raise self.fail(f"per-layer metadata {self.key(key)!r} = {shown(values)} differs between layers, "
                            f"which is not supported (one value for every layer is)")
        return counts[0]

    def number(self, key: str, default: float | None) -> float | None:
        """A positive finite number (epsilon, RoPE base, soft-cap), or ``default`` when absent."""
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
            raise self.fail(f"metadata {self.key(key)!r} = {shown(value)} must be a positive finite number")
        return float(value)


# --- metadata -> HF config ----------------------------------------------------------------------------------
def gguf_sizes(m: Meta, names: set[str]) -> HFConfig:
    """The hyper-parameters every architecture has, in Llama's HF names (the family functions rename)."""
    d_model, n_heads = m.count("embedding_length"), m.count("attention.head_count")
    if not m.has("attention.key_length") and d_model % n_heads:
        raise m.fail(f"{m.key('embedding_length')} = {d_model} is not a multiple of {m.key('attention.head_count')}"
                     f" = {n_heads} (and no attention.key_length says the head dim)")
    head_dim = m.count("attention.key_length", d_model // n_heads)
    if m.count("attention.value_length", head_dim) != head_dim:
        raise m.fail(f"key_length {head_dim} != value_length {m.get('attention.value_length')}")
    # llama.cpp may write a per-layer array (one value each, [1, 1] for a 2-layer MQA model).
    n_kv = m.layer_count("attention.head_count_kv", n_heads, m.count("block_count"))
    if n_heads % n_kv:
        raise m.fail(f"{m.key('attention.head_count')} = {n_heads} is not a multiple of "
                     f"{m.key('attention.head_count_kv')} = {n_kv}")
    vocab = m.get("vocab_size") or len(m.meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise m.fail(f"metadata has neither {m.key('vocab_size')} nor tokenizer.ggml.tokens")
    vocab = m.count("vocab_size", vocab)
    ids = {}
    for which in ("padding", "bos", "eos"):
        key = f"tokenizer.ggml.{which}_token_id"
        value = m.meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab):
            raise m.fail(f"metadata {key!r} = {shown(value)} is outside the vocabulary of {vocab} tokens")
        ids[which] = value
    return {
        "hidden_size": d_model, "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim,
        "num_hidden_layers": m.count("block_count"), "intermediate_size": m.count("feed_forward_length"),
        "vocab_size": vocab, "max_position_embeddings": m.count("context_length"),
        "tie_word_embeddings": "output.weight" not in names,
        "pad_token_id": ids["padding"], "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
    }


def rotary_dim(m: Meta, head_dim: int, *, partial_ok: bool = False) -> int:
    rot = m.count("rope.dimension_count", head_dim)
    if rot > head_dim or (rot != head_dim and not partial_ok):
        raise m.fail(f"{m.key('rope.dimension_count')} = {rot} differs from the head dim {head_dim}: partial rotary "
                     f"is not supported for {m.arch!r}, or one of these keys is wrong")
    return rot


def rope_parameters(m: Meta, names: set[str], theta_default: float) -> dict[str, Any]:
    """HF ``rope_parameters`` from ``rope.freq_base`` and ``rope.scaling.*``; only plain and linear RoPE."""
    if "rope_freqs.weight" in names:
        raise m.fail("RoPE scaling 'rope_freqs (llama3)' is not supported; only plain rotary or 'linear'")
    if "rope_factors_long.weight" in names or "rope_factors_short.weight" in names:
        raise m.fail("RoPE scaling 'longrope' (rope_factors_long / rope_factors_short tensors) is not supported; "
                     "only plain rotary or 'linear'")
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": m.number("rope.freq_base", theta_default)}
    kind = m.get("rope.scaling.type", "none")
    if kind in ("none", None):
        return params
    if kind != "linear":
        raise m.fail(f"RoPE scaling {kind!r} ({m.key('rope.scaling.type')}) is not supported; only plain rotary "
                     f"or 'linear'")
    factor = m.number("rope.scaling.factor", None)
    if factor is None:
        raise m.fail(f"{m.key('rope.scaling.type')} = 'linear' without {m.key('rope.scaling.factor')}")
    return {**params, "rope_type": "linear", "factor": factor}


def no_window(m: Meta) -> None:
    window = m.get("attention.sliding_window", 0)
    if window:
        raise m.fail(f"{m.key('attention.sliding_window')} = {window!r}: llama.cpp's {m.arch!r} has no sliding "
                     f"window, so which layers slide is unknown; not supported")


def pattern_windows(m: Meta, n_layers: int, period: int) -> tuple[int | None, list[str] | None]:
    """``(sliding_window, layer_types)`` of llama.cpp's fixed pattern: every ``period``-th layer is global."""
    window = m.get("attention.sliding_window", 0)
    if not window:
        return None, None
    window = m.count("attention.sliding_window")
    declared = m.get("attention.sliding_window_pattern", period)
    if declared != period:
        raise m.fail(f"{m.key('attention.sliding_window_pattern')} = {declared!r} is not supported; llama.cpp's "
                     f"{m.arch!r} slides on {period - 1} layer(s) of {period}")
    types = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n_layers)]
    return window, types


def declared_windows(m: Meta, n_layers: int) -> tuple[int | None, list[str] | None]:
    """``(sliding_window, layer_types)`` of an architecture whose files say which layers slide: a
    ``sliding_window_pattern`` of one boolean per layer (True: the layer slides; what newer converters write)
    or a period ``n`` (every ``n``-th layer global). No ``sliding_window`` means none; a window without a pattern
    is refused by name (which layers slide is not said).

    Example:
        >>> from interp.families._gguf import Meta, declared_windows
        >>> m = Meta({"exaone4.attention.sliding_window": 8,
        ...           "exaone4.attention.sliding_window_pattern": [True, True, False]}, "exaone4", "f.gguf")
        >>> declared_windows(m, 3)
        (8, ['sliding_attention', 'sliding_attention', 'full_attention'])
    """
    if not m.get("attention.sliding_window", 0):
        return None, None
    window = m.count("attention.sliding_window")
    pattern = m.get("attention.sliding_window_pattern")
    key = m.key("attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple)) and len(pattern) == n_layers and all(isinstance(p, bool) for p in pattern):
        slides = list(pattern)
    elif isinstance(pattern, (int, np.integer)) and not isinstance(pattern, bool) and pattern >= 1:
        slides = [(i + 1) % int(pattern) != 0 for i in range(n_layers)]
    elif pattern is None:
        raise m.fail(f"{m.key('attention.sliding_window')} = {window} without {key!r}: which layers slide is not "
                     f"said; not supported")
    else:
        raise m.fail(f"metadata {key!r} = {shown(pattern)} must be one boolean per layer "
                     f"({m.key('block_count')} = {n_layers}) or a positive period")
    return window, ["sliding_attention" if s else "full_attention" for s in slides]


def refuse_keys(m: Meta, why: Mapping[str, str]) -> None:
    """Refuse, by name and value, each ``{arch}.<key>`` of ``why`` that the file sets to something other than 0
    (``why``: key -> what it is, for the message).

    Example:
        >>> from interp.families._gguf import Meta, refuse_keys
        >>> refuse_keys(Meta({"glm4.nextn_predict_layers": 0}, "glm4", "f.gguf"), {"nextn_predict_layers": "MTP"})
    """
    for key, what in why.items():
        value = m.get(key)
        if value not in (None, 0, [], ()):
            raise m.fail(f"metadata {m.key(key)!r} = {shown(value)} ({what}) is not supported for {m.arch!r}")



def llama_like(model_type: str, **fixed: Any) -> Callable[[Meta, set[str]], HFConfig]:
    """The config function of a Llama-layout architecture (``llama``, ``qwen2``, ``olmo``, ...): the shared sizes,
    RMSNorm epsilon, plain or linear RoPE over the whole head, no sliding window, the biases the tensors have
    (``attention_bias``, ``attention_out_bias``, ``mlp_bias``: each family reads those its HF config has);
    ``fixed`` adds the architecture's own HF keys.

    Example:
        >>> from interp.families._gguf import Meta, llama_like
        >>> meta = {f"qwen2.{k}": v for k, v in {"embedding_length": 8, "attention.head_count": 2, "block_count": 1,
        ...         "feed_forward_length": 16, "context_length": 32, "vocab_size": 10}.items()}
        >>> llama_like("qwen2")(Meta(meta, "qwen2", "f.gguf"), set())["model_type"]
        'qwen2'
    """
    def config(m: Meta, names: set[str]) -> HFConfig:
        rope = rope_parameters(m, names, 10000.0)  # a scaling kind is refused before any missing key
        cfg = gguf_sizes(m, names)
        rotary_dim(m, cfg["head_dim"])
        no_window(m)
        return {**cfg, "model_type": model_type, "hidden_act": "silu",
                "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon", 1e-5), "rope_parameters": rope,
                "attention_bias": "blk.0.attn_q.bias" in names,
                "attention_out_bias": "blk.0.attn_output.bias" in names, "mlp_bias": "blk.0.ffn_up.bias" in names,
                **fixed}
    return config


# --- tensor names and transforms ----------------------------------------------------------------------------
def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row permutation of ``attn_q`` / ``attn_k`` (weights ``[n*D, M]`` or biases ``[n*D]``).

    llama.cpp stores each head's rows as interleaved pairs ``(0, D/2), (1, D/2+1), ...``; Hugging Face and
    interp keep the first half of the rotary dims, then the second half.

    Example:
        >>> import torch
        >>> from interp.families._gguf import unpermute_rotary
        >>> unpermute_rotary(torch.arange(8.0), 1)    # one head, D = 8
        tensor([0., 2., 4., 6., 1., 3., 5., 7.])
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"cannot split {rows} rows into {n_heads} heads of rotary pairs")
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])  # [n, D/2, 2, (M)]
            .transpose(1, 2).reshape(w.shape))  # [n, 2, D/2, (M)] -> [n*D, (M)]



#: ``(GGUF name, tensor, HF config, source) -> {HF name: tensor}``, or None for a tensor the tables name.
Special = Callable[..., "dict[str, torch.Tensor] | None"]

#: Llama's names, which most architectures share (``blk.N.<stem>`` -> ``model.layers.N.<name>``).
LLAMA_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LLAMA_ATTN = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj"}
QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
GATED_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
LLAMA_BLOCK = {**LLAMA_ATTN, **GATED_MLP, "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}

#: GPT-2's names (``transformer.h.N.<name>``), which GPT-BigCode shares.
GPT2_GLOBAL = {"token_embd": "transformer.wte", "position_embd": "transformer.wpe", "output_norm": "transformer.ln_f",
               "output": "lm_head"}
GPT2_BLOCK = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
              "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
#: The special-token ids :func:`gguf_sizes` reads, under their HF names.
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def gpt2_keys(m: Meta, sizes: HFConfig) -> HFConfig:
    """:func:`gguf_sizes`' Llama-named sizes under GPT-2's HF names (``n_embd``, ``n_head``, ...), with the
    LayerNorm epsilon and the tie (GPT-2 and GPT-BigCode configs).

    Example:
        >>> from interp.families._gguf import Meta, gguf_sizes, gpt2_keys
        >>> meta = {f"gpt2.{k}": v for k, v in {"embedding_length": 8, "attention.head_count": 2, "block_count": 1,
        ...         "feed_forward_length": 32, "context_length": 16, "vocab_size": 10}.items()}
        >>> m = Meta(meta, "gpt2", "f.gguf")
        >>> gpt2_keys(m, gguf_sizes(m, set()))["n_inner"]
        32
    """
    return {"n_embd": sizes["hidden_size"], "n_head": sizes["num_attention_heads"], "n_layer": sizes["num_hidden_layers"],
            "n_inner": sizes["intermediate_size"], "vocab_size": sizes["vocab_size"],
            "n_positions": sizes["max_position_embeddings"],
            "layer_norm_epsilon": m.number("attention.layer_norm_epsilon", 1e-5),
            "tie_word_embeddings": sizes["tie_word_embeddings"], **{k: sizes[k] for k in TOKEN_IDS}}


def partial_rope(m: Meta, names: set[str], head_dim: int) -> dict[str, Any]:
    """HF ``rope_parameters`` with ``partial_rotary_factor`` from ``rope.dimension_count`` (Phi, GPT-NeoX, StableLM;
    llama.cpp writes no RoPE base for these, so 10000, as their HF defaults)."""
    rot = rotary_dim(m, head_dim, partial_ok=True)
    return {**rope_parameters(m, names, 10000.0), "partial_rotary_factor": rot / head_dim}


def one_head_width(m: Meta, sizes: HFConfig, family: str) -> None:
    """Refuse a head dim other than ``embedding_length / head_count`` (families whose HF attention derives it)."""
    if sizes["head_dim"] * sizes["num_attention_heads"] != sizes["hidden_size"]:
        raise m.fail(f"{m.key('attention.key_length')} = {sizes['head_dim']} is not embedding_length / head_count; "
                     f"{family}'s head dim is")


def fixed_heads_sizes(m: Meta, names: set[str], family: str, *, kv_heads: int | None = None) -> HFConfig:
    """:func:`gguf_sizes` of a family whose head width is ``embedding_length / head_count``, whose K/V head count
    is fixed (``kv_heads``; default one per query head) and which has no sliding window (GPT-2, GPT-NeoX, BLOOM,
    StarCoder); each other value is refused by name.

    Example:
        >>> from interp.families._gguf import Meta, fixed_heads_sizes
        >>> meta = {f"gpt2.{k}": v for k, v in {"embedding_length": 8, "attention.head_count": 2, "block_count": 1,
        ...         "feed_forward_length": 32, "context_length": 16, "vocab_size": 10,
        ...         "attention.head_count_kv": 1}.items()}
        >>> fixed_heads_sizes(Meta(meta, "gpt2", "f.gguf"), set(), "GPT-2")
        Traceback (most recent call last):
        ...
        interp.families._gguf.GGUFError: f.gguf: gpt2.attention.head_count_kv = 1: GPT-2 has 2 K/V head(s) ...
    """
    sizes = gguf_sizes(m, names)
    one_head_width(m, sizes, family)
    want = sizes["num_attention_heads"] if kv_heads is None else kv_heads
    if sizes["num_key_value_heads"] != want:
        why = "one per query head" if kv_heads is None else "multi-query" if kv_heads == 1 else "fixed"
        raise m.fail(f"{m.key('attention.head_count_kv')} = {sizes['num_key_value_heads']}: {family} has {want} K/V "
                     f"head(s) ({why}); other counts are not supported")
    no_window(m)
    return sizes


def per_head_rows(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
    """Undo llama.cpp's ``[q | k | v]`` reorder of a fused ``attn_qkv`` whose HF rows are grouped per head
    (``[q_h, k_h, v_h]``: GPT-NeoX, BLOOM); other tensors pass.

    Example:
        >>> import torch
        >>> from interp.families._gguf import per_head_rows
        >>> per_head_rows("attn_qkv", "", torch.arange(6.0), {"num_attention_heads": 2})  # D = 1
        tensor([0., 2., 4., 1., 3., 5.])
    """
    if kind != "attn_qkv":
        return w
    H = hf_cfg.get("num_attention_heads") or hf_cfg["n_head"]
    if w.shape[0] % (3 * H):
        raise ValueError(f"has {w.shape[0]} rows, not 3 x {H} heads")
    return (w.reshape(3, H, w.shape[0] // (3 * H), *w.shape[1:])  # [3, H, D, ..]
            .transpose(0, 1).reshape(w.shape))  # [H, 3, D, ..] -> [H * 3 * D, ..]


def transposed(stems: tuple[str, ...]) -> Transform:
    """A transform that transposes the 2-D weights of ``stems`` back (llama.cpp stored GPT-2's ``Conv1D``
    ``[in, out]`` weights as ``[out, in]``; the HF mapping expects ``Conv1D``'s layout)."""
    def transform(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
        return w.T if kind in stems and w.dim() == 2 else w
    return transform


def llama_unpermute(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
    """Undo :func:`unpermute_rotary`'s permutation on ``attn_q`` / ``attn_k`` (what ``LlamaModel.permute`` did)."""
    heads = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}.get(kind)
    return w if heads is None else unpermute_rotary(w, hf_cfg[heads])


@dataclass(frozen=True)
class GGUFSpec:
    """How one ``general.architecture`` maps onto the Hugging Face model it was converted from.

    Attributes:
        config: ``(metadata, tensor names) -> HF config dict`` (refusing by name what it does not reproduce).
        global_names: GGUF stems outside the blocks (``token_embd``) -> HF names without ``.weight`` / ``.bias``.
        block_prefix: the HF prefix of block ``N`` (``"model.layers.{}."``).
        block: ``blk.N.<stem>`` stems -> HF names within a block, or a function of the HF config giving them.
        transform: undoes the converter's change to a tensor (see :data:`Transform`).
        special: tried before the tables (merged experts, split MLA halves); None for the tensors it leaves.
        experts: the architecture's files may carry ``expert_count`` (llama: Mixtral); others are refused.

    Example:
        >>> from interp.families._gguf import GGUFSpec, LLAMA_BLOCK, LLAMA_GLOBAL, llama_like
        >>> spec = GGUFSpec(llama_like("qwen2"), LLAMA_GLOBAL, "model.layers.{}.", LLAMA_BLOCK)
        >>> spec.hf_name("blk.3.ffn_up.weight", {})
        ('ffn_up', 'model.layers.3.mlp.up_proj.weight')
        >>> spec.hf_name("blk.0.attn_qkv.weight", {}) is None
        True
    """

    config: Callable[[Meta, set[str]], HFConfig]
    global_names: Mapping[str, str] = field(default_factory=dict)
    block_prefix: str = "model.layers.{}."
    block: Mapping[str, str] | Callable[[Mapping[str, Any]], Mapping[str, str]] = field(default_factory=dict)
    transform: Transform | None = None
    special: Special | None = None
    experts: bool = False

    def block_names(self, hf_cfg: Mapping[str, Any]) -> Mapping[str, str]:
        return self.block(hf_cfg) if callable(self.block) else self.block

    def hf_name(self, name: str, hf_cfg: Mapping[str, Any]) -> tuple[str, str] | None:
        """``(stem, HF name)`` of a GGUF tensor name, or None when this architecture's tables have no such tensor."""
        parts = name.split(".")
        if len(parts) == 2 and parts[0] in self.global_names and parts[1] in ("weight", "bias"):
            return parts[0], f"{self.global_names[parts[0]]}.{parts[1]}"
        block = self.block_names(hf_cfg)
        if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in block \
                and parts[3] in ("weight", "bias"):
            return parts[2], f"{self.block_prefix.format(int(parts[1]))}{block[parts[2]]}.{parts[3]}"
        return None

    def hf_config(self, meta: Mapping[str, Any], tensor_names: set[str], *, source: str = "GGUF") -> HFConfig:
        """The HF ``config.json`` dict the file's metadata describes.

        Raises:
            GGUFError: experts where the architecture has none, or what :attr:`config` refuses (key and value).
        """
        arch = meta.get("general.architecture")
        if meta.get(f"{arch}.expert_count", 0) and not self.experts:
            raise GGUFError(f"{source}: {meta[f'{arch}.expert_count']} experts per layer (mixture of experts) "
                            f"is not supported for {arch!r}; only dense decoders")
        return self.config(Meta(meta, str(arch), source), set(tensor_names))

    def hf_tensors(self, name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any], *, arch: str,
                   source: str = "GGUF") -> dict[str, torch.Tensor]:
        """The HF tensors one GGUF tensor becomes (its transform undone).

        Raises:
            GGUFError: a tensor the architecture has no place for, or one its transform refuses (named, with
                its shape).
        """
        if self.special is not None:
            pieces = self.special(name, w, hf_cfg, source=source)
            if pieces is not None:
                return pieces
        found = self.hf_name(name, hf_cfg)
        if found is None:
            raise GGUFError(f"{source}: tensor {name!r} has no place in a {arch!r} decoder")
        stem, hf = found
        if self.transform is None:
            return {hf: w}
        try:
            return {hf: self.transform(stem, hf, w, hf_cfg)}
        except (ValueError, RuntimeError) as e:
            raise GGUFError(f"{source}: tensor {name!r} of shape {tuple(w.shape)}: {e}") from e


def llama_spec(model_type: str, *, permuted: bool = False, qk_norm: bool = False, **fixed: Any) -> GGUFSpec:
    """The spec of a Llama-layout architecture (Llama's tensor names, :func:`llama_like` metadata); ``permuted``:
    llama.cpp's converter permuted the Q/K rows (``LlamaModel.permute``), undone on reading; ``qk_norm``: the
    blocks also hold ``attn_q_norm`` / ``attn_k_norm``."""
    block = {**LLAMA_BLOCK, **QK_NORM} if qk_norm else LLAMA_BLOCK
    return GGUFSpec(llama_like(model_type, **fixed), LLAMA_GLOBAL, "model.layers.{}.", block,
                    llama_unpermute if permuted else None)


__all__ = ["GPT2_BLOCK", "GPT2_GLOBAL", "GATED_MLP", "GGUFError", "GGUFSpec", "LLAMA_ATTN", "LLAMA_BLOCK", "LLAMA_GLOBAL", "Meta",
           "QK_NORM", "declared_windows", "gguf_sizes",
           "gpt2_keys", "llama_like", "llama_spec", "llama_unpermute", "one_head_width", "partial_rope", "refuse_keys",
           "shown",
           "transposed", "unpermute_rotary"]
