"""Training code of the library: the induction-2l recipe (a 2-layer attention-only decoder on repeated spans).

The model itself (config, tokenizer, checkpoint loading) lives in :mod:`interp.zoo.induction`; its losses
and head scores come from :mod:`interp.analysis` (:func:`~interp.analysis.in_context_gain`,
:func:`~interp.analysis.induction_scores`). ``experiments/train_induction.py`` and ``interp train-induction``
call :func:`train_induction_model`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .analysis import in_context_gain, induction_scores
from .config import ModelConfig
from .data import induction_training_batch, repeated_sequences
from .model import Transformer
from .zoo.induction import BOS_ID, build_induction_model

__all__ = ["train_induction_model", "evaluate_induction"]


def _losses_and_scores(model: Transformer, tokens: torch.Tensor, half_len: int, *, bos: bool) -> dict[str, Any]:
    """In-context losses (``first``, ``repeated``, ``gain``) and ``[L, H]`` ``prev_token`` / ``induction``
    attention scores (interp definition) on repeated sequences, in eval mode."""
    was_training = model.training
    model.eval()
    try:
        out: dict[str, Any] = in_context_gain(model, tokens, half_len, bos=bos)
        df = induction_scores(model, tokens, copying=False, batch_size=tokens.shape[0])
    finally:
        model.train(was_training)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    out["prev_token"] = torch.tensor(df["previous_token"].to_numpy()).view(L, H)  # [L, H]
    out["induction"] = torch.tensor(df["induction"].to_numpy()).view(L, H)  # [L, H]
    return out


def evaluate_induction(model: Transformer, *, n_seqs: int = 64, half_len: int = 25, seed: int = 12345,
                       bos_id: int | None = BOS_ID) -> dict[str, Any]:
    """Loss on first vs repeated halves and the best previous-token / induction heads, on fresh data.

    Args:
        model: an induction model.
        n_seqs: number of evaluation sequences.
        half_len: length of the random half (``(1 if bos) + 2 * half_len`` must fit ``n_ctx``).
        seed: data seed (use one that training did not use).
        bos_id: BOS id, or ``None`` for no BOS.

    Returns:
        dict with ``first``, ``repeated``, ``gain`` (nats/token), ``prev_token`` / ``induction`` score
        tensors ``[L, H]``, and ``best_prev_token`` = ``(head, score)`` in layer 0 and ``best_induction`` =
        ``(head, score)`` in layer 1 (the last layer, for deeper models).

    Example:
        >>> from interp.training import evaluate_induction
        >>> from interp.examples import model
        >>> stats = evaluate_induction(model)
        >>> stats["repeated"] < 0.3 * stats["first"]
        True
    """
    toks = repeated_sequences(n_seqs, half_len, model.cfg.d_vocab, seed=seed, bos_id=bos_id)
    out: dict[str, Any] = _losses_and_scores(model, toks, half_len, bos=bos_id is not None)
    scores = {"prev_token": out["prev_token"], "induction": out["induction"]}
    p0 = scores["prev_token"][0]
    i1 = scores["induction"][-1]
    out["best_prev_token"] = (int(p0.argmax()), float(p0.max()))
    out["best_induction"] = (int(i1.argmax()), float(i1.max()))
    return out


def train_induction_model(
    *,
    steps: int = 3000,
    seed: int = 0,
    cfg: ModelConfig | None = None,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    warmup: int = 100,
    p_repeat: float = 0.75,
    min_span: int = 4,
    bos_id: int | None = BOS_ID,
    eval_every: int = 250,
    eval_half_len: int | None = None,
    threads: int | None = None,
    progress: bool = True,
) -> tuple[Transformer, pd.DataFrame]:
    """Train an attention-only decoder on the repeated-span mixture with AdamW, from a fixed seed.

    Every choice that involves randomness (initialisation, data, nothing else) draws from generators seeded
    by ``seed``, so two calls with the same arguments give the same losses (on the same machine / thread
    count).

    Args:
        steps: optimisation steps.
        seed: seed of initialisation (``seed``) and data (``seed + 1``).
        cfg: architecture; default :data:`INDUCTION_2L_CONFIG`.
        batch_size: sequences per step, each ``cfg.n_ctx`` tokens long.
        lr: peak AdamW learning rate (linear warmup, then cosine decay to 10%).
        weight_decay: AdamW weight decay.
        warmup: warmup steps.
        p_repeat: fraction of training sequences that contain a repeated span.
        min_span: shortest repeated span (the longest is half the context).
        bos_id: BOS id prepended to every sequence, or ``None``.
        eval_every: evaluate (on fixed repeated sequences, seed ``seed + 2``) every this many steps; the
            last step is always evaluated.
        eval_half_len: half length of evaluation sequences; default fills the context.
        threads: if given, ``torch.set_num_threads(threads)`` for the run (restored afterwards).
        progress: show a tqdm bar.

    Returns:
        ``(model, history)``: the trained model in eval mode, and a DataFrame with one row per evaluation:
        ``step``, ``train_loss`` (mean over the steps since the previous row), ``first_loss``,
        ``repeated_loss``, ``prev_token_score`` (best layer-0 head), ``induction_score`` (best last-layer
        head), ``elapsed_s``.

    Raises:
        ValueError: non-positive ``steps`` / ``batch_size`` / ``eval_every``.

    Example:
        >>> from interp.training import train_induction_model
        >>> model, hist = train_induction_model(steps=20, eval_every=10, progress=False)
        >>> list(hist.step)
        [0, 10, 20]
    """
    for name, v in (("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r} must be a positive int")
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model = build_induction_model(cfg, seed=seed, bos_id=bos_id)
        cfg = model.cfg
        off = 0 if bos_id is None else 1
        half = eval_half_len if eval_half_len is not None else (cfg.n_ctx - off) // 2
        data_gen = torch.Generator().manual_seed(seed + 1)
        eval_toks = repeated_sequences(64, half, cfg.d_vocab, seed=seed + 2, bos_id=bos_id)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))

        def lr_at(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            frac = (step - warmup) / max(1, steps - warmup)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        rows: list[dict[str, float]] = []
        start = time.perf_counter()

        def evaluate(step: int, train_loss: float) -> None:
            scores = losses = _losses_and_scores(model, eval_toks, half, bos=bos_id is not None)
            model.train()
            rows.append({
                "step": step, "train_loss": train_loss, "first_loss": losses["first"],
                "repeated_loss": losses["repeated"], "prev_token_score": float(scores["prev_token"][0].max()),
                "induction_score": float(scores["induction"][-1].max()),
                "elapsed_s": time.perf_counter() - start,
            })

        evaluate(0, float("nan"))
        model.train()
        running, n_running = 0.0, 0
        bar = tqdm(range(1, steps + 1), desc="train induction-2l", disable=not progress)
        for step in bar:
            toks = induction_training_batch(batch_size, cfg.n_ctx, cfg.d_vocab, p_repeat=p_repeat, min_span=min_span,
                                            bos_id=bos_id,
                                            generator=data_gen)  # [B, n_ctx]
            logits = model(toks)  # [B, T, V]
            # Next-token loss on every position after the BOS (the BOS itself is never a target).
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), toks[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            running += float(loss.detach())
            n_running += 1
            if step % eval_every == 0 or step == steps:
                evaluate(step, running / n_running)
                running, n_running = 0.0, 0
                r = rows[-1]
                bar.set_postfix(first=f"{r['first_loss']:.2f}", rep=f"{r['repeated_loss']:.2f}",
                                ind=f"{r['induction_score']:.2f}")
        model.eval()
    finally:
        torch.set_num_threads(old_threads)
    history = pd.DataFrame(rows)
    model.training_history = history
    return model, history


