"""Retrieval heads (Wu et al. 2024, "Retrieval head mechanistically explains long-context factuality"): heads that,
while the model copies a needle from far back in the context, attend to the needle token being copied.

Data: generated needle-in-a-haystack prompts (:func:`interp.data.needle.needle_batches`), the needle repeated at
the end as the answer, teacher-forced. At answer position ``q`` (holding needle token ``j``) the model is to
produce needle token ``j + 1``; the head retrieves when its (unique) argmax key is that token's position in the
needle. The retrieval score is the share of answer rows where it does. Wu et al. also require the generated token
to equal the attended one; under teacher forcing the copied token is given, so this score counts the attention
half (a head that attends there while the model fails to copy still counts).

Threshold ``retrieval_threshold = 0.1``: Wu et al.'s cut-off (retrieval score > 0.1) for calling a head a
retrieval head; a head attending at random hits the one target key with probability ~1 / context.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from ..data import Batch
from ..data.needle import needle_batches
from ..streaming import Reducer
from ._stream import TargetReducer, key_allowed
from .kinds import HeadKind, KindRun, register_kind

__all__ = ["RetrievalReducer"]


class RetrievalReducer(TargetReducer):
    """The target of each answer row: the needle position of the token the model is to copy next (batches need the
    ``needle`` and ``answer`` annotations of :func:`~interp.data.needle.needle_batches`).

    Example:
        >>> import interp
        >>> from interp.analysis.retrieval import RetrievalReducer
        >>> from interp.examples import model
        >>> red = RetrievalReducer(model)
        >>> _ = interp.streaming.stream(model, interp.data.needle.needle_batches(128, 4, 40, 6, bos_id=0), [red])
        >>> red.result()["retrieval"]["argmax"].shape      # [L, H]
        torch.Size([2, 4])
    """

    def __init__(self, model: Any) -> None:
        super().__init__(model, ["retrieval"])

    def targets(self, batch: Batch, rows: slice) -> dict[str, torch.Tensor]:
        if "needle" not in batch.annotations or "answer" not in batch.annotations:
            raise ValueError("retrieval batches need the 'needle' and 'answer' annotations of needle_batches")
        B, T = batch.tokens.shape
        q = torch.arange(T)[rows]  # [T']
        needle, answer = batch.annotations["needle"], batch.annotations["answer"]  # [B] each
        n = T - answer  # [B] the needle's length
        j = q[None, :] - answer[:, None]  # [B, T']: the needle index of each query's token (answer rows)
        row_ok = (j >= 0) & (j < n[:, None] - 1)  # answer rows with a next needle token to copy
        key = needle[:, None] + j + 1  # [B, T'] the position of that next token in the needle
        tgt = (torch.arange(T)[None, None, :] == key[..., None]) & row_ok[..., None]  # [B, T', S]
        return {"retrieval": tgt & key_allowed(batch.tokens, batch.mask, self.model.cfg.causal, rows)}


def _data(run: KindRun) -> list[Batch]:
    cfg = run.model.cfg
    tok = getattr(run.model, "tokenizer", None)
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    context = run["needle_context"] if run["needle_context"] is not None else min(cfg.n_ctx, 256)
    return needle_batches(cfg.d_vocab, run["n_seqs"], context, run["needle_len"], n_ctx=cfg.n_ctx, bos_id=bos,
                          seed=run["seed"], batch_size=run["batch_size"])


def _reducers(run: KindRun) -> list[Reducer]:
    return [RetrievalReducer(run.model)]


def _rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    red = reducers[0]
    res = red.result()["retrieval"]
    threshold = run["retrieval_threshold"]
    context = run["needle_context"] if run["needle_context"] is not None else min(run.model.cfg.n_ctx, 256)
    run.probes["retrieval"] = (f"{run['n_seqs']} generated needle-in-a-haystack prompts of {context} tokens, "
                               f"needle of {run['needle_len']} tokens at a random depth")
    rows, table = [], []
    for layer in range(res["argmax"].shape[0]):
        for head in range(run.model.cfg.layer(layer).n_heads):
            score = float(res["argmax"][layer, head])
            table.append({"layer": layer, "head": head, "retrieval": score,
                          "mass": float(res["mass"][layer, head])})
            if score == score and score >= threshold:
                rows.append({"layer": layer, "head": head, "kind": "retrieval", "score": score,
                             "evidence": f"argmax on the needle token to copy in {100 * score:.0f}% of "
                                         f"{res['rows']} answer rows; mean weight there "
                                         f"{float(res['mass'][layer, head]):.2f}"})
    run.details["retrieval"] = pd.DataFrame(table)  # every head's retrieval score and mass on the target
    return rows


register_kind(HeadKind(
    "retrieval", ("retrieval",), "needles", _reducers, _rows,
    threshold="retrieval_threshold=0.1",
    reason="Wu et al.'s cut-off: a retrieval score above 0.1; a head attending at random hits the one target key "
           "with probability ~1 / context",
    source="Wu et al. 2024, Retrieval head mechanistically explains long-context factuality",
    default=False, colour="#1abc9c", data_builder=_data,
    defaults={"retrieval_threshold": 0.1, "needle_len": 16, "needle_context": None}))
