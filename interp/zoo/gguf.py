"""GGUF files (llama.cpp's format) to :class:`interp.Transformer`, tokenizer included.

A GGUF file holds metadata (the architecture's hyper-parameters and the tokenizer's vocabulary, merges and
special ids) and tensors, usually quantised. This module is a driver: :func:`load_gguf` reads both with a bounded
reader (:mod:`interp.zoo.gguf_file`) and the ``gguf`` package's dequantisers, looks ``general.architecture`` up
in the family registry (:data:`interp.families.BY_GGUF_ARCH`; one lookup) and lets that family's
:class:`~interp.families._gguf.GGUFSpec` turn the file into the config dict and state dict of the Hugging Face
model llama.cpp converted from (metadata keys, tensor names and the transforms llama.cpp applied). The family's
Hugging Face conversion then builds the model, so the two paths share one weight mapping per family.

What it accepts: every architecture in :data:`SUPPORTED_ARCHITECTURES` (``llama``: Llama 1/2/3, SmolLM /
SmolLM2, TinyLlama, Mistral 7B, and Mixtral when the file has experts; ``qwen2``, ``qwen3``, ``gemma``,
``gemma2``, ``gemma3``, ``phi3``, ``starcoder``, ``falcon``, ``cohere2``, ``exaone4``, ``glm4``,
``hunyuan-dense``, ...; the mixtures of experts ``deepseek2``, ``qwen2moe``, ``qwen3moe``, ``olmoe``, ``gpt-oss``
and ``llama4``). Every quantisation the ``gguf`` package can dequantise is read (F32, F16, BF16, Q4_0, Q4_1,
Q5_x, Q8_0, the K-quants, ...), each tensor straight into the requested dtype on the requested device.
Anything else (another architecture, experts elsewhere, ``rope_freqs`` / YaRN /
LongRoPE scaling, a sliding window the architecture has no rule for, ...) is refused with a ValueError naming
it and its value.

Tokenizers: byte-level BPE (``tokenizer.ggml.model == "gpt2"``: SmolLM, Llama 3, ...) and sentencepiece BPE
(``"llama"``: Llama 1/2, Mistral, TinyLlama) are rebuilt with the ``tokenizers`` library, with the file's
control tokens as special tokens and BOS/EOS added as the file says (``tokenizer.ggml.add_bos_token``).

GGUF dimensions are listed fastest-first (a ``[576, 49152]`` tensor is our ``[49152, 576]``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ModelConfig
from ..families import BY_GGUF_ARCH, converter
from ..families._gguf import GGUFSpec, shown, unpermute_rotary
from ..families._gguf_experts import join_split_tensors
from ..model import Transformer
from ..placement import block_bytes, build
from ..quantized import QuantizedEmbedding, QuantizedLinear, QuantizedWeight
from . import gguf_quantized
from .checkpoint import assign_weights, check_finite, check_fits
from .gguf_file import GGUFError, GGUFFile, _gguf, read_gguf
from .tokenizer import Tokenizer

#: Every llama.cpp ``general.architecture`` a family reads (:data:`interp.families.BY_GGUF_ARCH`).
SUPPORTED_ARCHITECTURES = tuple(sorted(BY_GGUF_ARCH))
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_CONTROL, _USER_DEFINED = 3, 4


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
        >>> from interp.zoo.gguf import read_metadata
        >>> from interp.zoo.smollm2 import fetch_gguf
        >>> read_metadata(fetch_gguf())["llama.attention.head_count_kv"]
        3
    """
    return _metadata(_reader(path))


def _metadata(reader: GGUFFile) -> dict[str, Any]:
    return dict(reader.metadata)


# --- config -----------------------------------------------------------------------------------------------
def _spec(meta: Mapping[str, Any], source: str) -> tuple[str, GGUFSpec]:
    """``(general.architecture, its family's spec)``: the one lookup every GGUF path goes through.

    Raises:
        GGUFError: an architecture no family reads (named, with the ones that are read).
    """
    arch = meta.get("general.architecture")
    if arch not in BY_GGUF_ARCH:
        raise GGUFError(f"{source}: GGUF architecture {arch!r} is not supported; this loader reads "
                        f"{list(SUPPORTED_ARCHITECTURES)}")
    return str(arch), BY_GGUF_ARCH[arch].gguf[arch]


