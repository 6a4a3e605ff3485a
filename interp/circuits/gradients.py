"""The gradient pass of EAP and EAP-IG: one forward that records every node's write, one backward that folds each
downstream input's gradient into the edge scores as it arrives.

The forward is the model's own: nothing is recomputed per head. EAP-IG's points on the path run as copies of the
batch in one forward and one backward; a gradient is summed over the copies when it is folded, since every copy
multiplies the same differences. Each node's write is subtracted from the
corrupted run's as it is made, so the differences ``[U, B, T, M]`` take no second buffer. Gradients are caught
where the model already splits by input: at ``hook_q`` / ``hook_k`` / ``hook_v`` (``[B, T, n, D]``, one slice
per head), at the MLP's normalised input and at the final residual. A layer's head gradients become gradients
with respect to the residual each head's query, key or value reads by one product with ``W_qkv``'s rows per
head and the vector-Jacobian product of the block's norm at the recorded residual (closed forms for RMSNorm
and LayerNorm); an MLP input's by the norm's product alone; the logits read the residual itself.

The pass stops at the final residual, the logits' input, hooked whole; a metric with ``reads_last_only = True``
gets the last position's logits alone.

Each gradient block ``[B, T, n, M]`` is copied into a bounded buffer ``[C, B*T*M]`` of columns; when the next
block does not fit, the buffer is folded into the scores by matrix products with the prefix of the upstream
differences ``[U', B*T*M]`` that can feed its columns. Memory is the buffer, not a gradient per edge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .graph import Graph
from .patch import node_hooks

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["DEFAULT_BUFFER_BYTES", "gradient_scores"]

Metric = Callable[[torch.Tensor], torch.Tensor]

#: Default bound on the gradient columns held before they are folded into the scores (256 MiB).
DEFAULT_BUFFER_BYTES = 256 * 2**20
#: Columns per product when the buffer is folded: a few layers' inputs, whose upstream prefixes are close.
_FOLD_BLOCK = 64


class _Folder:
    """Gradient columns waiting to be multiplied with the upstream differences (see the module docstring)."""

    def __init__(self, graph: Graph, diff: torch.Tensor, scores: torch.Tensor, buffer_bytes: int) -> None:
        U = diff.shape[0]
        self.flat = diff.reshape(U, -1)  # [U, U_rows=B*T*M]
        N = self.flat.shape[1]
        # Only nodes that write before an input reads can feed it: a prefix of the upstream order per column.
        has = graph.allowed.any(dim=0)
        last = torch.where(has, U - 1 - graph.allowed.flip(0).int().argmax(dim=0), -1)  # [D]
        self.n_up = (last + 1).tolist()
        # The widest block arrives at once: a layer's query, key and value inputs together.
        widest = max([h + 2 * k for h, k in zip(graph.heads, graph.kv_heads)] + [1])
        cap = max(widest, min(graph.allowed.shape[1], buffer_bytes // max(1, N * self.flat.element_size())))
        self.buf = self.flat.new_empty(cap, N)  # [C, B*T*M]
        self.cols: list[int] = []
        self.scores = scores

    def reserve(self, cols: slice) -> torch.Tensor:
        """Room for the gradients of the inputs ``cols``: a ``[n, B*T*M]`` view of the buffer that the caller
        fills (folding what is queued first when they do not fit)."""
        n = cols.stop - cols.start
        if len(self.cols) + n > self.buf.shape[0]:
            self.flush()
        k = len(self.cols)
        self.cols += range(cols.start, cols.stop)
        return self.buf[k:k + n]

    def flush(self) -> None:
        """Fold the queued columns into the scores: ``scores[:U', cols] += diff[:U'] @ grads^T``, in blocks of
        a few layers' columns so that each block multiplies only the upstream prefix its columns can read."""
        for start in range(0, len(self.cols), _FOLD_BLOCK):
            cols = self.cols[start:start + _FOLD_BLOCK]
            n_up = max(self.n_up[c] for c in cols)
            if n_up > 0:
                self.scores[:n_up, cols] += self.flat[:n_up] @ self.buf[start:start + len(cols)].T  # [U', k]
        self.cols = []


