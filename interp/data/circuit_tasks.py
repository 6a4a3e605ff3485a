"""Generated prompt pairs for circuit discovery: each clean prompt has a corrupted counterpart of the same length
that removes the behaviour, and the answers a metric reads. Nothing is downloaded.

- :func:`ioi_prompts`: indirect-object identification ("When Mary and John went to the store, John gave a drink
  to" -> " Mary", not " John"); corrupted: three other names (the "ABC" distribution), so no name is repeated.
- :func:`greater_than_prompts`: "The war lasted from the year 1732 to the year 17" -> a year after 32;
  corrupted: the start year ``..01``, after which every year is later.
- :func:`agreement_prompts`: subject-verb agreement ("The key near the cabinets" -> " is", not " are");
  corrupted: the subject in the plural.
- :func:`docstring_prompts`: the next argument of a Python docstring (Heimersheim & Janiak 2023): after
  ``def f(self, files, data, size):`` and ``:param files:`` / ``:param data:``, ``:param`` -> " size", not
  " files"; corrupted: other names in the ``def`` line, so the answer is nowhere in the prompt.

Induction (repeated random tokens) needs no tokenizer: :func:`interp.data.repeated_sequences` and
:func:`interp.analysis.corrupt_repeats` build it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from .batches import reads_text

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["ARG_NAMES", "NAMES", "TaskPrompts", "agreement_prompts", "docstring_prompts", "greater_than_prompts",
           "ioi_prompts"]

NAMES = ("Mary", "John", "Alice", "Bob", "Tom", "James", "Sarah", "David", "Michael", "Paul", "Anna", "Mark", "Lisa",
         "Peter", "Emma", "Kate", "Jack", "Daniel", "Laura", "Chris", "Sam", "Ryan", "Rachel", "Steven")
_IOI_TEMPLATES = ("When {A} and {B} went to the store, {C} gave a drink to",
                  "After {A} and {B} went to the park, {C} gave a ball to",
                  "Then, {A} and {B} had a long argument, and afterwards {C} said to")
_NOUNS = (("key", "keys"), ("dog", "dogs"), ("book", "books"), ("car", "cars"), ("house", "houses"),
          ("girl", "girls"), ("boy", "boys"), ("friend", "friends"), ("teacher", "teachers"), ("door", "doors"),
          ("table", "tables"), ("student", "students"), ("picture", "pictures"), ("road", "roads"))
_PREPS = ("near", "behind", "with", "beside")
ARG_NAMES = ("files", "data", "size", "name", "path", "key", "value", "user", "text", "mode", "item", "count",
             "index", "result", "source", "target", "config", "options", "model", "query", "token", "limit")
A = TypeVar("A")  # what a task's metric reads of one prompt
_FUNCTIONS = ("load", "update", "check", "parse", "send", "build", "read", "write")


@dataclass
class TaskPrompts:
    """Clean and corrupted prompts ``[B, T]`` and what a metric reads at the last position.

    Attributes:
        name: the task.
        clean, corrupted: ``[B, T]`` ids, one length.
        answers: ``[B, 2]`` (correct, wrong) ids for a logit difference, or None.
        good: ``[B, V]`` bool, the tokens that count as correct (greater-than), or None; ``bad`` the wrong ones.
    """

    name: str
    clean: torch.Tensor
    corrupted: torch.Tensor
    answers: torch.Tensor | None = None
    good: torch.Tensor | None = None
    bad: torch.Tensor | None = None


def _single(model: Transformer, word: str) -> int | None:
    """The id of ``word`` if it is one token (no BOS), else None."""
    ids = model.to_tokens(word, prepend_bos=False)[0].tolist()
    return ids[0] if len(ids) == 1 else None


def _start(model: Transformer, task: str, n: int) -> None:
    """Refuse ``n`` that is not a positive int and a model without a text tokenizer, as every task does first."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (the number of prompts), got {n!r}")
    if not reads_text(model):
        tok = getattr(model, "tokenizer", None)
        raise ValueError(f"task {task!r} needs a text tokenizer; model {model.name!r} has "
                         f"{type(tok).__name__ if tok is not None else 'none'} (use task 'induction')")


def _single_words(model: Transformer, task: str, words: tuple[str, ...], need: int, what: str
                  ) -> list[tuple[str, int]]:
    """``(word, id)`` of the ``words`` that are one token after a space; at least ``need`` of them (the task
    draws that many distinct ``what`` per prompt)."""
    found = [(w, _single(model, " " + w)) for w in words]
    kept = [(w, i) for w, i in found if i is not None]
    if len(kept) < need:
        raise ValueError(f"task {task!r} needs {need} {what} that are single tokens; this tokenizer has {len(kept)}")
    return kept