def hf_config_from_gguf(meta: Mapping[str, Any], tensor_names: set[str], *, source: str = "GGUF") -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict that a GGUF file's metadata describes.

    Each architecture's metadata keys map onto the config of the HF model llama.cpp converted from, as the
    family that reads it says (:data:`interp.families.BY_GGUF_ARCH`): ``llama`` -> ``model_type="llama"``,
    ``gemma3`` -> ``"gemma3_text"``, ``starcoder`` -> ``"gpt_bigcode"``, ...

    Args:
        meta: :func:`read_metadata` output.
        tensor_names: the file's tensor names (an ``output.weight`` means an untied unembedding; bias and
            norm tensors say what the metadata does not).
        source: named in errors.

    Returns:
        A ``config.json``-style dict for :func:`interp.zoo.hf.convert`.

    Raises:
        ValueError: another architecture, experts, RoPE scaling or a sliding-window setting this loader does
            not reproduce, partial rotary, or a missing key (each named with its value).

    Example:
        >>> from interp.zoo.gguf import hf_config_from_gguf, read_metadata
        >>> from interp.zoo.smollm2 import fetch_gguf
        >>> cfg = hf_config_from_gguf(read_metadata(fetch_gguf()), {"token_embd.weight"})
        >>> cfg["model_type"], cfg["num_key_value_heads"]
        ('llama', 3)
    """
    return _spec(meta, source)[1].hf_config(meta, set(tensor_names), source=source)


# --- weights ----------------------------------------------------------------------------------------------
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


def _hf_tensors(reader: GGUFFile, source: str) -> Callable[[str, torch.Tensor, Mapping[str, Any]],
                                                             dict[str, torch.Tensor]]:
    """``(GGUF name, tensor, HF config) -> {HF name: tensor}`` for this file's architecture: the tensors one GGUF
    tensor becomes (one renamed tensor, its transform undone, or merged experts split per expert)."""
    arch, spec = _spec(reader.metadata, source)
    return lambda name, w, hf_cfg: spec.hf_tensors(name, w, hf_cfg, arch=arch, source=source)


def check_tensor_table(reader: GGUFFile, hf_cfg: Mapping[str, Any], *, source: str = "GGUF") -> None:
    """Check a GGUF file's tensor table against the model its metadata declares, allocating nothing.

    The declared sizes come from a header anyone can edit: ``block_count = 10**6`` or ``vocab_size = 10**9``
    in a file of a few kilobytes must be refused before a model of that size is built. The layer count is
    compared with the ``blk.N`` tensors first (cheap, and it bounds the rest), then the architecture's
    renaming and transforms and the Hugging Face converter run on meta-device tensors of the table's own
    shapes and the result is fitted to a meta-device model.

    Args:
        reader: the parsed file (:func:`interp.zoo.gguf_file.read_gguf`).
        hf_cfg: :func:`hf_config_from_gguf` output.
        source: named in errors.

    Raises:
        GGUFError: (a ValueError) layers missing or extra, tensors missing, extra or of the wrong shape
            (each named with both shapes).

    Example:
        >>> from interp.zoo.gguf import check_tensor_table, hf_config_from_gguf, read_gguf
        >>> f = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
        >>> check_tensor_table(f, hf_config_from_gguf(f.metadata, {t.name for t in f.tensors}))  # doctest: +SKIP
    """
    to_hf = _hf_tensors(reader, source)
    n_layers = int(next(hf_cfg[k] for k in ("num_hidden_layers", "n_layer", "n_layers") if k in hf_cfg))
    blocks: dict[int, list[str]] = {}
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
    make_cfg, make_sd = converter(hf_cfg)
    try:
        cfg = make_cfg(hf_cfg)
    except ValueError as e:
        raise GGUFError(f"{source}: the metadata does not describe a model interp builds: {e}") from e
    hf_shapes = _Recording()
    hf_of = {}  # GGUF name -> the HF names it became
    for t in reader.tensors:
        pieces = to_hf(t.name, torch.empty(_gguf_rows_cols(t), device="meta"), hf_cfg)
        hf_of[t.name] = set(pieces)
        hf_shapes.update(pieces)
    try:
        joined = join_split_tensors(hf_shapes)
    except GGUFError as e:
        raise GGUFError(f"{source}: {e}") from e
    try:
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


# Float tensors are read from the memory map as they are stored, with no float32 copy on the way.
_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _dequantise(t, dtype: torch.dtype, device: torch.device | str | None, source: str) -> torch.Tensor:
    """One tensor as a fresh ``[rows, cols]`` tensor in ``dtype`` on ``device``: float types straight from the
    file's bytes, quantised ones through a float32 copy of that tensor only (the ``gguf`` package's
    dequantiser is numpy)."""
    kind = t.tensor_type.name
    if kind in _STORED:
        with warnings.catch_warnings():  # the memory map is read-only; the copy below never writes to it
            warnings.filterwarnings("ignore", message=".*not writable.*")
            stored = torch.frombuffer(t.data, dtype=_STORED[kind], count=t.n_elements)
    else:
        try:
            stored = torch.from_numpy(_gguf().quants.dequantize(t.data, t.tensor_type).reshape(-1))
        except NotImplementedError as e:
            raise GGUFError(f"{source}: tensor {t.name!r} is {kind}, which gguf cannot dequantise") from e
    # copy=True: the result never aliases the read-only map, even when the stored dtype is the one asked for.
    return stored.reshape(_gguf_rows_cols(t)).to(device=device, dtype=dtype, copy=True)  # [rows, cols]


def hf_state_dict_from_gguf(reader, hf_cfg: Mapping[str, Any], *, dtype: torch.dtype = torch.float32,
                            device: torch.device | str | None = None, progress: bool = False,
                            source: str = "GGUF", _skip: Callable[[Any], bool] | None = None
                            ) -> dict[str, torch.Tensor]:
    """Dequantise a GGUF file's tensors into the Hugging Face state dict of the model it was converted from.

    Each tensor goes straight to ``dtype`` on ``device``, one at a time: a bf16 file read as bf16 never
    passes through float32, and nothing of the model is held on the CPU when ``device`` is a GPU.

    Args:
        reader: the parsed file.
        hf_cfg: :func:`hf_config_from_gguf` output.
        dtype: the tensors' dtype.
        device: where they are put (default: the CPU).
        progress: show a progress bar.
        source: named in errors.

    Returns:
        ``{HF name: tensor}``, the architecture's transforms undone (the family's
        :class:`~interp.families._gguf.GGUFSpec`).

    Raises:
        GGUFError: (a ValueError) a tensor this loader does not know, a quantisation ``gguf`` cannot decode,
            or a tensor with NaN or infinite values after dequantisation (each named).
    """
    to_hf = _hf_tensors(reader, source)
    out: dict[str, torch.Tensor] = {}
    # _skip: tensors left out (keep_quantized's blocks; its own pass joins split tensors once all are in).
    tensors = [t for t in reader.tensors if _skip is None or not _skip(t)]
    if progress:
        from tqdm.auto import tqdm

        tensors = tqdm(tensors, desc="dequantising GGUF tensors", unit="tensor")
    for t in tensors:
        w = _dequantise(t, dtype, device, source)
        try:  # the one non-finite-weight policy of every loader (Hugging Face folders and models too)
            check_finite(w, t.name, f"{source} ({t.tensor_type.name}, dequantised to {dtype})")
        except ValueError as e:
            raise GGUFError(str(e)) from None
        out.update(to_hf(t.name, w, hf_cfg))
    if _skip is None:
        join_split_tensors(out)  # DeepSeek's split kv_b (a no-op for every other file)
    return out


# --- tokenizer --------------------------------------------------------------------------------------------
# Pre-tokenizer split patterns by ``tokenizer.ggml.pre`` (llama.cpp's names). Files whose name is absent
# use GPT-2's own pattern (ByteLevel's built-in regex), which SmolLM's "smollm" uses.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2 / Qwen3 (and Qwen2.5): Llama 3's pattern with single digits; their tokenizer also NFC-normalises.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
               "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
_NFC_PRES = ("qwen2",)
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
        >>> from interp.zoo.gguf import read_metadata, tokenizer_from_gguf
        >>> from interp.zoo.smollm2 import fetch_gguf
        >>> tok = tokenizer_from_gguf(read_metadata(fetch_gguf()))
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
            raise GGUFError(f"{source}: metadata {key!r} = {shown(value)} is not an id of the {len(tokens)} tokens "
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
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
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
        if pre in _NFC_PRES:
            tok.normalizer = normalizers.NFC()
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
        # Gemma's files say add_space_prefix = False: no "▁" is prepended at all.
        prepend = "first" if meta.get("tokenizer.ggml.add_space_prefix", True) else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend, split=False)
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


# --- the whole model ---------------------------------------------------------------------------------------
def _assemble(hf_cfg: Mapping[str, Any], hf_sd: dict[str, torch.Tensor], *, dtype: torch.dtype,
              device: torch.device | str, source: str,
              quantized: Mapping[str, QuantizedWeight] | None = None) -> Transformer:
    """The model from a HF config and state dict, its parameters *being* the converted tensors (assigned, not
    copied into a second set of weights): peak memory is the weights plus the fused tensors the converter
    concatenates (QKV), not twice the weights. ``hf_sd`` is emptied on the way.

    ``quantized`` (keep_quantized): interp keys whose weights stay in blocks; ``hf_sd`` then already holds
    interp's keys for the rest (:func:`interp.zoo.gguf_quantized.quantized_state_dict` ran the converter)."""
    make_cfg, make_sd = converter(hf_cfg)
    cfg = make_cfg(hf_cfg)
    if quantized is None:
        ours = make_sd(hf_sd, cfg)
    else:
        ours = dict(hf_sd)
    hf_sd.clear()  # what the converter kept lives on in `ours`; the parts of concatenated tensors are freed
    model = build(cfg, dtype=dtype, device=device, meta_weights=True)
    try:
        if quantized:
            shapes = {k: tuple(v.shape) for k, v in ours.items()}
            shapes.update({k: q.shape for k, q in quantized.items()})
            check_fits(model, shapes, source=source)  # the whole model, before blocks replace quantised weights
            _swap_in_quantized(model, quantized, source)
        assign_weights(model, ours, dtype=dtype, device=device, source=source, check=not quantized)
    except ValueError as e:
        raise GGUFError(str(e)) from None
    return model.eval()


