"""Activation patching and attribution patching: which activations carry the difference between two inputs.

Two runs on inputs that differ where it matters (clean: the behaviour is there; corrupted: it is not).
*Noising* runs the clean input and overwrites one activation with its value from the corrupted run: a big
drop of the metric says the activation is necessary. *Denoising* runs the corrupted input with one clean
activation: a big recovery says it is sufficient. Every table reports the raw ``metric`` of the patched run
and ``normalized = (metric - metric_corrupted) / (metric_clean - metric_corrupted)``: 1 is the clean
behaviour, 0 the corrupted one, for both directions.

Attribution patching (Nanda 2023; Syed et al. 2023) replaces each patched run by a first-order estimate
``(a_source - a_base) . d metric / d a`` at the base run: two forward passes and one backward pass for every
head and position at once.

What can be patched (TransformerLens short names): per head ``z``, ``result``, ``q`` (``by="head"`` or
``"head_pos"``); per layer ``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``, ``mlp_out``
(``by="layer"`` or ``"layer_pos"``). Patches go through the model's hook points.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import pandas as pd
import torch

from ..data import first_occurrence_mask, repeated_sequences
from ..interventions import gradient_probe_hook, patch_sites_hook, patch_units_hook, site_index
from ..pipeline import Pipeline
from ..progress import bar as progress_bar
from ..tensor_parallel import HeadParallel
from ..trace_views import ATTN_NAMES, BLOCK_NAMES
from . import patching_checks as checks

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["activation_patching", "attribution_patching", "corrupt_repeats", "in_context_metric", "logit_diff_metric",
           "patch_heads_together"]

Metric = Callable[[torch.Tensor], torch.Tensor]
_HEAD_ACTS = ("z", "result", "q")
_LAYER_ACTS = BLOCK_NAMES
_DIRECTIONS = ("noising", "denoising")
_LOGITS_BYTES = 1 << 30  # the most logits one patched pass returns when the metric reads every position


def logit_diff_metric(answer_tokens: torch.Tensor, pos: int = -1) -> Metric:
    """The default metric: mean over the batch of ``logit[correct] - logit[wrong]`` at position ``pos``.

    Args:
        answer_tokens: ``[B, 2]`` (correct, wrong) ids, or one pair ``[2]``.
        pos: the position read.

    Returns:
        ``metric(logits [B, T, V]) -> scalar tensor`` (differentiable, for attribution patching).

    Raises:
        ValueError: answer_tokens is not ``[B, 2]`` or ``[2]``.

    Example:
        >>> import torch
        >>> from interp.analysis.patching import logit_diff_metric
        >>> metric = logit_diff_metric(torch.tensor([[12, 40]]))
    """
    answers = torch.as_tensor(answer_tokens).long()
    if answers.dim() == 1:
        answers = answers[None]
    if answers.dim() != 2 or answers.shape[1] != 2:
        raise ValueError(f"answer_tokens must be [batch, 2] (correct, wrong) ids, got shape {tuple(answers.shape)}")

    return _LogitDiff(answers, pos)


class _LogitDiff:
    """:func:`logit_diff_metric`'s metric: a callable that also says which positions it reads."""

    def __init__(self, answers: torch.Tensor, pos: int) -> None:
        self.answers, self.pos = answers, pos
        self.reads_last_only = pos == -1  # activation_patching then unembeds the last position only

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        lg = logits[:, self.pos]  # [B, V]
        a = self.answers.to(lg.device).expand(lg.shape[0], 2)  # [B, 2]
        return (lg.gather(1, a[:, :1]) - lg.gather(1, a[:, 1:])).mean()