def _norm_vjp(norm: torch.nn.Module, resid: torch.Tensor, grad: torch.Tensor, out: torch.Tensor) -> None:
    """Bring ``grad`` ``[n, R*T, M]`` at the norm's output back to its input ``resid`` ``[R, T, M]`` (the same
    residual for each of the n inputs), writing ``out`` ``[n, R*T, M]`` (float32).

    The norms :func:`~interp.model.make_norm` builds have closed forms (``u = weight * grad``, per position):
    RMSNorm ``r u - x r^3 (u . x) / M`` with ``r = 1 / rms(x)``; LayerNorm ``(u - mean(u) - x_hat mean(u
    x_hat)) / sigma``. They are evaluated with the per-position factors folded into ``[R*T, M]`` vectors, so
    the n gradients are read twice. Any other module is differentiated by autograd, batched over the n.
    """
    M = resid.shape[-1]
    x = resid.detach().float().reshape(-1, M)  # [R*T, M]
    g = grad.float()
    if isinstance(norm, torch.nn.Identity):
        out.copy_(g)
        return
    if isinstance(norm, torch.nn.RMSNorm | torch.nn.LayerNorm) and norm.normalized_shape == (M,):
        w = torch.ones(M, dtype=x.dtype, device=x.device) if norm.weight is None else norm.weight.detach().float()
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        if isinstance(norm, torch.nn.RMSNorm):
            r = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)  # [R*T, 1]
            ux = torch.einsum("npm,pm->np", g, w * x)  # [n, R*T]: u . x
            torch.mul(g, w * r, out=out)  # r u
            out.addcmul_((ux * (r ** 3 / M).T)[..., None], x[None], value=-1)  # - x r^3 (u . x) / M
            return
        inv = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps)  # [R*T, 1]
        xh = (x - x.mean(-1, keepdim=True)) * inv  # [R*T, M]
        u_mean = (g @ w / M) * inv.T  # [n, R*T]: mean(u) / sigma
        uxh_mean = torch.einsum("npm,pm->np", g, w * xh) / M  # [n, R*T]: mean(u x_hat)
        torch.mul(g, w * inv, out=out)  # u / sigma
        out.sub_(u_mean[..., None])
        out.addcmul_(uxh_mean[..., None], (xh * inv)[None], value=-1)  # - x_hat mean(u x_hat) / sigma
        return
    with torch.enable_grad():
        xg = resid.detach().requires_grad_(True)
        y = norm(xg)
        (dx,) = torch.autograd.grad(y, xg, g.view(-1, *resid.shape).to(y.dtype), is_grads_batched=True)
    out.copy_(dx.reshape(out.shape))  # [n, R, T, M] -> [n, R*T, M]


