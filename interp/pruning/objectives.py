"""What pruning preserves: an objective gives a differentiable loss (for importance and L0 gates) and a metric
(for curves, higher is better).

Batches are :class:`interp.data.Batch` objects: ``tokens`` ``[B, T]``, ``mask`` (padding, optional) and, in
``annotations``, ``loss_mask`` ``[B, T]`` (the tokens scored as targets, optional) and ``reference`` ``[B, M]``
(sentence objective). A dict ``{"tokens", "attention_mask", "loss_mask", ...}`` or a bare ``[B, T]`` tensor is
read as the same Batch (:func:`interp.data.as_batch`).

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

from ..data import Batch, as_batch, read_conllu, text_batches
from ..interventions import head_mask

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["Batch", "LanguageModelObjective", "Objective", "SentenceSimilarityObjective", "check_batches",
           "mean_pool", "sentence_batches", "ud_sentences"]

def check_batches(batches: Sequence[Any] | Any, name: str = "batches") -> list[Batch]:
    """Validate a non-empty sequence of batches, as :class:`interp.data.Batch` objects.

    Args:
        batches: Batches, ``[B, T]`` token tensors or batch dicts (one of them alone is one batch).
        name: the argument's name, for messages.

    Returns:
        The batches as :class:`~interp.data.Batch` (a Batch given is returned as it is).

    Raises:
        ValueError: empty dataset.
        TypeError: a batch is neither a tensor, a Batch nor a dict with ``tokens``.

    Example:
        >>> import torch
        >>> from interp.pruning.objectives import check_batches
        >>> check_batches(torch.tensor([[1, 2, 3]]))[0].tokens.shape
        torch.Size([1, 3])
    """
    if isinstance(batches, (torch.Tensor, dict, Batch)):
        batches = [batches]
    batches = list(batches)
    if not batches:
        raise ValueError(f"{name} is empty: pruning needs at least one batch of data")
    for b in batches:
        if not (isinstance(b, (torch.Tensor, Batch)) or (isinstance(b, dict) and "tokens" in b)):
            raise TypeError(f"a batch must be a [B, T] token tensor, an interp.data.Batch or a dict with 'tokens', "
                            f"got {type(b).__name__}")
    if any(b.numel() == 0 for b in batches if isinstance(b, torch.Tensor)):
        raise ValueError(f"{name} contains an empty batch (0 tokens)")
    return [as_batch(b, f"{name}[{i}]") for i, b in enumerate(batches)]


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
        >>> from interp.pruning.objectives import LanguageModelObjective
        >>> from interp.examples import model, tokens
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
        tokens = batch.tokens
        logits = model(tokens, attention_mask=batch.mask)[:, :-1]  # [B, T-1, V]
        targets = tokens[:, 1:]  # [B, T-1]
        keep = torch.ones_like(targets, dtype=torch.bool)
        if batch.mask is not None:
            keep &= batch.mask[:, 1:].bool()
        loss_mask = batch.annotations.get("loss_mask")
        if loss_mask is not None:
            keep &= torch.as_tensor(loss_mask)[:, 1:].bool()
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
        # Summed on the logits' device in float64, read once at the end (no host sync per batch).
        total: torch.Tensor | float = 0.0
        n = 0
        for batch in check_batches(batches):
            logits, targets = self._logits_targets(model, batch)
            if self.metric_name == "accuracy":
                total = total + (logits.argmax(-1) == targets).sum(dtype=torch.float64)
            else:
                total = total - F.cross_entropy(logits.float(), targets, reduction="sum").double()
            n += len(targets)
        return float(total) / n


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of the hidden states over real tokens (sentence-transformers pooling): ``[B, T, M] -> [B, M]``."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)  # [B, T, 1]
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp_min(1e-9)


class SentenceSimilarityObjective:
    """Cosine similarity of the (pruned) model's mean-pooled sentence embeddings to the unpruned ones.

    Build it with the unpruned model and the batches: it stores each batch's reference embeddings in the
    batch's annotations under ``"reference"`` (computed with every gate removed; a dict batch also gets the key).

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
        batches: Batches (or batch dicts) with tokens and padding mask; extended in place with ``reference``.
        loss: ``"contrastive"`` (default) or ``"cosine"`` (1 - mean cosine).
        temperature: of the contrastive loss (0.05, sentence-transformers' scale 20).

    Raises:
        ValueError: the model has an unembedding, the batches are empty, or an unknown loss.

    Example:
        >>> import interp
        >>> from interp.pruning.objectives import SentenceSimilarityObjective, sentence_batches
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
        given = [batches] if isinstance(batches, (torch.Tensor, dict, Batch)) else list(batches)
        batches = check_batches(given)
        with torch.no_grad(), head_mask(model, None):  # restores any gates set before
            model.set_head_gates(None)  # the reference is the unpruned model
            for original, batch in zip(given, batches):
                batch.annotations["reference"] = self._embed(model, batch).detach()
                if isinstance(original, dict):  # the caller's dict keeps working as a batch of this objective
                    original["reference"] = batch.annotations["reference"]
        self.batches = batches

    @staticmethod
    def _embed(model, batch: Batch) -> torch.Tensor:
        hidden = model(batch.tokens, attention_mask=batch.mask)  # [B, T, M]
        return mean_pool(hidden, batch.mask)  # [B, M]

    @staticmethod
    def _reference(batch: Batch) -> torch.Tensor:
        if "reference" not in batch.annotations:
            raise ValueError("batch has no 'reference' embeddings: build the objective with these batches")
        return batch.annotations["reference"].float()  # [B, M]

    def _cosine(self, model, batch: Batch) -> torch.Tensor:
        batch = as_batch(batch)
        ref = self._reference(batch)
        return F.cosine_similarity(self._embed(model, batch).float(), ref, dim=-1)  # [B]

    def loss(self, model: Transformer, batch: Batch) -> torch.Tensor:
        if self.loss_kind == "cosine":
            return 1.0 - self._cosine(model, batch).mean()
        batch = as_batch(batch)
        ref = F.normalize(self._reference(batch), dim=-1)  # [B, M]
        emb = F.normalize(self._embed(model, batch).float(), dim=-1)  # [B, M]
        logits = emb @ ref.T / self.temperature  # [B, B]: sentence i against every unpruned embedding j
        return F.cross_entropy(logits, torch.arange(len(emb), device=emb.device))

    def example_losses(self, model, batch: Batch) -> torch.Tensor:
        """Per-example loss ``[B]``. Sentence i's contrastive term reads only its own pruned embedding (the
        in-batch negatives are the fixed unpruned references), so it depends only on example i's gates."""
        if self.loss_kind == "cosine":
            return 1.0 - self._cosine(model, batch)
        batch = as_batch(batch)
        ref = F.normalize(self._reference(batch), dim=-1)  # [B, M]
        emb = F.normalize(self._embed(model, batch).float(), dim=-1)  # [B, M]
        logits = emb @ ref.T / self.temperature  # [B, B]
        return F.cross_entropy(logits, torch.arange(len(emb), device=emb.device), reduction="none")

    @torch.no_grad()
    def metric(self, model: Transformer, batches: Sequence[Batch]) -> float:
        sims = [self._cosine(model, b) for b in check_batches(batches)]
        return float(torch.cat(sims).mean())


def sentence_batches(model: Transformer, sentences: Sequence[str], *, batch_size: int = 16, max_length: int = 64) -> list[Batch]:
    """Tokenize sentences with the model's tokenizer into padded Batches (:func:`interp.data.text_batches`,
    blank sentences dropped).

    Raises:
        ValueError: no sentences, or the model has no text tokenizer.
    """
    sentences = [s for s in sentences if s.strip()]
    if not sentences:
        raise ValueError("sentences is empty: pruning needs at least one sentence")
    return text_batches(model, sentences, batch_size=batch_size, max_length=max_length)


def ud_sentences(path: str | Path, n: int | None = None, *, skip: int = 0) -> list[str]:
    """The ``# text =`` sentences of a CoNLL-U file (read with :func:`interp.data.read_conllu`).

    Args:
        path: a .conllu file (e.g. ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu).
        n: how many to return (None: all); skip: how many to skip first (to split train / held-out).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a malformed line (``file:line`` named).
    """
    out: list[str] = []
    for i, sent in enumerate(read_conllu(Path(path))):
        if i < skip:
            continue
        if sent.text:
            out.append(sent.text)
        if n is not None and len(out) >= n:
            break
    return out