def in_context_metric(tokens: torch.Tensor, half_len: int, *, bos: bool) -> Metric:
    """The in-context logit advantage on repeated sequences ``[bos] x_1..x_n x_1..x_n``.

    Mean over the repeated half (its first token excluded) of ``logit[next token of tokens] - mean logit``:
    large when the model copies from the first occurrence, about 0 when it cannot. Targets always come from
    ``tokens`` (the clean run), also when the logits are those of a corrupted or patched run.

    Args:
        tokens: ``[B, T]`` clean repeated sequences (:func:`interp.data.repeated_sequences`).
        half_len: length of one half.
        bos: whether the sequences start with a BOS token.

    Returns:
        ``metric(logits [B, T, V]) -> scalar tensor``.

    Raises:
        ValueError: tokens of the wrong length for ``half_len``.

    Example:
        >>> from interp.analysis.patching import in_context_metric
        >>> from interp.examples import clean
        >>> metric = in_context_metric(clean, 10, bos=True)
    """
    T = (1 if bos else 0) + 2 * half_len
    if tokens.dim() != 2 or tokens.shape[1] != T:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}, expected [B, {T}] for half_len={half_len}")
    _, rep = first_occurrence_mask(tokens.shape[0], half_len, bos=bos)  # [B, T-1]
    targets = tokens[:, 1:]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        lg = logits[:, :-1]  # [B, T-1, V]: position t predicts token t + 1
        adv = lg.gather(-1, targets.to(lg.device)[..., None])[..., 0] - lg.mean(-1)  # [B, T-1]
        return adv[rep.to(lg.device)].mean()

    return metric


def corrupt_repeats(tokens: torch.Tensor, half_len: int, d_vocab: int, *, bos_id: int | None = None,
                    seed: int = 0) -> torch.Tensor:
    """Corrupted twins of repeated sequences: the repeated half replaced by fresh random tokens.

    Args:
        tokens: ``[B, (1) + 2 * half_len]`` from :func:`interp.data.repeated_sequences`.
        half_len: length of one half.
        d_vocab: vocabulary size.
        bos_id: the BOS id the sequences start with (never drawn), or None.
        seed: seed of the fresh tokens.

    Returns:
        ``[B, T]``: the same first half (and BOS), a new random second half.

    Raises:
        ValueError: tokens of the wrong length.

    Example:
        >>> from interp.analysis.patching import corrupt_repeats
        >>> from interp.examples import model, clean
        >>> corrupted = corrupt_repeats(clean, 10, model.cfg.d_vocab, bos_id=0)
    """
    off = 0 if bos_id is None else 1
    if tokens.dim() != 2 or tokens.shape[1] != off + 2 * half_len:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}, expected [B, {off + 2 * half_len}]")
    fresh = repeated_sequences(tokens.shape[0], half_len, d_vocab, seed=seed, bos_id=bos_id)[:, off:off + half_len]
    out = tokens.clone()
    out[:, off + half_len:] = fresh.to(tokens.device)  # [B, n]
    return out


def _plan(model: Transformer, act: str, by: str) -> list[str]:
    """The hook name of ``act`` in each layer (checks that ``by`` fits ``act``)."""
    short = act.removeprefix("hook_")
    if short in _HEAD_ACTS:
        if by not in ("head", "head_pos"):
            raise ValueError(f"act={act!r} is per head: by must be 'head' or 'head_pos', got {by!r}")
        names = [f"blocks.{layer}.attn.hook_{short}" for layer in range(model.cfg.n_layers)]
    elif short in _LAYER_ACTS:
        if by not in ("layer", "layer_pos"):
            raise ValueError(f"act={act!r} is per layer: by must be 'layer' or 'layer_pos', got {by!r}")
        names = [f"blocks.{layer}.hook_{short}" for layer in range(model.cfg.n_layers)]
        if short in ("resid_mid", "mlp_out") and model.cfg.attn_only:
            raise ValueError(f"act={act!r} does not exist in an attention-only model")
        if short == "resid_mid" and model.cfg.parallel_block != "none":
            raise ValueError(f"act={act!r} does not exist in a parallel block "
                             f"(parallel_block={model.cfg.parallel_block!r}: attention and MLP read resid_pre)")
    else:
        known = _HEAD_ACTS + _LAYER_ACTS
        raise ValueError(f"act must be one of {known}, got {act!r}" +
                         (" (patch per head with z, result or q)" if short in ATTN_NAMES else ""))
    return names


def _check_inputs(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, direction: str):
    clean, corrupted = model._check_tokens(clean), model._check_tokens(corrupted)
    if clean.shape != corrupted.shape:
        raise ValueError(f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} must have one shape")
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
    return clean, corrupted


