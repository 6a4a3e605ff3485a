"""The one definition of a pruning task: (train batches, held-out batches, objective) for a model.

The CLI, the dashboard and the experiments all call :func:`build_task`; data paths are parameters, and the
kind of data follows from the model (a decoder with an unembedding: repeated random sequences scored on the
repeated half; an encoder: sentences and the cosine to the unpruned sentence embeddings), never from its name.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..data import Batch, first_occurrence_mask, repeated_sequences
from .objectives import LanguageModelObjective, Objective, SentenceSimilarityObjective, sentence_batches, ud_sentences

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["PruningTask", "build_task", "DATA_KINDS"]

#: Data kinds :func:`build_task` understands.
DATA_KINDS = ("repeated", "ud", "texts")


@dataclass
class PruningTask:
    """What a pruning method optimises and is scored on.

    Attributes:
        train: :class:`interp.data.Batch` objects the method learns from (importance gradients, L0 gates); a
            repeated-sequence task's carry the scored tokens as annotation ``loss_mask``.
        held_out: Batches the curve is evaluated on.
        objective: the :class:`~interp.pruning.objectives.Objective` (loss to train, metric to report).

    Unpacks as ``train, held_out, objective = build_task(...)``.
    """

    train: list[Batch]
    held_out: list[Batch]
    objective: Objective

    def __iter__(self) -> Iterator[Any]:
        return iter((self.train, self.held_out, self.objective))


def build_task(model: Transformer, *, data: dict[str, Any] | None = None) -> PruningTask:
    """Training batches, held-out batches and the objective for ``model``.

    Args:
        model: the model to prune.
        data: the data config; ``kind`` defaults to ``"repeated"`` for a causal decoder with an unembedding,
            else to ``"texts"`` when ``data`` has ``texts`` and ``"ud"`` otherwise (keys of the other kinds are
            ignored, so a caller can give settings for both and let the model decide).

            - ``{"kind": "repeated", "n_seqs": 64, "half_len": 25, "seed": 1, "eval_seed": 2, "batch_size": 16,
              "bos_id": <the tokenizer's bos_id>, "metric": "accuracy"}``: repeated random sequences, the
              loss and metric on the repeated half after its first token (only in-context copying predicts it).
              ``half_len`` defaults to ``min(25, (n_ctx - 1) // 2)``.
            - ``{"kind": "ud", "path": PATH, "n_train": 64, "n_eval": 64, "batch_size": 16, "max_length": 64}``:
              sentences of a CoNLL-U file (``path`` required) and :class:`SentenceSimilarityObjective`.
            - ``{"kind": "texts", "texts": [...], "batch_size": 8}``: the same objective on given sentences,
              used for training and held-out alike.

    Returns:
        A :class:`PruningTask`.

    Raises:
        ValueError: an unknown kind, an empty dataset, or ``kind="ud"`` without ``path``.
        FileNotFoundError: the CoNLL-U file is missing.

    Example:
        >>> import interp
        >>> from interp.pruning.task import build_task
        >>> train, held, objective = build_task(interp.load("induction-2l"), data={"n_seqs": 32})
    """
    data = dict(data or {})
    kind = data.get("kind", "repeated" if model.cfg.causal and model.cfg.unembed else
                    "texts" if "texts" in data else "ud")
    bs = int(data.get("batch_size", 16))
    if kind == "repeated":
        n = int(data.get("n_seqs", 64))
        half = int(data.get("half_len", min(25, (model.cfg.n_ctx - 1) // 2)))
        bos = data.get("bos_id", getattr(getattr(model, "tokenizer", None), "bos_id", None))
        if n <= 0:
            raise ValueError(f"data.n_seqs={n}: the dataset is empty")

        def make(seed: int) -> list[Batch]:
            toks = repeated_sequences(n, half, model.cfg.d_vocab, seed=seed, bos_id=bos)  # [N, (1) + 2 half]
            _, rep = first_occurrence_mask(n, half, bos=bos is not None)  # [N, T-1] over targets
            loss_mask = torch.cat([torch.zeros(n, 1, dtype=torch.bool), rep], dim=1)  # [N, T] over tokens
            return [Batch(toks[i:i + bs], None, {"loss_mask": loss_mask[i:i + bs]}) for i in range(0, n, bs)]

        return PruningTask(make(int(data.get("seed", 1))), make(int(data.get("eval_seed", 2))),
                           LanguageModelObjective(data.get("metric", "accuracy")))
    if kind == "ud":
        if "path" not in data:
            raise ValueError("data.kind='ud' needs data['path'], a CoNLL-U file (for example UD English EWT dev)")
        n_train, n_eval = int(data.get("n_train", 64)), int(data.get("n_eval", 64))
        if n_train <= 0 or n_eval <= 0:
            raise ValueError(f"data.n_train={n_train}, n_eval={n_eval}: the dataset is empty")
        sents = ud_sentences(Path(data["path"]), n_train + n_eval)
        max_len = int(data.get("max_length", 64))
        train = sentence_batches(model, sents[:n_train], batch_size=bs, max_length=max_len)
        held = sentence_batches(model, sents[n_train:], batch_size=bs, max_length=max_len)
        return PruningTask(train, held, SentenceSimilarityObjective(model, train + held))
    if kind == "texts":
        texts = data.get("texts")
        if not texts or isinstance(texts, str):
            raise ValueError(f"data.kind='texts' needs a non-empty list of sentences in data['texts'], got {texts!r}")
        batches = sentence_batches(model, list(texts), batch_size=int(data.get("batch_size", 8)))
        return PruningTask(batches, batches, SentenceSimilarityObjective(model, batches))
    raise ValueError(f"data.kind={kind!r} is not one of {DATA_KINDS}")
