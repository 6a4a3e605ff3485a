"""Reading gold dependency trees from CoNLL-U (with the ``conllu`` package) and aligning words to tokens.

Only what the syntactic analysis needs is kept per sentence: the words, each word's head (0-based, -1 for the
root) and its relation. Multiword-token ranges (``3-4``) and empty nodes (``5.1``) are skipped, as they are
not words of the basic tree. Malformed input raises ``ValueError`` naming the file and the line number.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import conllu
import torch
from conllu.parser import parse_id_value, parse_int_value

from ._sources import first_items, open_source

__all__ = ["Sentence", "read_conllu", "align_words", "check_max_sentences", "parse_text_with_spacy"]

_N_FIELDS = 10


@dataclass
class Sentence:
    """One gold-parsed sentence.

    Attributes:
        words: the word forms.
        heads: ``heads[i]`` is the index of word i's head, -1 for the root.
        deprels: ``deprels[i]`` is the relation of word i to its head (``nsubj``, ``obl:tmod``...).
        sent_id: the ``# sent_id`` comment, if any.
        line: the line number (1-based) where the sentence starts.
        text: the ``# text`` comment (the sentence as written, with its original spacing), if any.
    """

    words: list[str]
    heads: list[int]
    deprels: list[str]
    sent_id: str | None = None
    line: int = 0
    text: str | None = None


def _blocks(lines: Iterator[str], where: str) -> Iterator[list[tuple[int, str, list[str] | None]]]:
    """Group lines into sentence blocks of ``(line_number, line, fields)`` (``fields`` None for a comment),
    checking the field count on the way."""
    block: list[tuple[int, str, list[str] | None]] = []
    for no, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):  # files are read as bytes so that a decoding error can name its line
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}:{no}: not UTF-8 text ({e.reason} at byte {e.start}); CoNLL-U files "
                                 "are UTF-8") from e
        line = raw.rstrip("\n").rstrip("\r")
        if no == 1:
            line = line.removeprefix("\ufeff")  # a byte-order mark some editors write
        if not line.strip():
            if block:
                yield block
                block = []
            continue
        if line.startswith("#"):
            block.append((no, line, None))
            continue
        fields = line.split("\t")
        if len(fields) != _N_FIELDS:
            raise ValueError(f"{where}:{no}: malformed CoNLL-U line (expected {_N_FIELDS} tab-separated fields, "
                             f"got {len(fields)}): {line!r}")
        block.append((no, line, fields))
    if block:
        yield block


def _parse_block(block: list[tuple[int, str, list[str] | None]], where: str) -> Sentence | None:
    # Only ID, FORM, HEAD and DEPREL are read; ID and HEAD go through conllu's own field parsers (so ranges
    # "3-4", empty nodes "5.1" and "_" mean what the library says), and FEATS / MISC / DEPS are never parsed:
    # parsing them was most of the time a whole-treebank analysis spent outside the model.
    words: list[str] = []
    heads: list[int] = []
    rels: list[str] = []
    head_lines: list[tuple[int, str]] = []
    sent_id = text = None
    for no, line, fields in block:
        if fields is None:
            key, _, value = line[1:].partition("=")
            if key.strip() == "sent_id" and value.strip():
                sent_id = value.strip()
            elif key.strip() == "text" and value.strip():
                text = value.strip()
            continue
        try:
            tok_id = _int_or(fields[0], parse_id_value)
            head = _int_or(fields[6], parse_int_value)
        except conllu.exceptions.ParseException as e:
            raise ValueError(f"{where}:{no}: malformed CoNLL-U line ({e}): {line!r}") from e
        if not isinstance(tok_id, int):
            continue  # multiword range or empty node: not part of the basic tree
        if tok_id != len(words) + 1:
            raise ValueError(f"{where}:{no}: word ids must count 1, 2, 3...; expected {len(words) + 1}, got "
                             f"{tok_id!r}: {line!r}")
        if not isinstance(head, int):
            raise ValueError(f"{where}:{no}: word {tok_id} has no integer HEAD ({head!r}): {line!r}")
        words.append(fields[1])
        heads.append(head - 1)
        rels.append(fields[7])
        head_lines.append((no, line))
    for h, (no, line) in zip(heads, head_lines):
        if not -1 <= h < len(words):
            raise ValueError(f"{where}:{no}: HEAD {h + 1} points outside the sentence of {len(words)} words: {line!r}")
    if not words:
        return None
    _check_tree(heads, head_lines, where)
    return Sentence(words, heads, rels, sent_id, block[0][0], text)


def _int_or(value: str, parse: Any) -> Any:
    """A plain non-negative integer field ("7", "0") as an int; anything else (ranges "3-4", empty nodes "5.1",
    "_", malformed values) through conllu's ``parse`` and its errors. Plain integers are nearly every ID and
    HEAD, and conllu's regular expressions were a third of the time spent reading a treebank."""
    if value.isdigit() and value.isascii() and (value[0] != "0" or value == "0"):
        return int(value)
    return parse(value)