def _metric_of(metric: Metric | None, answer_tokens: Any) -> Metric:
    if metric is None:
        if answer_tokens is None:
            raise ValueError("pass metric=callable(logits) -> scalar, or answer_tokens=[B, 2] for the logit difference")
        return logit_diff_metric(answer_tokens)
    if not callable(metric):
        raise TypeError(f"metric must be callable(logits) -> scalar tensor, got {type(metric).__name__}")
    return metric


def _sites(by: str, n_units: list[int], T: int) -> list[tuple[int, int, int]]:
    """(layer, unit, pos) triples; unit is a head (per-head acts) or -1, pos -1 means every position."""
    sites = []
    for layer, n in enumerate(n_units):
        units = range(n) if by.startswith("head") else [-1]
        for u in units:
            for p in (range(T) if by.endswith("_pos") else [-1]):
                sites.append((layer, u, p))
    return sites


def _frame(by: str, sites: list, values: list[float], m_clean: float, m_corr: float, extra: dict) -> pd.DataFrame:
    df = pd.DataFrame(sites, columns=["layer", "head", "pos"])
    if not by.startswith("head"):
        df = df.drop(columns="head")
    if not by.endswith("_pos"):
        df = df.drop(columns="pos")
    df["metric"] = values
    denom = m_clean - m_corr
    df["normalized"] = (df["metric"] - m_corr) / denom if denom != 0 else float("nan")
    df.attrs.update({"metric_clean": m_clean, "metric_corrupted": m_corr, **extra})
    return df


def _source_run(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, act: str, by: str,
                metric: Metric | None, answer_tokens: torch.Tensor | None, direction: str,
                attention_mask: torch.Tensor | None, pipe: Pipeline | None = None
                ) -> tuple[Metric, list[str], torch.Tensor, list[torch.Tensor | None], float, list[int]]:
    """What both patching methods start from: the checked inputs, the metric, the hook names to patch, the run
    that is patched (``base``), the recorded source activations (one per name), the source run's metric and the
    units (heads, or 1 for a layer) of each layer.

    Over a pipeline (``pipe``) each rank records its own layers (the others' activations are None here) and
    the metric is computed on the last rank, which holds the logits; the units are every rank's."""
    clean, corrupted = _check_inputs(model, clean, corrupted, direction)
    metric = _metric_of(metric, answer_tokens)
    names = _plan(model, act, by)
    base, source = (clean, corrupted) if direction == "noising" else (corrupted, clean)
    logits_src: torch.Tensor | None
    with torch.no_grad():
        if pipe is None:
            logits_src, trace = model.run_with_cache(source, attention_mask=attention_mask, names_filter=names)
        else:
            logits_src, trace = pipe.record_own(source, names_filter=names, attention_mask=attention_mask,
                                                logits_to_rank0=False)
        m_src = _on_last(pipe, lambda: float(metric(_held(logits_src))), "the source run's metric")
    recorded = [trace[n].detach() for n in names if n in trace]
    # A layer without heads (every head removed, a hybrid's convolution layer) never fires its attention hooks:
    # it gets an empty [B, T, 0, ...] tensor, so it has no sites.
    units = {layer: trace[n].shape[2] if by.startswith("head") else 1 for layer, n in enumerate(names) if n in trace}
    if pipe is not None:
        units = {k: v for rank_units in pipe._gather_all(units, "the patched layers' units") for k, v in rank_units.items()}
    if not units:
        raise ValueError(f"no layer of {getattr(model, 'name', 'the model')!r} has heads to patch")
    empty = recorded[0].new_zeros(recorded[0].shape[:2] + (0,) + recorded[0].shape[3:]) if recorded else None
    held = range(len(names)) if pipe is None else range(pipe.first, pipe.stop)
    src = [trace[n].detach() if n in trace else empty if layer in held else None for layer, n in enumerate(names)]
    n_units = [units.get(layer, 0 if by.startswith("head") else 1) for layer in range(len(names))]
    return metric, names, base, src, m_src, n_units


def _held(logits: torch.Tensor | None) -> torch.Tensor:
    """Logits this rank holds: over a pipeline only the last rank does, and only it reads them."""
    if logits is None:
        raise RuntimeError("activation_patching: the logits of a pipeline's pass are on its last rank")
    return logits


