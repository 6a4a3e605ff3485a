"""Coreference data aligned to model tokens: GAP (TSV, character offsets) and CorefUD (CoNLL-U, mentions in MISC).

Two readers turn files into annotation objects, and two window builders turn those into what a head scorer
needs, :class:`CorefWindow`: the words of one model input, their token ids and word alignment, and the
*queries* to score. A query is one mention that has an antecedent: the words whose tokens the attention comes
*from* (the mention's head word; GAP's pronoun), the candidate antecedents (each a tuple of words whose tokens
receive attention), which candidates are correct, and the candidate each rule-based baseline picks (computed
here, from the annotations alone, so that heads and baselines are judged on exactly the same queries).

- GAP (Webster et al. 2018): one window per row; the text is cut into words at whitespace *and* at the span
  boundaries of the pronoun and the two names, so every annotated span is a whole number of words. Rows whose
  pronoun refers to neither name are not queries. Baselines: ``nearest`` (the name closest in characters),
  ``first`` (the earlier name: the topical entity of a Wikipedia snippet), ``parallelism`` (a parser-free
  version of GAP's "Parallelism" baseline: a subject pronoun *he/she* picks the nearest name in subject
  position, approximated as opening its sentence, possibly after a fronted phrase ending in a comma, as
  English SVO order puts subjects first; object *him* the nearest name that is not; possessives, and no such
  name, fall back to ``nearest``).
- CorefUD (GUM): documents with mentions ``(start, end, head)`` and entities. The head word of a mention is its
  UD syntactic head (the word of the span whose head lies outside it); CorefUD's ``minspan`` is kept as well.
  Candidates of a mention are the distinct head words of the mentions that end before it starts, inside the
  window (singletons included: they are mentions a head could pick); a candidate is correct when one of its
  mentions belongs to the same entity (Clark et al. 2019). Baselines: ``nearest`` (the closest earlier head
  word), ``head_match`` (the nearest candidate with the same head-word form, case-folded; else ``nearest``),
  ``string_match`` (the nearest candidate with a mention of the same text, case-folded; else ``head_match``).
  Documents longer than the window are cut into overlapping windows of whole sentences, each starting half a
  window after the previous one; a mention is scored once, in the first window that holds its sentence, so it
  sees at least half a window of earlier text (whole document when it is shorter).

Errors name the file and line (``file:line: ...``) and the offending value.

The CoNLL-U line grouping is :mod:`interp.data.treebank`'s.
"""

from __future__ import annotations

import csv
import inspect
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import conllu
import torch

from ._sources import first_items, open_source
from .treebank import _blocks

__all__ = [
    "COREFUD_BASELINES",
    "GAP_BASELINES",
    "CorefDocument",
    "CorefQuery",
    "CorefWindow",
    "GapExample",
    "Mention",
    "corefud_windows",
    "gap_windows",
    "read_corefud",
    "read_gap",
]

GAP_BASELINES = ("nearest", "first", "parallelism")
COREFUD_BASELINES = ("nearest", "head_match", "string_match")
_GAP_COLUMNS = ["ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref"]


# --- CorefUD ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mention:
    """One mention of an entity, word indices counted over the whole document.

    Attributes:
        entity: the entity id (``"3"`` in ``Entity=(3-person-...)``).
        start, end: the span's first word and one past its last word.
        head: the UD syntactic head of the span (the word whose head lies outside the span; the first such).
        minspan: CorefUD's minimal span, as document word indices (empty when the field is absent).
        sentence: index of the sentence holding ``head``.
        line: the line that opened the mention.
    """

    entity: str
    start: int
    end: int
    head: int
    minspan: tuple[int, ...] = ()
    sentence: int = 0
    line: int = 0


