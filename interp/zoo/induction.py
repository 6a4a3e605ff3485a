"""The "induction-2l" model: a 2-layer attention-only decoder trained to continue repeated token spans.

Trained on :func:`interp.analysis.data.induction_training_batch` (random sequences, half of which copy a
random span to a later position), it grows the textbook two-head circuit (Olsson et al., 2022): a
previous-token head in layer 0 writes "the token before me was A" into each position, and an induction head
in layer 1 uses it (K-composition) to attend from the current token A to the token right after an earlier A,
and copies that token. On a sequence that repeats a random half, loss on the repeated half falls far below
the first half (the in-context gain).

The shipped checkpoint lives beside this module (``checkpoints/induction-2l.safetensors``) and is rebuilt by
``python experiments/train_induction.py`` (same seed, same weights up to floating point).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..data import first_occurrence_mask, induction_training_batch, repeated_sequences
from ..config import ModelConfig
from ..model import Transformer
from .checkpoint import load_checkpoint, read_checkpoint_metadata, save_checkpoint

__all__ = [
    "INDUCTION_2L_CONFIG", "INDUCTION_2L_PATH", "BOS_ID", "TokenIdTokenizer", "build_induction_model",
    "train_induction_model", "evaluate_induction", "induction_losses", "attention_scores",
    "load_induction_2l", "save_induction_model",
]

#: The BOS id of induction-2l: every sequence starts with it, it never appears elsewhere (an attention sink).
BOS_ID = 0

#: Architecture of induction-2l. Rotary positions make a previous-token head a matter of relative position
#: (learned absolute positions sat on the loss plateau far longer in trials); d_head = 32 gives the QK
#: (match the previous token) and OV (copy the token) circuits enough rank for a 128-token vocabulary, which
#: d_head = 16 did not.
INDUCTION_2L_CONFIG = ModelConfig(
    n_layers=2, d_model=128, n_heads=4, attn_only=True, causal=True, positional="rotary",
    normalization="pre", d_vocab=128, n_ctx=64,
)

#: Where the shipped checkpoint lives (inside the package).
INDUCTION_2L_PATH = Path(__file__).resolve().parent / "checkpoints" / "induction-2l.safetensors"

_TOKEN_RX = re.compile(r"^t(\d+)$")


class TokenIdTokenizer:
    """A tokenizer for abstract token ids: id 17 is the string ``"t17"``, the BOS id is ``"<bos>"``.

    It exists so that figures and the app can label positions; it has no text semantics.

    Args:
        d_vocab: vocabulary size.
        bos_id: the BOS id (or ``None``).

    Example:
        >>> tok = TokenIdTokenizer(128, bos_id=0)
        >>> tok.to_str_tokens([0, 17, 5])
        ['<bos>', 't17', 't5']
        >>> tok.to_tokens("t17 t5").tolist()
        [[0, 17, 5]]
    """

    bos_token = "<bos>"

    def __init__(self, d_vocab: int, bos_id: int | None = BOS_ID) -> None:
        if bos_id is not None and not 0 <= bos_id < d_vocab:
            raise ValueError(f"bos_id={bos_id} is outside the vocabulary [0, {d_vocab})")
        self.d_vocab = d_vocab
        self.bos_id = bos_id

    def id_to_str(self, i: int) -> str:
        if not 0 <= i < self.d_vocab:
            raise ValueError(f"token id {i} is outside the vocabulary [0, {self.d_vocab})")
        return self.bos_token if i == self.bos_id else f"t{i}"

    def str_to_id(self, s: str) -> int:
        if s == self.bos_token and self.bos_id is not None:
            return self.bos_id
        m = _TOKEN_RX.match(s)
        if m is None:
            raise ValueError(f"token {s!r} is not of the form 't<id>' or {self.bos_token!r}")
        i = int(m.group(1))
        if not 0 <= i < self.d_vocab:
            raise ValueError(f"token {s!r} is outside the vocabulary [0, {self.d_vocab})")
        return i

    def to_str_tokens(self, ids: Sequence[int] | torch.Tensor) -> list[str]:
        """Strings of a 1-D sequence of ids."""
        if isinstance(ids, torch.Tensor):
            ids = ids.flatten().tolist()
        return [self.id_to_str(int(i)) for i in ids]

    def to_tokens(self, text: str | Sequence[str], *, max_length: int | None = None,
                  prepend_bos: bool = True) -> torch.Tensor:
        """Parse whitespace-separated ``t<id>`` strings (one text, or a list of equally long texts).

        Args:
            text: e.g. ``"t3 t9 t3"``, or a list of such strings.
            max_length: refuse longer sequences.
            prepend_bos: start each sequence with the BOS id (when this tokenizer has one) unless it already
                starts with ``<bos>``.

        Returns:
            LongTensor ``[B, T]``.

        Raises:
            ValueError: an unparsable token, ragged batch, or a sequence longer than ``max_length``.
        """
        texts = [text] if isinstance(text, str) else list(text)
        rows = []
        for t in texts:
            ids = [self.str_to_id(s) for s in t.split()]
            if prepend_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
                ids.insert(0, self.bos_id)
            if max_length is not None and len(ids) > max_length:
                raise ValueError(f"sequence of {len(ids)} tokens exceeds max_length={max_length}")
            rows.append(ids)
        if len({len(r) for r in rows}) > 1:
            raise ValueError(f"texts have different lengths {[len(r) for r in rows]}; this tokenizer does not pad")
        return torch.tensor(rows, dtype=torch.long)


def build_induction_model(cfg: ModelConfig | None = None, *, seed: int = 0, bos_id: int | None = BOS_ID) -> Transformer:
    """A freshly initialised induction model (default: the induction-2l architecture).

    Initialisation draws from a forked RNG seeded with ``seed``, so it is reproducible and leaves the
    global torch RNG untouched.

    Args:
        cfg: the architecture; default :data:`INDUCTION_2L_CONFIG`.
        seed: initialisation seed.
        bos_id: the BOS id for the attached :class:`TokenIdTokenizer`.

    Returns:
        A :class:`Transformer` named ``"induction-2l"`` with ``tokenizer`` set.

    Example:
        >>> model = build_induction_model(seed=0)
        >>> model.cfg.n_layers, model.cfg.attn_only
        (2, True)
    """
    cfg = INDUCTION_2L_CONFIG if cfg is None else cfg
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
    if not (cfg.causal and cfg.unembed):
        raise ValueError(f"an induction model must be a causal decoder with an unembedding, got causal={cfg.causal}, "
                         f"unembed={cfg.unembed}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)
    model.name = "induction-2l"
    model.tokenizer = TokenIdTokenizer(cfg.d_vocab, bos_id)
    return model


def induction_losses(model: Transformer, tokens: torch.Tensor, half_len: int, *, bos: bool = True) -> dict[str, float]:
    """Mean next-token loss on the first half and on the repeated half of :func:`repeated_sequences` output.

    Args:
        model: a causal decoder.
        tokens: ``[B, (1 if bos) + 2 * half_len]`` from :func:`repeated_sequences`.
        half_len: the length of one half.
        bos: whether ``tokens`` start with a BOS token.

    Returns:
        ``{"first": loss, "repeated": loss, "gain": first - repeated}`` in nats per token. The first token of
        each half is excluded from "repeated" (it is not predictable from context).

    Raises:
        ValueError: ``tokens`` has the wrong length for ``half_len``.
    """
    T = (1 if bos else 0) + 2 * half_len
    if tokens.dim() != 2 or tokens.shape[1] != T:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}, expected [B, {T}] for half_len={half_len}, "
                         f"bos={bos}")
    with torch.no_grad():
        logits = model(tokens)  # [B, T, V]
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
        loss = loss.view(tokens.shape[0], T - 1)  # [B, T-1] loss of predicting token t+1 at position t
    first, rep = first_occurrence_mask(tokens.shape[0], half_len, bos=bos)
    f, r = float(loss[first].mean()), float(loss[rep].mean())
    return {"first": f, "repeated": r, "gain": f - r}


def attention_scores(model: Transformer, tokens: torch.Tensor, half_len: int, *, bos: bool = True) -> dict[str, Any]:
    """Per-head previous-token and induction scores on repeated sequences.

    * previous-token score of a head: mean attention from position t to t - 1 (over t after the BOS).
    * induction score: mean attention from a query in the repeated half to the token right after the
      earlier occurrence of the query's token, i.e. key ``t - half_len + 1`` (as in TransformerLens).

    Args:
        model: a Transformer.
        tokens: ``[B, (1 if bos) + 2 * half_len]`` from :func:`repeated_sequences`.
        half_len: the length of one half.
        bos: whether ``tokens`` start with a BOS token.

    Returns:
        ``{"prev_token": Tensor [L, H], "induction": Tensor [L, H]}``.
    """
    off = 1 if bos else 0
    T = off + 2 * half_len
    if tokens.dim() != 2 or tokens.shape[1] != T:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}, expected [B, {T}] for half_len={half_len}, "
                         f"bos={bos}")
    with torch.no_grad():
        _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
    pats = trace.patterns()  # [L, B, H, T, S]
    q = torch.arange(off + 1, T)
    prev = pats[..., q, q - 1].mean(dim=(1, 3))  # [L, H]
    q2 = torch.arange(off + half_len, T)  # queries in the repeated half (token equals token at q2 - half_len)
    ind = pats[..., q2, q2 - half_len + 1].mean(dim=(1, 3))  # [L, H]
    return {"prev_token": prev, "induction": ind}


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
        >>> stats = evaluate_induction(load_induction_2l())
        >>> stats["repeated"] < 0.3 * stats["first"]
        True
    """
    was_training = model.training
    model.eval()
    try:
        toks = repeated_sequences(n_seqs, half_len, model.cfg.d_vocab, seed=seed, bos_id=bos_id)
        out: dict[str, Any] = induction_losses(model, toks, half_len, bos=bos_id is not None)
        scores = attention_scores(model, toks, half_len, bos=bos_id is not None)
    finally:
        model.train(was_training)
    out.update(scores)
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
            model.eval()
            losses = induction_losses(model, eval_toks, half, bos=bos_id is not None)
            scores = attention_scores(model, eval_toks, half, bos=bos_id is not None)
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