class _GradientPass:
    """The hooks of one gradient pass (see the module docstring)."""

    def __init__(self, model: Transformer, graph: Graph, *, alphas: tuple[float, ...], start: torch.Tensor | None,
                 source: torch.Tensor | None) -> None:
        self.model, self.graph = model, graph
        #: Copy s of the batch reads the embedding start + alphas[s] (own - start); the last copy's writes are
        #: the ones subtracted from the source.
        self.alphas, self.start = alphas, start
        #: With a source ([U, B, T, M] float32), each write is subtracted from it as it is made: source
        #: becomes the differences without a second [U, B, T, M] buffer.
        self.source = source
        self.n_up = 0
        #: The 0-d leaf added to the embedding: the pass requires grad whatever the parameters do, and backward
        #: into it alone computes no parameter gradient.
        self.base = torch.zeros((), requires_grad=True)
        self.resid: dict[tuple[int, str], torch.Tensor] = {}  # (layer, "pre"|"mid") -> [R, T, M], detached
        self.folder: _Folder | None = None
        self.qkv_grads: dict[int, dict[str, torch.Tensor]] = {}  # layer -> the q / k / v gradients so far

    def _fold(self, cols: slice, norm: torch.nn.Module, resid: torch.Tensor, grad: torch.Tensor) -> None:
        """Queue the gradients ``grad`` ``[n, R*T, M]`` at a norm's output as the inputs ``cols``' gradients
        at the residual ``resid`` ``[R, T, M]``."""
        assert self.folder is not None
        n, S = grad.shape[0], len(self.alphas)
        out = self.folder.reserve(cols)  # [n, B*T*M]
        if S == 1:
            _norm_vjp(norm, resid, grad, out.view(grad.shape))  # [n, R*T, M]
            return
        per_copy = grad.new_empty(grad.shape, dtype=torch.float32)  # [n, S*B*T, M]
        _norm_vjp(norm, resid, grad, per_copy)
        torch.sum(per_copy.view(n, S, -1), dim=1, out=out)  # [n, S, B*T*M] -> [n, B*T*M]

    def _wrote(self, write: torch.Tensor) -> None:
        """Subtract an upstream group's write ``[R, T, n, M]`` (its last copy's rows) from its rows of the
        source."""
        if self.source is not None:
            n, B = write.shape[2], self.source.shape[1]
            last = write.detach()[write.shape[0] - B:]  # [B, T, n, M]
            self.source[self.n_up:self.n_up + n].sub_(last.permute(2, 0, 1, 3))  # [n, B, T, M]
            self.n_up += n

    def resid_pre(self, layer: int):
        def hook(t: torch.Tensor, hook: Any) -> torch.Tensor:
            if layer == 0:
                if self.start is not None:
                    t = self._path(t)
                t = t + self.base.to(t.device, t.dtype)
                self._wrote(t[:, :, None, :])
            self.resid[(layer, "pre")] = t.detach()
            return t
        return hook

    def _path(self, t: torch.Tensor) -> torch.Tensor:
        """The embeddings ``[S*B, T, M]`` of the copies: ``start + alpha (own - start)``, the run's own where
        alpha is 1 (``t`` holds the run's own embedding in each copy)."""
        assert self.start is not None
        B = self.start.shape[0]
        start = self.start.to(t.dtype)
        copies = [t[s * B:(s + 1) * B] if a == 1 else torch.lerp(start, t[s * B:(s + 1) * B], a)
                  for s, a in enumerate(self.alphas)]  # S x [B, T, M]
        return torch.cat(copies)  # [S*B, T, M]

    def resid_mid(self, layer: int):
        def hook(t: torch.Tensor, hook: Any) -> None:
            self.resid[(layer, "mid")] = t.detach()
        return hook

    def qkv(self, layer: int, kind: str):
        block: Any = self.model.blocks[layer]

        def on_grad(g: torch.Tensor) -> None:
            # A layer's q, k and v gradients are brought back together: one product with W_qkv's rows per head
            # and one batched norm backward for its H + 2K inputs (consecutive in the downstream order).
            got = self.qkv_grads.setdefault(layer, {})
            got[kind] = g
            if len(got) < 3:
                return
            del self.qkv_grads[layer]
            attn = block.attn
            w = attn.W_qkv.weight.detach().view(-1, attn.d_head, attn.W_qkv.weight.shape[1])  # [H+2K, D, M]
            heads = torch.cat([got["q"], got["k"], got["v"]], dim=2).to(w.dtype)  # [R, T, H+2K, D]
            n = heads.shape[2]
            at_norm = torch.bmm(heads.permute(2, 0, 1, 3).reshape(n, -1, heads.shape[3]), w)  # [H+2K, R*T, M]
            first = self.graph.down_slice(layer, "q").start
            self._fold(slice(first, first + n), block.ln1, self.resid[(layer, "pre")], at_norm)

        def hook(t: torch.Tensor, hook: Any) -> torch.Tensor:
            t = t.view(t.shape)  # a node of its own: its gradient is this input's alone
            t.register_hook(on_grad)
            return t
        return hook

    def result(self, t: torch.Tensor, hook: Any) -> None:
        self._wrote(t)

    def mlp_out(self, t: torch.Tensor, hook: Any) -> None:
        self._wrote(t[:, :, None, :])

    def mlp_pre(self, layer: int):
        block: Any = self.model.blocks[layer]
        norm = block.ln2 if hasattr(block, "ln2") else block.ln1  # a one-norm parallel block shares ln1
        cols = self.graph.down_slice(layer, "mlp")
        where = "pre" if self.graph.parallel else "mid"

        def on_grad(g: torch.Tensor) -> None:
            self._fold(cols, norm, self.resid[(layer, where)], g.reshape(1, -1, g.shape[-1]))  # [1, R*T, M]

        def hook(_module: Any, args: tuple) -> tuple:
            # A view of its own: in a one-norm parallel block the attention reads the same normalised tensor.
            x = args[0].view(args[0].shape)
            x.register_hook(on_grad)
            return (x, *args[1:])
        return hook

    def logits_pre(self, _module: Any, args: tuple) -> None:
        """Nothing: the pass stops at the final residual and hooks it whole (:meth:`final`), since it may
        unembed only its last position."""

    def final(self, resid: torch.Tensor) -> torch.Tensor:
        """The logits' input ``[R, T, M]``, as a node whose gradient is folded into the logits' column."""
        cols = self.graph.down_slice(-1, "logits")
        x = resid.view(resid.shape)
        identity = torch.nn.Identity()  # the logits read the residual itself
        # The hook holds the residual's value, never x itself: x -> its grad_fn -> this hook -> x would be a cycle
        # through autograd's C++ graph, which Python's collector cannot see, and it would keep the whole graph and
        # this pass's buffers alive after the call (~1 GB per EAP call on SmolLM2 at 4 x 128).
        value = x.detach()  # [R, T, M]
        x.register_hook(lambda g: self._fold(cols, identity, value, g.reshape(1, -1, g.shape[-1])))  # [1, R*T, M]
        return x


