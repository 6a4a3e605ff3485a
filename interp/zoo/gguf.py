"""Llama-family GGUF files (llama.cpp's format) to :class:`interp.Transformer`, tokenizer included.

A GGUF file holds metadata (the architecture's hyper-parameters and the tokenizer's vocabulary, merges and
special ids) and tensors, usually quantised. :func:`load_gguf` reads both with the ``gguf`` package (pure
Python + numpy), dequantises every tensor to float32 (or bfloat16 on request), renames the tensors to
Hugging Face's Llama names and hands them to the Llama converter of :mod:`interp.zoo.hf`, so the two
paths share one weight mapping.

What it accepts: ``general.architecture == "llama"``, which llama.cpp writes for Llama 1/2/3, SmolLM /
SmolLM2, TinyLlama, Mistral 7B and other dense Llama-style decoders (RMSNorm, SwiGLU, rotary attention with
grouped K/V heads, tied or untied unembedding), with plain rotary (no RoPE scaling), no experts and rotary
over the whole head. Every quantisation the ``gguf`` package can dequantise is read (F32, F16, BF16, Q4_0,
Q4_1, Q5_x, Q8_0, the K-quants, ...). Mixtures of experts (``llama`` with ``expert_count``: Mixtral; and
``deepseek2``: DeepSeek-V2/V3 with MLA) are mapped by :mod:`interp.zoo.gguf_experts` onto the same HF
conversion. Anything else (``qwen2``, ``gemma``, ``phi3``, ``rope_freqs`` scaling, ...) is refused with a
ValueError naming it.

Tokenizers: byte-level BPE (``tokenizer.ggml.model == "gpt2"``: SmolLM, Llama 3, ...) and sentencepiece BPE
(``"llama"``: Llama 1/2, Mistral, TinyLlama) are rebuilt with the ``tokenizers`` library, with the file's
control tokens as special tokens and BOS/EOS added as the file says (``tokenizer.ggml.add_bos_token``).

Two llama.cpp conventions are undone: GGUF dimensions are listed fastest-first (a ``[576, 49152]`` tensor is
our ``[49152, 576]``), and llama.cpp's converter permutes the rows of ``attn_q`` / ``attn_k`` so that each
head's rotary pairs are interleaved (``x0, x1`` rotate together) instead of split in halves (``x_i`` with
``x_{i + D/2}``, the rotate-half convention of :mod:`interp.rotary` and Hugging Face).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..model import Transformer
from . import gguf_experts
from .checkpoint import check_fits
from .gguf_file import GGUFError, GGUFFile, read_gguf
from .hf import CONVERTERS, convert
from .tokenizer import Tokenizer

_GGUF_EXTRA = "pip install interp[gguf]"
SUPPORTED_ARCHITECTURES = ("llama", *gguf_experts.ARCHITECTURES)
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_CONTROL, _USER_DEFINED = 3, 4


def _gguf():
    try:
        import gguf
    except ImportError as e:
        raise ImportError(f"reading GGUF files needs the gguf package: {_GGUF_EXTRA}") from e
    return gguf


def _reader(path: str | Path) -> GGUFFile:
    _gguf()  # the ImportError naming the extra comes first
    return read_gguf(path)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata entry of a GGUF file as Python values (strings, numbers, lists).

    Args:
        path: the ``.gguf`` file.

    Returns:
        ``{key: value}``, e.g. ``{"general.architecture": "llama", "llama.block_count": 30, ...}``.

    Raises:
        FileNotFoundError: no file at ``path``.
        GGUFError: (a ValueError) the file is not GGUF, or its header is corrupt (file and key named).

    Example:
        >>> read_metadata(interp.zoo.smollm2.fetch_gguf())["llama.attention.head_count_kv"]
        3
    """
    return _metadata(_reader(path))


def _metadata(reader: GGUFFile) -> dict[str, Any]:
    return dict(reader.metadata)


# --- config -----------------------------------------------------------------------------------------------
def _check_architecture(meta: Mapping[str, Any], tensor_names: set[str], source: str) -> str:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"{source}: GGUF architecture {arch!r} is not supported; this loader reads "
                         f"{list(SUPPORTED_ARCHITECTURES)} (Llama, SmolLM, Mistral-style dense decoders)")
    if arch in gguf_experts.ARCHITECTURES:  # their own settings, RoPE scaling included, are read there
        return arch
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in tensor_names:
        kind = scaling if scaling not in ("none", None) else "rope_freqs (llama3)"
        raise GGUFError(f"{source}: RoPE scaling {kind!r} is not supported; only plain rotary")
    return arch


