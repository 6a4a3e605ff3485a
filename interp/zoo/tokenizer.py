"""A small tokenizer wrapper over Hugging Face ``tokenizers``: text to padded id tensors and back.

The wrapped tokenizer's own padding/truncation settings (MiniLM's ``tokenizer.json`` pads every input to
128) are switched off; this class pads a batch to its longest sequence and truncates only when asked.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as _HFTokenizer

# Token strings that conventionally mean padding / sequence start / separator, checked in this order.
_PAD_NAMES = ("[PAD]", "<pad>", "<|pad|>", "<|padding|>")
_CLS_NAMES = ("[CLS]", "<s>", "<|begin_of_text|>", "<bos>")
_SEP_NAMES = ("[SEP]", "</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>")


class Tokenizer:
    """Text <-> token ids for one model.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (its post-processor decides the special tokens added).
        pad_token_id: id used to pad batches; default: the tokenizer's padding id, else a token named
            ``[PAD]``/``<pad>``, else the end-of-text token (GPT-2 style), else 0.

    Raises:
        TypeError: ``tokenizer`` is not a ``tokenizers.Tokenizer``.

    Example:
        >>> from interp.zoo.tokenizer import Tokenizer
        >>> import os; from interp.zoo.minilm import minilm_path
        >>> tok = Tokenizer.from_file(os.path.join(minilm_path(), "tokenizer.json"))
        >>> ids, mask = tok.encode_batch_with_mask(["a short one", "a slightly longer sentence"])
        >>> tok.to_str_tokens(ids[0].tolist())
    """

    def __init__(self, tokenizer: _HFTokenizer, *, pad_token_id: int | None = None) -> None:
        if not isinstance(tokenizer, _HFTokenizer):
            raise TypeError(f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        padding = tokenizer.padding
        # Work on a copy so that switching off padding/truncation never changes the caller's object.
        self._tok = _HFTokenizer.from_str(tokenizer.to_str())
        self._tok.no_padding()
        self._tok.no_truncation()
        if pad_token_id is None and padding is not None:
            pad_token_id = padding.get("pad_id")
        if pad_token_id is None:
            pad_token_id = self._find(_PAD_NAMES)
        if pad_token_id is None:
            pad_token_id = self._find(_SEP_NAMES[3:])  # "<|endoftext|>" / "<eos>": the usual decoder padding
        self._pad = pad_token_id
        self._byte_level = _has_byte_level(json.loads(self._tok.to_str()).get("pre_tokenizer"))

    # --- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> Tokenizer:
        """Load a ``tokenizer.json`` file.

        Raises:
            FileNotFoundError: no file at ``path``.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer file at {str(path)!r}")
        return cls(_HFTokenizer.from_file(str(path)), **kwargs)

    @classmethod
    def from_json(cls, text: str, **kwargs) -> Tokenizer:
        """Rebuild from :meth:`to_json` output (the ``tokenizer.json`` format)."""
        return cls(_HFTokenizer.from_str(text), **kwargs)

    def to_json(self) -> str:
        """The tokenizer in ``tokenizer.json`` format (padding/truncation off)."""
        return self._tok.to_str()

    @property
    def backend(self) -> _HFTokenizer:
        """The wrapped ``tokenizers.Tokenizer`` (no padding, no truncation)."""
        return self._tok

    # --- special tokens -------------------------------------------------------------------------------
    def _find(self, names: Sequence[str]) -> int | None:
        for name in names:
            i = self._tok.token_to_id(name)
            if i is not None:
                return i
        return None

    @property
    def pad_token_id(self) -> int | None:
        """Id used to pad batches (``None`` if the vocabulary has no sensible one: padding then uses 0)."""
        return self._pad

    @property
    def cls_token_id(self) -> int | None:
        """Id of the sequence-start token (``[CLS]``, ``<s>``...), or None."""
        return self._find(_CLS_NAMES)

    @property
    def sep_token_id(self) -> int | None:
        """Id of the separator / end token (``[SEP]``, ``</s>``, ``<|endoftext|>``...), or None."""
        return self._find(_SEP_NAMES)

    @functools.cached_property
    def _prefix_ids(self) -> tuple[int, ...]:
        """The ids the post-processor puts before the text (``[CLS]`` for BERT, ``<s>`` for Llama, none for GPT-2)."""
        full = self._tok.encode("a", add_special_tokens=True).ids
        plain = self._tok.encode("a", add_special_tokens=False).ids
        starts = [i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain]
        return tuple(full[:starts[0]]) if starts else ()

    @property
    def bos_token_id(self) -> int | None:
        """The sequence-start id ``prepend_bos=True`` adds: the one the tokenizer itself puts first, else a token
        named like one (``[CLS]``, ``<s>``...), else the end-of-text token (GPT-2 and SmolLM2 use
        ``<|endoftext|>`` as BOS); ``None`` if the vocabulary has none of these."""
        if self._prefix_ids:
            return self._prefix_ids[0]
        found = self._find(_CLS_NAMES)
        return found if found is not None else self._find(_SEP_NAMES[3:])

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> set[int]:
        """Ids of every token the tokenizer marks as special."""
        return {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    # --- encoding -------------------------------------------------------------------------------------
    def _encode(self, texts: list[str] | list[list[str]], max_length: int | None, is_pretokenized: bool = False,
                add_special_tokens: bool = True):
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
                raise ValueError(f"max_length={max_length!r} must be a positive int or None")
            self._tok.enable_truncation(max_length)
        try:
            return self._tok.encode_batch(texts, is_pretokenized=is_pretokenized,
                                          add_special_tokens=add_special_tokens)
        finally:
            self._tok.no_truncation()

    def _encode_ids(self, texts: list[str], max_length: int | None, prepend_bos: bool | None,
                    special_tokens: bool) -> list[list[int]]:
        """Each text's ids with the leading BOS as ``prepend_bos`` asks (see :meth:`encode_batch_with_mask`)."""
        if not special_tokens:
            return [e.ids for e in self._encode(texts, max_length, add_special_tokens=False)]
        prefix, bos = self._prefix_ids, self.bos_token_id
        if prepend_bos is None or (prepend_bos and prefix[:1] == (bos,)) or (not prepend_bos and not prefix):
            return [e.ids for e in self._encode(texts, max_length)]  # the tokenizer already does what was asked
        if prepend_bos:
            if bos is None:
                raise ValueError("prepend_bos=True but this tokenizer has no BOS token (no [CLS], <s>, "
                                 "<|endoftext|>...)")
            # Truncate one shorter so that the BOS fits; the tokenizer's own truncation keeps its end tokens.
            cut = None if max_length is None else max_length - 1
            if cut == 0:
                return [[bos] for _ in texts]
            return [[bos, *e.ids] for e in self._encode(texts, cut)]
        cut = None if max_length is None else max_length + len(prefix)
        return [e.ids[len(prefix):] if tuple(e.ids[:len(prefix)]) == prefix else e.ids
                for e in self._encode(texts, cut)]

    @staticmethod
    def _texts(text: str | Sequence[str]) -> list[str]:
        if isinstance(text, str):
            return [text]
        if isinstance(text, Sequence) and not isinstance(text, (bytes, bytearray)):
            texts = list(text)
            bad = [t for t in texts if not isinstance(t, str)]
            if not texts or bad:
                raise TypeError(f"text must be a str or a non-empty list of str, got {text!r}")
            return texts
        raise TypeError(f"text must be a str or a list of str, got {type(text).__name__}")

    def encode_batch_with_mask(self, texts: str | Sequence[str], max_length: int | None = None, *,
                               prepend_bos: bool | None = None, special_tokens: bool = True
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenize (adding special tokens), pad to the longest sequence, and say which ids are real.

        Args:
            texts: one string or a list of strings.
            max_length: truncate each sequence to this many ids (special tokens kept).
            prepend_bos: ``None``: the special tokens the tokenizer adds; ``True``: every sequence starts with
                :attr:`bos_token_id` (added when the tokenizer does not add it); ``False``: without the leading
                special token the tokenizer adds (a trailing ``[SEP]`` stays).
            special_tokens: ``False``: no special tokens at all (``prepend_bos`` is then ignored).

        Returns:
            ``(ids [B, T] long, attention_mask [B, T] long)`` with 1 for real tokens, 0 for padding.

        Raises:
            TypeError: ``texts`` is not a str or a list of str.
            ValueError: ``max_length`` is not a positive int.

        Example:
            >>> from interp.examples import tok
            >>> ids, mask = tok.encode_batch_with_mask(["hi", "hello there"])
        """
        rows = self._encode_ids(self._texts(texts), max_length, prepend_bos, special_tokens)
        T = max(len(r) for r in rows)
        pad = 0 if self._pad is None else self._pad
        ids = torch.full((len(rows), T), pad, dtype=torch.long)  # [B, T]
        mask = torch.zeros((len(rows), T), dtype=torch.long)  # [B, T]
        for row, row_ids in enumerate(rows):
            ids[row, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
            mask[row, : len(row_ids)] = 1
        return ids, mask

    def to_tokens(self, text: str | Sequence[str], max_length: int | None = None, *,
                  prepend_bos: bool | None = None, special_tokens: bool = True) -> torch.Tensor:
        """Token ids ``[B, T]`` (special tokens added, a batch right-padded with ``pad_token_id``).

        ``prepend_bos`` and ``special_tokens`` as in :meth:`encode_batch_with_mask`.

        Example:
            >>> from interp.examples import tok
            >>> tok.to_tokens("Hello world")       # MiniLM: [[101, 7592, 2088, 102]]
        """
        return self.encode_batch_with_mask(text, max_length, prepend_bos=prepend_bos,
                                           special_tokens=special_tokens)[0]

    def encode_words(self, words: Sequence[str], max_length: int | None = None, *,
                     space_before: Sequence[bool] | None = None) -> tuple[torch.Tensor, list[int | None]]:
        """Tokenize pre-split words (a treebank sentence) and map every token back to its word.

        Args:
            words: the words of one sentence.
            max_length: truncate to this many ids.
            space_before: for byte-level tokenizers, whether each word follows a space in the original text
                (``False`` for ``'s`` in ``Simon's`` cut into two words); default: every word but the first.
                Ignored by other tokenizers (WordPiece has no notion of a leading space).

        Returns:
            ``(ids [T] long, word_index)`` where ``word_index[t]`` is the index in ``words`` of the word that
            token ``t`` belongs to, or ``None`` for special tokens.

        A byte-level BPE tokenizer (GPT-2, SmolLM2, Llama 3) marks a word's leading space inside its first token
        (``" Simon"`` -> ``"ĠSimon"``); encoding bare words would give the word-initial forms a model sees only at
        the start of a text (``"Simon"``, often cut into rarer pieces). So every word after the first gets a
        leading space, and the ids are those of ``" ".join(words)`` encoded as text.

        Raises:
            TypeError: ``words`` is not a list of str.
            ValueError: ``words`` is empty, or ``space_before`` is not one bool per word.

        Example:
            >>> from interp.examples import tok
            >>> ids, where = tok.encode_words(["Unbelievable", "!"])   # where == [None, 0, 0, 0, 1, None]
        """
        space = None if space_before is None else [space_before]
        ((ids, word_index),) = self.encode_words_batch([words], max_length, space_before=space)
        return torch.tensor(ids, dtype=torch.long), word_index

    def encode_words_batch(self, sentences: Sequence[Sequence[str]], max_length: int | None = None, *,
                           space_before: Sequence[Sequence[bool]] | None = None
                           ) -> list[tuple[list[int], list[int | None]]]:
        """:meth:`encode_words` for many sentences in one tokenizer call (the Rust tokenizer batches them).

        Args:
            sentences: the words of each sentence.
            max_length: truncate each sentence to this many ids.
            space_before: per sentence, as in :meth:`encode_words` (default: every word but the first).

        Returns:
            One ``(ids, word_index)`` per sentence, as plain lists.

        Raises:
            TypeError: a sentence is not a list of str.
            ValueError: a sentence is empty, or ``space_before`` does not match the sentences.

        Example:
            >>> from interp.examples import tok
            >>> [ids for ids, _ in tok.encode_words_batch([["Hi", "!"], ["Bye"]])]
        """
        if isinstance(sentences, str) or not isinstance(sentences, Sequence):
            raise TypeError(f"sentences must be a list of word lists, got {type(sentences).__name__}")
        if space_before is not None and (isinstance(space_before, str) or len(space_before) != len(sentences)):
            raise ValueError(f"space_before must hold one list per sentence ({len(sentences)}), got {space_before!r}")
        batch = []
        for k, words in enumerate(sentences):
            if isinstance(words, str) or not isinstance(words, Sequence):
                raise TypeError(f"words must be a list of str, got {type(words).__name__}")
            words = list(words)
            if not words:
                raise ValueError("words is empty: pass the words of one sentence")
            bad = [w for w in words if not isinstance(w, str)]
            if bad:
                raise TypeError(f"words must all be str, got {bad[:3]!r}")
            space = space_before[k] if space_before is not None else [i > 0 for i in range(len(words))]
            if isinstance(space, str) or len(space) != len(words):
                raise ValueError(f"space_before must hold one bool per word ({len(words)}), got {space!r}")
            if self._byte_level:
                words = [" " + w if sp and not w[:1].isspace() else w for w, sp in zip(words, space)]
            batch.append(words)
        return [(enc.ids, enc.word_ids) for enc in self._encode(batch, max_length, is_pretokenized=True)]

    # --- decoding -------------------------------------------------------------------------------------
    def to_str_tokens(self, ids: Sequence[int] | torch.Tensor) -> list[str]:
        """One string per id (special tokens kept; WordPiece continuations keep their ``##``).

        Raises:
            ValueError: ``ids`` is not one sequence.
        """
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"to_str_tokens takes one sequence of ids, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        return [self._tok.decode([int(i)], skip_special_tokens=False) or (self._tok.id_to_token(int(i)) or "")
                for i in ids]

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        """Ids of one sequence back to text."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, pad_token_id={self._pad})"


def _has_byte_level(pre_tokenizer: Any) -> bool:
    """Whether a ``tokenizer.json`` pre-tokenizer (possibly a ``Sequence``) contains a ``ByteLevel`` step."""
    if isinstance(pre_tokenizer, dict):
        return pre_tokenizer.get("type") == "ByteLevel" or any(_has_byte_level(v) for v in pre_tokenizer.values())
    if isinstance(pre_tokenizer, list):
        return any(_has_byte_level(v) for v in pre_tokenizer)
    return False


def as_tokenizer(tokenizer: Any) -> Tokenizer | None:
    """An interp :class:`Tokenizer` for ``tokenizer``: None and ours as they are, a ``tokenizers.Tokenizer`` or a HF
    fast tokenizer (its backend) wrapped.

    Raises:
        TypeError: anything else (its type named).

    Example:
        >>> from interp.zoo.tokenizer import as_tokenizer
        >>> as_tokenizer(None) is None
        True
    """
    if tokenizer is None or isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, _HFTokenizer):
        return Tokenizer(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, _HFTokenizer):
        return Tokenizer(backend, pad_token_id=getattr(tokenizer, "pad_token_id", None))
    raise TypeError(f"tokenizer must be an interp Tokenizer, a tokenizers.Tokenizer or a HF fast tokenizer, "
                    f"got {type(tokenizer).__name__}")