@dataclass
class CorefDocument:
    """A CorefUD document: words, per-word UPOS and head (document indices, -1 for a root), sentences, mentions.

    Attributes:
        doc_id: the ``# newdoc id``.
        words, upos, heads: one entry per word of the document.
        sentences: ``(start, end)`` word ranges, one per sentence.
        mentions: every mention, sorted by ``(start, -end)``.
        line: the line where the document starts.
    """

    doc_id: str
    words: list[str] = field(default_factory=list)
    upos: list[str] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)
    sentences: list[tuple[int, int]] = field(default_factory=list)
    mentions: list[Mention] = field(default_factory=list)
    line: int = 0

    @property
    def entities(self) -> dict[str, list[Mention]]:
        """``{entity: [mentions in text order]}`` (the coreference chains, singletons included)."""
        out: dict[str, list[Mention]] = {}
        for m in self.mentions:
            out.setdefault(m.entity, []).append(m)
        return out

    def text(self, m: Mention) -> str:
        """The words of a mention joined by spaces."""
        return " ".join(self.words[m.start:m.end])


def _fields_of(header: str) -> list[str]:
    return header.split("=", 1)[1].strip().split("-")


def _entity_events(value: str, where: str) -> list[tuple[str, str, bool]]:
    """Parse an ``Entity=`` value into ``(kind, payload, closes_now)`` events: ``("open", "3-person-...", bool)``
    or ``("close", "3", True)``, in order."""
    events, i, n = [], 0, len(value)
    while i < n:
        if value[i] == "(":
            j = i + 1
            while j < n and value[j] not in "()":
                j += 1
            payload = value[i + 1:j]
            if not payload:
                raise ValueError(f"{where}: empty mention '()' in Entity={value!r}")
            closes = j < n and value[j] == ")"
            events.append(("open", payload, closes))
            i = j + 1 if closes else j
        else:
            j = i
            while j < n and value[j] not in "()":
                j += 1
            if j >= n or value[j] != ")":
                raise ValueError(f"{where}: expected 'ID)' closing a mention in Entity={value!r}")
            events.append(("close", value[i:j], True))
            i = j + 1
    return events


def _span_head(start: int, end: int, heads: list[int]) -> int:
    """The word of ``[start, end)`` whose head lies outside the span (the first such; ``start`` if none)."""
    for w in range(start, end):
        if not start <= heads[w] < end:
            return w
    return start


def _check_limit(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")


def _decoded(handle: Iterable[bytes | str], where: str) -> Iterator[str]:
    """Lines of a file read as bytes, decoded one by one so that an error names its line, or given lines as they
    are; a BOM is dropped."""
    for no, raw in enumerate(handle, start=1):
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}:{no}: not UTF-8 text ({e.reason} at byte {e.start} of the line); GAP files "
                             f"are UTF-8") from e
        yield line.removeprefix("\ufeff") if no == 1 else line


def read_corefud(source: str | Path | Sequence[str], *, max_documents: int | None = None) -> Iterator[CorefDocument]:
    """Stream the documents of a CorefUD CoNLL-U file (coreference in the MISC column's ``Entity=``).

    Args:
        source: a path, or the file's lines.
        max_documents: stop after this many documents.

    Yields:
        :class:`CorefDocument` objects, one per ``# newdoc`` (text before the first one forms a document too).

    Raises:
        FileNotFoundError: no file at the path.
        ValueError: a malformed or non-UTF-8 line, a mention closed that was never opened, a mention left open
            at the end of its document, or an ``Entity`` value without an entity id (the message starts with
            ``file:line``); a negative or non-int ``max_documents``.

    Example:
        >>> from interp.data.coref import read_corefud
        >>> doc = next(read_corefud("../shared/data/gum-coref/en_gum-ud-dev.ccby.conllu"))
        >>> [doc.text(m) for m in doc.entities["3"]][:3]
        ['Byron', 'his', 'he']
    """
    _check_limit("max_documents", max_documents)
    where, handle = open_source(source, "CoNLL-U", "<conllu>")
    return first_items(_read_corefud(where, handle), handle, max_documents)