def _no_dependence(metric: Metric, value: torch.Tensor) -> ValueError:
    return ValueError(f"metric {getattr(metric, '__name__', metric)!r} does not depend on the logits (it returned "
                      f"{float(value.detach())} with no gradient): no edge can move it")


def gradient_scores(model: Transformer, graph: Graph, tokens: torch.Tensor, metric: Metric, scores: torch.Tensor, *,
                    source: torch.Tensor | None = None, diff: torch.Tensor | None = None,
                    alphas: tuple[float, ...] = (1.0,), start: torch.Tensor | None = None,
                    attention_mask: torch.Tensor | None = None,
                    buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """Add ``diff[u] . sum_s d metric(copy s) / d input[d]`` for every edge ``(u, d)`` to ``scores`` from one
    forward and one backward over ``S = len(alphas)`` copies of the batch.

    Copy ``s`` reads the embedding ``start + alphas[s] (own - start)`` (EAP-IG's points on the path from the
    corrupted embedding ``start`` to the run's own); without ``start`` there is one copy, the run itself.

    Args:
        model, graph: the model and its graph.
        tokens: ``[B, T]`` ids of the run.
        metric: ``metric(logits [B, T, V]) -> scalar``, applied to each copy.
        scores: ``[U, D]`` float32, added to in place.
        source: ``[U, B, T, M]`` the corrupted writes; the differences are ``source`` minus the last copy's
            writes (computed in ``source``'s storage, which the caller gives up; the last alpha must be 1).
            Give this or ``diff``.
        diff: ``[U, B, T, M]`` differences already known (EAP-IG's later passes).
        alphas: the copies' points on the path (1 = the run's own embedding).
        start: ``[B, T, M]`` the embedding the path starts from (needed when an alpha is not 1).
        attention_mask: optional padding mask.
        buffer_bytes: bound on the gradient columns held before they are folded.

    Returns:
        ``(the last copy's metric, diff)``.

    Raises:
        ValueError: a metric that does not depend on the logits; ``source`` with a last alpha other than 1;
            alphas other than 1 without ``start``.

    Example:
        >>> import torch
        >>> from interp.circuits.gradients import gradient_scores
        >>> from interp.examples import model, clean, corrupted, metric
        >>> from interp.circuits import build_graph, node_writes
        >>> g = build_graph(model); _, src = node_writes(model, g, corrupted)
        >>> s = torch.zeros(g.allowed.shape)
        >>> value, diff = gradient_scores(model, g, clean, metric, s, source=src)
        >>> diff.shape
        torch.Size([9, 2, 21, 128])
    """
    if source is not None and alphas[-1] != 1:
        raise ValueError(f"with source the last copy's writes give the differences: its alpha must be 1, got "
                         f"alphas={alphas!r}")
    if start is None and any(a != 1 for a in alphas):
        raise ValueError(f"alphas={alphas!r} need start=[B, T, M], the embedding the path starts from")
    if (source is None) == (diff is None):
        raise ValueError("give exactly one of source (the corrupted writes) and diff (the differences)")
    if source is not None:
        source = source.float()  # float32 differences (a copy only for a half-precision model)
    state = _GradientPass(model, graph, alphas=alphas, start=start, source=source)
    B, S = tokens.shape[0], len(alphas)
    rows = tokens.repeat(S, 1)  # [S*B, T]: copy s is rows s*B .. (s+1)*B
    mask = None if attention_mask is None else attention_mask.repeat(S, 1)
    # The per-head writes are formed only when they are subtracted from the source.
    with torch.enable_grad(), node_hooks(model, graph, state, writes=source is not None):
        final = state.final(model(rows, attention_mask=mask, stop_at_layer=model.cfg.n_layers))  # [S*B, T, M]
        # A metric of the last position gets that position's logits alone (SmolLM2's unembedding is a fifth of
        # its forward); the logits' input node still has every position's gradient column, zero but the last.
        logits = model.unembed_residual(final[:, -1:] if getattr(metric, "reads_last_only", False) else final)
        # split, not slices: one backward concatenation instead of a zero [S*B, T, V] buffer per copy
        values = [metric(part) for part in logits.split(B)]
        del logits
    value = torch.stack(values).sum() if S > 1 else values[0]
    if not value.requires_grad:
        raise _no_dependence(metric, value)
    if diff is None:
        assert source is not None
        assert state.n_up == source.shape[0], "every upstream node's write is subtracted once"
        diff = source
    state.folder = _Folder(graph, diff, scores, buffer_bytes)
    torch.autograd.backward(value, inputs=[state.base])
    state.folder.flush()
    return values[-1].detach(), diff
