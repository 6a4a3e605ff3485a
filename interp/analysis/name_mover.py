"""Name mover and negative name mover heads (Wang et al. 2022, "Interpretability in the wild: a circuit for
indirect object identification in GPT-2 small"): at the end of an IOI prompt ("When Mary and John went to the
store, John gave a drink to"), heads that attend to the indirect object (" Mary") and copy it into the logits, or,
negative name movers, write it down.

Two numbers per head:

- **attention to IO** (the score): the attention weight from the last position (END) to the indirect object's
  position, per prompt, averaged over prompts (:class:`EndToIOReducer`, folded in the streamed pass over the IOI
  prompts; the per-prompt values give the bootstrap interval).
- **copying scores** of the head's effective OV circuit (:mod:`.ov_circuit`) on the prompts' names, Wang et al.'s
  copy score measured as a rank: for each name, the share of ``comparisons`` vocabulary tokens whose logit lies
  strictly below the name's own when the head attends to the name (positive), or strictly above it (negative).
  1 = the name always tops the comparison tokens (a copying head) / always sits below them (a suppressing head).

A head is a ``name-mover`` when its attention to IO is at least ``name_mover_threshold`` and its positive copying
score at least ``name_mover_copying``; a ``negative-name-mover`` with the same attention and a negative copying
score at least ``name_mover_copying``. The copying score is a gate, not the score (as for induction heads).

Thresholds: ``name_mover_threshold = 0.3``: Wang et al.'s name movers put most of END's attention on IO, and the
prompt holds ~15 tokens, so 0.3 is several times uniform attention and well above a head that spreads its weight
over the three names; ``name_mover_copying = 0.9``: the name ranks above (below) 90 % of the vocabulary in the
head's own logits (chance: 0.5), the cut-off copy suppression uses.

Causal check: the logit difference IO - S at END (:func:`~interp.analysis.kind_causal.kind_metric` with
``"name-mover"``): mean-ablating name movers should lower it more than random head sets of the same size,
ablating negative name movers should raise it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..data import Batch
from ..data.batches import reads_text
from ..data.circuit_tasks import TaskPrompts, ioi_prompts
from ..streaming import Reducer
from ._stream import PATTERN_HOOKS, head_counts, head_grid, layer_of, state_device, zeros64
from .kinds import HeadKind, KindRun, not_measured, register_kind
from .ov_circuit import has_unembedding, ov_logits

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["EndToIOReducer", "io_positions", "ioi_batches", "name_copying_scores"]


def io_positions(prompts: TaskPrompts) -> torch.Tensor:
    """The position of the indirect object (``answers[:, 0]``) in each clean prompt.

    Raises:
        ValueError: prompts without answers, or a prompt where the IO token does not occur exactly once (the
            message names the prompt and the token).

    Example:
        >>> import torch
        >>> from interp.analysis.name_mover import TaskPrompts, io_positions
        >>> p = TaskPrompts("ioi", torch.tensor([[0, 5, 6, 6, 9]]), torch.tensor([[0, 1, 2, 3, 9]]),
        ...                 answers=torch.tensor([[5, 6]]))
        >>> io_positions(p).tolist()
        [1]
    """
    if prompts.answers is None:
        raise ValueError(f"task {prompts.name!r} has no answers: name movers need (IO, S) answer pairs")
    hits = prompts.clean == prompts.answers[:, :1]  # [B, T]
    counts = hits.sum(1)
    bad = (counts != 1).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        raise ValueError(f"IOI prompt {i}: the indirect object token {int(prompts.answers[i, 0])} occurs "
                         f"{int(counts[i])} times; name movers need it exactly once")
    return hits.float().argmax(1)  # [B]


def ioi_batches(prompts: TaskPrompts, batch_size: int = 32) -> list[Batch]:
    """The clean IOI prompts as batches annotated with ``io`` (``[B]``, :func:`io_positions`).

    Raises:
        ValueError: as :func:`io_positions`.

    Example:
        >>> import torch
        >>> from interp.analysis.name_mover import TaskPrompts, ioi_batches
        >>> p = TaskPrompts("ioi", torch.tensor([[0, 5, 6, 6, 9]]), torch.tensor([[0, 1, 2, 3, 9]]),
        ...                 answers=torch.tensor([[5, 6]]))
        >>> ioi_batches(p)[0].annotations["io"].tolist()
        [1]
    """
    io = io_positions(prompts)
    return [Batch(prompts.clean[i:i + batch_size], None, {"io": io[i:i + batch_size]})
            for i in range(0, len(prompts.clean), batch_size)]


class EndToIOReducer(Reducer):
    """Per prompt and head, the attention weight from the last position to the IO position (batches need the
    ``io`` annotation of :func:`ioi_batches`; prompts are unpadded, so the last position is END).

    State (mergeable sums): ``sum`` ``[L, H_max]`` and ``n`` prompts; per-prompt values in
    :meth:`per_sequence` (the rows of the bootstrap interval).

    Example:
        >>> import interp
        >>> import torch
        >>> from interp.analysis.name_mover import EndToIOReducer, TaskPrompts, ioi_batches
        >>> from interp.examples import model
        >>> p = TaskPrompts("ioi", torch.tensor([[0, 5, 6, 6, 9]]), torch.tensor([[0, 1, 2, 3, 9]]),
        ...                 answers=torch.tensor([[5, 6]]))
        >>> red = EndToIOReducer(model)
        >>> _ = interp.streaming.stream(model, ioi_batches(p), [red])
        >>> red.result().shape       # [L, H]
        torch.Size([2, 4])
    """

    reads_query_chunks = True  # update() picks END's row out of whichever query chunk holds it

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.names = PATTERN_HOOKS
        L, H = head_grid(model)
        self._shape = (L, H)
        self._dev = state_device(model)
        self.state = {"sum": zeros64(L, H, device=self._dev), "n": zeros64(device=self._dev)}
        self._rows: list[torch.Tensor] = []  # [B, L, H] per batch

    def begin_batch(self, batch: Batch) -> None:
        if "io" not in batch.annotations:
            raise ValueError("name-mover batches need the 'io' annotation of ioi_batches")
        if batch.mask is not None and not bool(batch.mask.bool().all()):
            raise ValueError("name-mover batches must be unpadded: the last position is END")
        self._io = batch.annotations["io"].to(self._dev)  # [B]
        self._end = batch.tokens.shape[1] - 1
        self._batch = torch.full((len(batch), *self._shape), torch.nan, dtype=torch.float64, device=self._dev)

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        B, H, Tc, S = tensor.shape  # a pattern chunk
        row = self._end - q_start
        if not 0 <= row < Tc:
            return
        end = tensor[:, :, row].detach().double().to(self._dev)  # [B, H, S]
        self._batch[:, layer_of(name), :H] = end.gather(-1, self._io[:, None, None].expand(B, H, 1))[..., 0]

    def end_batch(self) -> None:
        self._rows.append(self._batch.cpu())
        self.state["sum"] += self._batch.nan_to_num(0).sum(0)
        self.state["n"] += float(len(self._batch))

    def per_sequence(self) -> torch.Tensor:
        """``[N, L, H]``: one row per prompt seen by this reducer."""
        return torch.cat(self._rows) if self._rows else torch.zeros(0, *self._shape, dtype=torch.float64)

    def result(self) -> torch.Tensor:
        """``[L, H_max]`` mean attention from END to IO (NaN before any prompt)."""
        n = float(self.state["n"])
        return (self.state["sum"].cpu() / n).float() if n else torch.full(self._shape, torch.nan)


@torch.no_grad()
def name_copying_scores(model: Transformer, names: torch.Tensor, *, comparisons: int = 256,
                        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head and name, the positive and negative copying scores of the effective OV circuit.

    Args:
        model: an interp Transformer with an unembedding.
        names: ``[n]`` the name tokens.
        comparisons: vocabulary tokens each name is ranked against (the whole vocabulary when it is smaller).
        seed: of the comparison draw.

    Returns:
        ``(positive, negative)``, each ``[L, H_max, n]`` float32: the share of comparison tokens strictly below /
        above the name's own logit (the name itself never counts); NaN for heads a pruned layer lacks.

    Raises:
        ValueError: no name, ``comparisons`` < 1, or a model without an unembedding.

    Example:
        >>> import torch
        >>> from interp.analysis.name_mover import name_copying_scores
        >>> from interp.examples import model
        >>> pos, neg = name_copying_scores(model, torch.tensor([3, 4]))
        >>> pos.mean(-1).shape           # [L, H]
        torch.Size([2, 4])
    """
    if isinstance(comparisons, bool) or not isinstance(comparisons, int) or comparisons < 1:
        raise ValueError(f"comparisons={comparisons!r} must be an int >= 1")
    names = torch.as_tensor(names).flatten()
    if not len(names):
        raise ValueError("names is empty: the copying score needs at least one name token")
    unembed = model.unembed
    if unembed is None or not has_unembedding(model):
        raise ValueError("copying scores read the unembedding, and this model has none")
    V = unembed.weight.shape[0]
    gen = torch.Generator().manual_seed(seed)
    if comparisons >= V:
        others = torch.arange(V).expand(len(names), V)  # [n, V]
    else:
        others = torch.randint(V, (len(names), comparisons), generator=gen)  # [n, K]
    cols = torch.cat([names[:, None], others], dim=1)  # [n, 1 + K]: column 0 is the name itself
    logits = ov_logits(model, names, cols)  # [L, H, n, 1 + K]
    own, other = logits[..., :1], logits[..., 1:]
    valid = (others != names[:, None]).to(other.device)  # [n, K]
    count = valid.float().sum(-1)  # [n]
    below = ((other < own) & valid).float().sum(-1) / count  # [L, H, n]
    above = ((other > own) & valid).float().sum(-1) / count
    nan = logits[..., 0].isnan()
    return below.masked_fill(nan, torch.nan).cpu(), above.masked_fill(nan, torch.nan).cpu()


