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
from ..quantized import unembed_rows
from ..streaming import Reducer, stream
from ._stream import (
    PATTERN_HOOKS,
    TargetReducer,
    first_argmax,
    head_grid,
    heads_of,
    key_allowed,
    layer_of,
    offset_targets,
    row_maxima,
    state_device,
    zeros64,
)

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["induction_scores", "repeated_tokens_for", "induction_targets", "tl_detection_patterns", "tl_detection_rows",
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


def tl_detection_rows(tokens: torch.Tensor, mask: torch.Tensor | None, rows: slice, n_keys: int
                      ) -> dict[str, torch.Tensor]:
    """The rows ``rows`` of :func:`tl_detection_patterns` of every sequence of a batch, placed at its real tokens'
    positions, for its first ``n_keys`` keys: ``{kind: [B, T', n_keys] bool}``, built without a ``[T, T]`` matrix.

    TL scores each unpadded sequence, so "previous" means the previous real token: previous-token is the key that
    precedes the query among the real tokens; duplicate-token the earlier real keys holding the query's token;
    induction the real keys up to the query (itself included) whose previous real token is the query's token.

    Args:
        tokens: ``[B, T]`` token ids.
        mask: ``[B, T]`` attention mask (1 = real token) or None.
        rows: the query positions.
        n_keys: the keys to cover (``T``, or fewer for a causal chunk cut after its last query).

    Returns:
        ``{"previous_token", "duplicate_token", "induction": [B, T', n_keys] bool}``.

    Example:
        >>> import torch
        >>> from interp.analysis.induction import tl_detection_patterns, tl_detection_rows
        >>> toks = torch.tensor([[5, 6, 7, 5, 6, 7]])
        >>> rows = tl_detection_rows(toks, None, slice(2, 5), 5)
        >>> torch.equal(rows["induction"][0].float(), tl_detection_patterns(toks[0])["induction"][2:5, :5])
        True
    """
    B, T = tokens.shape
    real = Batch(tokens, mask).real  # [B, T]
    pos = torch.arange(T)
    # The previous real position of each position (-1: none): the running maximum of the real positions before it.
    before = torch.where(real, pos, -1).cummax(1).values  # [B, T] the last real position <= each position
    prev_pos = torch.cat([torch.full((B, 1), -1), before[:, :-1]], 1)  # [B, T]
    prev_tok = tokens.gather(1, prev_pos.clamp(min=0))  # [B, T] (meaningless where prev_pos < 0)
    q, k = pos[rows], pos[:n_keys]  # [T'], [n]
    tok_q, real_q = tokens[:, rows], real[:, rows]  # [B, T'] each
    both = real_q[:, :, None] & real[:, None, :n_keys]  # [B, T', n]: TL sees real tokens only
    return {
        "previous_token": both & (k[None, None, :] == prev_pos[:, rows, None]),
        "duplicate_token": both & (k[None, :] < q[:, None])[None] & (tok_q[:, :, None] == tokens[:, None, :n_keys]),
        "induction": both & (k[None, :] <= q[:, None])[None] & (prev_pos[:, None, :n_keys] >= 0)
        & (tok_q[:, :, None] == prev_tok[:, None, :n_keys]),
    }


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
    reads_query_chunks = True
    reads_cut_rows = True  # the detection rows are cut to the chunk's keys

    def __init__(self, model: Transformer, *, exclude_bos: bool = False, exclude_current_token: bool = False) -> None:
        super().__init__()
        self.exclude_bos = exclude_bos
        self.exclude_current = exclude_current_token
        L, H = head_grid(model)
        self._shape = (L, H)
        self._dev = state_device(model)
        self.state = {f"sum_{k}": zeros64(L, H, device=self._dev) for k in _KINDS}
        self.state["n_sequences"] = zeros64(device=self._dev)

    def begin_batch(self, batch: Batch) -> None:
        tokens = batch.tokens
        B = tokens.shape[0]
        self._batch = batch
        self._real = batch.real.to(self._dev)  # [B, T]
        L, H = self._shape
        self._num = {k: zeros64(B, L, H, device=self._dev) for k in _KINDS}
        self._den = zeros64(B, L, H, device=self._dev)

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        layer = layer_of(name)
        q0 = q_start
        p = tensor.detach().float().clone()  # [B, H, Tc, S] (S = q0 + Tc when handed over cut)
        H, Tc, S = p.shape[1], p.shape[2], p.shape[3]
        p = p * self._real[:, None, q0:q0 + Tc, None].to(p)  # padding rows do not exist in TL's run
        if self.exclude_bos:
            p[..., 0] = 0
        if self.exclude_current:
            rows = torch.arange(Tc)
            p[:, :, rows, rows + q0] = 0
        self._den[:, layer, :H] += p.sum((2, 3)).to(self._den)
        # The chunk's detection rows, built anew for each layer: keeping them would hold [B, T, T] per batch.
        dets = tl_detection_rows(self._batch.tokens, self._batch.mask, slice(q0, q0 + Tc), S)
        for k in _KINDS:
            det = dets[k].to(p)  # [B, Tc, S]
            self._num[k][:, layer, :H] += (p * det[:, None]).sum((2, 3)).to(self._den)

    def end_batch(self) -> None:
        for k in _KINDS:
            # Heads a pruned layer lacks have a zero denominator: they add 0, not NaN.
            self.state[f"sum_{k}"] += (self._num[k] / self._den.masked_fill(self._den == 0, 1)).sum(0)
        self.state["n_sequences"] += self._den.shape[0]

    def result(self) -> dict[str, torch.Tensor]:
        n = max(float(self.state["n_sequences"]), 1.0)
        return {k: self.state[f"sum_{k}"].cpu() / n for k in _KINDS}


#: The fewest comparison tokens a row draws under a batch budget (:func:`comparison_draws`): a row's own
#: fraction keeps a standard error <= 0.0625.
MIN_COMPARISONS = 64


def comparison_draws(n_rows: int, comparisons: int, budget: int | None) -> int:
    """Comparison tokens each of a batch's ``n_rows`` rows draws for the copying score: ``comparisons``, or fewer
    when the batch would draw more than ``budget`` in all, never under :data:`MIN_COMPARISONS` (nor over
    ``comparisons``). See :class:`CopyingReducer`.

    Args:
        n_rows: rows scored in the batch.
        comparisons: draws a row without a budget.
        budget: draws a batch, at most; None: no budget.

    Returns:
        Draws per row.

    Example:
        >>> from interp.analysis.induction import comparison_draws
        >>> [comparison_draws(n, 256, 2**18) for n in (800, 1024, 2048, 4096, 100_000)]
        [256, 256, 128, 64, 64]
    """
    if budget is None:
        return comparisons
    return min(comparisons, max(MIN_COMPARISONS, budget // max(n_rows, 1)))


class CopyingReducer(Reducer):
    """Copying score: does a head's direct effect on the logits raise the token it attends to?

    For every row with an induction target, take the head's residual write, pass it through the final norm
    with the scale frozen at the full residual's value (direct logit attribution) and the unembedding, and find
    the rank of the attended token (the token at the row's argmax key) among the vocabulary. The residual write
    is ``z_h W_O[h]`` (what ``hook_result`` holds) on a block whose attention output enters the residual as it
    is; where a norm follows attention (``sublayer_norm`` ``"sandwich"``, Gemma 2/3, or ``"output"``, OLMo 2)
    it is that share passed through the norm with the summed output's scale: ``w_post * z_h W_O[h] / rms(sum)``
    (a LayerNorm also centres it). The score is the mean fraction of the vocabulary whose direct logit
    is strictly below the attended token's: 1 = always the top logit, ~0.5 = chance, 0 for a head that writes
    nothing the unembedding reads. State: ``sum`` ``[L, H_max]`` and ``rows``.

    The frozen norm scales (the final norm's, and the output norm's ``rms(sum)`` of the same pass) are positive
    numbers per row, the same for every token, so they cannot change which logits lie below the attended one:
    they are left out, and the pass needs nothing after the last layer's ``hook_z``
    (:func:`~interp.streaming.stream` stops there). The final norm's weight (and a LayerNorm's centring,
    ``(r - mean r) . u = r . (u - mean u)``) is applied to the unembedding columns instead of to every write;
    an output norm's weight (and centring) is folded into the layer's ``W_O``.

    The exact fraction costs ``heads x vocabulary x d_model`` multiply-adds a row (SmolLM2: 270 x 49,152 x
    576, ~7.6 GFLOP), far more than the forward pass. With ``comparisons=K`` (default 256) each row is instead
    compared with ``K`` tokens drawn uniformly from the vocabulary (with replacement, fresh for every row,
    seeded): the attended token's logit is one gathered column of ``W_U``, the comparison logits one
    ``[all heads, d_model] x [d_model, K]`` product per row (every layer's heads at once, ~80 MFLOP a row on
    SmolLM2). The per-row fraction is then an unbiased estimate of the exact one (a draw of the attended token
    itself never counts as below, as in the exact score), with standard error ``sqrt(p (1 - p) / K)`` per row;
    the draws being independent across rows, a head's score over ``N`` rows has standard error at most
    ``0.5 / sqrt(K N)`` (SmolLM2's 800 default rows, K = 256: <= 0.0011). A vocabulary of at most ``K`` tokens
    (or ``comparisons=None``) is scored exactly.

    A batch of many rows needs fewer draws a row for the same precision: each batch draws at most
    ``comparison_budget`` tokens in all (:func:`comparison_draws`), so a head's standard error stays <= 0.001
    (``0.5 / sqrt(2**18)``) from 1,024 rows up, while the cost, ``N`` x heads x d_model x ``(K + d_head)``, no
    longer grows with ``K N`` (SmolLM2 at 8,192 tokens, 4,096 rows: 64 draws a row, the batch's scoring ~6.6 s
    of a 63 s pass down to ~2.5 s). Batches of at most 1,024 rows keep ``comparisons``.

    Precision and place: z and the weights are read in float32 (a bf16 model's z is upcast), the sums are
    float64 on the model's device, and only :meth:`result` copies them to the host.

    Args:
        model: the model whose heads are scored.
        max_rows: score at most this many rows per batch, drawn at random (seeded) among the rows with an
            induction target; None scores them all.
        seed: seeds the row sample and the comparison tokens.
        comparisons: comparison tokens drawn per row (at most); None: the whole vocabulary (exact).
        comparison_budget: comparison tokens drawn per batch (at most; never under
            :data:`MIN_COMPARISONS` a row); None: always ``comparisons`` a row.

    Raises:
        ValueError: ``max_rows``, ``comparisons`` or ``comparison_budget`` < 1, or a model without unembedding.
    """

    reads_query_chunks = True
    reads_cut_rows = True  # a causal row's argmax lies at a key <= its query

    def __init__(self, model: Transformer, *, max_rows: int | None = None, seed: int = 0,
                 comparisons: int | None = 256, comparison_budget: int | None = 2**18) -> None:
        super().__init__()
        unembed = model.unembed
        if unembed is None:
            raise ValueError(f"the copying score reads the unembedding: model {model.name!r} has none "
                             "(cfg.unembed=False)")
        self._unembed = unembed
        for name, v in (("max_rows", max_rows), ("comparisons", comparisons),
                        ("comparison_budget", comparison_budget)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name}={v!r} must be an int >= 1 or None")
        self.max_rows = max_rows
        V = model.cfg.d_vocab  # not unembed.weight.shape: a quantised unembedding would dequantise to say it
        self.comparisons = None if comparisons is None or comparisons >= V else comparisons
        self.comparison_budget = comparison_budget
        self._gen = torch.Generator().manual_seed(seed)
        self._cmp_gen = torch.Generator().manual_seed(seed + 1)
        L = model.cfg.n_layers
        self.model = model
        self.names = [PATTERN_HOOKS, "blocks.*.attn.hook_z"]
        self._H = head_grid(model)[1]
        self._dev = state_device(model)
        self.state = {"sum": zeros64(L, self._H, device=self._dev), "rows": zeros64(device=self._dev)}

    def begin_batch(self, batch: Batch) -> None:
        tokens = batch.tokens
        T = tokens.shape[1]
        # The query rows scored: real rows with an induction target, built in row chunks (no [T, S] at once).
        # All of this is on the host, from the batch's tokens: no device sync.
        chunks = [induction_targets(tokens, batch.mask, self.model.cfg.causal, slice(i, min(i + 1024, T)))
                  ["induction"].any(-1) for i in range(0, T, 1024)]
        self._rows = torch.cat(chunks, dim=1) & batch.real  # [B, T]
        if self.max_rows is not None and int(self._rows.sum()) > self.max_rows:
            where = self._rows.flatten().nonzero().flatten()  # [N] flat indices of the candidate rows
            keep = where[torch.randperm(len(where), generator=self._gen)[:self.max_rows]]  # [max_rows]
            self._rows = torch.zeros_like(self._rows).flatten().index_fill_(0, keep, True).view_as(self._rows)
        self._b, self._q = self._rows.nonzero(as_tuple=True)  # [N] each, row-major (host)
        N = len(self._b)
        dev = self._dev
        self._tokens = tokens.to(dev)
        self._at = {k: v.to(dev) for k, v in (("b", self._b), ("q", self._q))}
        self._chunk_rows: dict[tuple[int, int], torch.Tensor] = {}  # (q0, Tc) -> rows of that query chunk
        self._attended: dict[int, torch.Tensor] = {}  # layer -> [N, H] the token at each row's argmax key
        self._z: dict[int, torch.Tensor] = {}  # layer -> [N, H, D] float32
        # The same comparison tokens serve every layer of a row (drawn once a batch, on the host generator).
        self._compare = (None if self.comparisons is None or N == 0 else torch.randint(
            self.model.cfg.d_vocab, (N, comparison_draws(N, self.comparisons, self.comparison_budget)),
            generator=self._cmp_gen).to(dev))  # [N, K]

    def update(self, name: str, tensor: torch.Tensor, *, q_start: int) -> None:
        if not len(self._b):
            return
        layer = layer_of(name)
        if name.endswith("hook_pattern"):
            B, H, Tc, S = tensor.shape
            if not H:
                return
            key = (q_start, Tc)
            if key not in self._chunk_rows:  # the rows whose query lies in this chunk, found on the host
                self._chunk_rows[key] = ((self._q >= q_start) & (self._q < q_start + Tc)).nonzero().flatten().to(
                    self._dev)
            sel = self._chunk_rows[key]  # [n]
            if not len(sel):
                return
            b, q = self._at["b"][sel].to(tensor.device), self._at["q"][sel].to(tensor.device)
            # A causal row is 0 after its query (never the max).
            n_keys = min(S, q_start + Tc) if self.model.cfg.causal else S
            if 2 * len(sel) > B * Tc:  # most rows scored: the chunk's argmax, shared with the induction scores
                best = row_maxima(tensor, n_keys).best[b, :, q - q_start].to(self._dev)  # [B, H, Tc] -> [n, H]
            else:
                best = first_argmax(tensor.detach()[b, :, q - q_start, :n_keys]).to(self._dev)  # [n, H, S'] -> [n, H]
            attended = self._tokens[self._at["b"][sel][:, None], best]  # [n, H]
            if layer not in self._attended:
                self._attended[layer] = torch.zeros(len(self._b), H, dtype=torch.long, device=self._dev)
            self._attended[layer][sel] = attended
        else:  # hook_z [B, T, H, D]: keep the scored rows only
            b, q = self._at["b"].to(tensor.device), self._at["q"].to(tensor.device)
            self._z[layer] = tensor.detach()[b, q].to(self._dev, torch.float32)  # [N, H, D]

    @staticmethod
    def _through(norm: torch.nn.Module | None, rows: torch.Tensor) -> torch.Tensor:
        """Vectors ``[..., M]`` through ``norm`` with its positive per-row scale left out: times its weight and,
        for a LayerNorm, centred (linear, so it may act on a head's share of the normalised sum or on the
        unembedding columns the normalised residual meets)."""
        if isinstance(norm, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
            if norm.weight is not None:
                rows = rows * norm.weight.detach().to(rows)
            if isinstance(norm, torch.nn.LayerNorm):
                rows = rows - rows.mean(-1, keepdim=True)
        return rows

    def _readout(self, cols: torch.Tensor) -> torch.Tensor:
        """Unembedding columns ``[..., M]`` as a head's write meets them through the final norm."""
        return self._through(self.model.ln_final, cols)

    #: Float32 bytes of W_O held at once: layers are scored in groups below this (one group for small models,
    #: SmolLM2's 30 layers take 40 MB; Llama-3.1-8B's 32 layers of [4096, 4096], 2.1 GB, go one at a time).
    W_O_GROUP_BYTES = 64 * 2**20
    #: Elements of the largest per-step temporary (``[n, A, M]`` writes, their gathered unembedding columns,
    #: ``[n, A, K]`` logits): 4M floats keep a step's operands in the last-level cache, where 16M (~64 MB each)
    #: made the gathers and products memory-bound (SmolLM2 at 1k tokens: 1.9 s a batch instead of 2.4-3.2 s).
    STEP_ELEMENTS = 2**22

    def _layer_groups(self, layers: list[int]) -> list[list[int]]:
        groups: list[list[int]] = [[]]
        size = 0
        for layer in layers:
            w = self.model.blocks[layer].attn.W_O
            nbytes = w.in_features * w.out_features * 4
            if groups[-1] and size + nbytes > self.W_O_GROUP_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(layer)
            size += nbytes
        return groups

    def end_batch(self) -> None:
        N = len(self._b)
        layers = [layer for layer in sorted(self._z) if self._z[layer].shape[1] and layer in self._attended]
        if N == 0 or not layers:
            self._z, self._attended = {}, {}
            return
        dev, f32 = self._dev, torch.float32
        attended = torch.cat([self._attended[layer] for layer in layers], dim=1)  # [N, A]: every scored head
        compare = self._compare
        if compare is None:
            W_U = self._unembed.weight.detach().to(dev, f32)  # [V, M]
        else:
            # Only the columns compared are read (row-wise the same numbers): a quantised unembedding
            # dequantises those rows, never the whole [V, M] table.
            needed, where = torch.unique(torch.cat([attended.flatten(), compare.flatten()]), return_inverse=True)
            attended = where[:attended.numel()].view_as(attended)  # [N, A] rows of W_U below
            compare = where[attended.numel():].view_as(compare)  # [N, K]
            W_U = unembed_rows(self._unembed, needed).detach().to(dev, f32)  # [u, M]
        U = self._readout(W_U)  # [V or u, M], once a batch: cheaper than on every gathered column
        first = 0  # the group's first column of `attended`
        for group in self._layer_groups(layers):
            heads_w_o: list[torch.Tensor] = []
            flat = []
            for layer in group:
                attn = self.model.blocks[layer].attn
                w = attn.W_O_heads.detach().to(dev, f32)  # [H, D, M]
                if attn.gate is not None:
                    w = w * attn.gate.detach().to(dev, f32)[:, None, None]  # gated head h writes gate_h z_h W_O[h]
                # A norm after attention (sandwich / output) reaches the residual: its weight (and centring) acts on
                # each head's share of the sum; its scale rms(sum) is one positive number a row, as the final one.
                w = self._through(getattr(self.model.blocks[layer], "ln1_post", None), w)  # [H, D, M]
                heads_w_o.append(w)
                flat.append(layer * self._H + torch.arange(w.shape[0], device=dev))
            w_o = torch.cat(heads_w_o)  # [A, D, M]: every scored head of the group's layers (A heads)
            A, M = w_o.shape[0], U.shape[1]
            att_group = attended[:, first:first + A]  # [N, A]
            first += A
            K = U.shape[0] if compare is None else compare.shape[1]
            step = max(1, self.STEP_ELEMENTS // (A * max(K, M)))  # rows per chunk: bounds the [n, A, M] writes, [n, A, K] logits
            # Filled in place: a small tensor kept from every step would sit among the steps' freed temporaries
            # and split them, so that each step's temporaries take fresh heap (glibc; 2-3 GB more at 8k tokens).
            below = torch.empty(N, A, dtype=torch.long, device=dev)  # [N, A]: comparison tokens below, counted
            for i in range(0, N, step):
                # The step's rows of every layer's z, gathered per step: no [N, A, D] copy of them all at once.
                z = torch.cat([self._z[layer][i:i + step] for layer in group], dim=1)  # [n, A, D]
                r = torch.einsum("nad,adm->nam", z, w_o)  # [n, A, M]: each head's residual write
                att = att_group[i:i + step]  # [n, A]
                if compare is None:
                    logits = r @ U.T  # [n, A, V]
                    own = logits.gather(-1, att[..., None])  # [n, A, 1]
                    torch.sum(logits < own, dim=-1, out=below[i:i + step])  # [n, A]: tokens below, counted
                    continue
                cmp = compare[i:i + step]  # [n, K]
                own = torch.linalg.vecdot(r, U[att]).unsqueeze(-1)  # [n, A, 1]: the attended token's column
                logits = torch.bmm(r, U[cmp].transpose(1, 2))  # [n, A, K]
                hit = (logits < own) & (cmp[:, None, :] != att[..., None])  # [n, A, K]
                torch.sum(hit, dim=-1, out=below[i:i + step])  # [n, A]
            # Counts add exactly, in any order: a head's sum is the same bits whichever heads are scored with it
            # (a pipeline's rank scores its own layers' heads only). One division by K turns it into fractions.
            total = below.sum(0).to(self.state["sum"].dtype) / K  # [A]: summed per-row fractions
            self.state["sum"].view(-1).index_add_(0, torch.cat(flat), total.to(self.state["sum"]))
        self.state["rows"] += N
        self._z, self._attended = {}, {}

    def result(self) -> torch.Tensor:
        """``[L, H_max]`` mean copying score per head (on the host; NaN before any row was scored)."""
        total, rows = self.state["sum"].cpu(), float(self.state["rows"])
        return total / rows if rows else torch.full_like(total, torch.nan)


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
            (:class:`CopyingReducer`'s ``comparisons``; a batch of more than 1,024 rows draws fewer a row, see
            :func:`comparison_draws`); None: the whole vocabulary (exact, slow on a large one).
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
        >>> from interp.analysis.induction import induction_scores
        >>> from interp.examples import model
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
    L, H = head_grid(model)
    copy = copy_red.result() if copy_red is not None else torch.full((L, H), torch.nan)
    definition = "interp" if isinstance(scores, InductionReducer) else "transformer_lens"
    if definition == "interp":
        res = scores.result()
        cols = {k: res[k]["mass"] for k in _KINDS} | {f"{k}_argmax": res[k]["argmax"] for k in _KINDS}
    else:
        cols = scores.result()
    rows = []
    for layer, head in heads_of(model):
        row: dict[str, float] = {"layer": layer, "head": head}
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