def hf_config_from_gguf(meta: Mapping[str, Any], tensor_names: set[str], *, source: str = "GGUF") -> dict[str, Any]:
    """The Hugging Face ``LlamaConfig`` dict that a llama GGUF file's metadata describes.

    Args:
        meta: :func:`read_metadata` output.
        tensor_names: the file's tensor names (an ``output.weight`` means an untied unembedding).
        source: named in errors.

    Returns:
        A ``config.json``-style dict (``model_type="llama"``) for :func:`interp.zoo.hf.llama_config`.

    Raises:
        ValueError: another architecture, experts, RoPE scaling, partial rotary, or a missing key.

    Example:
        >>> cfg = hf_config_from_gguf(read_metadata(interp.zoo.smollm2.fetch_gguf()), {"token_embd.weight"})
        >>> cfg["num_key_value_heads"]
        3
    """
    arch = _check_architecture(meta, tensor_names, source)
    if arch in gguf_experts.ARCHITECTURES:
        return gguf_experts.hf_config(meta, None, tensor_names, source=source)

    def count(key: str, default: Any = None, *, low: int = 1) -> int:
        """A whole-number hyper-parameter, refused by name when absent, not an integer or below ``low``."""
        full = f"{arch}.{key}"
        value = meta.get(full, default)
        if value is None:
            raise GGUFError(f"{source}: metadata has no {full!r}")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise GGUFError(f"{source}: metadata {full!r} = {value!r} must be an integer >= {low}")
        return int(value)

    d_model, n_heads = count("embedding_length"), count("attention.head_count")
    if f"{arch}.attention.key_length" not in meta and d_model % n_heads:
        raise GGUFError(f"{source}: {arch}.embedding_length = {d_model} is not a multiple of "
                        f"{arch}.attention.head_count = {n_heads} (and no attention.key_length says the head dim)")
    head_dim = count("attention.key_length", d_model // n_heads)
    if count("attention.value_length", head_dim) != head_dim:
        raise GGUFError(f"{source}: key_length {head_dim} != value_length {meta[f'{arch}.attention.value_length']}")
    rot = count("rope.dimension_count", head_dim)
    if rot != head_dim:
        raise GGUFError(f"{source}: {arch}.rope.dimension_count = {rot} differs from the head dim {head_dim} "
                        f"(embedding_length {d_model} / head_count {n_heads}): partial rotary is not "
                        f"supported, or one of these keys is wrong")
    n_kv = meta.get(f"{arch}.attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):  # llama.cpp allows a per-layer list; dense llama files keep one value
        if len(set(n_kv)) != 1:
            raise GGUFError(f"{source}: per-layer {arch}.attention.head_count_kv {n_kv[:8]} is not supported")
        n_kv = n_kv[0]
    n_kv = count("attention.head_count_kv", n_kv)
    if n_heads % n_kv:
        raise GGUFError(f"{source}: {arch}.attention.head_count = {n_heads} is not a multiple of "
                        f"{arch}.attention.head_count_kv = {n_kv}")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise GGUFError(f"{source}: metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    vocab = count("vocab_size", vocab)
    eps = meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    theta = meta.get(f"{arch}.rope.freq_base", 10000.0)
    for key, value in (("attention.layer_norm_rms_epsilon", eps), ("rope.freq_base", theta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
            raise GGUFError(f"{source}: metadata {arch}.{key!r} = {value!r} must be a positive finite number")
    ids = {}
    for which in ("padding", "bos", "eos"):
        key = f"tokenizer.ggml.{which}_token_id"
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab):
            raise GGUFError(f"{source}: metadata {key!r} = {value!r} is outside the vocabulary of {vocab} tokens")
        ids[which] = value
    llama = {
        "model_type": "llama", "hidden_act": "silu", "hidden_size": d_model, "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv, "head_dim": head_dim, "num_hidden_layers": count("block_count"),
        "intermediate_size": count("feed_forward_length"), "vocab_size": vocab,
        "max_position_embeddings": count("context_length"),
        "rms_norm_eps": float(eps), "rope_theta": float(theta),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "pad_token_id": ids["padding"], "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
    }
    if gguf_experts.is_expert_file(meta):  # Mixtral: llama attention, experts in place of the MLPs
        return gguf_experts.hf_config(meta, llama, tensor_names, source=source)
    return llama


# --- weights ----------------------------------------------------------------------------------------------
def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row permutation of ``attn_q`` / ``attn_k`` (weights ``[n*D, M]`` or biases ``[n*D]``).

    llama.cpp stores each head's rows as interleaved pairs ``(0, D/2), (1, D/2+1), ...``; Hugging Face and
    interp keep the first half of the rotary dims, then the second half.

    Example:
        >>> unpermute_rotary(torch.arange(8.0), 1)    # one head, D = 8
        tensor([0., 2., 4., 6., 1., 3., 5., 7.])
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"cannot split {rows} rows into {n_heads} heads of rotary pairs")
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])  # [n, D/2, 2, (M)]
            .transpose(1, 2).reshape(w.shape))  # [n, 2, D/2, (M)] -> [n*D, (M)]


_HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_HF_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _hf_name(name: str) -> str | None:
    if name in _HF_NAMES:
        return _HF_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _HF_BLOCK:
        return f"model.layers.{parts[1]}.{_HF_BLOCK[parts[2]]}.{parts[3]}"
    return None


def _hf_tensors(name: str, w: torch.Tensor, hf_cfg: Mapping[str, Any], source: str) -> dict[str, torch.Tensor]:
    """The HF tensors one GGUF tensor becomes: one renamed tensor, or (expert files) merged experts split."""
    if hf_cfg["model_type"] != "llama":
        pieces = gguf_experts.hf_tensors(name, w, hf_cfg, source=source)
        if pieces is not None:
            return pieces
    hf = _hf_name(name)
    if hf is None:
        raise GGUFError(f"{source}: tensor {name!r} has no place in a {hf_cfg['model_type']} decoder")
    return {hf: _unpermuted(w, name, hf_cfg, source)}


def _gguf_rows_cols(t) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims fastest first


def _block_index(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blk":
        return int(parts[1]) if parts[1].isdigit() else -1
    return None


class _Recording(dict):
    """A state dict that remembers which tensors the converter read (the rest are extra tensors)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def check_tensor_table(reader: GGUFFile, hf_cfg: Mapping[str, Any], *, source: str = "GGUF") -> None:
    """Check a GGUF file's tensor table against the model its metadata declares, allocating nothing.

    The declared sizes come from a header anyone can edit: ``block_count = 10**6`` or ``vocab_size = 10**9``
    in a file of a few kilobytes must be refused before a model of that size is built. The layer count is
    compared with the ``blk.N`` tensors first (cheap, and it bounds the rest), then the converter runs on
    meta-device tensors of the table's own shapes and the result is fitted to a meta-device model.

    Args:
        reader: the parsed file (:func:`interp.zoo.gguf_file.read_gguf`).
        hf_cfg: :func:`hf_config_from_gguf` output.
        source: named in errors.

    Raises:
        GGUFError: (a ValueError) layers missing or extra, tensors missing, extra or of the wrong shape
            (each named with both shapes).

    Example:
        >>> f = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
        >>> check_tensor_table(f, hf_config_from_gguf(f.metadata, {t.name for t in f.tensors}))  # doctest: +SKIP
    """
    n_layers = int(hf_cfg["num_hidden_layers"])
    blocks = {}
    for t in reader.tensors:
        i = _block_index(t.name)
        if i is not None:
            blocks.setdefault(i, []).append(t.name)
    extra = sorted(i for i in blocks if not 0 <= i < n_layers)
    if extra:
        names = [n for i in extra for n in blocks[i]]
        raise GGUFError(f"{source}: the metadata declares block_count = {n_layers}, but the file holds tensors "
                        f"for layer(s) {extra[:8]} too: {names[:8]}{' ...' if len(names) > 8 else ''}")
    if len(blocks) != n_layers:
        missing = sorted(set(range(n_layers)) - set(blocks))
        raise GGUFError(f"{source}: the metadata declares block_count = {n_layers}, but the file holds tensors "
                        f"for {len(blocks)} layer(s); no tensors for layer(s) {missing[:8]}")
    hf_shapes, hf_of = _Recording(), {}
    for t in reader.tensors:
        pieces = _hf_tensors(t.name, torch.empty(_gguf_rows_cols(t), device="meta"), hf_cfg, source)
        hf_of[t.name] = set(pieces)
        hf_shapes.update(pieces)
    try:
        joined = gguf_experts.join_split_tensors(hf_shapes)
    except GGUFError as e:
        raise GGUFError(f"{source}: {e}") from e
    make_cfg, make_sd = CONVERTERS[hf_cfg["model_type"]]
    try:
        cfg = make_cfg(hf_cfg)
        with torch.device("meta"):
            skeleton = Transformer(cfg)
        ours = make_sd(hf_shapes, cfg)
    except (ValueError, RuntimeError) as e:  # a missing tensor, or a torch.cat of mismatched shapes
        raise GGUFError(f"{source}: the tensors do not fit the declared model: {e}") from e
    unused = [name for name, hfs in hf_of.items() if not {joined.get(h, h) for h in hfs} & hf_shapes.read]
    if unused:
        raise GGUFError(f"{source}: tensors the declared model has no place for: {unused[:8]}")
    try:
        check_fits(skeleton, {k: tuple(v.shape) for k, v in ours.items()}, source=source)
    except ValueError as e:
        raise GGUFError(f"{e} (shapes after conversion to interp's layout; GGUF lists dims reversed)") from e


def _check_widths(meta: Mapping[str, Any], reader: GGUFFile, source: str) -> None:
    """The model width and vocabulary against the embedding's own shape, before any derived check (a wrong
    ``embedding_length`` would otherwise surface as a head dim that looks like partial rotary)."""
    arch = meta.get("general.architecture")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None or len(embed.shape) != 2:
        return
    width, rows = (int(d) for d in embed.shape)  # GGUF order: [d_model, vocab]
    for key, found in (("embedding_length", width), ("vocab_size", rows)):
        declared = meta.get(f"{arch}.{key}")
        if declared is not None and declared != found:
            raise GGUFError(f"{source}: metadata '{arch}.{key}' = {declared!r}, but tensor 'token_embd.weight' "
                            f"has shape {[rows, width]} ({key} {found})")


def _unpermuted(w: torch.Tensor, name: str, hf_cfg: Mapping[str, Any], source: str) -> torch.Tensor:
    heads = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}.get(name.split(".")[-2])
    if heads is None:
        return w
    try:
        return unpermute_rotary(w, hf_cfg[heads])
    except (ValueError, RuntimeError) as e:
        raise GGUFError(f"{source}: tensor {name!r} of shape {tuple(w.shape)}: {e}") from e


def hf_state_dict_from_gguf(reader, hf_cfg: Mapping[str, Any], *, dtype: torch.dtype = torch.float32,
                            progress: bool = False, source: str = "GGUF") -> dict[str, torch.Tensor]:
    """Dequantise a llama GGUF file's tensors into a Hugging Face ``LlamaForCausalLM`` state dict.

    Raises:
        GGUFError: (a ValueError) a tensor this loader does not know, a quantisation ``gguf`` cannot decode,
            or a tensor with NaN or infinite values after dequantisation (each named).
    """
    gguf = _gguf()
    out: dict[str, torch.Tensor] = {}
    tensors = reader.tensors
    if progress:
        from tqdm.auto import tqdm

        tensors = tqdm(tensors, desc="dequantising GGUF tensors", unit="tensor")
    for t in tensors:
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise GGUFError(f"{source}: tensor {t.name!r} is {t.tensor_type.name}, which gguf cannot "
                            f"dequantise") from e
        # A copy: F32 tensors come back as read-only views of the memory-mapped file.
        w = torch.from_numpy(np.array(arr, dtype=np.float32)).reshape(_gguf_rows_cols(t))  # [rows, cols]
        if not bool(torch.isfinite(w).all()):
            bad = int((~torch.isfinite(w)).sum())
            raise GGUFError(f"{source}: tensor {t.name!r} ({t.tensor_type.name}) holds {bad} NaN or infinite "
                            f"value(s) after dequantisation; the file is corrupt")
        out.update({k: v.to(dtype) for k, v in _hf_tensors(t.name, w, hf_cfg, source).items()})
    gguf_experts.join_split_tensors(out)
    return out


# --- tokenizer --------------------------------------------------------------------------------------------
# Pre-tokenizer split patterns by ``tokenizer.ggml.pre`` (llama.cpp's names). Files whose name is absent
# use GPT-2's own pattern (ByteLevel's built-in regex), which SmolLM's "smollm" uses.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
               "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT}
_GPT2_PRES = ("default", "gpt2", "gpt-2", "smollm", "starcoder", "refact", None)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet byte-level BPE vocabularies are written in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_from_gguf(meta: Mapping[str, Any], *, source: str = "GGUF") -> Tokenizer:
    """Rebuild the tokenizer a GGUF file describes with the ``tokenizers`` library.

    Args:
        meta: :func:`read_metadata` output (``tokenizer.ggml.*`` keys).
        source: named in errors.

    Returns:
        An :class:`interp.zoo.tokenizer.Tokenizer` (BOS/EOS added as the file's ``add_bos_token`` /
        ``add_eos_token`` say; control tokens such as ``<|im_start|>`` kept whole and special).

    Raises:
        ValueError: a tokenizer model other than ``gpt2`` (byte-level BPE) or ``llama`` (sentencepiece BPE),
            or a byte-level pre-tokenizer this loader does not know (both named).

    Example:
        >>> tok = tokenizer_from_gguf(read_metadata(interp.zoo.smollm2.fetch_gguf()))
        >>> tok.to_str_tokens(tok.to_tokens("Hello world")[0].tolist())
        ['Hello', ' world']
    """
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    if not tokens:
        raise GGUFError(f"{source}: metadata has no tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise GGUFError(f"{source}: metadata 'tokenizer.ggml.tokens' must be a list of strings")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if not isinstance(types, list) or len(types) != len(tokens):
        raise GGUFError(f"{source}: metadata 'tokenizer.ggml.token_type' has {len(types) if isinstance(types, list) else types!r} "
                        f"entries for {len(tokens)} tokens")
    for which in ("bos", "eos", "unknown", "padding"):
        key = f"tokenizer.ggml.{which}_token_id"
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value < len(tokens)):
            raise GGUFError(f"{source}: metadata {key!r} = {value!r} is not an id of the {len(tokens)} tokens "
                            f"in 'tokenizer.ggml.tokens'")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    try:
        return _build_tokenizer(meta, kind, tokens, types, unk, source)
    except GGUFError:
        raise
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
        raise GGUFError(f"{source}: the tokenizer in 'tokenizer.ggml.*' cannot be built: {e}") from e


def _merge_pairs(meta: Mapping[str, Any], vocab: Mapping[str, int], source: str) -> list[tuple[str, str]]:
    merges = meta.get("tokenizer.ggml.merges") or []
    pairs = []
    for i, m in enumerate(merges):
        pair = tuple(m.split(" ", 1)) if isinstance(m, str) else ()
        if len(pair) != 2 or not all(pair):
            raise GGUFError(f"{source}: metadata 'tokenizer.ggml.merges'[{i}] = {m!r} is not two tokens joined by "
                            f"one space")
        missing = [p for p in pair if p not in vocab]
        if missing:
            raise GGUFError(f"{source}: metadata 'tokenizer.ggml.merges'[{i}] = {m!r} merges {missing} that are "
                            f"not in 'tokenizer.ggml.tokens'")
        pairs.append(pair)
    return pairs


def _unique_vocab(spelled: list[str], source: str) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(spelled):
        if t in vocab:
            raise GGUFError(f"{source}: metadata 'tokenizer.ggml.tokens' holds {t!r} twice (ids {vocab[t]} and {i})")
        vocab[t] = i
    return vocab


def _build_tokenizer(meta, kind, tokens, types, unk, source) -> Tokenizer:
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    if kind == "gpt2":
        pre = meta.get("tokenizer.ggml.pre")
        if pre not in _PRE_SPLITS and pre not in _GPT2_PRES:
            raise GGUFError(f"{source}: byte-level pre-tokenizer {pre!r} is not known; known: "
                             f"{sorted(str(p) for p in (*_PRE_SPLITS, *_GPT2_PRES) if p)}")
        spell = _bytes_to_unicode()
        alphabet = set(spell.values())
        # A few files store a token in raw UTF-8 rather than in the byte alphabet: respell it.
        vocab = _unique_vocab([t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))
                               for t in tokens], source)
        merges = _merge_pairs(meta, vocab, source)
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        if pre in _PRE_SPLITS:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_PRE_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        # Control tokens written outside the byte alphabet are llama.cpp mislabels; keep them out.
        special_ok: Callable[[str], bool] = lambda t: set(t) <= alphabet
    elif kind == "llama":
        vocab = _unique_vocab(tokens, source)
        merges = _merge_pairs(meta, vocab, source)
        if not merges:
            merges = _merges_from_scores(tokens, meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens), vocab)
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                     unk_token=None if unk is None else tokens[unk]))
        # Spaces become "▁" and one is prepended unless the text already starts with one (as transformers'
        # LlamaTokenizer; sentencepiece itself would prepend one more before a leading space).
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1, right=0)])
        special_ok = lambda t: True
    else:
        raise GGUFError(f"{source}: tokenizer model {kind!r} is not supported; supported: "
                         f"'gpt2' (byte-level BPE), 'llama' (sentencepiece BPE)")
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(tokens, types) if ty == _CONTROL and special_ok(t)])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab])
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        first = [tokens[bos]] if add_bos else []
        last = [tokens[eos]] if add_eos else []
        specials = [(tokens[i], i) for i, on in ((bos, add_bos), (eos, add_eos)) if on]
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join([*first, "$A", *last]), pair=" ".join([*first, "$A", *last, "$B"]),
            special_tokens=list(dict.fromkeys(specials)))
    elif kind == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    pad = meta.get("tokenizer.ggml.padding_token_id")
    return Tokenizer(tok, pad_token_id=pad if pad is not None else eos)


def _merges_from_scores(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Sentencepiece files list no merges: every split of a token into two known pieces is a merge, ranked by
    the merged token's score (higher first), then by the pieces' ids (the order sentencepiece itself uses)."""
    found = []
    for t, score in zip(tokens, scores):
        for cut in range(1, len(t)):
            a, b = t[:cut], t[cut:]
            if a in vocab and b in vocab:
                found.append((-float(score), vocab[a], vocab[b], a, b))
    found.sort()
    return [(a, b) for *_, a, b in found]


