"""Token batches: what every streaming analysis iterates over.

A :class:`Batch` is token ids ``[B, T]``, an optional padding mask ``[B, T]`` and the annotations that came
with the rows (for a treebank: the gold sentences and their word-to-token alignment), so that every scorer
that reads the same text can prepare its targets from one batch and share one forward pass.

- :func:`iter_batches` normalises whatever a user passes as a dataset (a tensor, dicts, tuples, an iterable
  of those) into batches.
- :func:`pad` / :func:`bucket_by_length` turn variable-length sequences into padded batches, grouping
  sequences of similar length so that little compute is spent on padding.
- :func:`text_batches` and :func:`treebank_batches` tokenize texts and gold-parsed sentences.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .treebank import Sentence, check_max_sentences, check_word_index, read_conllu, word_members

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["Batch", "as_batch", "iter_batches", "pad", "bucket_by_length", "text_batches", "treebank_batches",
           "sentences", "check_length", "reads_text"]


@dataclass
class Batch:
    """One forward pass worth of rows.

    Attributes:
        tokens: ``[B, T]`` LongTensor of token ids.
        mask: ``[B, T]`` padding mask (1 = real token), or ``None`` when every position is real.
        annotations: per-batch extras keyed by name. Treebank batches carry ``"sentences"``
            (``list[Sentence]``, one per row) and ``"member"`` (``[B, W, T]`` float, 1 where token t belongs
            to word w); pruning batches ``"loss_mask"`` (``[B, T]`` bool, the tokens scored as next-token
            targets) and, once a sentence objective has seen them, ``"reference"`` (``[B, M]``, the unpruned
            model's sentence embeddings); scorers that need other annotations document their keys.

    Example:
        >>> import torch
        >>> from interp.data.batches import Batch
        >>> b = Batch(torch.tensor([[1, 2, 3]]))
        >>> b.real.tolist()
        [[True, True, True]]
    """

    tokens: torch.Tensor
    mask: torch.Tensor | None = None
    annotations: dict[str, Any] = field(default_factory=dict)

    @property
    def real(self) -> torch.Tensor:
        """``[B, T]`` bool: the positions that are real tokens (not padding)."""
        return torch.ones(self.tokens.shape, dtype=torch.bool) if self.mask is None else self.mask.bool()

    def __len__(self) -> int:
        return self.tokens.shape[0]


def as_batch(item: Any, where: str = "batch") -> Batch:
    """One dataset item -> a :class:`Batch` (tokens ``[B, T]`` long, mask ``[B, T]`` or None).

    Args:
        item: a :class:`Batch` (returned as it is), token ids (``[B, T]`` or ``[T]``), a ``(tokens, mask)``
            tuple, or a dict with ``tokens`` (or ``input_ids``), optionally ``attention_mask``, and any other
            keys, which become annotations (``{"tokens": t, "loss_mask": m}``).
        where: the item's name, for error messages.

    Raises:
        ValueError: a dict without tokens, or bad shapes.
        TypeError: ids that are not integers.

    Example:
        >>> import torch
        >>> from interp.data.batches import as_batch
        >>> as_batch({"tokens": torch.tensor([[1, 2]]), "loss_mask": torch.tensor([[0, 1]])}).annotations["loss_mask"]
        tensor([[0, 1]])
    """
    if isinstance(item, Batch):
        return item
    mask = None
    extras: dict[str, Any] = {}
    if isinstance(item, Mapping):
        if "tokens" not in item and "input_ids" not in item:
            raise ValueError(f"{where}: a dict batch needs a 'tokens' (or 'input_ids') key, got keys {sorted(item)}")
        tokens = item.get("tokens", item.get("input_ids"))
        mask = item.get("attention_mask")
        extras = {k: v for k, v in item.items() if k not in ("tokens", "input_ids", "attention_mask")}
    elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], torch.Tensor):
        tokens, mask = item
    else:
        tokens = item
    if not isinstance(tokens, torch.Tensor):
        try:
            tokens = torch.as_tensor(tokens, dtype=torch.long)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{where}: expected token ids (a LongTensor or lists of ints), got {type(tokens).__name__}"
                            ) from e
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"{where}: token ids must be integers, got dtype {tokens.dtype}")
    if tokens.dim() == 1:
        tokens = tokens[None]  # [1, T]
        mask = None if mask is None else torch.as_tensor(mask)[None]  # [1, T]
    if tokens.dim() != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"{where}: token ids must have shape [batch, pos] with both > 0, got {tuple(tokens.shape)}")
    if mask is not None:
        mask = torch.as_tensor(mask)
        if tuple(mask.shape) != tuple(tokens.shape):
            raise ValueError(f"{where}: attention_mask has shape {tuple(mask.shape)}, tokens {tuple(tokens.shape)}")
    return Batch(tokens.long(), mask, extras)


#: What an analysis takes as token ids (see :func:`iter_batches`): one LongTensor ``[N, T]``, a dict with
#: ``tokens`` (and ``attention_mask``), a :class:`Batch`, or an iterable of batches (each one of those, or a
#: ``(tokens, attention_mask)`` tuple).
TokenData = torch.Tensor | Mapping[str, torch.Tensor] | Batch | Iterable[object]


def iter_batches(data: TokenData, *, batch_size: int = 32, name: str = "tokens") -> Iterator[Batch]:
    """Normalise what a user passes as a dataset into :class:`Batch` objects.

    Args:
        data: a LongTensor ``[N, T]`` (or ``[T]``), split into ``batch_size`` rows; a dict with ``tokens``
            (and optionally ``attention_mask``); or any iterable of batches, each a :class:`Batch`, a tensor,
            a ``(tokens, attention_mask)`` tuple or such a dict (a generator streams).
        batch_size: rows per batch when ``data`` is one tensor.
        name: the argument's name, for error messages.

    Yields:
        :class:`Batch` objects.

    Raises:
        ValueError: the dataset is empty, or a batch has a bad shape.
        TypeError: a batch is not made of integer ids.

    Example:
        >>> import torch
        >>> from interp.data.batches import iter_batches
        >>> [tuple(b.tokens.shape) for b in iter_batches(torch.zeros(5, 3, dtype=torch.long), batch_size=2)]
        [(2, 3), (2, 3), (1, 3)]
    """
    if data is None:
        raise ValueError(f"{name} is None: pass token ids (a LongTensor [batch, pos] or an iterable of batches)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    if isinstance(data, (torch.Tensor, Mapping, Batch)):
        whole = as_batch(data, name)
        n = whole.tokens.shape[0]
        for i in range(0, n, batch_size):
            rows = slice(i, i + batch_size)
            yield Batch(whole.tokens[rows], None if whole.mask is None else whole.mask[rows],
                        {k: _rows_of(v, rows, n) for k, v in whole.annotations.items()})
        return
    if not isinstance(data, Iterable) or isinstance(data, (str, bytes)):
        raise TypeError(f"{name} must be a LongTensor or an iterable of batches, got {type(data).__name__}")
    if isinstance(data, list) and data and all(isinstance(x, int) for x in data):
        yield as_batch(data, name)  # one sequence given as a flat list of ints
        return
    n = 0
    for i, item in enumerate(data):
        n += 1
        yield as_batch(item, f"{name}[{i}]")
    if n == 0:
        raise ValueError(f"{name} is an empty dataset: nothing to analyse")


def _rows_of(value: Any, rows: slice, n: int) -> Any:
    """The ``rows`` of a per-row annotation (a tensor or list with one entry per row); others as they are."""
    if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == n:
        return value[rows]
    if isinstance(value, (list, tuple)) and len(value) == n:
        return value[rows]
    return value


def pad(seqs: Sequence[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D id tensors into ``(tokens [B, T], mask [B, T])``.

    Raises:
        ValueError: no sequence, or an empty sequence.

    Example:
        >>> import torch
        >>> from interp.data.batches import pad
        >>> tokens, mask = pad([torch.tensor([5, 6]), torch.tensor([7])], pad_id=0)
        >>> tokens.tolist(), mask.tolist()
        ([[5, 6], [7, 0]], [[1, 1], [1, 0]])
    """
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError(f"pad needs at least one non-empty sequence, got lengths {[len(s) for s in seqs]}")
    T = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return tokens, mask


def bucket_by_length(lengths: Sequence[int], batch_size: int, *, window: int | None = None) -> list[list[int]]:
    """Group indices into batches of similar length (less padding), deterministically.

    Indices are read in windows of ``window`` items (default ``16 * batch_size``, so a stream is never held
    whole); inside a window they are sorted by length (stable) and cut into batches of ``batch_size``.

    Args:
        lengths: the length of each item.
        batch_size: items per batch.
        window: items sorted together; 1 keeps the input order.

    Returns:
        Lists of indices into ``lengths``; every index appears exactly once.

    Example:
        >>> from interp.data.batches import bucket_by_length
        >>> bucket_by_length([5, 1, 4, 2], 2)
        [[1, 3], [2, 0]]
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    window = 16 * batch_size if window is None else window
    out: list[list[int]] = []
    for w0 in range(0, len(lengths), window):
        idx = sorted(range(w0, min(w0 + window, len(lengths))), key=lambda i: lengths[i])
        out += [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]
    return out


def check_length(model: Transformer, T: int, what: str = "sequence") -> None:
    """Raise ValueError when a batch is longer than the model's context."""
    if T > model.cfg.n_ctx:
        raise ValueError(f"{what} length {T} exceeds the model's n_ctx={model.cfg.n_ctx}")


def reads_text(model: Transformer) -> bool:
    """Whether ``model`` has a tokenizer for text: not none, and not the toy models' token-id tokenizer (which
    reads ``"t5 t17"`` strings, so prompts written as sentences mean nothing to it).

    Args:
        model: any model (its ``tokenizer`` attribute is read; a missing one counts as none).

    Returns:
        True for a text tokenizer.

    Example:
        >>> import interp
        >>> from interp.data.batches import reads_text
        >>> reads_text(interp.load("minilm-l6")), reads_text(interp.load("induction-2l"))
        (True, False)
    """
    tok = getattr(model, "tokenizer", None)
    return tok is not None and type(tok).__name__ != "TokenIdTokenizer"


def text_batches(model: Transformer, texts: Sequence[str], *, batch_size: int = 32,
                 max_length: int | None = None) -> list[Batch]:
    """Tokenize ``texts`` with the model's tokenizer into padded batches.

    Args:
        model: the model whose tokenizer reads the texts.
        texts: the texts.
        batch_size: texts per batch.
        max_length: truncate each text to this many tokens (special tokens kept); default and at most the
            model's ``n_ctx``.

    Raises:
        ValueError: no text tokenizer, or ``texts`` is not a non-empty list of str.

    Example:
        >>> import interp
        >>> from interp.data.batches import text_batches
        >>> text_batches(interp.load("minilm-l6"), ["The cat sat.", "A dog."])[0].tokens.shape   # [2, T]
    """
    tok = getattr(model, "tokenizer", None)
    if tok is None or not hasattr(tok, "encode_batch_with_mask"):
        raise ValueError(f"texts given but model {getattr(model, 'name', '?')!r} has no text tokenizer; pass tokens")
    if isinstance(texts, str) or not texts:
        raise ValueError(f"texts must be a non-empty list of str, got {texts!r}")
    limit = model.cfg.n_ctx if max_length is None else min(max_length, model.cfg.n_ctx)
    return [as_batch(tok.encode_batch_with_mask(list(texts[i:i + batch_size]), max_length=limit), "texts")
            for i in range(0, len(texts), batch_size)]


def sentences(conllu: str | Path | Iterable[Sentence], max_sentences: int | None = None) -> Iterator[Sentence]:
    """The sentences of a CoNLL-U path, or of an iterable of :class:`Sentence`, up to ``max_sentences``.

    Raises:
        TypeError: ``conllu`` is neither, or an item is not a Sentence.
    """
    if isinstance(conllu, (str, Path)):
        yield from read_conllu(conllu, max_sentences=max_sentences)
        return
    if not isinstance(conllu, Iterable):
        raise TypeError(f"conllu must be a path or an iterable of Sentence, got {type(conllu).__name__}")
    check_max_sentences(max_sentences)
    for i, s in enumerate(conllu):
        if max_sentences is not None and i >= max_sentences:
            return  # stop reading at the cap: an endless source must not be consumed to its end
        if not isinstance(s, Sentence):
            raise TypeError(f"conllu items must be Sentence objects, got {type(s).__name__}")
        yield s


class TreebankStats:
    """Counts filled by :func:`treebank_batches`: sentences seen, skipped (longer than ``n_ctx``), skipped
    because a word tokenizes to nothing (``untokenized``), batched."""

    def __init__(self) -> None:
        self.seen = self.skipped = self.untokenized = self.batched = 0


def treebank_batches(
    model: Transformer,
    conllu: str | Path | Iterable[Sentence],
    *,
    tokenizer: Any = None,
    batch_size: int = 32,
    max_sentences: int | None = None,
    bucket: bool = True,
    stats: TreebankStats | None = None,
) -> Iterator[Batch]:
    """Gold-parsed sentences tokenized into padded batches annotated with ``sentences`` and ``member``.

    Sentences longer than the model's context are skipped (counted in ``stats.skipped``), and so are sentences
    with a word that tokenizes to nothing (``stats.untokenized``).

    Args:
        model: the model whose context length (and, by default, tokenizer) applies.
        conllu: a CoNLL-U path or an iterable of :class:`Sentence`.
        tokenizer: anything with ``encode_words(words) -> (ids, word_index)`` and ``pad_token_id``; default
            ``model.tokenizer``.
        batch_size: sentences per batch.
        max_sentences: read only the first sentences.
        bucket: group sentences of similar length (:func:`bucket_by_length`) to spend less on padding.
        stats: a :class:`TreebankStats` to fill.

    Yields:
        :class:`Batch` with ``annotations["sentences"]`` and ``annotations["member"]`` ``[B, W, T]``.

    Raises:
        ValueError: the model has no word-aware tokenizer, or a CoNLL-U line is malformed.

    Example:
        >>> import interp
        >>> from interp.data.batches import treebank_batches
        >>> b = next(treebank_batches(interp.load("minilm-l6"), "../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu", batch_size=8))
        >>> b.annotations["member"].shape    # [8, W, T]
    """
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is None or not hasattr(tok, "encode_words"):
        raise ValueError(f"model {getattr(model, 'name', '?')!r} has no tokenizer with encode_words; pass tokenizer=")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    stats = TreebankStats() if stats is None else stats
    # Checked above, eagerly; the batches themselves are produced lazily.
    return _treebank_stream(model, conllu, tok, batch_size, max_sentences, bucket, stats)


def _encode_sentences(tok: Any, sents: list[Sentence]) -> list[tuple[Sequence[int], Sequence[int | None]]]:
    """``(ids, word_index)`` of each sentence, in one call when the tokenizer encodes batches of sentences."""
    if hasattr(tok, "encode_words_batch"):
        return tok.encode_words_batch([s.words for s in sents])
    return [tok.encode_words(s.words) for s in sents]


def _treebank_stream(model: Transformer, conllu: Any, tok: Any, batch_size: int, max_sentences: int | None,
                     bucket: bool, stats: TreebankStats) -> Iterator[Batch]:
    pad_id = getattr(tok, "pad_token_id", None) or 0
    window = 16 * batch_size if bucket else 1
    pending: list[tuple[Sentence, torch.Tensor, Sequence[int | None]]] = []

    def emit(items: list[tuple[Sentence, torch.Tensor, Sequence[int | None]]]) -> Iterator[Batch]:
        for group in bucket_by_length([len(ids) for _, ids, _ in items], batch_size, window=window):
            rows = [items[i] for i in group]
            tokens, mask = pad([ids for _, ids, _ in rows], pad_id)
            W = max(len(s.words) for s, _, _ in rows)
            member = word_members([wi for _, _, wi in rows], W, tokens.shape[1])  # [B, W, T]
            stats.batched += len(rows)
            yield Batch(tokens, mask, {"sentences": [s for s, _, _ in rows], "member": member})

    # Sentences are tokenized a window at a time (one tokenizer call), then taken one by one as before.
    for sents in _chunks(sentences(conllu, max_sentences), max(window, batch_size)):
        for s, (ids, word_index) in zip(sents, _encode_sentences(tok, sents)):
            stats.seen += 1
            if len(ids) > model.cfg.n_ctx:
                stats.skipped += 1
                continue
            word_index = list(word_index)
            try:
                check_word_index(word_index, len(s.words))
            except ValueError:
                stats.untokenized += 1  # a word whose form tokenizes to nothing: skip the sentence, count it
                continue
            pending.append((s, torch.as_tensor(ids, dtype=torch.long), word_index))
            if len(pending) == max(window, batch_size):
                yield from emit(pending)
                pending = []
    if pending:
        yield from emit(pending)


def _chunks(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    """Lists of up to ``n`` consecutive items."""
    it = iter(items)
    while chunk := list(itertools.islice(it, n)):
        yield chunk