def save_induction_model(model: Transformer, path: str | Path = INDUCTION_2L_PATH, *,
                         metadata: dict[str, Any] | None = None) -> Path:
    """Save an induction model with :func:`interp.zoo.checkpoint.save_checkpoint`, recording its BOS id.

    Args:
        model: the model (its ``tokenizer.bos_id`` is stored as metadata ``bos_id``).
        path: destination ``.safetensors`` file.
        metadata: extra JSON-serialisable entries (training settings, evaluation numbers).

    Returns:
        The path written.
    """
    tok = getattr(model, "tokenizer", None)
    meta = {"bos_id": json.dumps(getattr(tok, "bos_id", None)), "tokenizer_kind": "token-id"}
    for k, v in (metadata or {}).items():
        meta[k] = v if isinstance(v, str) else json.dumps(v)
    return save_checkpoint(model, path, metadata=meta)


def load_induction_2l(path: str | Path | None = None, *, device: torch.device | str | None = None) -> Transformer:
    """Load the shipped induction-2l checkpoint (no training needed).

    Args:
        path: another checkpoint written by :func:`save_induction_model`; default the shipped one.
        device: where to put the model.

    Returns:
        The model in eval mode, named ``"induction-2l"``, with a :class:`TokenIdTokenizer` (``"t17"`` labels).

    Raises:
        FileNotFoundError: the checkpoint is missing (rebuild it with ``python experiments/train_induction.py``).

    Example:
        >>> model = load_induction_2l()
        >>> model.to_str_tokens(torch.tensor([0, 5, 9]))
        ['<bos>', 't5', 't9']
    """
    path = Path(INDUCTION_2L_PATH if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"no induction checkpoint at {str(path)!r}; build it with "
                                "`python experiments/train_induction.py`")
    meta = read_checkpoint_metadata(path)
    model = load_checkpoint(path, device=device)
    bos_id = json.loads(meta.get("bos_id", "null"))
    model.tokenizer = TokenIdTokenizer(model.cfg.d_vocab, bos_id)
    model.name = "induction-2l" if path.resolve() == INDUCTION_2L_PATH else model.name
    return model
