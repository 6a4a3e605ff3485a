"""Induction, previous-token and duplicate-token heads, scored on repeated random token sequences.

On ``[bos] x_1..x_n x_1..x_n`` (see :func:`interp.data.repeated_sequences`) an induction head
attends from the second occurrence of a token to the token right after its first occurrence (prefix
matching) and its output raises the logit of the token it attends to (copying; Olsson et al., 2022). A
previous-token head attends to position ``q - 1``; a duplicate-token head attends to earlier occurrences of
the current token. Encoders get the same attention scores; copying needs an unembedding and is NaN without.

Two definitions of the attention scores:

- ``definition="interp"`` (default): the mean attention mass on the targets, averaged only over the query
  rows that *have* a target (for previous-token every row but the first; for duplicate-token and induction
  the second half). Rows without a target say nothing about the head, and counting them would cap a
  perfect induction head at ~0.5 on a sequence repeated once. It also reports the fraction of those rows
  whose unique argmax is a target (``*_argmax``).
- ``definition="transformer_lens"``: TransformerLens' ``head_detector`` "mul" measure, reproduced exactly:
  per sequence, ``sum(pattern * detection) / sum(pattern)`` over all (real) rows, with TL's lower-triangular
  detection patterns (also for encoders, whose attention to later keys then only enters the denominator),
  averaged over sequences with equal weight (as ``detect_head`` does for a list of prompts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import torch

from ..data import Batch, repeated_tokens_for
from ..streaming import Reducer, stream
from ._stream import PATTERN_HOOKS, TargetReducer, head_counts, heads_of, key_allowed, layer_of, offset_targets

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["induction_scores", "repeated_tokens_for", "induction_targets", "tl_detection_patterns",
           "InductionReducer", "TLHeadDetectorReducer", "CopyingReducer"]

_DEFINITIONS = ("interp", "transformer_lens")
_KINDS = ("previous_token", "duplicate_token", "induction")


# --- target sets ----------------------------------------------------------------------------------------
def induction_targets(tokens: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                      rows: slice = slice(None)) -> dict[str, torch.Tensor]:
    """The ``interp`` target keys ``[B, T', S]`` bool of each score, for the query ``rows`` (default: all).

    - ``previous_token``: key ``q - 1``.
    - ``duplicate_token``: earlier keys ``k < q`` holding the same token as ``q``.
    - ``induction`` (prefix matching): keys ``k != q`` whose previous token ``k - 1 < q`` equals token ``q``,
      i.e. the token after an earlier occurrence of the current token.

    Only real, attendable keys count (padding and, for a causal model, future keys are never targets).
    Building them for a slice of rows keeps query-chunked scoring linear in memory.
    """
    B, T = tokens.shape
    allowed = key_allowed(tokens, mask, causal, rows)  # [B, T', S]
    real = Batch(tokens, mask).real  # [B, T]
    q = torch.arange(T)[rows]  # [T']
    k = torch.arange(T)  # [S]
    same = (tokens[:, rows, None] == tokens[:, None, :]) & real[:, rows, None] & real[:, None, :]  # [B, T', S]
    dup = same & (k[None, :] < q[:, None])[None]  # [B, T', S]
    # prev_same[b, q, k] = token[k-1] == token[q]: shift the key axis of `same` right by one.
    prev_same = torch.zeros_like(same)
    prev_same[:, :, 1:] = same[:, :, :-1]
    key_after_earlier = (k[None, :] - 1 < q[:, None]) & (k[None, :] != q[:, None])  # [T', S]
    return {
        "previous_token": offset_targets(T, -1, rows)[None] & allowed,
        "duplicate_token": dup & allowed,
        "induction": prev_same & key_after_earlier[None] & allowed,
    }


def tl_detection_patterns(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """TransformerLens' detection patterns for one unpadded sequence ``[T]``: ``{kind: [T, T] float}``.

    Written from TL 4.x ``head_detector``: previous-token is the sub-diagonal; duplicate-token is
    ``tril(tokens[q] == tokens[k])`` with a zero diagonal; induction is the duplicate pattern shifted one key
    to the right with a zero first column, then ``tril`` (so it may include ``k == q``).
    """
    T = tokens.shape[-1]
    tokens = tokens.reshape(T)  # [T]
    prev = torch.zeros(T, T)
    prev[1:, :-1] = torch.eye(T - 1)
    dup = (tokens[:, None] == tokens[None, :]).float()  # [T, T]
    dup.fill_diagonal_(0)
    dup = dup.tril()
    ind = torch.zeros(T, T)
    ind[:, 1:] = dup[:, :-1]
    return {"previous_token": prev.tril(), "duplicate_token": dup, "induction": ind.tril()}


# --- reducers -------------------------------------------------------------------------------------------
class InductionReducer(TargetReducer):
    """The ``interp`` scores: previous-token, duplicate-token and induction targets of each batch
    (:func:`induction_targets`)."""

    def __init__(self, model: Transformer, *, tie_tol: float = 1e-6) -> None:
        super().__init__(model, list(_KINDS), tie_tol=tie_tol)

    def targets(self, batch: Batch, rows: slice) -> dict[str, torch.Tensor]:
        return induction_targets(batch.tokens, batch.mask, self.model.cfg.causal, rows)


class TLHeadDetectorReducer(Reducer):
    """TransformerLens' "mul" score per sequence, summed over sequences (see the module docstring).

    State: ``sum_{kind}`` ``[L, H_max]`` (per-sequence scores summed) and ``n_sequences``.
    """

    names = PATTERN_HOOKS

    def __init__(self, model: Transformer, *, exclude_bos: bool = False, exclude_current_token: bool = False) -> None:
        super().__init__()
        self.exclude_bos = exclude_bos
        self.exclude_current = exclude_current_token
        L, H = model.cfg.n_layers, max(head_counts(model), default=0)
        self._shape = (L, H)
        self.state = {f"sum_{k}": torch.zeros(L, H, dtype=torch.float64) for k in _KINDS}
        self.state["n_sequences"] = torch.zeros((), dtype=torch.float64)

    def begin_batch(self, batch: Batch) -> None:
        tokens = batch.tokens
        B, T = tokens.shape
        real = batch.real  # [B, T]
        dets = {k: torch.zeros(B, T, T) for k in _KINDS}
        for b in range(B):
            idx = real[b].nonzero().flatten()  # positions of the real tokens (right or left padding)
            for k, d in tl_detection_patterns(tokens[b, idx]).items():
                dets[k][b][idx[:, None], idx[None, :]] = d
        self._dets = dets
        self._real = real
        L, H = self._shape
        self._num = {k: torch.zeros(B, L, H, dtype=torch.float64) for k in _KINDS}
        self._den = torch.zeros(B, L, H, dtype=torch.float64)

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = layer_of(name)
        q0 = q_start
        p = tensor.detach().float().clone()  # [B, H, Tc, S]
        H, Tc = p.shape[1], p.shape[2]
        p = p * self._real[:, None, q0:q0 + Tc, None].to(p)  # padding rows do not exist in TL's run
        if self.exclude_bos:
            p[..., 0] = 0
        if self.exclude_current:
            rows = torch.arange(Tc)
            p[:, :, rows, rows + q0] = 0
        self._den[:, layer, :H] += p.sum((2, 3)).double().cpu()
        for k in _KINDS:
            det = self._dets[k][:, q0:q0 + Tc].to(p)  # [B, Tc, S]
            self._num[k][:, layer, :H] += (p * det[:, None]).sum((2, 3)).double().cpu()

    def end_batch(self) -> None:
        for k in _KINDS:
            # Heads a pruned layer lacks have a zero denominator: they add 0, not NaN.
            self.state[f"sum_{k}"] += (self._num[k] / self._den.masked_fill(self._den == 0, 1)).sum(0)
        self.state["n_sequences"] += self._den.shape[0]

    def result(self) -> dict[str, torch.Tensor]:
        n = max(float(self.state["n_sequences"]), 1.0)
        return {k: self.state[f"sum_{k}"] / n for k in _KINDS}


class CopyingReducer(Reducer):
    """Copying score: does a head's direct effect on the logits raise the token it attends to?

    For every row with an induction target, take the head's residual write (``hook_result``), pass it through
    the final norm with the scale frozen at the full residual's value (direct logit attribution) and the
    unembedding, and find the rank of the attended token (the token at the row's argmax key) among the
    vocabulary. The score is the mean fraction of the vocabulary whose direct logit is strictly below the
    attended token's: 1 = always the top logit, ~0.5 = chance, 0 for a head that writes nothing the
    unembedding reads. State: ``sum`` ``[L, H_max]`` and ``rows``.

    The exact fraction costs ``heads x vocabulary x d_model`` multiply-adds a row (SmolLM2: 270 x 49,152 x
    576, ~7.6 GFLOP), far more than the forward pass. With ``comparisons=K`` (default 256) each row is instead
    compared with ``K`` tokens drawn uniformly from the vocabulary (with replacement, fresh for every row,
    seeded): the attended token's logit is one gathered column of ``W_U``, the comparison logits one batched
    ``[H, d_model] x [d_model, K]`` product per row. The per-row fraction is then an unbiased estimate of the
    exact one (a draw of the attended token itself never counts as below, as in the exact score), with
    standard error ``sqrt(p (1 - p) / K)`` per row; the draws being independent across rows, a head's score
    over ``N`` rows has standard error at most ``0.5 / sqrt(K N)`` (SmolLM2's 800 default rows, K = 256:
    <= 0.0011). A vocabulary of at most ``K`` tokens (or ``comparisons=None``) is scored exactly.

    Args:
        model: the model whose heads are scored.
        max_rows: score at most this many rows per batch, drawn at random (seeded) among the rows with an
            induction target; None scores them all.
        seed: seeds the row sample and the comparison tokens.
        comparisons: comparison tokens drawn per row; None: the whole vocabulary (exact).

    Raises:
        ValueError: ``max_rows`` or ``comparisons`` < 1.
    """

    def __init__(self, model: Transformer, *, max_rows: int | None = None, seed: int = 0,
                 comparisons: int | None = 256) -> None:
        super().__init__()
        for name, v in (("max_rows", max_rows), ("comparisons", comparisons)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name}={v!r} must be an int >= 1 or None")
        self.max_rows = max_rows
        V = model.unembed.weight.shape[0]
        self.comparisons = None if comparisons is None or comparisons >= V else comparisons
        self._gen = torch.Generator().manual_seed(seed)
        self._cmp_gen = torch.Generator().manual_seed(seed + 1)
        cfg = model.cfg
        L = cfg.n_layers
        self.model = model
        self.names = [PATTERN_HOOKS, "blocks.*.attn.hook_result", f"blocks.{L - 1}.hook_resid_post"]
        self._H = max(head_counts(model), default=0)
        self.state = {"sum": torch.zeros(L, self._H, dtype=torch.float64),
                      "rows": torch.zeros((), dtype=torch.float64)}
        self._last = f"blocks.{L - 1}.hook_resid_post"

    def begin_batch(self, batch: Batch) -> None:
        tokens = batch.tokens
        self._tokens = tokens
        T = tokens.shape[1]
        # The query rows scored: real rows with an induction target, built in row chunks (no [T, S] at once).
        chunks = [induction_targets(tokens, batch.mask, self.model.cfg.causal, slice(i, min(i + 1024, T)))
                  ["induction"].any(-1) for i in range(0, T, 1024)]
        self._rows = torch.cat(chunks, dim=1) & batch.real  # [B, T]
        if self.max_rows is not None and int(self._rows.sum()) > self.max_rows:
            where = self._rows.flatten().nonzero().flatten()  # [N] flat indices of the candidate rows
            keep = where[torch.randperm(len(where), generator=self._gen)[:self.max_rows]]  # [max_rows]
            self._rows = torch.zeros_like(self._rows).flatten().index_fill_(0, keep, True).view_as(self._rows)
        B = tokens.shape[0]
        self._argmax = torch.zeros(self.model.cfg.n_layers, B, self._H, T, dtype=torch.long)
        self._res: dict[int, torch.Tensor] = {}

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        if name.endswith("hook_pattern"):
            H = tensor.shape[1]
            self._argmax[layer_of(name), :, :H, q_start:q_start + tensor.shape[2]] = tensor.detach().argmax(-1).cpu()
        elif name.endswith("hook_result"):
            self._res[layer_of(name)] = tensor.detach()[self._rows.to(tensor.device)].float()  # [N, H, M]
        if name == self._last:
            self._finish(tensor.detach().float())

    def _finish(self, resid: torch.Tensor) -> None:
        rows = self._rows.to(resid.device)
        x = resid[rows]  # [N, M]
        N = x.shape[0]
        if N == 0:
            return
        ln = self.model.ln_final
        W_U = self.model.unembed.weight.float()  # [V, M]
        if isinstance(ln, torch.nn.LayerNorm):
            scale = (x.var(-1, unbiased=False, keepdim=True) + ln.eps).rsqrt()  # [N, 1]
            center, weight = True, ln.weight
        elif isinstance(ln, torch.nn.RMSNorm):
            eps = ln.eps if ln.eps is not None else torch.finfo(x.dtype).eps
            scale = (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()  # [N, 1]
            center, weight = False, ln.weight
        else:
            scale, center, weight = torch.ones(N, 1, device=x.device), False, None
        b_idx, q_idx = rows.nonzero(as_tuple=True)  # [N]
        # The same comparison tokens serve every layer of a row (drawn once a batch, on the CPU generator).
        compare = (None if self.comparisons is None else torch.randint(
            W_U.shape[0], (N, self.comparisons), generator=self._cmp_gen).to(x.device))  # [N, K]
        for layer, r in self._res.items():
            H = r.shape[1]
            if not H:
                continue
            if center:
                r = r - r.mean(-1, keepdim=True)
            r = r * scale[:, None]  # [N, H, M]
            if weight is not None:
                r = r * weight.float()
            key = self._argmax[layer][b_idx.cpu(), :H, q_idx.cpu()]  # [N, H]
            attended = self._tokens[b_idx.cpu()[:, None], key].to(r.device)  # [N, H]
            if compare is None:
                below = self._below_exact(r, attended, W_U)
            else:
                below = self._below_sampled(r, attended, W_U, compare)
            self.state["sum"][layer, :H] += below.sum(0).double().cpu()
        self.state["rows"] += N

    @staticmethod
    def _below_exact(r: torch.Tensor, attended: torch.Tensor, W_U: torch.Tensor) -> torch.Tensor:
        """``[N, H]``: share of the whole vocabulary whose direct logit is strictly below the attended token's."""
        N, H = attended.shape
        V = W_U.shape[0]
        step = max(1, 2 ** 24 // (H * V))  # rows per chunk: bounds the [n, H, V] logits tensor
        out = []
        for i in range(0, N, step):
            logits = r[i:i + step] @ W_U.T  # [n, H, V]
            own = logits.gather(-1, attended[i:i + step, :, None])  # [n, H, 1]
            out.append((logits < own).float().mean(-1))  # [n, H]
        return torch.cat(out)

    @staticmethod
    def _below_sampled(r: torch.Tensor, attended: torch.Tensor, W_U: torch.Tensor,
                       compare: torch.Tensor) -> torch.Tensor:
        """``[N, H]``: share of each row's comparison tokens ``compare [N, K]`` strictly below the attended
        token's direct logit (a draw of the attended token itself never counts, as in the exact score)."""
        N, H = attended.shape
        K, M = compare.shape[1], W_U.shape[1]
        own = (r * W_U[attended]).sum(-1, keepdim=True)  # [N, H, 1]: the attended token's gathered column
        step = max(1, 2 ** 24 // (K * max(H, M)))  # rows per chunk: bounds the [n, K, M] gather and logits
        out = []
        for i in range(0, N, step):
            cols = W_U[compare[i:i + step]]  # [n, K, M]
            logits = torch.bmm(r[i:i + step], cols.transpose(1, 2))  # [n, H, K]
            below = (logits < own[i:i + step]) & (compare[i:i + step, None, :] != attended[i:i + step, :, None])
            out.append(below.float().mean(-1))  # [n, H]
        return torch.cat(out)

    def result(self) -> torch.Tensor:
        rows = float(self.state["rows"])
        return self.state["sum"] / rows if rows else torch.full_like(self.state["sum"], torch.nan)


# --- public ---------------------------------------------------------------------------------------------
def induction_scores(
    model: Transformer,
    tokens: torch.Tensor | object = None,
    *,
    definition: str = "interp",
    n_seqs: int = 32,
    half_len: int | None = None,
    seed: int = 0,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    copying: bool = True,
    copying_comparisons: int | None = 256,
    batch_size: int = 32,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Previous-token, duplicate-token, induction (prefix-matching) and copying scores of every head.

    Args:
        model: an interp Transformer (decoder or encoder).
        tokens: token ids to score on (LongTensor ``[N, T]`` or an iterable of batches); default: repeated
            random sequences from :func:`repeated_tokens_for` (``n_seqs``, ``half_len``, ``seed``).
        definition: ``"interp"`` or ``"transformer_lens"`` (see the module docstring for the difference).
        n_seqs, half_len, seed: the default data.
        exclude_bos, exclude_current_token: ``"transformer_lens"`` only, as in TL's ``detect_head``.
        copying: compute the copying score (needs ``model.W_U``; NaN for models without unembedding).
        copying_comparisons: vocabulary tokens each row's attended token is ranked against
            (:class:`CopyingReducer`'s ``comparisons``); None: the whole vocabulary (exact, slow on a large one).
        batch_size: rows per forward pass when ``tokens`` is one tensor.
        progress: a per-batch progress bar on stderr (None: on in terminals and notebooks).

    Returns:
        DataFrame, one row per head: ``layer, head, previous_token, duplicate_token, induction, copying``;
        with ``definition="interp"`` also ``previous_token_argmax, duplicate_token_argmax,
        induction_argmax`` (fraction of rows whose unique argmax is a target). ``df.attrs`` holds
        ``definition`` and ``rows`` (rows per score, interp) or ``n_sequences``.

    Raises:
        ValueError: unknown definition, an empty dataset, or sequences longer than the model's context.

    Example:
        >>> df = induction_scores(model)
        >>> df.sort_values("induction").tail(3)
    """
    if definition not in _DEFINITIONS:
        raise ValueError(f"definition={definition!r} is not one of {_DEFINITIONS}")
    if definition == "interp" and (exclude_bos or exclude_current_token):
        raise ValueError("exclude_bos / exclude_current_token apply to definition='transformer_lens' only")
    reducers = induction_reducers(model, definition=definition, exclude_bos=exclude_bos,
                                  exclude_current_token=exclude_current_token, copying=copying,
                                  copying_comparisons=copying_comparisons)
    if tokens is None:
        tokens = repeated_tokens_for(model, n_seqs, half_len, seed=seed)
    n_seq = stream(model, tokens, reducers, batch_size=batch_size, name="tokens",
                   progress=progress, desc="induction_scores")
    return induction_table(model, reducers, n_seq)


def induction_reducers(model: Transformer, *, definition: str = "interp", exclude_bos: bool = False,
                       exclude_current_token: bool = False, copying: bool = True,
                       copying_rows: int | None = None, copying_comparisons: int | None = 256) -> list[Reducer]:
    """The streaming pieces of :func:`induction_scores`: the attention scores of ``definition``, then the
    copying score when asked for and the model has an unembedding (pre-LN), on at most ``copying_rows`` rows
    per batch against ``copying_comparisons`` tokens a row (:class:`CopyingReducer`'s ``max_rows`` and
    ``comparisons``).

    Raises:
        ValueError: unknown definition, or TL-only options with ``definition="interp"``.
    """
    if definition not in _DEFINITIONS:
        raise ValueError(f"definition={definition!r} is not one of {_DEFINITIONS}")
    if definition == "interp" and (exclude_bos or exclude_current_token):
        raise ValueError("exclude_bos / exclude_current_token apply to definition='transformer_lens' only")
    reds: list[Reducer] = [InductionReducer(model) if definition == "interp" else TLHeadDetectorReducer(
        model, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token)]
    if copying and getattr(model, "unembed", None) is not None and model.cfg.normalization != "post":
        reds.append(CopyingReducer(model, max_rows=copying_rows, comparisons=copying_comparisons))
    return reds


def induction_table(model: Transformer, reducers: list[Reducer], n_sequences: int) -> pd.DataFrame:
    """The :func:`induction_scores` table from the reducers of :func:`induction_reducers`."""
    scores, copy_red = reducers[0], (reducers[1] if len(reducers) > 1 else None)
    L, H = model.cfg.n_layers, max(head_counts(model), default=0)
    copy = copy_red.result() if copy_red is not None else torch.full((L, H), torch.nan)
    definition = "interp" if isinstance(scores, InductionReducer) else "transformer_lens"
    if definition == "interp":
        res = scores.result()
        cols = {k: res[k]["mass"] for k in _KINDS} | {f"{k}_argmax": res[k]["argmax"] for k in _KINDS}
    else:
        cols = scores.result()
    rows = []
    for layer, head in heads_of(model):
        row = {"layer": layer, "head": head}
        row.update({k: float(v[layer, head]) for k, v in cols.items() if k in _KINDS})
        row["copying"] = float(copy[layer, head])
        row.update({k: float(v[layer, head]) for k, v in cols.items() if k not in _KINDS})
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["definition"] = definition
    df.attrs["n_sequences"] = n_sequences
    if definition == "interp":
        df.attrs["rows"] = {k: res[k]["rows"] for k in _KINDS}
    return df