# --- the registry entry -------------------------------------------------------------------------------------------
def _task(run: KindRun) -> TaskPrompts | None:
    given = run.given("ioi_prompts", TaskPrompts, "ioi_prompts")
    if given is not None:
        return given
    if not reads_text(run.model) or not has_unembedding(run.model):
        return None  # the rows say why nothing was measured
    if "ioi:prompts" not in run.passes:  # built once: the data builder and the rows read the same prompts
        run.passes["ioi:prompts"] = ioi_prompts(run.model, run["ioi_n_prompts"], seed=run["seed"])
    return run.passes["ioi:prompts"]


def _data(run: KindRun) -> list[Batch]:
    task = _task(run)
    return [] if task is None else ioi_batches(task, run["batch_size"])


def _reducers(run: KindRun) -> list[Reducer]:
    return [EndToIOReducer(run.model)]


def _rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    red = reducers[0]
    assert isinstance(red, EndToIOReducer)
    if not has_unembedding(run.model):
        return not_measured(run, "name-mover", "the model has no unembedding")
    task = _task(run)
    if task is None:
        return not_measured(run, "name-mover", "no text tokenizer and no ioi_prompts")
    assert task.answers is not None
    names = torch.unique(task.answers.flatten())
    run.probes["name-mover"] = (f"{len(task.clean)} IOI prompts of {task.clean.shape[1]} tokens (attention from END "
                                f"to IO); copying scores of the weights on their {len(names)} names")
    attn, seq = red.result(), red.per_sequence()
    pos, neg = name_copying_scores(run.model, names, comparisons=run["name_mover_comparisons"], seed=run["seed"])
    pos, neg = pos.mean(-1), neg.mean(-1)  # [L, H]
    threshold, gate = run["name_mover_threshold"], run["name_mover_copying"]
    rows, table = [], []
    for layer, H in enumerate(head_counts(run.model)):
        for head in range(H):
            a, p, n = float(attn[layer, head]), float(pos[layer, head]), float(neg[layer, head])
            role = "name-mover" if p >= gate else "negative-name-mover" if n >= gate else ""
            table.append({"layer": layer, "head": head, "attention_to_io": a, "copying": p,
                          "negative_copying": n, "role": role if a >= threshold else ""})
            if role:
                what = f"copying score {p:.2f}" if role == "name-mover" else f"negative copying score {n:.2f}"
                rows.append({"layer": layer, "head": head, "kind": role, "score": a,
                             "evidence": f"attention {a:.2f} from END to the indirect object; {what} on the "
                                         f"{len(names)} names",
                             "samples": seq[:, layer, head], "threshold": threshold, "passed": a >= threshold})
    run.details["name-mover"] = pd.DataFrame(table)
    return rows


register_kind(HeadKind(
    "name-mover", ("name-mover", "negative-name-mover"), "ioi", _reducers, _rows,
    threshold="name_mover_threshold=0.3, name_mover_copying=0.9",
    reason="0.3 of END's attention on the indirect object is several times uniform attention over an IOI prompt "
           "and more than a head spreading its weight over the names gives it; the name must rank above (name "
           "mover) or below (negative name mover) 90 % of the vocabulary in the head's own logits (chance 0.5)",
    source="Wang et al. 2022, Interpretability in the wild: a circuit for indirect object identification in GPT-2 "
           "small",
    default=False, colour="#a04000", data_builder=_data,
    defaults={"name_mover_threshold": 0.3, "name_mover_copying": 0.9, "ioi_prompts": None, "ioi_n_prompts": 32,
              "name_mover_comparisons": 256}))
