"""What pruning preserves: an objective gives a differentiable loss (for importance and L0 gates) and a metric
(for curves, higher is better).

Batches are dicts ``{"tokens": [B, T], "attention_mask": [B, T] (optional), "loss_mask": [B, T] (optional),
"reference": [B, M] (sentence objective)}``; a bare ``[B, T]`` tensor is read as ``{"tokens": tensor}``.

* :class:`LanguageModelObjective` - next-token cross-entropy for decoders; the metric is next-token accuracy
  on the scored positions (e.g. the repeated half of ``repeated_sequences``, which only induction solves).
* :class:`SentenceSimilarityObjective` - for encoders without an LM head (MiniLM). The metric is the cosine
  similarity between the pruned and the unpruned model's sentence embeddings (mean pooling over real tokens,
  as sentence-transformers computes all-MiniLM-L6-v2 embeddings), averaged over held-out sentences; the
  loss is 1 - that cosine. Why this objective: the model's product is its sentence embedding (it is trained
  and used for similarity search), it needs no labels or task head, it is 1.0 exactly for the unpruned
  model (a fixed scale across methods), and a pruned model whose embeddings keep their direction keeps
  its cosine-similarity rankings.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from ..model import Transformer

Batch = dict[str, torch.Tensor]


def as_batch(batch: torch.Tensor | Batch) -> Batch:
    """A tensor of token ids or a batch dict -> a batch dict.

    Raises:
        TypeError: anything else.
    """
    if isinstance(batch, torch.Tensor):
        return {"tokens": batch if batch.dim() == 2 else batch[None]}
    if isinstance(batch, dict) and "tokens" in batch:
        return batch
    raise TypeError(f"a batch must be a [B, T] token tensor or a dict with 'tokens', got {type(batch).__name__}")


def check_batches(batches: Sequence[Any], name: str = "batches") -> list[Batch]:
    """Validate a non-empty sequence of batches.

    Raises:
        ValueError: empty dataset.
        TypeError: a batch is neither a tensor nor a dict with ``tokens``.
    """
    if isinstance(batches, (torch.Tensor, dict)):
        batches = [batches]
    batches = list(batches)
    if not batches:
        raise ValueError(f"{name} is empty: pruning needs at least one batch of data")
    out = [as_batch(b) for b in batches]
    if any(b["tokens"].numel() == 0 for b in out):
        raise ValueError(f"{name} contains an empty batch (0 tokens)")
    return out


class Objective(Protocol):
    """What the pruning methods need from an objective."""

    metric_name: str

    def loss(self, model: Transformer, batch: Batch) -> torch.Tensor:
        """A differentiable scalar to minimise."""

    def metric(self, model: Transformer, batches: Sequence[Batch]) -> float:
        """A number to keep high (the y axis of a pruning curve)."""


class LanguageModelObjective:
    """Next-token cross-entropy (loss) and accuracy (metric) of a decoder.

    Args:
        metric: ``"accuracy"`` (default) or ``"neg_loss"`` (minus the mean cross-entropy).

    A batch's optional ``loss_mask`` ``[B, T]`` says which tokens are scored as targets (position 0 never is).

    Example:
        >>> obj = LanguageModelObjective()
        >>> obj.loss(model, {"tokens": tokens}).backward()
    """

    def __init__(self, metric: str = "accuracy") -> None:
        if metric not in ("accuracy", "neg_loss"):
            raise ValueError(f"metric={metric!r} is not 'accuracy' or 'neg_loss'")
        self.metric_name = metric

    def _scored(self, model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Next-token logits ``[B, T-1, V]``, targets ``[B, T-1]`` and which targets are scored ``[B, T-1]``
        (real tokens, inside ``loss_mask`` when the batch has one)."""
        batch = as_batch(batch)
        tokens = batch["tokens"]
        logits = model(tokens, attention_mask=batch.get("attention_mask"))[:, :-1]  # [B, T-1, V]
        targets = tokens[:, 1:]  # [B, T-1]
        keep = torch.ones_like(targets, dtype=torch.bool)
        if batch.get("attention_mask") is not None:
            keep &= batch["attention_mask"][:, 1:].bool()
        if batch.get("loss_mask") is not None:
            keep &= batch["loss_mask"][:, 1:].bool()
        return logits, targets, keep

    def _logits_targets(self, model, batch: Batch):
        logits, targets, keep = self._scored(model, batch)
        if not bool(keep.any()):
            raise ValueError("a batch has no scored target tokens (loss_mask / attention_mask exclude all)")
        return logits[keep], targets[keep]  # [N, V], [N]

    def loss(self, model: Transformer, batch: Batch) -> torch.Tensor:
        logits, targets = self._logits_targets(model, batch)
        return F.cross_entropy(logits.float(), targets)

    def example_losses(self, model, batch: Batch) -> torch.Tensor:
        """Per-example loss ``[B]``: each sequence's mean cross-entropy over its own scored targets (0 for a
        sequence with none; Michel et al.'s importance takes |dL(x)/d xi| per example x)."""
        logits, targets, keep = self._scored(model, batch)
        ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")  # [B*(T-1)]
        ce = ce.view(targets.shape) * keep  # [B, T-1]
        return ce.sum(-1) / keep.sum(-1).clamp(min=1)

    @torch.no_grad()
    def metric(self, model: Transformer, batches: Sequence[Batch]) -> float:
        total, n = 0.0, 0
        for batch in check_batches(batches):
            logits, targets = self._logits_targets(model, batch)
            if self.metric_name == "accuracy":
                total += float((logits.argmax(-1) == targets).sum())
            else:
                total -= float(F.cross_entropy(logits.float(), targets, reduction="sum"))
            n += len(targets)
        return total / n


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of the hidden states over real tokens (sentence-transformers pooling): ``[B, T, M] -> [B, M]``."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)  # [B, T, 1]
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp_min(1e-9)


