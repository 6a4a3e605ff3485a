"""In-context-learning (ICL) task sets for function-vector heads (Todd et al. 2024, "Function vectors in large
language models"): each task is a list of ``(input, output)`` pairs, and :func:`icl_prompts` builds few-shot
prompts from them with a shuffled-label counterpart of each.

Tasks (:data:`ICL_TASKS`): antonyms, country -> capital, lowercase -> uppercase letter, number -> the next number
as a word, English -> French number words. Licence: hand-written here from common knowledge (opposite words,
capital cities, the alphabet, counting in English and French); no third-party text, nothing downloaded. Public
domain (CC0).

A prompt is ``[bos] x_1 between y_1 after ... x_k between y_k after x_q between``; its answer is the first token of
``y_q``. The corrupted prompt keeps every token of the clean one but moves the ``k`` labels: demonstration ``i``
gets the label of another demonstration (a random cyclic derangement), so no demonstration pairs its input with
its own output while the query, the labels and the length stay the same (Todd et al.'s corruption).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ICL_TASKS", "ICLPrompts", "icl_prompts", "icl_token_pairs", "split_pairs"]

#: Each task's ``(input, output)`` pairs, as words (outputs are written after a space in the prompt).
ICL_TASKS: dict[str, list[tuple[str, str]]] = {
    "antonym": [
        ("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("good", "bad"), ("high", "low"),
        ("old", "new"), ("open", "closed"), ("rich", "poor"), ("early", "late"), ("hard", "soft"),
        ("dark", "light"), ("long", "short"), ("happy", "sad"), ("strong", "weak"), ("wet", "dry"),
        ("full", "empty"), ("true", "false"), ("right", "wrong"), ("win", "lose"), ("buy", "sell"),
        ("push", "pull"), ("day", "night"), ("love", "hate"), ("in", "out"), ("on", "off"), ("yes", "no"),
        ("first", "last"), ("thick", "thin"), ("clean", "dirty"), ("near", "far"), ("inside", "outside"),
        ("above", "below"), ("before", "after"), ("always", "never"), ("start", "end"), ("cheap", "expensive"),
        ("quiet", "loud"), ("safe", "dangerous"), ("north", "south"), ("east", "west"),
        ("left", "right"), ("top", "bottom"), ("front", "back"), ("easy", "difficult"), ("alive", "dead"),
        ("male", "female"), ("friend", "enemy"), ("accept", "reject"),
    ],
    "country-capital": [
        ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
        ("China", "Beijing"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Greece", "Athens"),
        ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Ireland", "Dublin"),
        ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"),
        ("Hungary", "Budapest"), ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Peru", "Lima"),
        ("Chile", "Santiago"), ("Argentina", "Buenos Aires"), ("Cuba", "Havana"), ("Kenya", "Nairobi"),
        ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("India", "New Delhi"), ("Thailand", "Bangkok"),
        ("Vietnam", "Hanoi"), ("Australia", "Canberra"), ("England", "London"), ("Scotland", "Edinburgh"),
        ("Belgium", "Brussels"), ("Netherlands", "Amsterdam"), ("Switzerland", "Bern"), ("Ukraine", "Kyiv"),
        ("Brazil", "Brasilia"), ("Colombia", "Bogota"), ("Nigeria", "Abuja"), ("Ghana", "Accra"),
        ("Ethiopia", "Addis Ababa"), ("Pakistan", "Islamabad"), ("Indonesia", "Jakarta"), ("Philippines", "Manila"),
    ],
    "lowercase-uppercase": [(chr(c), chr(c).upper()) for c in range(ord("a"), ord("z") + 1)],
    "number-next-word": [
        (str(i), w) for i, w in enumerate(
            ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen",
             "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"], start=1)
    ],
    "english-french-number": [
        ("one", "un"), ("two", "deux"), ("three", "trois"), ("four", "quatre"), ("five", "cinq"), ("six", "six"),
        ("seven", "sept"), ("eight", "huit"), ("nine", "neuf"), ("ten", "dix"), ("eleven", "onze"),
        ("twelve", "douze"), ("thirteen", "treize"), ("fourteen", "quatorze"), ("fifteen", "quinze"),
        ("sixteen", "seize"), ("seventeen", "dix-sept"), ("eighteen", "dix-huit"), ("nineteen", "dix-neuf"),
        ("twenty", "vingt"),
    ],
}

TokenPairs = dict[str, list[tuple[list[int], list[int]]]]


@dataclass
class ICLPrompts:
    """Few-shot prompts, their shuffled-label counterparts and answers.

    Attributes:
        clean: one ``[T_i]`` id tensor per prompt (lengths may differ between prompts).
        corrupted: the same prompts with the labels moved (each the length of its clean prompt).
        answers: ``[N]`` the first token of each query's output.
        tasks: the task of each prompt.
        n_shots: demonstrations per prompt.
    """

    clean: list[torch.Tensor]
    corrupted: list[torch.Tensor]
    answers: torch.Tensor
    tasks: list[str]
    n_shots: int

    def __len__(self) -> int:
        return len(self.clean)

    def groups(self) -> list[list[int]]:
        """The prompt indices grouped by length (a group stacks into one ``[B, T]`` batch), in first-seen order."""
        out: dict[int, list[int]] = {}
        for i, p in enumerate(self.clean):
            out.setdefault(len(p), []).append(i)
        return list(out.values())


def icl_token_pairs(tokenizer: Any, tasks: dict[str, list[tuple[str, str]]] | None = None, *,
                    output_prefix: str = " ") -> TokenPairs:
    """Each task's pairs as token ids: the input as written, the output after ``output_prefix``.

    Args:
        tokenizer: an interp tokenizer (its ``backend``), a ``tokenizers`` Tokenizer or a ``transformers``
            tokenizer (anything with ``encode(text, add_special_tokens=False)``).
        tasks: ``{name: [(input, output), ...]}`` (default :data:`ICL_TASKS`).
        output_prefix: put before every output (BPE vocabularies hold `` cold``, with its space, as one token).

    Returns:
        ``{task: [(input ids, output ids), ...]}``.

    Example:
        >>> from interp.data.icl import icl_token_pairs
        >>> from interp.examples import tok
        >>> pairs = icl_token_pairs(tok)
        >>> sorted(pairs)[:2]
        ['antonym', 'country-capital']
    """
    enc = getattr(tokenizer, "backend", tokenizer)

    def ids(text: str) -> list[int]:
        out = enc.encode(text, add_special_tokens=False)
        return list(getattr(out, "ids", out))

    return {name: [(ids(x), ids(output_prefix + y)) for x, y in pairs]
            for name, pairs in (tasks if tasks is not None else ICL_TASKS).items()}


def split_pairs(pairs: TokenPairs, n_parts: int) -> list[TokenPairs]:
    """Each task's pairs dealt into ``n_parts`` disjoint parts (pair ``i`` goes to part ``i % n_parts``), for
    prompt sets that share no input or output.

    Raises:
        ValueError: ``n_parts`` < 1.

    Example:
        >>> from interp.data.icl import split_pairs
        >>> [len(p["t"]) for p in split_pairs({"t": [([1], [2])] * 7}, 3)]
        [3, 2, 2]
    """
    if isinstance(n_parts, bool) or not isinstance(n_parts, int) or n_parts < 1:
        raise ValueError(f"n_parts={n_parts!r} must be an int >= 1")
    return [{name: p[i::n_parts] for name, p in pairs.items()} for i in range(n_parts)]


def _ids(x: int | Sequence[int], where: str) -> list[int]:
    ids = [int(x)] if isinstance(x, int) else [int(t) for t in x]
    if not ids:
        raise ValueError(f"{where} is empty: every input and output needs at least one token")
    return ids


def _prompt(head: list[int], inputs: list[list[int]], labels: list[list[int]], query: list[int],
            between: list[int], after: list[int]) -> torch.Tensor:
    """``head x_1 between y_1 after ... x_k between y_k after query between`` as ``[T]`` ids."""
    ids = list(head)
    for x, y in zip(inputs, labels):
        ids += x + between + y + after
    return torch.tensor(ids + query + between)  # [T]


def icl_prompts(pairs: Mapping[str, Sequence[tuple[Any, Any]]], n_prompts: int, n_shots: int = 5, *,
                bos_id: int | None = None, between: Sequence[int] = (), after: Sequence[int] = (),
                seed: int = 0) -> ICLPrompts:
    """``n_prompts`` few-shot prompts per task, with their shuffled-label counterparts.

    Args:
        pairs: ``{task: [(input, output), ...]}``, each input / output a token id or a list of ids
            (:func:`icl_token_pairs` turns :data:`ICL_TASKS` into them).
        n_prompts: prompts per task.
        n_shots: demonstrations per prompt (>= 2: one demonstration has no other label to take).
        bos_id: the first token of every prompt (None: none).
        between: ids between an input and its output (``":"``).
        after: ids after each output (``"\\n"``).
        seed: of the draws (demonstrations, query and derangement).

    Returns:
        :class:`ICLPrompts`: ``n_prompts`` per task, tasks in the order of ``pairs``; in each prompt the query and
        the demonstrations are distinct pairs of the task.

    Raises:
        ValueError: ``n_prompts`` < 1, ``n_shots`` < 2, no task, or a task with fewer than ``n_shots + 1`` pairs
            (the message names the task and its number of examples).

    Example:
        >>> from interp.data.icl import icl_prompts
        >>> p = icl_prompts({"succ": [(i, i + 1) for i in range(2, 12)]}, 2, 3, bos_id=0)
        >>> p.clean[0].shape, len(p.answers)
        (torch.Size([8]), 2)
    """
    for name, v, low in (("n_prompts", n_prompts, 1), ("n_shots", n_shots, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            why = " (shuffling the labels of one demonstration changes nothing)" if name == "n_shots" else ""
            raise ValueError(f"{name}={v!r} must be an int >= {low}{why}")
    if not pairs:
        raise ValueError("pairs={} holds no ICL task")
    for name, ps in pairs.items():
        if len(ps) < n_shots + 1:
            raise ValueError(f"ICL task {name!r} has {len(ps)} example(s); {n_shots} demonstrations and a query "
                             f"need at least {n_shots + 1} distinct pairs")
    between, after = [int(t) for t in between], [int(t) for t in after]
    head = [] if bos_id is None else [int(bos_id)]
    gen = torch.Generator().manual_seed(seed)
    clean, corrupted, answers, tasks = [], [], [], []
    for name, ps in pairs.items():
        items = [(_ids(x, f"task {name!r} input {x!r}"), _ids(y, f"task {name!r} output {y!r}")) for x, y in ps]
        for _ in range(n_prompts):
            pick = torch.randperm(len(items), generator=gen)[:n_shots + 1].tolist()
            demos, (qx, qy) = [items[i] for i in pick[:n_shots]], items[pick[n_shots]]
            order = torch.randperm(n_shots, generator=gen).tolist()
            moved = [0] * n_shots  # demonstration order[j] takes the label of order[j + 1]: a derangement
            for j in range(n_shots):
                moved[order[j]] = order[(j + 1) % n_shots]

            inputs = [x for x, _ in demos]
            clean.append(_prompt(head, inputs, [y for _, y in demos], qx, between, after))
            corrupted.append(_prompt(head, inputs, [demos[moved[i]][1] for i in range(n_shots)], qx, between, after))
            answers.append(qy[0])
            tasks.append(name)
    return ICLPrompts(clean, corrupted, torch.tensor(answers), tasks, n_shots)