def _is_matrix(t) -> bool:
    """keep_quantized maps every weight matrix's rows through the converter (gguf_quantized), not its values."""
    return len(t.shape) == 2


def _swap_in_quantized(model: Transformer, quantized: Mapping[str, QuantizedWeight], source: str) -> None:
    """Put a :class:`~interp.quantized.QuantizedLinear` / ``QuantizedEmbedding`` in place of each module whose
    ``weight`` stays quantised (the model is still on the meta device); a module tied to one of them (the
    unembedding of tied embeddings) shares the same blocks."""
    modules = dict(model.named_modules())  # by name: the model's W_E / W_U attributes are weight views
    by_param: dict[int, QuantizedWeight] = {}
    for key, q in quantized.items():
        path = key.removesuffix(".weight")
        old = modules.get(path)
        if not key.endswith(".weight") or not isinstance(old, (nn.Linear, nn.Embedding)):
            raise GGUFError(f"{source}: {key!r} is quantised, but only the weights of linear and embedding layers "
                            f"can stay quantised ({type(old).__name__} here); load with keep_quantized=False")
        by_param[id(old.weight)] = q
    for path, old in modules.items():
        if not isinstance(old, (nn.Linear, nn.Embedding)) or id(old.weight) not in by_param:
            continue
        q = by_param[id(old.weight)]
        new = (QuantizedLinear(q, old.bias) if isinstance(old, nn.Linear) else QuantizedEmbedding(q))
        owner, _, attr = path.rpartition(".")
        setattr(modules[owner] if owner else model, attr, new)


