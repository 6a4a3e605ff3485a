"""Attention-sink (dormant) heads: heads that park their attention on the first token, whose value carries almost
nothing (Xiao et al. 2023, StreamingLLM; Gu et al. 2024, "When attention sink emerges"; Guo et al. 2024,
"Active-dormant attention heads").

Two numbers per head, folded in the text pass (:class:`SinkReducer`):

- **sink mass**: the mean attention weight on the sequence's first real token, over the real queries after it
  (the first query can only attend to itself); averaged per sequence, then over sequences.
- **value ratio**: the norm of the first token's value vector over the mean norm of the other real tokens'
  values (the head's K/V group; for a pruned or GQA model the query head's group). Gu et al. and Guo et al.
  show sink tokens have small values: attending there is a way of writing nothing.

A head is a ``sink`` when its sink mass is at least ``sink_threshold`` (0.3: Gu et al.'s epsilon for "a head
with an attention sink") **and** its value ratio is at most ``sink_value_ratio`` (0.5: the first token's value
is at most half a typical one, so the mass there moves little). A head that attends to the first token with a
value as large as any other is reading that token, a real first-token positional head: it is not a sink, and
keeps its ``positional:first`` label. A sink head's ``positional:first`` row is dropped (the sink row says
more).

A model with learned sinks (``cfg.attn_sinks``, gpt-oss) has a sink that is no token: each head's own logit takes
part of every row's softmax and writes nothing (its value is zero). There the **sink mass** is the mean of
``hook_sink_mass`` (the learned sink's probability) over every real query, and the **value ratio** is 0 (the
learned sink's value is zero): a head is a ``sink`` when its learned sink takes at least ``sink_threshold`` of
its attention.

Every head's sink mass and value ratio are in ``report.details["sink"]``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from ..data import Batch
from ..streaming import Reducer
from ._stream import PATTERN_HOOKS, head_counts, head_grid, layer_of, state_device, zeros64
from .kinds import HeadKind, KindRun, register_kind

__all__ = ["SINK_MASS_HOOKS", "SinkReducer"]

#: The learned sinks' mass hooks (``[B, H, T]``) of a model with ``cfg.attn_sinks``.
SINK_MASS_HOOKS = "blocks.*.attn.hook_sink_mass"


class SinkReducer(Reducer):
    """Per sequence and head: the attention mass on the first real token, and that token's value-norm ratio.

    State (mergeable sums): ``mass`` and ``ratio`` ``[L, H_max]`` summed over sequences, ``n`` sequences. The
    per-sequence values are also kept (``per_sequence()``) for the bootstrap interval over sequences.

    Example:
        >>> import interp
        >>> from interp.analysis.sink import SinkReducer
        >>> from interp.examples import model, tokens
        >>> red = SinkReducer(model)
        >>> n = interp.streaming.stream(model, tokens, [red])
        >>> red.result()["mass"].shape     # [L, H]
    """

    reads_query_chunks = True
    reads_cut_rows = True  # only the first real key is read, on rows after it

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        # A learned sink (gpt-oss) is the sink: its own mass hook, its value zero.
        self.learned = bool(getattr(model.cfg, "attn_sinks", False))
        self.names = [SINK_MASS_HOOKS] if self.learned else [PATTERN_HOOKS, "blocks.*.attn.hook_v"]
        L, H = head_grid(model)
        self._shape = (L, H)
        self._dev = state_device(model)
        self.state = {"mass": zeros64(L, H, device=self._dev), "ratio": zeros64(L, H, device=self._dev),
                      "n": zeros64(device=self._dev)}
        self._mass_rows: list[torch.Tensor] = []  # [B, L, H] per batch
        self._ratio_rows: list[torch.Tensor] = []

    def begin_batch(self, batch: Batch) -> None:
        real = batch.real  # [B, T]
        self._real = real.to(self._dev)
        self._first = real.float().argmax(1).to(self._dev)  # [B]: the first real position (left padding too)
        B = real.shape[0]
        L, H = self._shape
        self._mass = zeros64(B, L, H, device=self._dev)
        # The queries each sequence's mean runs over, from the batch alone (not from whichever layer fires first:
        # on a pipeline's rank the first layer is another rank's): every real query for a learned sink, else the
        # real queries after the first real token (the first can only attend to itself).
        q = torch.arange(real.shape[1], device=self._dev)  # [T]
        counted = self._real if self.learned else self._real & (q[None, :] > self._first[:, None])  # [B, T]
        self._rows = counted.sum(-1).to(self._mass.dtype)  # [B]
        self._ratio = torch.full((B, L, H), torch.nan, dtype=torch.float64, device=self._dev)
        if self.learned:
            self._ratio.zero_()  # the learned sink's value is zero: it writes nothing

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = layer_of(name)
        t = tensor.detach().float().to(self._dev)
        b = torch.arange(t.shape[0], device=self._dev)
        if name.endswith("hook_v"):  # [B, S, K, D]
            norms = t.norm(dim=-1)  # [B, S, K]
            first = norms[b, self._first]  # [B, K]
            others = self._real.clone()
            others[b, self._first] = False
            mean = (norms * others[..., None]).sum(1) / others.sum(1, keepdim=True).clamp(min=1)  # [B, K]
            # 0 / 0 (a head whose values are all zero writes nothing at all): ratio 0, it is dormant.
            ratio = torch.where(mean > 0, first / mean.clamp(min=1e-30), torch.zeros_like(first))  # [B, K]
            H = self.model.cfg.layer(layer).n_heads
            K = ratio.shape[1]
            attn = self.model.blocks[layer].attn
            kv = getattr(attn, "kv_index", None)
            kv = kv.to(self._dev) if kv is not None else torch.arange(H, device=self._dev) // max(1, H // max(K, 1))
            self._ratio[:, layer, :H] = ratio[:, kv].double()  # [B, H]: each query head's K/V group
            return
        if name.endswith("hook_sink_mass"):  # [B, H, Tc]: the learned sink's probability, every real query
            B, H, Tc = t.shape
            rows = self._real[:, q_start:q_start + Tc]  # [B, Tc]
            self._mass[:, layer, :H] += (t * rows[:, None]).sum(-1).double()
            return
        B, H, Tc, S = t.shape  # pattern chunk (S = q_start + Tc when handed over cut)
        q = torch.arange(q_start, q_start + Tc, device=self._dev)  # [Tc]
        rows = self._real[:, q_start:q_start + Tc] & (q[None, :] > self._first[:, None])  # [B, Tc]
        # A cut chunk may end before a left-padded sequence's first real key: its rows are all masked out then.
        first = self._first.clamp(max=S - 1)[:, None, None, None].expand(B, H, Tc, 1)  # [B, H, Tc, 1]
        on_first = t.gather(-1, first)[..., 0]  # [B, H, Tc]
        self._mass[:, layer, :H] += (on_first * rows[:, None]).sum(-1).double()

    def end_batch(self) -> None:
        mass = self._mass / self._rows.clamp(min=1)[:, None, None]  # [B, L, H]: per-sequence mean mass
        keep = self._rows > 0  # sequences with a query after the first token
        mass, ratio = mass[keep], self._ratio[keep]
        self._mass_rows.append(mass.cpu())
        self._ratio_rows.append(ratio.cpu())
        self.state["mass"] += mass.sum(0).to(self.state["mass"])
        self.state["ratio"] += ratio.nan_to_num(0).sum(0).to(self.state["ratio"])
        self.state["n"] += float(keep.sum())

    def per_sequence(self) -> dict[str, torch.Tensor]:
        """``{"mass", "ratio"}``: ``[N, L, H]`` one row per sequence seen by this reducer."""
        L, H = self._shape
        cat = (lambda xs: torch.cat(xs) if xs else torch.zeros(0, L, H, dtype=torch.float64))
        return {"mass": cat(self._mass_rows), "ratio": cat(self._ratio_rows)}

    def result(self) -> dict[str, torch.Tensor]:
        """``{"mass", "ratio"}``: ``[L, H_max]`` means over sequences (NaN before any sequence)."""
        n = float(self.state["n"])
        out = {k: (self.state[k].cpu() / n if n else torch.full(self._shape, torch.nan)).float()
               for k in ("mass", "ratio")}
        return out


def _reducers(run: KindRun) -> list[Reducer]:
    return [SinkReducer(run.model)]


def _rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    red = reducers[0]
    assert isinstance(red, SinkReducer)
    res, seq = red.result(), red.per_sequence()
    t_mass, t_ratio = run["sink_threshold"], run["sink_value_ratio"]
    table, rows = [], []
    for layer, n_heads in enumerate(head_counts(run.model)):
        for head in range(n_heads):
            mass, ratio = float(res["mass"][layer, head]), float(res["ratio"][layer, head])
            role = ("sink" if mass >= t_mass and ratio <= t_ratio else
                    "reads the first token" if mass >= t_mass else "")
            table.append({"layer": layer, "head": head, "sink_mass": mass, "value_ratio": ratio, "role": role})
            evidence = (f"mean attention {mass:.2f} on the learned sink, which writes nothing" if red.learned else
                        f"mean attention {mass:.2f} on the first token, whose value norm is {ratio:.2f}x the "
                        "other tokens'")
            rows.append({"layer": layer, "head": head, "kind": "sink", "score": mass, "evidence": evidence,
                         "samples": seq["mass"][:, layer, head], "threshold": t_mass,
                         # The value gate is a condition, not the score: a head that reads a large first-token
                         # value is never a sink, however sure its mass.
                         "passed": mass >= t_mass and ratio <= t_ratio, "gate": ratio <= t_ratio})
    run.details["sink"] = pd.DataFrame(table)
    return [r for r in rows if r.pop("gate")]


register_kind(HeadKind(
    "sink", ("sink",), "text", _reducers, _rows,
    threshold="sink_threshold=0.3, sink_value_ratio=0.5",
    reason="Gu et al.'s epsilon: a head with at least 0.3 of its attention on the first token has a sink; the "
           "first token's value at most half a typical one's norm means the mass there writes little "
           "(a larger value is a head reading the first token, not a sink)",
    source="Xiao et al. 2023 (StreamingLLM); Gu et al. 2024, When attention sink emerges; Guo et al. 2024, "
           "Active-dormant attention heads",
    default=False, colour="#34495e", supersedes=("positional:first",),
    defaults={"sink_threshold": 0.3, "sink_value_ratio": 0.5}))