def _on_last(pipe: Pipeline | None, compute: Callable[[], Any], what: str) -> Any:
    """``compute()`` here, or over a pipeline on its last rank (which holds the logits), its value on every rank."""
    return compute() if pipe is None else pipe._from_last(compute, what)


def _groups(sites: list[tuple[int, int, int]], per_run: int, prefix: bool) -> list[list[int]]:
    """Indices of ``sites`` run in one growing pass, at most ``per_run`` each, every group in order of layer.

    Sites are taken in order of layer (then position, unit); with ``prefix`` (a causal model patched per
    position) in order of position first, since a pass starts at its earliest site's position and its sites
    should share it.
    """
    def key(i: int) -> tuple[int, int, int]:
        layer, unit, pos = sites[i]
        return (pos, layer, unit) if prefix else (layer, pos, unit)

    order = sorted(range(len(sites)), key=key)
    groups = [order[k:k + per_run] for k in range(0, len(order), per_run)]
    return [sorted(g, key=lambda i: sites[i][0]) for g in groups]  # stable: keeps the order within a layer


def _patched_run(model: Transformer, run: list[tuple[int, int, int]], names: list[str],
                 src: list[torch.Tensor | None], resid: list[torch.Tensor | None], base_cache: Any, start: int,
                 attention_mask: torch.Tensor | None, last_only: bool, *, shape: tuple[int, int],
                 stage: tuple[int, int] | None = None, arriving: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``[n B, T - start, V]`` (``[n B, 1, V]`` with ``last_only``) of ``n = len(run)`` patched copies
    of the base run (``shape`` = its ``(B, T)``), copy ``j`` with site ``run[j]`` patched (``run`` in order of layer).

    One pass that grows: it starts at the lowest patched layer, and at each layer the copies patched there join
    the batch as the base run's residual entering it (``resid[layer]``, ``[B, T, M]``; nothing below a patch
    differs from the base run). When ``start > 0`` the pass computes positions ``start ..`` only, each layer's
    cache holding the base run's keys and values of the earlier positions for the copies present there (a
    causal model's positions before the patch are unchanged).

    On a pipeline's rank, ``stage`` = its blocks ``(lo, hi)``: the pass runs those only (``src``, ``resid`` and
    the cache are needed for them only), from ``arriving`` (the residual of the copies that joined below ``lo``,
    sent by the previous rank) when the lowest patched layer is below ``lo``, and returns the residual leaving
    block ``hi - 1`` unless that is the last block.
    """
    B, T = shape
    L = model.cfg.n_layers
    lo, hi = stage if stage is not None else (0, L)
    joining = [0] * L  # copies that join the pass at each layer
    for layer, _, _ in run:
        joining[layer] += 1
    first = run[0][0]
    begin = max(first, lo)  # the first block this pass runs here
    present = [sum(joining[:layer + 1]) for layer in range(L)]  # copies in the pass at each layer

    def enter(layer: int, x: torch.Tensor) -> torch.Tensor:
        # The pass starts from the base run's B rows at the lowest patched layer; they are replaced there by
        # the copies patched in it, and every higher layer with patches adds its own copies. On a later rank
        # the copies that joined below arrive from the previous one.
        if layer == begin and arriving is not None:
            x = arriving  # [present[lo - 1] B, T - start, M]
        if not joining[layer]:
            return x
        new = resid[layer][:, start:].repeat(joining[layer], 1, 1)  # type: ignore[index]  # [k B, T - start, M]
        return new if layer == first else torch.cat([x, new.to(x.device)])  # [present B, T - start, M]

    cache = None
    if start:
        cache = model.make_cache(len(run) * B, max_len=T)
        for layer in range(begin, hi):
            mine, theirs, n = cache.layers[layer], base_cache.layers[layer], present[layer]
            mine.buffers = [buf[:n * B] for buf in mine.buffers]  # the copies in the pass at this layer
            for buf, old, dim in zip(mine.buffers, theirs.buffers, mine.seq_dims):
                reps = [n] + [1] * (buf.dim() - 1)
                buf.narrow(dim, 0, start).copy_(old.narrow(dim, 0, start).repeat(*reps))  # [n B, ..., start, ...]
        for mine in cache.layers:  # every layer holds the prefix (the layers below the patch are skipped)
            mine.length = start

    # src is None only for another rank's layers, whose hooks never fire in this rank's blocks.
    hook = patch_sites_hook(names, cast("list[torch.Tensor]", src), run, B, start=start)
    with model.lock, model.hooks([(sorted({names[s[0]] for s in run}), hook)]):
        # forward's start_at_layer / stop_at_layer, plus the one private argument: enter, which grows the batch
        # layer by layer (the rows of a layer's cache are the copies present there, so the public check of
        # the cache against the whole batch does not apply). A pass that arrives starts from B of its rows,
        # which enter replaces by all of them.
        x = resid[first][:, start:] if arriving is None else arriving[:B]  # type: ignore[index]  # [B, T', M]
        resid_out = model._forward(x, attention_mask=attention_mask, kv_cache=cache, start_at_layer=begin,
                                   stop_at_layer=hi, enter=enter)  # [n B, T - start, M]
        if hi < L:
            return resid_out  # the next rank goes on from here
        return model.unembed_residual(resid_out[:, -1:] if last_only else resid_out)  # [n B, T', V]


def _values(found: list[Any]) -> list[float]:
    """The patched runs' metrics as floats, moved off the device in one copy.

    Raises:
        ValueError: a metric that is not finite (as :func:`~interp.analysis.patching_checks.checked_metric`).
    """
    values = torch.stack([v.to(torch.float64) for v in found]).cpu() if found else torch.zeros(0)  # [sites]
    bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"metric returned {values[bad[0]].item()} on {len(bad)} patched run(s); patching scores "
                         "would be NaN (check the metric, the answer ids, or the logits)")
    return values.tolist()


def activation_patching(model: Transformer | HeadParallel | Pipeline, clean: torch.Tensor, corrupted: torch.Tensor, *,
                        act: str = "z", by: str = "head", metric: Metric | None = None,
                        answer_tokens: torch.Tensor | None = None, direction: str = "noising",
                        attention_mask: torch.Tensor | None = None, batch_size: int = 256,
                        progress: bool | None = None) -> pd.DataFrame:
    """Patch one activation at a time between the clean and the corrupted run and measure the metric.

    Nothing upstream of a patch is recomputed. Patched copies of the batch share forward passes that grow:
    a pass starts at its lowest patched layer, and each copy joins it at its own patched layer from the base
    run's residual stream there. In a causal model patched per position (``by="head_pos"`` / ``"layer_pos"``)
    a pass also starts at its earliest patched position, with the base run's keys and values of the earlier
    positions (their logits are the base run's). When the metric reads every position, a pass's copies are
    capped so that its logits stay under 1 GiB.

    Args:
        model: an interp Transformer (any attention variant), or a :class:`~interp.tensor_parallel.HeadParallel`
            shard under torchrun, every rank calling with the same arguments: per-layer acts only (each rank
            runs the same patched passes, its heads' writes summed over ranks after each module, so every
            rank returns one process's table); or a :class:`~interp.pipeline.Pipeline` under torchrun, every
            rank calling with the same arguments: every act, each rank running its own blocks of every patched
            pass (a pass starts on the rank of its lowest patched layer and its residual goes on from rank to
            rank, the passes of a rank overlapping the next rank's), the last rank computing the metrics; every
            rank returns one process's table, bit for bit.
        clean: ``[B, T]`` ids where the behaviour is present.
        corrupted: ``[B, T]`` ids where it is not (same shape).
        act: ``"z"``, ``"result"``, ``"q"`` (per head) or ``"resid_pre"``, ``"resid_mid"``, ``"resid_post"``,
            ``"attn_out"``, ``"mlp_out"`` (per layer).
        by: ``"head"`` / ``"head_pos"`` for per-head acts, ``"layer"`` / ``"layer_pos"`` for per-layer acts
            (``_pos``: one position at a time, else every position at once).
        metric: ``metric(logits) -> scalar tensor``; default the logit difference of ``answer_tokens``. A
            metric with the attribute ``reads_last_only = True`` (as :func:`logit_diff_metric` at ``pos=-1``)
            reads only ``logits[:, -1]``: the patched runs then unembed the last position only and pass it
            ``[B, 1, V]`` logits.
        answer_tokens: ``[B, 2]`` (correct, wrong) ids for the default metric.
        direction: ``"noising"`` (run clean, patch in corrupted activations) or ``"denoising"`` (the reverse).
        attention_mask: ``[B, T]`` padding mask, used for both runs.
        batch_size: sequences per forward pass; patched copies of the batch are run together up to it.
        progress: a progress bar over the patched runs on stderr (None: on in terminals and notebooks).

    Returns:
        DataFrame with ``layer`` (and ``head``, ``pos``), ``metric`` and ``normalized`` (1 = clean behaviour,
        0 = corrupted); ``df.attrs`` holds ``metric_clean``, ``metric_corrupted``, ``act``, ``direction``.

    Raises:
        ValueError: unknown act / by / direction, inputs of different shapes or identical, no metric, a
            ``batch_size`` that is not a positive int, ``answer_tokens`` of the wrong batch size or outside
            the vocabulary, a metric that returns more than one number or a NaN (over a pipeline raised on every
            rank), or a per-head act on a :class:`~interp.tensor_parallel.HeadParallel` (the ranks would run
            different passes).
        DistributedError: over a pipeline, a peer rank died or timed out.

    Example:
        >>> import interp
        >>> from interp.analysis.patching import activation_patching
        >>> from interp.examples import model, clean, corrupted, answers
        >>> df = activation_patching(model, clean, corrupted, act="z", answer_tokens=answers)
        >>> interp.viz.patching_heatmap(df)
    """
    pipe = model if isinstance(model, Pipeline) else None
    if isinstance(model, HeadParallel):
        # The shard is the model with the other ranks' heads removed, plus a reduction after each attention and
        # dense MLP: residual-stream sites are whole on every rank, so the same code on the shard is one
        # process's patching. A per-head site lives on one rank only; patching it would give the ranks
        # different passes (and unmatched reductions), so it is refused rather than joined.
        if act.removeprefix("hook_") in _HEAD_ACTS:
            raise ValueError(f"activation_patching: act={act!r} is per head; over a HeadParallel's ranks patch a "
                             f"per-layer act ({', '.join(_LAYER_ACTS)}), or run per-head patching in one process")
        progress = progress if model.rank == 0 else False  # one bar, on rank 0
        model = model.model
    elif isinstance(model, Pipeline):
        # Every rank runs the same passes over its own blocks: a patched pass starts on the rank of its lowest
        # patched layer, its residual goes on rank by rank, and the last rank computes the metrics.
        progress = progress if model.rank == 0 else False
        model = model.model
    batch_size = checks.check_batch_size(batch_size)
    checks.check_clean_corrupted(clean, corrupted)
    checks.check_answer_tokens(answer_tokens, clean, model.cfg.d_vocab)
    user_metric = metric
    metric = checks.checked_metric(metric)
    metric, names, base, src, m_src, n_units = _source_run(model, clean, corrupted, act, by, metric, answer_tokens,
                                                           direction, attention_mask, pipe)
    # The checked metric turns its value into a Python float (a device sync): the source and base runs use it,
    # the patched runs the plain one, their values checked together at the end.
    plain = _metric_of(user_metric, answer_tokens)
    with torch.no_grad():
        L, (B, T) = model.cfg.n_layers, base.shape
        # One base run records what every patched run resumes from: the residual entering each layer and, for
        # a causal model patched per position, the keys and values of the positions before the patch.
        # (Not past a sliding window or a chunk: such a layer's cache keeps only its end, not the prefix.)
        prefix = (by.endswith("_pos") and bool(model.cfg.causal)
                  and not any(model.cfg.cache_bounded(layer) for layer in range(L)))
        base_cache = model.make_cache(B, max_len=T) if prefix else None
        resid_names = [f"blocks.{layer}.hook_resid_pre" for layer in range(L)]
        last_only = bool(getattr(plain, "reads_last_only", False))
        resid: dict[str, torch.Tensor] = {}

        def keep(t: torch.Tensor, hook: Any) -> None:
            resid[hook.name] = t.detach()

        logits_base: torch.Tensor | None
        if pipe is None:
            logits_base = model.run_with_hooks(base, attention_mask=attention_mask, kv_cache=base_cache,
                                               fwd_hooks=[(resid_names, keep)])
        else:  # each rank keeps its own layers' residuals (and cache); the logits stay on the last rank
            logits_base, own = pipe.record_own(base, names_filter=resid_names, attention_mask=attention_mask,
                                               logits_to_rank0=False, kv_cache=base_cache)
            resid.update({n: own[n] for n in own.keys()})
        m_base, itemsize = _on_last(pipe, lambda: (float(metric(_held(logits_base))),
                                                   _held(logits_base).element_size()), "the base run's metric")
        sites = _sites(by, n_units, T)
        found: list[Any] = [None] * len(sites)  # each site's metric (a 0-d tensor), left on the device
        per_run = max(1, batch_size // B)  # several patched copies of the batch share one forward pass
        if not last_only:  # every position's logits come back: keep one pass's under _LOGITS_BYTES
            row = B * T * model.cfg.d_vocab * itemsize
            per_run = max(1, min(per_run, _LOGITS_BYTES // row))
        resid_in = [resid.get(n) for n in resid_names]
        stage, sending = (None if pipe is None else (pipe.first, pipe.stop)), None
        for group in progress_bar(_groups(sites, per_run, prefix), desc="activation_patching",
                                  progress=progress, unit="run"):
            run = [sites[i] for i in group]
            start = min(pos for _, _, pos in run) if prefix else 0  # before it, nothing differs from the base
            arriving = None
            if pipe is not None:
                if pipe.stop <= run[0][0]:
                    continue  # the pass starts on a later rank
                if pipe.first > run[0][0]:  # the copies that joined on earlier ranks arrive from the previous one
                    below = sum(layer < pipe.first for layer, _, _ in run)
                    arriving = pipe._receive((below * B, T - start, model.cfg.d_model), "a patched pass's residual")
            logits = _patched_run(model, run, names, src, resid_in, base_cache, start, attention_mask, last_only,
                                  shape=(B, T), stage=stage, arriving=arriving)
            if pipe is not None and pipe.stop < L:
                sending = pipe._send(logits, "a patched pass's residual", sending)  # the residual, going on
                continue
            if start and not last_only:  # positions before the patch are the base run's: its logits there
                logits = torch.cat([_held(logits_base)[:, :start].repeat(len(group), 1, 1), logits], dim=1)  # [n B, T, V]
            for j, i in enumerate(group):
                found[i] = torch.as_tensor(plain(logits[j * B:(j + 1) * B])).detach().reshape(())
        if pipe is not None and sending is not None:
            pipe._send_done(sending, "a patched pass's residual")
        values = _on_last(pipe, lambda: _values(found), "the patched runs' metrics")
    m_clean, m_corr = (m_base, m_src) if direction == "noising" else (m_src, m_base)
    return _frame(by, sites, values, m_clean, m_corr, {"act": act, "direction": direction, "method": "activation"})


def attribution_patching(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, *,
                         act: str = "z", by: str = "head", metric: Metric | None = None,
                         answer_tokens: torch.Tensor | None = None, direction: str = "noising",
                         attention_mask: torch.Tensor | None = None, progress: bool | None = None) -> pd.DataFrame:
    """The gradient approximation of :func:`activation_patching`: same arguments, same table.

    ``metric`` of a patched site is estimated as ``metric_base + sum((a_source - a_base) * grad)`` over the
    site's entries, with the gradient of the metric taken at the base run (clean for noising). Cheap (two
    forwards and one backward for every site) and a good ranking where the metric is close to linear in
    the activation; it can be badly off where the patched run leaves the linear regime (large attention
    pattern changes, saturated softmax outputs).

    ``progress``: a bar over the three steps (the source run, the base run's forward and backward pass, the
    sites' estimates; None: on in terminals and notebooks).

    Returns:
        DataFrame as :func:`activation_patching`, with ``attrs["method"] = "attribution"``.

    Example:
        >>> from interp.analysis.patching import attribution_patching
        >>> from interp.examples import model, clean, corrupted, answers
        >>> est = attribution_patching(model, clean, corrupted, act="z", answer_tokens=answers)
    """
    checks.check_clean_corrupted(clean, corrupted)
    checks.check_answer_tokens(answer_tokens, clean, model.cfg.d_vocab)
    metric = checks.checked_metric(metric)
    steps = progress_bar(desc="attribution_patching", progress=progress, total=3, unit="step")
    metric, names, base, found_src, m_src, n_units = _source_run(model, clean, corrupted, act, by, metric,
                                                                 answer_tokens, direction, attention_mask)
    src = [t for t in found_src if t is not None]  # one process: every layer's (an empty one for no heads)
    steps.update()
    acts: dict[str, torch.Tensor] = {}
    probes: dict[str, torch.Tensor] = {}
    hook = gradient_probe_hook(acts, probes)

    with torch.enable_grad():
        logits = model.run_with_hooks(base, attention_mask=attention_mask, fwd_hooks=[(names, hook)])
        m = metric(logits)
        live = [n for n in names if n in probes]  # a layer without heads fires no hook: it has no sites
        found = dict(zip(live, torch.autograd.grad(m, [probes[n] for n in live])))
    steps.update()
    m_base = float(m.detach())
    grads = [found.get(n, s) for n, s in zip(names, src)]
    per = [((s - acts.get(n, s)) * g).detach() for s, n, g in zip(src, names, grads)]  # [B, T, (H,) ...] each
    sites = _sites(by, n_units, base.shape[1])
    # Every site's sum stays on the device; one copy brings them all back.
    sums = torch.stack([per[site[0]][site_index(site)].sum().double() for site in sites]).cpu()  # [sites]
    values = (m_base + sums).tolist()
    steps.update()
    steps.close()
    m_clean, m_corr = (m_base, m_src) if direction == "noising" else (m_src, m_base)
    return _frame(by, sites, values, m_clean, m_corr, {"act": act, "direction": direction, "method": "attribution"})


def patch_heads_together(model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor,
                         heads: list[tuple[int, int]], *, act: str = "z", metric: Metric | None = None,
                         answer_tokens: torch.Tensor | None = None, direction: str = "noising",
                         attention_mask: torch.Tensor | None = None) -> dict[str, float]:
    """Patch several heads at once (every position) and measure the metric.

    Args:
        model, clean, corrupted, metric, answer_tokens, direction, attention_mask: as :func:`activation_patching`.
        heads: ``(layer, head)`` pairs patched together.
        act: ``"z"``, ``"result"`` or ``"q"``.

    Returns:
        ``{"metric", "normalized", "metric_clean", "metric_corrupted"}``.

    Raises:
        TypeError: ``heads`` is not a list of ``(layer, head)`` int pairs.
        ValueError: a head out of range, or the errors of :func:`activation_patching`.

    Example:
        >>> from interp.analysis.patching import patch_heads_together
        >>> from interp.examples import model, clean, corrupted, metric
        >>> patch_heads_together(model, clean, corrupted, [(1, h) for h in range(4)], metric=metric)["normalized"]
    """
    heads = checks.check_heads(heads)
    checks.check_clean_corrupted(clean, corrupted)
    checks.check_answer_tokens(answer_tokens, clean, model.cfg.d_vocab)
    metric = checks.checked_metric(metric)
    clean, corrupted = _check_inputs(model, clean, corrupted, direction)
    metric = _metric_of(metric, answer_tokens)
    names = _plan(model, act, "head")
    for layer, head in heads:
        if not (0 <= layer < len(names) and 0 <= head < model.blocks[layer].attn.n_heads):
            raise ValueError(f"head ({layer}, {head}) is outside the model")
    base, source = (clean, corrupted) if direction == "noising" else (corrupted, clean)
    with torch.no_grad():
        logits_src, trace = model.run_with_cache(source, attention_mask=attention_mask, names_filter=names)
        m_src = float(metric(logits_src))
        m_base = float(metric(model(base, attention_mask=attention_mask)))
        by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            by_layer.setdefault(layer, []).append(head)
        hook = patch_units_hook(names, trace, by_layer)
        hooked = [names[layer] for layer in by_layer]
        m = float(metric(model.run_with_hooks(base, attention_mask=attention_mask,
                                              fwd_hooks=[(hooked, hook)] if hooked else [])))
    m_clean, m_corr = (m_base, m_src) if direction == "noising" else (m_src, m_base)
    denom = m_clean - m_corr
    return {"metric": m, "normalized": (m - m_corr) / denom if denom else float("nan"),
            "metric_clean": m_clean, "metric_corrupted": m_corr}