def _check_tree(heads: list[int], head_lines: list[tuple[int, str]], where: str) -> None:
    """A basic UD tree: no word is its own head, exactly one root, and every word reaches it (no cycle)."""
    for i, (h, (no, line)) in enumerate(zip(heads, head_lines)):
        if h == i:
            raise ValueError(f"{where}:{no}: word {i + 1} is its own HEAD: {line!r}")
    roots = [i for i, h in enumerate(heads) if h == -1]
    if len(roots) != 1:
        at = head_lines[roots[1]][0] if roots else head_lines[0][0]
        raise ValueError(f"{where}:{at}: a sentence needs exactly one root (HEAD 0), found {len(roots)} "
                         f"(words {[r + 1 for r in roots]})")
    rooted = {-1}  # words known to reach the root: each walk stops at the first one (linear in the words)
    for i in range(len(heads)):
        path: list[int] = []
        seen: set[int] = set()
        j = i
        while j not in rooted:
            if j in seen:
                no, line = head_lines[i]
                raise ValueError(f"{where}:{no}: the HEADs of words {sorted(k + 1 for k in seen)} form a cycle "
                                 f"(word {i + 1} never reaches the root): {line!r}")
            seen.add(j)
            path.append(j)
            j = heads[j]
        rooted.update(path)


def read_conllu(source: str | Path | Sequence[str], *, max_sentences: int | None = None) -> Iterator[Sentence]:
    """Stream the sentences of a CoNLL-U file (or of CoNLL-U text given as a list of lines).

    Args:
        source: a path to a ``.conllu`` file, or the file's lines.
        max_sentences: stop after this many sentences.

    Yields:
        :class:`Sentence` objects, one at a time (the file is never read whole).

    Raises:
        FileNotFoundError: no file at the path.
        ValueError: ``max_sentences`` < 1, or a malformed line (not UTF-8, wrong fields, a HEAD outside the
            sentence, a self-loop, a cycle, no root or several roots); the message starts with ``file:line``.

    Example:
        >>> from interp.data.treebank import read_conllu
        >>> for sent in read_conllu("../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu", max_sentences=2):
        ...     print(sent.words, sent.heads, sent.deprels)
    """
    check_max_sentences(max_sentences)
    where, handle = open_source(source, "CoNLL-U", "<conllu>")
    return first_items(_read(where, handle), handle, max_sentences)


def check_max_sentences(max_sentences: int | None) -> None:
    """Raise unless ``max_sentences`` is None or an int >= 1."""
    if max_sentences is not None and (isinstance(max_sentences, bool) or not isinstance(max_sentences, int)):
        raise TypeError(f"max_sentences={max_sentences!r} must be an int or None")
    if max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_sentences={max_sentences} must be >= 1 (or None for all)")


def _read(where: str, handle: Any) -> Iterator[Sentence]:
    for block in _blocks(handle, where):
        sent = _parse_block(block, where)
        if sent is not None:
            yield sent


def check_word_index(word_index: Sequence[int | None], n_words: int) -> None:
    """Raise ValueError unless every token's word index is in ``[0, n_words)`` (or None, a special token) and
    every word has a token."""
    words = [w for w in word_index if w is not None]
    bad = [(t, w) for t, w in enumerate(word_index) if w is not None and not 0 <= w < n_words]
    if bad:
        raise ValueError(f"word index {bad[0][1]} at token {bad[0][0]} is outside [0, {n_words})")
    if len(set(words)) != n_words:
        empty = sorted(set(range(n_words)) - set(words))
        raise ValueError(f"words {empty} have no token after tokenization")


def word_members(word_indices: Sequence[Sequence[int | None]], n_words: int, n_tokens: int) -> torch.Tensor:
    """Word-to-token membership of several sequences at once: ``[B, n_words, n_tokens]``, 1 where token t of
    sequence b belongs to word w (indices already checked by :func:`check_word_index`; one scatter)."""
    bwt = [(b, w, t) for b, wi in enumerate(word_indices) for t, w in enumerate(wi) if w is not None]
    member = torch.zeros(len(word_indices), n_words, n_tokens)  # [B, W, T]
    if bwt:
        member[tuple(torch.tensor(bwt, dtype=torch.long).T)] = 1.0
    return member


def align_words(word_index: Sequence[int | None], n_words: int) -> torch.Tensor:
    """Word-to-token membership ``[W, T]`` (1 where token t belongs to word w) from a tokenizer's word ids.

    Special tokens (``None``) belong to no word.

    Raises:
        ValueError: a word has no token (the tokenizer dropped it) or an index is out of range.

    Example:
        >>> from interp.data.treebank import align_words
        >>> align_words([None, 0, 0, 1, None], 2).tolist()
        [[0.0, 1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]]
    """
    check_word_index(word_index, n_words)
    return word_members([word_index], n_words, len(word_index))[0]


def parse_text_with_spacy(text: str, model_name: str = "en_core_web_sm") -> list[Sentence]:
    """Parse a user's own text into :class:`Sentence` trees with spaCy (optional dependency).

    Args:
        text: raw text.
        model_name: an installed spaCy pipeline with a dependency parser.

    Returns:
        One :class:`Sentence` per spaCy sentence (spaCy's English labels, ClearNLP-style, not UD).

    Raises:
        ImportError: spaCy or the pipeline is not installed (install them yourself; interp does not).
    """
    try:
        import spacy
    except ImportError as e:
        raise ImportError("parse_text_with_spacy needs spaCy: pip install spacy && python -m spacy download "
                          f"{model_name}") from e
    try:
        nlp = spacy.load(model_name)
    except OSError as e:
        raise ImportError(f"spaCy pipeline {model_name!r} is not installed: python -m spacy download {model_name}") from e
    out = []
    for sent in nlp(text).sents:
        toks = list(sent)
        start = toks[0].i
        heads = [-1 if t.head.i == t.i else t.head.i - start for t in toks]
        out.append(Sentence([t.text for t in toks], heads, [t.dep_.lower() for t in toks]))
    return out