def _read_corefud(where: str, handle: Any) -> Iterator[CorefDocument]:
    fields = ["GRP", "etype", "infstat", "salience", "centering", "minspan", "link", "identity"]
    doc: CorefDocument | None = None
    open_: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}  # entity -> stack of (start, line, minspan)
    raw: list[tuple[str, int, int, tuple[int, ...], int]] = []  # (entity, start, end, minspan, line)
    n_docs = 0

    def finish(d: CorefDocument) -> CorefDocument:
        left = [(e, line) for e, stack in open_.items() for _, line, _ in stack]
        if left:
            e, line = left[0]
            raise ValueError(f"{where}:{line}: mention of entity {e!r} opened here is never closed in document "
                             f"{d.doc_id!r}")
        sent_of = [0] * len(d.words)
        for s, (a, b) in enumerate(d.sentences):
            sent_of[a:b] = [s] * (b - a)
        mentions = []
        for e, a, b, mins, line in raw:
            h = _span_head(a, b, d.heads)
            mentions.append(Mention(e, a, b, h, mins, sent_of[h], line))
        d.mentions = sorted(mentions, key=lambda m: (m.start, -m.end, m.line))
        return d

    for block in _blocks(handle, where):
        comments = [(no, line) for no, line, _ in block if line.startswith("#")]
        for no, line in comments:
            if re.match(r"#\s*newdoc\b", line):
                if doc is not None and doc.words:
                    yield finish(doc)
                    n_docs += 1
                m = re.search(r"id\s*=\s*(\S+)", line)
                doc = CorefDocument(m.group(1) if m else f"doc{n_docs}", line=no)
                open_.clear()
                raw.clear()
            elif re.match(r"#\s*global\.Entity\s*=", line):
                fields = _fields_of(line)
        if doc is None:
            doc = CorefDocument("doc0", line=block[0][0])
        token_lines = [(no, line) for no, line, _ in block if not line.startswith("#")]
        if not token_lines:  # a block of comments only (a trailing "# newdoc", a stray "#"): no sentence
            continue
        text = "\n".join(line for _, line in token_lines) + "\n\n"
        try:
            (toks,) = conllu.parse(text)
        except conllu.exceptions.ParseException as e:
            for no, line in token_lines:
                try:
                    conllu.parse(line + "\n\n")
                except conllu.exceptions.ParseException as e_line:
                    raise ValueError(f"{where}:{no}: malformed CoNLL-U line ({e_line}): {line!r}") from e_line
            raise ValueError(f"{where}:{block[0][0]}: malformed CoNLL-U sentence ({e})") from e
        offset = len(doc.words)
        words_here = [(t, ln) for t, ln in zip(toks, token_lines) if isinstance(t["id"], int)]
        n_words = len(words_here)
        for k, (t, (no, line)) in enumerate(words_here):
            if t["id"] != k + 1:
                raise ValueError(f"{where}:{no}: word ids must count 1, 2, 3...; expected {k + 1}, got "
                                 f"{t['id']!r}: {line!r}")
            h = t["head"]
            if not isinstance(h, int) or not 0 <= h <= n_words:
                raise ValueError(f"{where}:{no}: HEAD {h!r} is not a word of this {n_words}-word sentence: "
                                 f"{line!r}")
            doc.words.append(str(t["form"]))
            doc.upos.append(str(t["upos"]))
            doc.heads.append(-1 if h == 0 else offset + h - 1)
            w = offset + k
            misc = line.split("\t")[9]
            value = next((p.split("=", 1)[1] for p in misc.split("|") if p.startswith("Entity=")), None)
            if value is None:
                continue
            for kind, payload, closes in _entity_events(value, f"{where}:{no}"):
                if kind == "open":
                    parts = payload.split("-", len(fields) - 1)
                    eid = parts[0]
                    if not eid or "[" in eid:
                        raise ValueError(f"{where}:{no}: unsupported entity id {eid!r} in Entity={value!r} "
                                         "(discontinuous mentions are not read)")
                    mins: tuple[int, ...] = ()
                    if "minspan" in fields and fields.index("minspan") < len(parts):
                        spec = parts[fields.index("minspan")]
                        if re.fullmatch(r"\d+(,\d+)*", spec):
                            mins = tuple(w + int(x) - 1 for x in spec.split(","))  # 1-based, mention-relative
                    if closes:
                        raw.append((eid, w, w + 1, mins, no))
                    else:
                        open_.setdefault(eid, []).append((w, no, mins))
                else:
                    stack = open_.get(payload)
                    if not stack:
                        raise ValueError(f"{where}:{no}: mention of entity {payload!r} closed but never opened "
                                         f"(Entity={value!r})")
                    a, line_open, mins = stack.pop()
                    raw.append((payload, a, w + 1, mins, line_open))
        if n_words:
            doc.sentences.append((offset, offset + n_words))
    if doc is not None and doc.words:
        yield finish(doc)