def stored_sizes(path: str | Path, *, dtype: torch.dtype = torch.float32, keep_quantized: bool = True
                 ) -> tuple[ModelConfig, tuple[int, list[int], int], str]:
    """The model a GGUF file holds and what its weights take in memory, from the header alone (no weight is
    read): for :func:`interp.placement.plan_memory` and ``interp plan``.

    Args:
        path: the ``.gguf`` file.
        dtype: the float weights' dtype.
        keep_quantized: count quantised matrices as their stored blocks (``load_gguf(keep_quantized=True)``);
            False: as ``dtype`` floats.

    Returns:
        ``(config, (embedding bytes, [bytes per block], head bytes), label)``; the label names the block
        types (``"Q4_1/Q8_0 blocks as stored, float32 otherwise"``).

    Raises:
        GGUFError: (a ValueError) as :func:`load_gguf` for the header, the tensor table or the architecture.

    Example:
        >>> from interp.zoo.gguf import stored_sizes
        >>> from interp.zoo.smollm2 import fetch_gguf
        >>> cfg, (emb, blocks, head), label = stored_sizes(fetch_gguf())
        >>> cfg.n_layers, len(blocks), label
        (30, 30, 'Q4_1/Q8_0 blocks as stored, float32 otherwise')
    """
    reader = _reader(path)
    source = str(path)
    meta = _metadata(reader)
    _check_widths(meta, reader, source)
    hf_cfg = hf_config_from_gguf(meta, {t.name for t in reader.tensors}, source=source)
    check_tensor_table(reader, hf_cfg, source=source)
    cfg = converter(hf_cfg)[0](hf_cfg)
    emb, blocks, head = block_bytes(cfg, dtype)
    kinds: set[str] = set()
    if keep_quantized:
        to_hf = _hf_tensors(reader, source)
        floats = {}  # the 1-D tensors, as shapes only
        for t in reader.tensors:
            if len(t.shape) != 2:
                floats.update(to_hf(t.name, torch.empty(_gguf_rows_cols(t), device="meta"), hf_cfg))
        held = gguf_quantized.stored_bytes(reader, hf_cfg, floats, lambda n, w: to_hf(n, w, hf_cfg), dtype=dtype,
                                           source=source)
        kinds = {t.tensor_type.name for t in reader.tensors if gguf_quantized.is_kept(t)}
        for key, (stored, as_float) in held.items():
            saved = as_float - stored
            if key.startswith("blocks."):
                blocks[int(key.split(".")[1])] -= saved
            elif key.startswith("W_U."):
                head -= saved
            else:
                emb -= saved
    name = str(dtype).removeprefix("torch.")
    label = f"{'/'.join(sorted(kinds))} blocks as stored, {name} otherwise" if kinds else name
    return cfg, (emb, blocks, head), label


