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
Q4_1, Q5_x, Q8_0, the K-quants, ...). Anything else (``qwen2``, ``gemma``, ``phi3``, ``mixtral``-style
experts, ``rope_freqs`` scaling, ...) is refused with a ValueError naming it.

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
from .hf import convert
from .tokenizer import Tokenizer

_GGUF_EXTRA = "pip install interp[gguf]"
SUPPORTED_ARCHITECTURES = ("llama",)
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_CONTROL, _USER_DEFINED = 3, 4


def _gguf():
    try:
        import gguf
    except ImportError as e:
        raise ImportError(f"reading GGUF files needs the gguf package: {_GGUF_EXTRA}") from e
    return gguf


def _reader(path: str | Path):
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or Path to a .gguf file, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    try:
        return _gguf().GGUFReader(str(path))
    except ValueError as e:  # the reader's own error on a file without the GGUF magic
        raise ValueError(f"{str(path)!r} is not a readable GGUF file: {e}") from e


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata entry of a GGUF file as Python values (strings, numbers, lists).

    Args:
        path: the ``.gguf`` file.

    Returns:
        ``{key: value}``, e.g. ``{"general.architecture": "llama", "llama.block_count": 30, ...}``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not GGUF.

    Example:
        >>> read_metadata(interp.zoo.smollm2.fetch_gguf())["llama.attention.head_count_kv"]
        3
    """
    return _metadata(_reader(path))


def _metadata(reader) -> dict[str, Any]:
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        out[key] = value.tolist() if isinstance(value, np.ndarray) else value
    return out


# --- config -----------------------------------------------------------------------------------------------
def _check_architecture(meta: Mapping[str, Any], tensor_names: set[str], source: str) -> str:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{source}: GGUF architecture {arch!r} is not supported; this loader reads "
                         f"{list(SUPPORTED_ARCHITECTURES)} (Llama, SmolLM, Mistral-style dense decoders)")
    if meta.get(f"{arch}.expert_count", 0):
        raise ValueError(f"{source}: {meta[f'{arch}.expert_count']} experts per layer (mixture of experts) "
                         f"is not supported; only dense llama decoders")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in tensor_names:
        kind = scaling if scaling not in ("none", None) else "rope_freqs (llama3)"
        raise ValueError(f"{source}: RoPE scaling {kind!r} is not supported; only plain rotary")
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

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in meta:
            raise ValueError(f"{source}: metadata has no {arch}.{key!r}")
        return meta[f"{arch}.{key}"]

    d_model, n_heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", d_model // n_heads))
    if int(meta.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise ValueError(f"{source}: key_length {head_dim} != value_length {meta[f'{arch}.attention.value_length']}")
    rot = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise ValueError(f"{source}: rope.dimension_count={rot} differs from the head dim {head_dim} "
                         f"(partial rotary) and is not supported")
    n_kv = meta.get(f"{arch}.attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):  # llama.cpp allows a per-layer list; dense llama files keep one value
        if len(set(n_kv)) != 1:
            raise ValueError(f"{source}: per-layer head_count_kv {n_kv} is not supported")
        n_kv = n_kv[0]
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise ValueError(f"{source}: metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    return {
        "model_type": "llama", "hidden_act": "silu", "hidden_size": d_model, "num_attention_heads": n_heads,
        "num_key_value_heads": int(n_kv), "head_dim": head_dim, "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")), "vocab_size": int(vocab),
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }


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


def hf_state_dict_from_gguf(reader, hf_cfg: Mapping[str, Any], *, dtype: torch.dtype = torch.float32,
                            progress: bool = False, source: str = "GGUF") -> dict[str, torch.Tensor]:
    """Dequantise a llama GGUF file's tensors into a Hugging Face ``LlamaForCausalLM`` state dict.

    Raises:
        ValueError: a tensor this loader does not know (named), or a quantisation ``gguf`` cannot decode.
    """
    gguf = _gguf()
    out: dict[str, torch.Tensor] = {}
    tensors = reader.tensors
    if progress:
        from tqdm.auto import tqdm

        tensors = tqdm(tensors, desc="dequantising GGUF tensors", unit="tensor")
    for t in tensors:
        hf = _hf_name(t.name)
        if hf is None:
            raise ValueError(f"{source}: tensor {t.name!r} has no place in a llama decoder")
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ValueError(f"{source}: tensor {t.name!r} is {t.tensor_type.name}, which gguf cannot "
                             f"dequantise") from e
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims fastest first
        # A copy: F32 tensors come back as read-only views of the memory-mapped file.
        w = torch.from_numpy(np.array(arr, dtype=np.float32)).reshape(shape)  # [rows, cols]
        if t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_rotary(w, hf_cfg["num_attention_heads"])
        elif t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_rotary(w, hf_cfg["num_key_value_heads"])
        out[hf] = w.to(dtype)
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
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    if not tokens:
        raise ValueError(f"{source}: metadata has no tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    if kind == "gpt2":
        pre = meta.get("tokenizer.ggml.pre")
        if pre not in _PRE_SPLITS and pre not in _GPT2_PRES:
            raise ValueError(f"{source}: byte-level pre-tokenizer {pre!r} is not known; known: "
                             f"{sorted(str(p) for p in (*_PRE_SPLITS, *_GPT2_PRES) if p)}")
        spell = _bytes_to_unicode()
        alphabet = set(spell.values())
        # A few files store a token in raw UTF-8 rather than in the byte alphabet: respell it.
        vocab = {t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8")): i
                 for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
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
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
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
        raise ValueError(f"{source}: tokenizer model {kind!r} is not supported; supported: "
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
        ValueError: not a GGUF file; an architecture, setting, tensor or tokenizer this loader does not
            support (named in the message).
        TypeError: ``dtype`` is not a floating torch dtype.
        ImportError: the ``gguf`` package is missing (``pip install interp[gguf]``).

    Example:
        >>> model = load_gguf(interp.zoo.smollm2.fetch_gguf())  # ~1 min (dequantises every tensor)  # doctest: +SKIP
        >>> model.generate(model.to_tokens("The capital of France is"), 5)  # doctest: +SKIP
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype!r}")
    reader = _reader(path)
    source = Path(path).name
    meta = _metadata(reader)
    names = {t.name for t in reader.tensors}
    hf_cfg = hf_config_from_gguf(meta, names, source=source)
    sd = hf_state_dict_from_gguf(reader, hf_cfg, dtype=dtype, progress=progress, source=source)
    model = convert(hf_cfg, sd, name=name or meta.get("general.name") or Path(path).stem)
    model.tokenizer = tokenizer_from_gguf(meta, source=source) if tokenizer else None
    model.gguf_metadata = {k: v for k, v in meta.items() if not isinstance(v, list)}
    if device is not None:
        model.to(device)
    return model.eval()


__all__ = ["SUPPORTED_ARCHITECTURES", "hf_config_from_gguf", "hf_state_dict_from_gguf", "load_gguf",
           "read_metadata", "tokenizer_from_gguf", "unpermute_rotary"]