# --- GAP --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """A character span of a text: ``text[start:end] == string``."""

    string: str
    start: int
    end: int


@dataclass(frozen=True)
class GapExample:
    """One GAP row.

    Attributes:
        id: the row's ID.
        text: the snippet.
        pronoun, a, b: character spans of the pronoun and the two candidate names.
        a_coref, b_coref: whether the pronoun refers to A / B.
        line: the row's line in the file (the header is line 1).
    """

    id: str
    text: str
    pronoun: Span
    a: Span
    b: Span
    a_coref: bool
    b_coref: bool
    line: int = 0

    @property
    def label(self) -> str | None:
        """``"A"``, ``"B"``, or None when the pronoun refers to neither (or, malformed, both)."""
        if self.a_coref == self.b_coref:
            return None
        return "A" if self.a_coref else "B"


def _bool(v: str, where: str, column: str) -> bool:
    s = v.strip().upper()
    if s not in ("TRUE", "FALSE"):
        raise ValueError(f"{where}: column {column} must be TRUE or FALSE, got {v!r}")
    return s == "TRUE"


def _span(text: str, string: str, offset: str, where: str, column: str) -> Span:
    try:
        start = int(offset)
    except ValueError:
        raise ValueError(f"{where}: {column}-offset must be an integer, got {offset!r}") from None
    if not string or text[start:start + len(string)] != string or start < 0:
        raise ValueError(f"{where}: {column} {string!r} is not at offset {start} of the text (found "
                         f"{text[max(start, 0):max(start, 0) + len(string)]!r})")
    return Span(string, start, start + len(string))


def read_gap(source: str | Path | Sequence[str], *, max_rows: int | None = None) -> Iterator[GapExample]:
    """Stream the rows of a GAP TSV file.

    Args:
        source: a path, or the file's lines (header first).
        max_rows: stop after this many rows.

    Yields:
        :class:`GapExample` objects.

    Raises:
        FileNotFoundError: no file at the path.
        ValueError: a missing column in the header, a row with too few fields or a field over csv's size
            limit, a line that is not UTF-8, an offset that does not point at its string, a coref flag that
            is not TRUE/FALSE, or a contradictory row (A and B both TRUE, A and B the same span, the pronoun
            inside a name); the message starts with ``file:line``. A negative or non-int ``max_rows``.

    Example:
        >>> from interp.data.coref import read_gap
        >>> ex = next(read_gap("../shared/data/gap/gap-development.tsv"))
        >>> ex.pronoun.string, ex.a.string, ex.label
        ('her', 'Cheryl Cassidy', 'A')
    """
    _check_limit("max_rows", max_rows)
    where, handle = open_source(source, "GAP", "<gap>")
    return first_items(_read_gap(where, _decoded(handle, where)), handle, max_rows)