# --- the whole model --------------------------------------------------------------------------------------
def load_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32, tokenizer: bool = True,
              name: str | None = None, progress: bool = False,
              device: torch.device | str | None = None) -> Transformer:
    """Load a llama-family GGUF file as an :class:`interp.Transformer` with its tokenizer.

    Args:
        path: the ``.gguf`` file.
        dtype: parameter dtype after dequantisation (``torch.float32`` default, ``torch.bfloat16``...).
        tokenizer: rebuild the file's tokenizer (False: weights only, ``model.tokenizer`` is None).
        name: ``model.name`` (default: the file's ``general.name``, else its file name).
        progress: show a progress bar while dequantising.
        device: where to put the model.

    Returns:
        The model in eval mode; ``model.gguf_metadata`` keeps the scalar metadata (licence, name, ...).

    Raises:
        FileNotFoundError: no file at ``path``.
        GGUFError: (a ValueError) not a GGUF file, a corrupt header, metadata that disagrees with the
            tensor table, non-finite weights, or an architecture, setting, tensor or tokenizer this loader
            does not support; the message names the file and the key or tensor.
        TypeError: ``dtype`` is not a floating torch dtype.
        ImportError: the ``gguf`` package is missing (``pip install interp[gguf]``).

    Example:
        >>> model = load_gguf(interp.zoo.smollm2.fetch_gguf())  # ~1 min (dequantises every tensor)  # doctest: +SKIP
        >>> model.generate(model.to_tokens("The capital of France is"), 5)  # doctest: +SKIP
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype!r}")
    reader = _reader(path)
    source = str(path)
    meta = _metadata(reader)
    names = {t.name for t in reader.tensors}
    _check_widths(meta, reader, source)
    hf_cfg = hf_config_from_gguf(meta, names, source=source)
    # Everything the header declares is checked against the tensor table, and the tokenizer is built,
    # before a single weight is dequantised or a parameter allocated.
    check_tensor_table(reader, hf_cfg, source=source)
    tok = tokenizer_from_gguf(meta, source=source) if tokenizer else None
    sd = hf_state_dict_from_gguf(reader, hf_cfg, dtype=dtype, progress=progress, source=source)
    model = convert(hf_cfg, sd, name=name or meta.get("general.name") or Path(path).stem)
    model.tokenizer = tok
    model.gguf_metadata = {k: v for k, v in meta.items() if not isinstance(v, list)}
    if device is not None:
        model.to(device)
    return model.eval()


__all__ = ["GGUFError", "SUPPORTED_ARCHITECTURES", "check_tensor_table", "hf_config_from_gguf", "hf_state_dict_from_gguf", "load_gguf",
           "read_metadata", "tokenizer_from_gguf", "unpermute_rotary"]