def _stack(model: Transformer, task: str, texts: list[str], corrupt: list[str]
           ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Tokenize clean and corrupted texts; keep the pairs of one length, the most common one.

    Returns:
        ``(clean [B, T], corrupted [B, T], the indices of the kept pairs)``.
    """
    pairs = [(model.to_tokens(a)[0], model.to_tokens(b)[0]) for a, b in zip(texts, corrupt)]
    same = [i for i, (a, b) in enumerate(pairs) if len(a) == len(b)]
    if not same:
        raise ValueError(f"task {task!r}: no clean / corrupted pair tokenizes to one length with this tokenizer")
    lengths = [len(pairs[i][0]) for i in same]
    common = max(set(lengths), key=lengths.count)
    keep = [i for i in same if len(pairs[i][0]) == common]
    return torch.stack([pairs[i][0] for i in keep]), torch.stack([pairs[i][1] for i in keep]), keep


def _drawn(model: Transformer, task: str, n: int, seed: int, draw: Callable[[torch.Generator], tuple[str, str, A]]
           ) -> tuple[torch.Tensor, torch.Tensor, list[A]]:
    """``n`` seeded draws of ``(clean text, corrupted text, what the metric reads)``, tokenized by :func:`_stack`.

    Returns:
        ``(clean [B, T], corrupted [B, T], the kept draws' third items)``.
    """
    gen = torch.Generator().manual_seed(seed)
    draws = [draw(gen) for _ in range(n)]
    clean, corrupted, keep = _stack(model, task, [d[0] for d in draws], [d[1] for d in draws])
    return clean, corrupted, [draws[i][2] for i in keep]


def ioi_prompts(model: Transformer, n: int = 16, *, seed: int = 0) -> TaskPrompts:
    """Indirect-object identification prompts (Wang et al. 2022) and their "ABC" corruptions.

    Args:
        model: a model with a text tokenizer (names that are not one token are skipped).
        n: prompts to draw (pairs that tokenize to another length than most are dropped).
        seed: seed of the names and templates.

    Returns:
        :class:`TaskPrompts` with ``answers`` = (indirect object, subject).

    Raises:
        ValueError: a model without a text tokenizer, fewer than 5 single-token names, ``n`` < 1.

    Example:
        >>> import interp
        >>> from interp.data.circuit_tasks import ioi_prompts
        >>> model = interp.load("smollm2-135m")
        >>> p = ioi_prompts(model, 4)
        >>> model.to_string(p.clean[0]), model.to_str_tokens(p.answers[0])
        ('Then, Sam and James had a long argument, and afterwards James said to', [' Sam', ' James'])
        >>> p.clean.shape == p.corrupted.shape
        True
    """
    _start(model, "ioi", n)
    names = _single_words(model, "ioi", NAMES, 5, "names")

    def draw(gen: torch.Generator) -> tuple[str, str, tuple[int, int]]:
        pick = torch.randperm(len(names), generator=gen)[:5].tolist()
        (io, io_id), (s, s_id), (x, _), (y, _), (z, _) = (names[i] for i in pick)
        template = _IOI_TEMPLATES[int(torch.randint(len(_IOI_TEMPLATES), (1,), generator=gen))]
        first, second = (io, s) if bool(torch.rand(1, generator=gen) < 0.5) else (s, io)
        return template.format(A=first, B=second, C=s), template.format(A=x, B=y, C=z), (io_id, s_id)

    clean, corrupted, answers = _drawn(model, "ioi", n, seed, draw)
    return TaskPrompts("ioi", clean, corrupted, answers=torch.tensor(answers))


def greater_than_prompts(model: Transformer, n: int = 16, *, seed: int = 0) -> TaskPrompts:
    """Greater-than prompts (Hanna et al. 2023): "from the year 17YY to the year 17" -> a later year.

    Works with tokenizers that write a two-digit year as one token (GPT-2) and with those that split digits
    (Llama, SmolLM2): the answer is then the first digit, ``good`` the digits above YY's first, ``bad`` below.

    Returns:
        :class:`TaskPrompts` with ``good`` / ``bad`` ``[B, V]`` masks; corrupted prompts start at ``..01``.

    Raises:
        ValueError: a model without a text tokenizer, ``n`` < 1.

    Example:
        >>> import interp
        >>> from interp.data.circuit_tasks import greater_than_prompts
        >>> p = greater_than_prompts(interp.load("smollm2-135m"), 4)
        >>> p.good.shape[0]
        4
    """
    _start(model, "greater-than", n)
    two = [_single(model, f"{i:02d}") for i in range(100)]
    whole = all(i is not None for i in two)
    digits = [_single(model, str(i)) for i in range(10)]
    if not whole and any(d is None for d in digits):
        raise ValueError("task 'greater-than' needs years' digits as tokens (two-digit tokens or single digits)")
    V = model.cfg.d_vocab

    def draw(gen: torch.Generator) -> tuple[str, str, tuple[torch.Tensor, torch.Tensor]]:
        yy = int(torch.randint(2, 99, (1,), generator=gen))
        # The next token is the year's two digits (one token) or its first digit; an equal first digit is neither.
        ids, start = (two, yy) if whole else (digits, yy // 10)
        good, bad = torch.zeros(V, dtype=torch.bool), torch.zeros(V, dtype=torch.bool)
        good[[t for i, t in enumerate(ids) if i > start]] = True
        bad[[t for i, t in enumerate(ids) if i < start]] = True
        return (f"The war lasted from the year 17{yy:02d} to the year 17",
                "The war lasted from the year 1701 to the year 17", (good, bad))

    clean, corrupted, masks = _drawn(model, "greater-than", n, seed, draw)
    return TaskPrompts("greater-than", clean, corrupted, good=torch.stack([g for g, _ in masks]),
                       bad=torch.stack([b for _, b in masks]))


def agreement_prompts(model: Transformer, n: int = 16, *, seed: int = 0) -> TaskPrompts:
    """Subject-verb agreement across a prepositional phrase: "The key near the cabinets" -> " is", not " are".

    Returns:
        :class:`TaskPrompts` with ``answers`` = (" is", " are"); corrupted prompts have the plural subject.

    Raises:
        ValueError: a model without a text tokenizer, " is" / " are" not single tokens, ``n`` < 1.

    Example:
        >>> import interp
        >>> from interp.data.circuit_tasks import agreement_prompts
        >>> p = agreement_prompts(interp.load("smollm2-135m"), 4)
        >>> p.answers.shape
        torch.Size([4, 2])
    """
    _start(model, "agreement", n)
    is_id, are_id = _single(model, " is"), _single(model, " are")
    if is_id is None or are_id is None:
        raise ValueError("task 'agreement' needs ' is' and ' are' as single tokens")
    nouns = [(s, p) for s, p in _NOUNS if _single(model, " " + s) is not None and _single(model, " " + p) is not None]
    if len(nouns) < 2:
        raise ValueError(f"task 'agreement' needs 2 nouns whose singular and plural are single tokens, got {nouns}")

    def draw(gen: torch.Generator) -> tuple[str, str, None]:
        i, j = torch.randperm(len(nouns), generator=gen)[:2].tolist()
        prep = _PREPS[int(torch.randint(len(_PREPS), (1,), generator=gen))]
        return f"The {nouns[i][0]} {prep} the {nouns[j][1]}", f"The {nouns[i][1]} {prep} the {nouns[j][1]}", None

    clean, corrupted, _ = _drawn(model, "agreement", n, seed, draw)
    return TaskPrompts("agreement", clean, corrupted, answers=torch.tensor([[is_id, are_id]] * len(clean)))


def docstring_prompts(model: Transformer, n: int = 16, *, seed: int = 0) -> TaskPrompts:
    """Docstring-argument prompts: the third parameter of a ``def`` named in its docstring.

    Clean::

        def load(self, files, data, size):
            \"\"\"Load the files.

            :param files: the first input
            :param data: the second input
            :param

    -> " size" (wrong: " files", the first parameter, already documented). Corrupted: the same prompt with
    three other names in the ``def`` line.

    Returns:
        :class:`TaskPrompts` with ``answers`` = (the third parameter, the first).

    Raises:
        ValueError: a model without a text tokenizer, fewer than 6 single-token names, ``n`` < 1.

    Example:
        >>> import interp
        >>> from interp.data.circuit_tasks import docstring_prompts
        >>> model = interp.load("smollm2-135m")
        >>> p = docstring_prompts(model, 4)
        >>> print(model.to_string(p.clean[0]))
        def write(self, item, path, target):
            \"\"\"Write the item.
        <BLANKLINE>
            :param item: the first input
            :param path: the second input
            :param
        >>> model.to_str_tokens(p.answers[0])
        [' target', ' item']
    """
    _start(model, "docstring", n)
    names = _single_words(model, "docstring", ARG_NAMES, 6, "argument names")

    def draw(gen: torch.Generator) -> tuple[str, str, tuple[int, int]]:
        pick = torch.randperm(len(names), generator=gen)[:6].tolist()
        (a, a_id), (b, _), (c, c_id), (x, _), (y, _), (z, _) = (names[i] for i in pick)
        fn = _FUNCTIONS[int(torch.randint(len(_FUNCTIONS), (1,), generator=gen))]

        def prompt(p: str, q: str, r: str) -> str:
            return (f'def {fn}(self, {p}, {q}, {r}):\n    """{fn.capitalize()} the {a}.\n\n'
                    f"    :param {a}: the first input\n    :param {b}: the second input\n    :param")

        return prompt(a, b, c), prompt(x, y, z), (c_id, a_id)

    clean, corrupted, answers = _drawn(model, "docstring", n, seed, draw)
    return TaskPrompts("docstring", clean, corrupted, answers=torch.tensor(answers))