class SentenceSimilarityObjective:
    """Cosine similarity of the (pruned) model's mean-pooled sentence embeddings to the unpruned ones.

    Build it with the unpruned model and the batches: it stores each batch's reference embeddings under
    ``batch["reference"]`` (computed with every gate removed).

    The metric is always the mean cosine to the unpruned embeddings. The loss (what importance and L0 gates
    differentiate) is by default contrastive: in-batch InfoNCE that asks each pruned embedding to be nearer its
    own unpruned embedding than the other sentences' (cross-entropy over cos / temperature, the
    MultipleNegativesRankingLoss that trained all-MiniLM-L6-v2, with the unpruned embeddings as targets).
    Why not ``1 - cos`` itself: the unpruned model is its exact minimum, so every gradient with respect to the
    head gates is 0 there and Michel et al.'s first-order importance is noise (measured on MiniLM: the importance
    curve then falls *below* the random baseline). The contrastive loss is not at its minimum, and its gradient
    says which heads keep sentences distinguishable, which is what similarity search needs.

    Args:
        model: an encoder with ``cfg.unembed=False`` (hidden states out).
        batches: batch dicts with ``tokens`` and ``attention_mask``; extended in place with ``reference``.
        loss: ``"contrastive"`` (default) or ``"cosine"`` (1 - mean cosine).
        temperature: of the contrastive loss (0.05, sentence-transformers' scale 20).

    Raises:
        ValueError: the model has an unembedding, the batches are empty, or an unknown loss.

    Example:
        >>> model = interp.load("minilm-l6")
        >>> batches = sentence_batches(model, ["The cat sat.", "A dog ran after the ball."], batch_size=2)
        >>> obj = SentenceSimilarityObjective(model, batches)
        >>> obj.metric(model, batches)   # 1.0 for the unpruned model
    """

    metric_name = "cosine_to_unpruned"

    def __init__(self, model, batches: Sequence[Batch], *, loss: str = "contrastive",
                 temperature: float = 0.05) -> None:
        if loss not in ("contrastive", "cosine"):
            raise ValueError(f"loss={loss!r} is not 'contrastive' or 'cosine'")
        if temperature <= 0:
            raise ValueError(f"temperature={temperature} must be > 0")
        self.loss_kind, self.temperature = loss, float(temperature)
        if model.cfg.unembed:
            raise ValueError("SentenceSimilarityObjective needs an encoder returning hidden states (cfg.unembed=False)")
        batches = check_batches(batches)
        from .gates import head_mask

        with torch.no_grad(), head_mask(model, None):  # restores any gates set before
            model.set_head_gates(None)  # the reference is the unpruned model
            for batch in batches:
                batch["reference"] = self._embed(model, batch).detach()
        self.batches = batches

    @staticmethod
    def _embed(model, batch: Batch) -> torch.Tensor:
        hidden = model(batch["tokens"], attention_mask=batch.get("attention_mask"))  # [B, T, M]
        return mean_pool(hidden, batch.get("attention_mask"))  # [B, M]

    def _cosine(self, model, batch: Batch) -> torch.Tensor:
        if "reference" not in batch:
            raise ValueError("batch has no 'reference' embeddings: build the objective with these batches")
        return F.cosine_similarity(self._embed(model, batch).float(), batch["reference"].float(), dim=-1)  # [B]

    def loss(self, model: Transformer, batch: Batch) -> torch.Tensor:
        if self.loss_kind == "cosine":
            return 1.0 - self._cosine(model, batch).mean()
        if "reference" not in batch:
            raise ValueError("batch has no 'reference' embeddings: build the objective with these batches")
        emb = F.normalize(self._embed(model, batch).float(), dim=-1)  # [B, M]
        ref = F.normalize(batch["reference"].float(), dim=-1)  # [B, M]
        logits = emb @ ref.T / self.temperature  # [B, B]: sentence i against every unpruned embedding j
        return F.cross_entropy(logits, torch.arange(len(emb), device=emb.device))

    def example_losses(self, model, batch: Batch) -> torch.Tensor:
        """Per-example loss ``[B]``. Sentence i's contrastive term reads only its own pruned embedding (the
        in-batch negatives are the fixed unpruned references), so it depends only on example i's gates."""
        if self.loss_kind == "cosine":
            return 1.0 - self._cosine(model, batch)
        if "reference" not in batch:
            raise ValueError("batch has no 'reference' embeddings: build the objective with these batches")
        emb = F.normalize(self._embed(model, batch).float(), dim=-1)  # [B, M]
        ref = F.normalize(batch["reference"].float(), dim=-1)  # [B, M]
        logits = emb @ ref.T / self.temperature  # [B, B]
        return F.cross_entropy(logits, torch.arange(len(emb), device=emb.device), reduction="none")

    @torch.no_grad()
    def metric(self, model: Transformer, batches: Sequence[Batch]) -> float:
        sims = [self._cosine(model, b) for b in check_batches(batches)]
        return float(torch.cat(sims).mean())


