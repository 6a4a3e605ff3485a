"""The GGUF architectures :mod:`interp.zoo.gguf` reads, as one table: metadata -> Hugging Face config, GGUF
tensor names -> Hugging Face state-dict names, and the per-architecture tensor transforms that undo what
llama.cpp's converter (``convert_hf_to_gguf.py``) did to the weights.

A GGUF file is turned into the ``config.json`` dict and state dict of the Hugging Face model it was converted
from, and that pair goes through the Hugging Face converters of :mod:`interp.zoo.hf` /
:mod:`interp.zoo.hf_families`: one weight mapping per family, whichever format the weights come in.

What llama.cpp changes, per ``general.architecture`` (the HF ``model_type`` it came from in brackets):

* ``llama`` (llama, mistral, SmolLM, TinyLlama): ``attn_q`` / ``attn_k`` rows permuted so that each head's
  rotary pairs are interleaved; undone by :func:`unpermute_rotary`. No other architecture is permuted.
* ``qwen2``, ``qwen3`` (qwen2 / qwen3): names only (Qwen3 adds ``attn_q_norm`` / ``attn_k_norm``).
* ``gemma``, ``gemma2``, ``gemma3`` (gemma / gemma2 / gemma3_text): every RMSNorm weight is stored as ``1 + w``
  (llama.cpp's RMSNorm has no ``1 +``); undone here, the Gemma converter adds it back. Gemma 2 slides on even
  layers and Gemma 3 on five layers of six (llama.cpp's fixed patterns), Gemma 3's local layers rotate with
  base 10000; ``query_pre_attn_scalar`` is not in the file and is taken as llama.cpp does: the head dim,
  except ``d_model / n_heads`` for the 27B shapes (46 layers for Gemma 2, 62 for Gemma 3).
* ``phi3``: fused ``attn_qkv`` (``[q | k | v]``) and ``ffn_up`` (``[gate | up]``) as in HF; a
  ``sliding_window`` of 0 means none.
* ``starcoder`` (gpt_bigcode): MQA only (``head_count_kv`` 1), learned positions.
* ``falcon``: the fused QKV was reordered from HF's per-K/V-group ``[q_1 .. q_G, k, v]`` into
  ``[q | k | v]`` (``tensor_data_layout = "jploski"``); regrouped here. A second norm per block
  (``attn_norm_2``, HF's ``ln_attn``; ``attn_norm`` is then ``ln_mlp``) means the new decoder architecture
  with two norms (Falcon 40B / 180B).

Refused by name, with the value: any other architecture; RoPE scaling other than ``linear`` (and
``rope_freqs`` / LongRoPE factor tensors); a sliding window on an architecture that has none in llama.cpp;
a ``sliding_window_pattern`` other than the architecture's fixed one; partial rotary outside Phi-3; StarCoder
with more than one K/V head; a Falcon ``tensor_data_layout`` other than ``jploski``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .gguf_file import GGUFError

HFConfig = dict[str, Any]


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, with the entry count of a long array: an error message
    never echoes a 10^6-entry metadata array.

    Example:
        >>> from interp.zoo.gguf_archs import shown
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
        >>> from interp.zoo.gguf_archs import Meta
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
            >>> from interp.zoo.gguf_archs import Meta
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
def _shape(m: Meta, names: set[str]) -> HFConfig:
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


def _rotary_dim(m: Meta, head_dim: int, *, partial_ok: bool = False) -> int:
    rot = m.count("rope.dimension_count", head_dim)
    if rot > head_dim or (rot != head_dim and not partial_ok):
        raise m.fail(f"{m.key('rope.dimension_count')} = {rot} differs from the head dim {head_dim}: partial rotary "
                     f"is not supported for {m.arch!r}, or one of these keys is wrong")
    return rot


def _rope_parameters(m: Meta, names: set[str], theta_default: float) -> dict[str, Any]:
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


def _no_window(m: Meta) -> None:
    window = m.get("attention.sliding_window", 0)
    if window:
        raise m.fail(f"{m.key('attention.sliding_window')} = {window!r}: llama.cpp's {m.arch!r} has no sliding "
                     f"window, so which layers slide is unknown; not supported")


def _pattern_windows(m: Meta, n_layers: int, period: int) -> tuple[int | None, list[str] | None]:
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


def _llama_like(model_type: str) -> Callable[[Meta, set[str]], HFConfig]:
    def config(m: Meta, names: set[str]) -> HFConfig:
        rope = _rope_parameters(m, names, 10000.0)  # a scaling kind is refused before any missing key
        cfg = _shape(m, names)
        _rotary_dim(m, cfg["head_dim"])
        _no_window(m)
        return {**cfg, "model_type": model_type, "hidden_act": "silu",
                "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon", 1e-5), "rope_parameters": rope,
                "attention_bias": "blk.0.attn_q.bias" in names}
    return config


def _gemma(model_type: str) -> Callable[[Meta, set[str]], HFConfig]:
    def config(m: Meta, names: set[str]) -> HFConfig:
        cfg = _shape(m, names)
        _rotary_dim(m, cfg["head_dim"])
        n_layers = cfg["num_hidden_layers"]
        cfg.update(model_type=model_type, hidden_activation="gelu_pytorch_tanh",
                   rms_norm_eps=m.number("attention.layer_norm_rms_epsilon", 1e-6),
                   attention_bias="blk.0.attn_q.bias" in names)
        if model_type == "gemma":
            _no_window(m)
            return {**cfg, "rope_parameters": _rope_parameters(m, names, 10000.0)}
        # llama.cpp's attention scale: 1/sqrt(head_dim), except the 27B shapes (by layer count, as llama.cpp).
        big = n_layers == (46 if model_type == "gemma2" else 62)
        cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"] if big else cfg["head_dim"]
        if model_type == "gemma2":
            window, types = _pattern_windows(m, n_layers, 2)
            return {**cfg, "rope_parameters": _rope_parameters(m, names, 10000.0), "sliding_window": window,
                    "layer_types": types, "attn_logit_softcapping": m.number("attn_logit_softcapping", 50.0),
                    "final_logit_softcapping": m.number("final_logit_softcapping", 30.0)}
        window, types = _pattern_windows(m, n_layers, 6)
        local = {"rope_type": "default", "rope_theta": m.number("rope.freq_base_swa", 10000.0)}
        return {**cfg, "rope_parameters": {"full_attention": _rope_parameters(m, names, 1_000_000.0),
                                           "sliding_attention": local},
                "sliding_window": window, "layer_types": types, "attn_logit_softcapping": None,
                "final_logit_softcapping": m.number("final_logit_softcapping", None)}
    return config


def _phi3(m: Meta, names: set[str]) -> HFConfig:
    cfg = _shape(m, names)
    if cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        raise m.fail(f"{m.key('attention.key_length')} = {cfg['head_dim']} is not embedding_length / head_count; "
                     f"Phi-3's head dim is")
    rot = _rotary_dim(m, cfg["head_dim"], partial_ok=True)
    window = m.get("attention.sliding_window", 0)
    return {**cfg, "model_type": "phi3", "hidden_act": "silu",
            "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon", 1e-5),
            "rope_parameters": {**_rope_parameters(m, names, 10000.0), "partial_rotary_factor": rot / cfg["head_dim"]},
            "sliding_window": m.count("attention.sliding_window") if window else None}


def _starcoder(m: Meta, names: set[str]) -> HFConfig:
    cfg = _shape(m, names)
    if cfg["num_key_value_heads"] != 1:
        raise m.fail(f"{m.key('attention.head_count_kv')} = {cfg['num_key_value_heads']}: llama.cpp's starcoder is "
                     f"multi-query (1 K/V head); other counts are not supported")
    _no_window(m)
    return {"model_type": "gpt_bigcode", "n_embd": cfg["hidden_size"], "n_head": cfg["num_attention_heads"],
            "n_layer": cfg["num_hidden_layers"], "n_inner": cfg["intermediate_size"], "vocab_size": cfg["vocab_size"],
            "n_positions": cfg["max_position_embeddings"], "multi_query": True,
            "layer_norm_epsilon": m.number("attention.layer_norm_epsilon", 1e-5),
            "activation_function": "gelu_pytorch_tanh", "tie_word_embeddings": cfg["tie_word_embeddings"],
            **{k: cfg[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")}}


def _falcon(m: Meta, names: set[str]) -> HFConfig:
    cfg = _shape(m, names)
    layout = m.get("tensor_data_layout", "jploski")
    if layout != "jploski":
        raise m.fail(f"{m.key('tensor_data_layout')} = {layout!r} is not supported (only 'jploski', the "
                     f"[q | k | v] layout llama.cpp's converter writes)")
    if cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        raise m.fail(f"{m.key('attention.key_length')} = {cfg['head_dim']} is not embedding_length / head_count")
    _rotary_dim(m, cfg["head_dim"])
    _no_window(m)
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    two_norms = "blk.0.attn_norm_2.weight" in names
    # HF spells the K/V grouping three ways; each below converts to the same model.
    if two_norms or K not in (1, H):
        layout_cfg = {"new_decoder_architecture": True, "num_kv_heads": K, "num_ln_in_parallel_attn": 2 if two_norms else 1}
    else:
        layout_cfg = {"new_decoder_architecture": False, "multi_query": K == 1}
    return {"model_type": "falcon", "hidden_size": cfg["hidden_size"], "num_attention_heads": H,
            "num_hidden_layers": cfg["num_hidden_layers"], "vocab_size": cfg["vocab_size"],
            "ffn_hidden_size": cfg["intermediate_size"], "max_position_embeddings": cfg["max_position_embeddings"],
            "layer_norm_epsilon": m.number("attention.layer_norm_epsilon", 1e-5),
            "rope_parameters": _rope_parameters(m, names, 10000.0), "parallel_attn": True, "alibi": False,
            "bias": "blk.0.attn_qkv.bias" in names, "activation": "gelu",
            "tie_word_embeddings": cfg["tie_word_embeddings"], **layout_cfg,
            **{k: cfg[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")}}


# --- tensor names and transforms ----------------------------------------------------------------------------
def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row permutation of ``attn_q`` / ``attn_k`` (weights ``[n*D, M]`` or biases ``[n*D]``).

    llama.cpp stores each head's rows as interleaved pairs ``(0, D/2), (1, D/2+1), ...``; Hugging Face and
    interp keep the first half of the rotary dims, then the second half.

    Example:
        >>> import torch
        >>> from interp.zoo.gguf_archs import unpermute_rotary
        >>> unpermute_rotary(torch.arange(8.0), 1)    # one head, D = 8
        tensor([0., 2., 4., 6., 1., 3., 5., 7.])
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"cannot split {rows} rows into {n_heads} heads of rotary pairs")
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])  # [n, D/2, 2, (M)]
            .transpose(1, 2).reshape(w.shape))  # [n, 2, D/2, (M)] -> [n*D, (M)]


def _llama_unpermute(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
    heads = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}.get(kind)
    return w if heads is None else unpermute_rotary(w, hf_cfg[heads])


def _gemma_norm(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
    # llama.cpp's converter adds 1 to every tensor whose HF name ends in "norm.weight".
    return w - 1 if hf_name.endswith("norm.weight") else w


def _falcon_regroup(kind: str, hf_name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any]) -> torch.Tensor:
    """``[q | k | v]`` rows (llama.cpp) back to HF Falcon's per-K/V-group ``[q_1 .. q_G, k, v]``."""
    if kind != "attn_qkv":
        return w
    H = hf_cfg["num_attention_heads"]
    K = hf_cfg.get("num_kv_heads", 1 if hf_cfg.get("multi_query") else H)
    D = hf_cfg["hidden_size"] // H
    if w.shape[0] != (H + 2 * K) * D:
        raise ValueError(f"has {w.shape[0]} rows, {H} query + 2 x {K} K/V heads of {D} need {(H + 2 * K) * D}")
    rest = w.shape[1:]
    q, k, v = w.split([H * D, K * D, K * D])
    groups = [q.reshape(K, H // K, D, *rest), k.reshape(K, 1, D, *rest), v.reshape(K, 1, D, *rest)]
    return torch.cat(groups, dim=1).reshape(w.shape)  # [K, G + 2, D, ..] -> [(H + 2K) D, ..]


Transform = Callable[[str, str, torch.Tensor, Mapping[str, Any]], torch.Tensor]

_LLAMA_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LLAMA_ATTN_MLP = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LLAMA_BLOCK = {**_LLAMA_ATTN_MLP, "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_SANDWICH_BLOCK = {**_LLAMA_ATTN_MLP, "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                   "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}


def _falcon_block(hf_cfg: Mapping[str, Any]) -> dict[str, str]:
    two = hf_cfg.get("new_decoder_architecture") and hf_cfg.get("num_ln_in_parallel_attn") == 2
    # Two norms (gguf's tensor map, as llama.cpp's falcon graph reads them): attn_norm_2 feeds the attention,
    # attn_norm the MLP.
    return {"attn_norm": "ln_mlp" if two else "input_layernorm", "attn_norm_2": "ln_attn",
            "attn_qkv": "self_attention.query_key_value", "attn_output": "self_attention.dense",
            "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"}


@dataclass(frozen=True)
class Architecture:
    """How one ``general.architecture`` maps onto the Hugging Face model it was converted from.

    ``global_names`` / ``block`` map GGUF tensor stems (``token_embd``, ``blk.N.<stem>``) to HF names without
    the ``.weight`` / ``.bias`` suffix; ``block`` may depend on the HF config (Falcon's norm names).
    ``transform(stem, hf_name, tensor, hf_cfg)`` undoes the converter's change to a tensor (on any device,
    the meta device included: the tensor-table check runs it on shapes only).
    """

    config: Callable[[Meta, set[str]], HFConfig]
    global_names: Mapping[str, str]
    block_prefix: str
    block: Mapping[str, str] | Callable[[Mapping[str, Any]], Mapping[str, str]]
    transform: Transform | None = None

    def block_names(self, hf_cfg: Mapping[str, Any]) -> Mapping[str, str]:
        return self.block(hf_cfg) if callable(self.block) else self.block

    def hf_name(self, name: str, hf_cfg: Mapping[str, Any]) -> tuple[str, str] | None:
        """``(stem, HF name)`` of a GGUF tensor name, or None when this architecture has no such tensor.

        Example:
            >>> from interp.zoo.gguf_archs import ARCHITECTURES
            >>> ARCHITECTURES["gemma2"].hf_name("blk.3.post_ffw_norm.weight", {})
            ('post_ffw_norm', 'model.layers.3.post_feedforward_layernorm.weight')
            >>> ARCHITECTURES["llama"].hf_name("blk.0.attn_qkv.weight", {}) is None
            True
        """
        parts = name.split(".")
        if len(parts) == 2 and parts[0] in self.global_names and parts[1] in ("weight", "bias"):
            return parts[0], f"{self.global_names[parts[0]]}.{parts[1]}"
        block = self.block_names(hf_cfg)
        if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in block \
                and parts[3] in ("weight", "bias"):
            return parts[2], f"{self.block_prefix.format(int(parts[1]))}{block[parts[2]]}.{parts[3]}"
        return None


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(_llama_like("llama"), _LLAMA_GLOBAL, "model.layers.{}.", _LLAMA_BLOCK, _llama_unpermute),
    "qwen2": Architecture(_llama_like("qwen2"), _LLAMA_GLOBAL, "model.layers.{}.", _LLAMA_BLOCK),
    "qwen3": Architecture(_llama_like("qwen3"), _LLAMA_GLOBAL, "model.layers.{}.", _LLAMA_BLOCK),
    "gemma": Architecture(_gemma("gemma"), _LLAMA_GLOBAL, "model.layers.{}.", _LLAMA_BLOCK, _gemma_norm),
    "gemma2": Architecture(_gemma("gemma2"), _LLAMA_GLOBAL, "model.layers.{}.", _SANDWICH_BLOCK, _gemma_norm),
    "gemma3": Architecture(_gemma("gemma3_text"), _LLAMA_GLOBAL, "model.layers.{}.", _SANDWICH_BLOCK, _gemma_norm),
    "phi3": Architecture(_phi3, _LLAMA_GLOBAL, "model.layers.{}.", {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_qkv": "self_attn.qkv_proj",
        "attn_output": "self_attn.o_proj", "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"}),
    "starcoder": Architecture(_starcoder, {
        "token_embd": "transformer.wte", "position_embd": "transformer.wpe", "output_norm": "transformer.ln_f",
        "output": "lm_head"}, "transformer.h.{}.", {
        "attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
        "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}),
    "falcon": Architecture(_falcon, {
        "token_embd": "transformer.word_embeddings", "output_norm": "transformer.ln_f", "output": "lm_head"},
        "transformer.h.{}.", _falcon_block, _falcon_regroup),
}


__all__ = ["ARCHITECTURES", "Architecture", "Meta", "unpermute_rotary"]