def load_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32, tokenizer: bool = True,
              name: str | None = None, progress: bool = False,
              device: torch.device | str | None = None, keep_quantized: bool = False) -> Transformer:
    """Load a GGUF file (any architecture of :data:`SUPPORTED_ARCHITECTURES`) as an :class:`interp.Transformer`
    with its tokenizer.

    Args:
        path: the ``.gguf`` file.
        dtype: parameter dtype (``torch.float32`` default, ``torch.bfloat16``...); each tensor is dequantised
            straight into it.
        tokenizer: rebuild the file's tokenizer (False: weights only, ``model.tokenizer`` is None).
        name: ``model.name`` (default: the file's ``general.name``, else its file name).
        progress: show a progress bar while dequantising.
        device: where to build the model; each tensor is dequantised onto it, one at a time.
        keep_quantized: keep the quantised weight matrices in their blocks (:mod:`interp.quantized`): a
            Q4_0 file takes about its own size in memory instead of 7x that in float32, and each layer
            dequantises its weight when it runs (``dtype`` is then the compute dtype). Float tensors (norms,
            F16 matrices) are loaded as usual.

    Returns:
        The model in eval mode; ``model.gguf_metadata`` keeps the scalar metadata (licence, name, ...).

    Raises:
        FileNotFoundError: no file at ``path``.
        GGUFError: (a ValueError) not a GGUF file, a corrupt header, metadata that disagrees with the
            tensor table, non-finite weights, or an architecture, setting, tensor or tokenizer this loader
            does not support, or (keep_quantized) a block type or tensor that cannot stay quantised; the
            message names the file and the key or tensor.
        TypeError: ``dtype`` is not a floating torch dtype.
        ImportError: the ``gguf`` package is missing (``pip install interp[gguf]``).

    Example:
        >>> from interp.zoo.gguf import load_gguf
        >>> from interp.zoo.smollm2 import fetch_gguf
        >>> model = load_gguf(fetch_gguf())  # ~1 min (dequantises every tensor)  # doctest: +SKIP
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
    quantized = None
    to_hf = _hf_tensors(reader, source)
    if keep_quantized:
        gguf_quantized.check_keepable(reader, source)
    sd = hf_state_dict_from_gguf(reader, hf_cfg, dtype=dtype, device=device, progress=progress, source=source,
                                 _skip=_is_matrix if keep_quantized else None)
    if keep_quantized:
        sd, quantized = gguf_quantized.quantized_state_dict(
            reader, hf_cfg, sd, lambda n, w: to_hf(n, w, hf_cfg),
            lambda t: _dequantise(t, dtype, device, source), dtype=dtype, device=device, source=source)
    model = _assemble(hf_cfg, sd, dtype=dtype, device=device if device is not None else "cpu", source=source,
                      quantized=quantized)
    model.name = name or meta.get("general.name") or Path(path).stem
    model.tokenizer = tok
    # A plain attribute (nn.Module's __setattr__ stub types every attribute as Tensor | Module).
    model.gguf_metadata = {k: v for k, v in meta.items() if not isinstance(v, list)}  # type: ignore[assignment]
    return model.eval()


__all__ = ["GGUFError", "SUPPORTED_ARCHITECTURES", "check_tensor_table", "hf_config_from_gguf", "hf_state_dict_from_gguf", "load_gguf",
           "read_metadata", "stored_sizes", "tokenizer_from_gguf", "unpermute_rotary"]