def sentence_batches(model: Transformer, sentences: Sequence[str], *, batch_size: int = 16, max_length: int = 64) -> list[Batch]:
    """Tokenize sentences with the model's tokenizer into padded batch dicts (tokens + attention_mask).

    Raises:
        ValueError: no sentences, or the model has no tokenizer.
    """
    sentences = [s for s in sentences if s.strip()]
    if not sentences:
        raise ValueError("sentences is empty: pruning needs at least one sentence")
    pad = model.cfg.pad_token_id if model.cfg.pad_token_id is not None else 0
    out = []
    for i in range(0, len(sentences), batch_size):
        tokens = model.to_tokens(list(sentences[i:i + batch_size]), max_length=max_length)  # [B, T]
        out.append({"tokens": tokens, "attention_mask": (tokens != pad).long()})
    return out


def ud_sentences(path: str | Path, n: int | None = None, *, skip: int = 0) -> list[str]:
    """The ``# text =`` sentences of a CoNLL-U file (read with the ``conllu`` library).

    Args:
        path: a .conllu file (e.g. ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu).
        n: how many to return (None: all); skip: how many to skip first (to split train / held-out).

    Raises:
        FileNotFoundError: no such file.
    """
    import conllu

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no CoNLL-U file at {path}")
    out: list[str] = []
    with path.open(encoding="utf-8") as f:
        for i, sent in enumerate(conllu.parse_incr(f)):
            if i < skip:
                continue
            text = sent.metadata.get("text")
            if text:
                out.append(text)
            if n is not None and len(out) >= n:
                break
    return out