def _gap_rows(reader: Any, where: str) -> Iterator[tuple[int, list[str]]]:
    """``(line, row)`` pairs; csv's own errors (a field over its size limit) become errors naming the line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise ValueError(f"{where}:{reader.line_num}: unreadable GAP row ({e}; the limit is "
                             f"{csv.field_size_limit()} characters per field)") from e
        yield reader.line_num, row


def _check_gap_row(ex: GapExample, where: str) -> GapExample:
    """Refuse rows that contradict themselves (GAP gives each pronoun at most one antecedent)."""
    if ex.a_coref and ex.b_coref:
        raise ValueError(f"{where}: A-coref and B-coref are both TRUE; a GAP pronoun refers to at most one name")
    if (ex.a.start, ex.a.end) == (ex.b.start, ex.b.end):
        raise ValueError(f"{where}: A and B are the same span {ex.a.string!r} at offset {ex.a.start}")
    for name, span in (("A", ex.a), ("B", ex.b)):
        if ex.pronoun.start < span.end and span.start < ex.pronoun.end:
            raise ValueError(f"{where}: the pronoun {ex.pronoun.string!r} at offset {ex.pronoun.start} overlaps "
                             f"{name} {span.string!r} at offset {span.start}")
    return ex


def _read_gap(where: str, lines: Iterable[str]) -> Iterator[GapExample]:
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next((row for _, row in _gap_rows(reader, where)), None)
    if header is None:
        raise ValueError(f"{where}:1: empty file, expected a GAP header {_GAP_COLUMNS}")
    missing = [c for c in _GAP_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{where}:1: GAP header lacks columns {missing}: {header!r}")
    col = {c: header.index(c) for c in _GAP_COLUMNS}
    for no, row in _gap_rows(reader, where):
        if not row or all(not x.strip() for x in row):
            continue
        if len(row) < len(header):
            raise ValueError(f"{where}:{no}: expected {len(header)} tab-separated fields, got {len(row)}")
        at = f"{where}:{no}"
        text = row[col["Text"]]
        yield _check_gap_row(GapExample(
            row[col["ID"]], text,
            _span(text, row[col["Pronoun"]], row[col["Pronoun-offset"]], at, "Pronoun"),
            _span(text, row[col["A"]], row[col["A-offset"]], at, "A"),
            _span(text, row[col["B"]], row[col["B-offset"]], at, "B"),
            _bool(row[col["A-coref"]], at, "A-coref"), _bool(row[col["B-coref"]], at, "B-coref"), no), at)


# --- windows: what the scorer consumes --------------------------------------------------------------------
@dataclass
class CorefQuery:
    """One mention to score.

    Attributes:
        source: words whose tokens the attention comes from (mean over their tokens).
        candidates: candidate antecedents, each a tuple of words (attention to it: sum over their tokens).
        gold: ``gold[i]`` is True when candidate ``i`` is a correct antecedent (at least one is).
        group: ``"pronoun"`` / ``"nominal"`` (CorefUD, by the head word's UPOS) or ``"gap"``.
        baselines: ``{name: index of the candidate that baseline picks}``.
    """

    source: tuple[int, ...]
    candidates: list[tuple[int, ...]]
    gold: list[bool]
    group: str
    baselines: dict[str, int] = field(default_factory=dict)


@dataclass
class CorefWindow:
    """One model input: its words, token ids, word of each token (None for special tokens), and queries."""

    doc_id: str
    words: list[str]
    ids: torch.Tensor
    word_index: list[int | None]
    queries: list[CorefQuery]


def _encode(tokenizer: Any, words: list[str], space_before: list[bool] | None = None
            ) -> tuple[torch.Tensor, list[int | None]]:
    # Only a tokenizer that takes ``space_before`` (interp's, byte-level BPE) gets it; simpler ones join by spaces.
    if space_before is not None and "space_before" in inspect.signature(tokenizer.encode_words).parameters:
        ids, word_index = tokenizer.encode_words(words, space_before=space_before)
    else:
        ids, word_index = tokenizer.encode_words(words)
    return torch.as_tensor(ids, dtype=torch.long), list(word_index)


def _gap_words(ex: GapExample) -> tuple[list[str], list[tuple[int, int]]]:
    """Cut the text into words at whitespace and at the annotated spans' boundaries: ``(words, char ranges)``."""
    cuts = {ex.pronoun.start, ex.pronoun.end, ex.a.start, ex.a.end, ex.b.start, ex.b.end}
    words, ranges = [], []
    for m in re.finditer(r"\S+", ex.text):
        a = m.start()
        for c in sorted(x for x in cuts if m.start() < x < m.end()) + [m.end()]:
            words.append(ex.text[a:c])
            ranges.append((a, c))
            a = c
    return words, ranges


def _words_in(span: Span, ranges: list[tuple[int, int]], where: str) -> tuple[int, ...]:
    ws = tuple(i for i, (a, b) in enumerate(ranges) if span.start <= a and b <= span.end)
    if not ws:
        raise ValueError(f"{where}: span {span.string!r} at {span.start} holds no word")
    return ws


_SENT_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def _gap_baselines(ex: GapExample) -> dict[str, int]:
    spans = [ex.a, ex.b]
    p = ex.pronoun

    def dist(s: Span) -> int:
        return p.start - s.end if s.end <= p.start else s.start - p.end

    nearest = min(range(2), key=lambda i: (dist(spans[i]), -spans[i].start))
    first = min(range(2), key=lambda i: spans[i].start)
    sent_starts = [0] + [m.end() for m in _SENT_END.finditer(ex.text)]

    def opens_sentence(i: int) -> bool:  # first in its sentence, or right after a fronted phrase and a comma
        s0 = max(x for x in sent_starts if x <= spans[i].start)
        before = ex.text[s0:spans[i].start].strip()
        return not before or before.endswith(",")

    role = {"he": "subj", "she": "subj", "him": "obj"}.get(p.string.lower())
    par = nearest
    if role is not None:
        same = [i for i in range(2) if opens_sentence(i) == (role == "subj")]
        if same:
            par = min(same, key=lambda i: (dist(spans[i]), -spans[i].start))
    return {"nearest": nearest, "first": first, "parallelism": par}


def gap_windows(examples: Iterable[GapExample], tokenizer: Any, *, max_tokens: int | None = None,
                stats: dict[str, int] | None = None) -> Iterator[CorefWindow]:
    """One :class:`CorefWindow` per GAP row whose pronoun refers to A or B.

    Args:
        examples: from :func:`read_gap`.
        tokenizer: anything with ``encode_words(words) -> (ids, word_index)``.
        max_tokens: skip rows longer than this many tokens.
        stats: a dict that receives counts: ``rows``, ``neither`` (no antecedent among A/B, not scored),
            ``too_long``.

    Yields:
        Windows with one query each: the pronoun's words -> candidates ``[A's words, B's words]``.

    Example:
        >>> import interp
        >>> from interp.data.coref import gap_windows, read_gap
        >>> w = next(gap_windows(read_gap("../shared/data/gap/gap-development.tsv"), interp.load("minilm-l6").tokenizer))
        >>> [w.words[i] for i in w.queries[0].candidates[0]]
        ['Cheryl', 'Cassidy']
    """
    st = stats if stats is not None else {}
    for k in ("rows", "neither", "too_long"):
        st.setdefault(k, 0)
    for ex in examples:
        st["rows"] += 1
        if ex.label is None:
            st["neither"] += 1
            continue
        words, ranges = _gap_words(ex)
        where = f"GAP row {ex.id!r} (line {ex.line})"
        src = _words_in(ex.pronoun, ranges, where)
        cands = [_words_in(ex.a, ranges, where), _words_in(ex.b, ranges, where)]
        # "Simon's" cut at the span's end is "Simon" + "'s" with no space between (byte-level BPE cares).
        spaces = [i > 0 and ranges[i - 1][1] < a for i, (a, _) in enumerate(ranges)]
        ids, word_index = _encode(tokenizer, words, spaces)
        if max_tokens is not None and len(ids) > max_tokens:
            st["too_long"] += 1
            continue
        q = CorefQuery(src, cands, [ex.a_coref, ex.b_coref], "gap", _gap_baselines(ex))
        yield CorefWindow(ex.id, words, ids, word_index, [q])


def _corefud_queries(doc: CorefDocument, lo: int, hi: int, scored: list[Mention],
                     mentions: list[Mention]) -> list[CorefQuery]:
    """Queries of the mentions ``scored`` with candidates among ``mentions``, words re-based to ``lo``."""
    out = []
    lower = [w.lower() for w in doc.words]
    for m in scored:
        units: dict[int, list[Mention]] = {}
        for c in mentions:
            if c.end <= m.start and lo <= c.head < hi:
                units.setdefault(c.head, []).append(c)
        heads = sorted(units)
        gold = [any(c.entity == m.entity for c in units[h]) for h in heads]
        if not any(gold):
            continue
        nearest = len(heads) - 1
        same_head = [i for i, h in enumerate(heads) if lower[h] == lower[m.head]]
        head_match = same_head[-1] if same_head else nearest
        text = doc.text(m).lower()
        same_text = [i for i, h in enumerate(heads) if any(doc.text(c).lower() == text for c in units[h])]
        string_match = same_text[-1] if same_text else head_match
        group = "pronoun" if doc.upos[m.head] == "PRON" else "nominal"
        out.append(CorefQuery((m.head - lo,), [(h - lo,) for h in heads], gold, group,
                              {"nearest": nearest, "head_match": head_match, "string_match": string_match}))
    return out


def corefud_windows(docs: Iterable[CorefDocument], tokenizer: Any, *, max_tokens: int,
                    stats: dict[str, int] | None = None) -> Iterator[CorefWindow]:
    """Cut documents into windows of whole sentences that fit ``max_tokens`` and attach the queries.

    Args:
        docs: from :func:`read_corefud`.
        tokenizer: anything with ``encode_words(words) -> (ids, word_index)``.
        max_tokens: the longest window in tokens (special tokens included), usually the model's ``n_ctx``.
        stats: a dict that receives counts: ``documents``, ``mentions``, ``with_antecedent`` (not the first of
            their entity), ``scored``, ``antecedent_outside_window``, ``sentences_too_long`` (longer than a
            window on their own: their mentions are not scored).

    Yields:
        :class:`CorefWindow` objects; each mention with an antecedent is a query in exactly one window.

    Raises:
        ValueError: ``max_tokens`` is not a positive int.

    Example:
        >>> import interp
        >>> from interp.data.coref import corefud_windows, read_corefud
        >>> docs = read_corefud("../shared/data/gum-coref/en_gum-ud-dev.ccby.conllu", max_documents=1)
        >>> n = sum(len(w.queries) for w in corefud_windows(docs, interp.load("minilm-l6").tokenizer, max_tokens=512))
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens!r} must be a positive int")
    st = stats if stats is not None else {}
    for stat in ("documents", "mentions", "with_antecedent", "scored", "antecedent_outside_window",
                 "sentences_too_long"):
        st.setdefault(stat, 0)
    for doc in docs:
        st["documents"] += 1
        st["mentions"] += len(doc.mentions)
        first_of: dict[str, Mention] = {}
        for m in doc.mentions:
            first_of.setdefault(m.entity, m)
        has_ante = [m for m in doc.mentions if first_of[m.entity] is not m]
        st["with_antecedent"] += len(has_ante)
        # Token cost of each sentence alone, without the special tokens the tokenizer adds once per input.
        cost = []
        for a, b in doc.sentences:
            _, wi = _encode(tokenizer, doc.words[a:b])
            cost.append(sum(1 for x in wi if x is not None))
        _, wi0 = _encode(tokenizer, doc.words[doc.sentences[0][0]:doc.sentences[0][1]])
        n_special = sum(1 for x in wi0 if x is None)
        budget = max_tokens - n_special
        done: set[int] = set()  # sentences whose mentions were scored in an earlier window
        S = len(doc.sentences)
        i = 0
        while i < S:
            if cost[i] > budget:
                st["sentences_too_long"] += 1
                done.add(i)
                i += 1
                continue
            j, used = i, 0
            while j < S and used + cost[j] <= budget:
                used += cost[j]
                j += 1
            while True:  # sentence costs are estimates: shrink until the joined window really fits
                lo, hi = doc.sentences[i][0], doc.sentences[j - 1][1]
                ids, word_index = _encode(tokenizer, doc.words[lo:hi])
                if len(ids) <= max_tokens or j == i + 1:
                    break
                j -= 1
            if len(ids) > max_tokens:
                st["sentences_too_long"] += 1
                done.add(i)
                i += 1
                continue
            new = [s for s in range(i, j) if s not in done]
            scored = [m for m in has_ante if m.sentence in new]
            queries = _corefud_queries(doc, lo, hi, scored, doc.mentions)
            st["scored"] += len(queries)
            st["antecedent_outside_window"] += len(scored) - len(queries)
            done.update(new)
            if queries:
                yield CorefWindow(f"{doc.doc_id}@{i}", doc.words[lo:hi], ids, word_index, queries)
            if j >= S:
                break
            # Next window starts half a window later, so every mention scored there has half a window before it.
            k, acc = i, 0
            while k < j - 1 and acc + cost[k] <= used // 2:
                acc += cost[k]
                k += 1
            i = max(k, i + 1)
