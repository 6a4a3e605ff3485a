"""Head ablation, one API for induction checks and pruning: zero, mean and resample ablation, at every position or
at chosen ones, and the comparison of target heads against random head sets of the same size.

Ablation acts on ``hook_z`` (the head's output before ``W_O``), so ablating head h replaces its residual write
``z_h W_O[h]`` by the write of the replacement z:

* ``"zero"``: z = 0 (the same as a head gate at 0). Off-distribution: the next layers never saw a missing head,
  so zero-ablation can hurt for reasons that have nothing to do with the head's job (induction-2l with its
  layer 1 zero-ablated predicts *worse* than uniform guessing on both halves).
* ``"mean"``: z = the head's mean z over a reference distribution (over examples and positions, or per
  position with ``per_position=True``); keeps the head's constant contribution, removes what depends on the
  input (Wang et al. 2022, IOI).
* ``"resample"``: z = the head's z on *another* input from the reference distribution, at the same position
  (Chan et al. 2022, causal scrubbing): on-distribution values carrying the wrong information.

Claims like "these k heads do the job" compare the effect of ablating them with ablating k random heads,
many times (:func:`compare_with_random`), not with ablating nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pandas as pd
import torch

__all__ = ["ABLATIONS", "ablate_heads", "compare_with_random", "head_z_means", "head_z_samples", "random_expert_sets",
           "random_head_sets", "repeated_text_sequences"]

#: The ablation methods.
ABLATIONS = ("zero", "mean", "resample")

Heads = Iterable[tuple[int, int]]


def _check_heads(model: Any, heads: Heads) -> dict[int, list[int]]:
    """``(layer, head)`` pairs -> ``{layer: sorted heads}``, validated against the model."""
    counts = [block.attn.n_heads for block in model.blocks]
    by_layer: dict[int, set[int]] = {}
    for pair in heads:
        try:
            layer, head = (int(x) for x in pair)
        except (TypeError, ValueError):
            raise TypeError(f"heads must be (layer, head) pairs, got {pair!r}") from None
        if not (0 <= layer < len(counts) and 0 <= head < counts[layer]):
            raise ValueError(f"head ({layer}, {head}) is outside the model (head counts per layer {counts})")
        by_layer.setdefault(layer, set()).add(head)
    return {layer: sorted(hs) for layer, hs in sorted(by_layer.items())}


def _as_token_batches(reference: Any) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """A ``[B, T]`` tensor, a batch dict or a sequence of them -> ``[(tokens, attention_mask or None)]``."""
    if isinstance(reference, (torch.Tensor, dict)):
        reference = [reference]
    out = []
    for b in reference:
        if isinstance(b, torch.Tensor):
            out.append((b if b.dim() == 2 else b[None], None))
        elif isinstance(b, dict) and "tokens" in b:
            out.append((b["tokens"], b.get("attention_mask")))
        else:
            raise TypeError(f"reference batches must be [B, T] token tensors or dicts with 'tokens', got "
                            f"{type(b).__name__}")
    if not out:
        raise ValueError("reference is empty: mean and resample ablation need reference inputs")
    return out


@torch.no_grad()
def _record_z(model: Any, reference: Any, layers: Sequence[int]) -> list[tuple[dict[int, torch.Tensor], torch.Tensor]]:
    """Clean forward passes over the reference: per batch ``({layer: z [B, T, H, D]}, real-token mask [B, T])``."""
    p = next(model.parameters())
    out = []
    for tokens, mask in _as_token_batches(reference):
        zs: dict[int, torch.Tensor] = {}

        def grab(layer: int):
            def fn(z: torch.Tensor, hook) -> None:
                zs[layer] = z.detach()  # noqa: B023 - called inside this iteration's forward pass
            return fn

        with model.hooks([(f"blocks.{layer}.attn.hook_z", grab(layer)) for layer in layers]):
            model(tokens.to(p.device), attention_mask=None if mask is None else mask.to(p.device))
        real = torch.ones(tokens.shape, dtype=torch.bool) if mask is None else mask.bool().cpu()
        out.append((zs, real))
    return out


def head_z_means(model: Any, reference: Any, layers: Sequence[int] | None = None, *,
                 per_position: bool = False) -> dict[int, torch.Tensor]:
    """Each head's mean z over a reference distribution (what mean-ablation puts in its place).

    Args:
        model: an interp Transformer.
        reference: ``[B, T]`` token ids, a batch dict (``tokens``, optional ``attention_mask``) or a sequence of
            them; padding (attention_mask 0) is left out of the mean.
        layers: the layers to record (default all).
        per_position: one mean per position ``[T, H, D]`` (all batches must have the same length) instead of
            one over all positions ``[H, D]``.

    Returns:
        ``{layer: [H, D]}`` (or ``[T, H, D]``), on the model's device.

    Raises:
        ValueError: empty reference, or batches of different lengths with ``per_position``.
        TypeError: a reference batch that is not token ids.

    Example:
        >>> means = head_z_means(model, repeated_sequences(64, 25, 128, seed=7, bos_id=0))
        >>> means[1].shape
        torch.Size([4, 32])
    """
    layers = list(range(len(model.blocks))) if layers is None else list(layers)
    recs = _record_z(model, reference, layers)
    if per_position and len({real.shape[1] for _, real in recs}) > 1:
        raise ValueError(f"per_position means need reference batches of one length, got lengths "
                         f"{sorted({real.shape[1] for _, real in recs})}")
    means = {}
    for layer in layers:
        total, count = None, None
        for zs, real in recs:
            z = zs[layer].double()  # [B, T, H, D]
            w = real.to(z.device).double()[:, :, None, None]  # [B, T, 1, 1]
            s, c = ((z * w).sum(0), w.sum(0)) if per_position else ((z * w).sum((0, 1)), w.sum((0, 1)))
            total = s if total is None else total + s
            count = c if count is None else count + c
        means[layer] = (total / count.clamp(min=1)).to(recs[0][0][layer].dtype)  # [T, H, D] or [H, D]
    return means


def head_z_samples(model: Any, reference: Any, layers: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
    """Each head's z on every reference input ``{layer: [R, T, H, D]}`` (what resample-ablation draws from).

    Raises:
        ValueError: empty reference, or reference batches of different lengths.
    """
    layers = list(range(len(model.blocks))) if layers is None else list(layers)
    recs = _record_z(model, reference, layers)
    if len({real.shape[1] for _, real in recs}) > 1:
        raise ValueError("resample ablation needs reference batches of one length, got lengths "
                         f"{sorted({real.shape[1] for _, real in recs})}")
    return {layer: torch.cat([zs[layer] for zs, _ in recs]) for layer in layers}


def _position_mask(positions: Any, B: int, T: int, device: torch.device) -> torch.Tensor | None:
    """None (every position) or a bool ``[B, T]`` mask of the positions to ablate."""
    if positions is None:
        return None
    pos = torch.as_tensor(positions, device=device)
    if pos.dtype == torch.bool:
        if pos.shape == (T,):
            return pos[None].expand(B, T)
        if pos.shape == (B, T):
            return pos
        raise ValueError(f"a bool positions mask must be [T]={T} or [B, T]=({B}, {T}), got {tuple(pos.shape)}")
    if pos.dim() != 1 or (len(pos) and (int(pos.min()) < -T or int(pos.max()) >= T)):
        raise ValueError(f"positions {positions!r} must be indices in [-{T}, {T}) or a bool mask")
    m = torch.zeros(T, dtype=torch.bool, device=device)
    m[pos.long()] = True
    return m[None].expand(B, T)


@contextlib.contextmanager
def ablate_heads(model: Any, heads: Heads, method: str = "mean", *, reference: Any = None,
                 per_position: bool = False, positions: Any = None, seed: int = 0,
                 values: dict[int, torch.Tensor] | None = None) -> Iterator[None]:
    """Run ``model`` with ``heads`` ablated inside the ``with`` block (hooks on ``hook_z``, removed on exit).

    Args:
        model: an interp Transformer.
        heads: ``(layer, head)`` pairs.
        method: ``"zero"``, ``"mean"`` or ``"resample"`` (see the module docstring).
        reference: the reference distribution for mean / resample: ``[R, T]`` token ids, a batch dict or a list of
            them. It should come from the same distribution as the inputs, not be the inputs themselves.
        per_position: mean-ablate with a per-position mean (the inputs must have the reference's length).
        positions: ablate only at these query positions (indices, a bool ``[T]`` or ``[B, T]`` mask); None =
            everywhere.
        seed: which reference input each ablated input draws (resample); each input draws one reference input,
            with replacement, shared by all ablated heads (one coherent "other input").
        values: precomputed replacements ``{layer: z}`` from :func:`head_z_means` / :func:`head_z_samples`
            (saves the reference passes when the same heads are ablated many times).

    Raises:
        ValueError: unknown method, a head out of range, a missing reference, bad positions, or an input whose
            length does not match a per-position / resample reference.

    Example:
        >>> with ablate_heads(model, [(1, 0), (1, 2)], "mean", reference=ref_tokens):
        ...     logits = model(tokens)
    """
    if method not in ABLATIONS:
        raise ValueError(f"method={method!r} is not one of {ABLATIONS}")
    by_layer = _check_heads(model, heads)
    layers = list(by_layer)
    if method != "zero" and values is None:
        if reference is None:
            raise ValueError(f"method={method!r} needs reference inputs (reference=...) or precomputed values")
        values = (head_z_means(model, reference, layers, per_position=per_position) if method == "mean"
                  else head_z_samples(model, reference, layers))
    gen = torch.Generator().manual_seed(seed)
    draws: dict[int, torch.Tensor] = {}  # batch size -> reference rows, shared across layers in one forward

    def hook_for(layer: int):
        idx = by_layer[layer]

        def fn(z: torch.Tensor, hook) -> torch.Tensor:
            B, T, H, D = z.shape
            hs = torch.tensor(idx, device=z.device)
            if method == "zero":
                rep = torch.zeros(B, T, len(idx), D, dtype=z.dtype, device=z.device)
            elif method == "mean":
                v = values[layer].to(device=z.device, dtype=z.dtype)
                if v.dim() == 3:  # per position [T_ref, H, D]
                    if v.shape[0] != T:
                        raise ValueError(f"per-position means have length {v.shape[0]}, the input has {T}")
                    rep = v[None, :, hs].expand(B, T, len(idx), D)
                else:
                    rep = v[None, None, hs].expand(B, T, len(idx), D)
            else:
                v = values[layer].to(device=z.device, dtype=z.dtype)  # [R, T_ref, H, D]
                if v.shape[1] != T:
                    raise ValueError(f"resample reference has length {v.shape[1]}, the input has {T}")
                if B not in draws:
                    draws[B] = torch.randint(0, v.shape[0], (B,), generator=gen)
                rep = v[draws[B].to(z.device)][:, :, hs]  # [B, T, k, D]
            mask = _position_mask(positions, B, T, z.device)
            z = z.clone()
            if mask is None:
                z[:, :, hs] = rep
            else:
                z[:, :, hs] = torch.where(mask[:, :, None, None], rep, z[:, :, hs])
            return z

        return fn

    def new_forward(_module, _inputs) -> None:
        draws.clear()  # a fresh draw per forward pass, shared by every ablated layer of that pass

    handle = model.register_forward_pre_hook(new_forward)
    try:
        with model.hooks([(f"blocks.{layer}.attn.hook_z", hook_for(layer)) for layer in layers]):
            yield
    finally:
        handle.remove()


def random_head_sets(model: Any, k: int, n_draws: int, *, seed: int = 0, exclude: Heads = (),
                     layers: Sequence[int] | None = None,
                     skip_sets: Iterable[Heads] = ()) -> list[list[tuple[int, int]]]:
    """``n_draws`` distinct random sets of ``k`` heads (sampled without replacement inside a set).

    Args:
        model: gives the head counts.
        k: heads per set.
        n_draws: how many sets (fewer when fewer distinct sets exist).
        seed: the random generator's seed.
        exclude: heads never drawn (e.g. the target heads, for a "k other heads" baseline).
        layers: draw only from these layers (default all).
        skip_sets: sets never returned (e.g. the target set itself, which is no random comparison).

    Raises:
        ValueError: k < 1, n_draws < 1, or fewer than k heads to draw from.

    Example:
        >>> random_head_sets(model, 4, 20, seed=0)[0]
        [(0, 1), (1, 0), (1, 3), (0, 2)]
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be an int >= 1")
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 1:
        raise ValueError(f"n_draws={n_draws!r} must be an int >= 1")
    ex = set(map(tuple, exclude))
    layers = range(len(model.blocks)) if layers is None else layers
    pool = [(layer, h) for layer in layers for h in range(model.blocks[layer].attn.n_heads) if (layer, h) not in ex]
    return _draw_sets(pool, k, n_draws, seed, skip_sets, "heads")


def random_expert_sets(model: Any, k: int, n_draws: int, *, seed: int = 0, exclude: Iterable[tuple[int, int]] = (),
                       layers: Sequence[int] | None = None,
                       skip_sets: Iterable[Iterable[tuple[int, int]]] = ()) -> list[list[tuple[int, int]]]:
    """``n_draws`` distinct random sets of ``k`` ``(layer, expert)`` pairs from the MoE layers, as
    :func:`random_head_sets` draws heads.

    Raises:
        ValueError: k < 1, n_draws < 1, a model without experts, or fewer than k experts to draw from.

    Example:
        >>> sets = random_expert_sets(moe_model, 2, 20, seed=0)   # 20 distinct pairs of (layer, expert)
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be an int >= 1")
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 1:
        raise ValueError(f"n_draws={n_draws!r} must be an int >= 1")
    cfg = model.cfg
    moe = [layer for layer in range(cfg.n_layers) if cfg.is_moe_layer(layer)]
    if not moe:
        raise ValueError(f"model has no mixture-of-experts layer (cfg.n_experts={cfg.n_experts})")
    ex = set(map(tuple, exclude))
    layers = moe if layers is None else [layer for layer in layers if layer in moe]
    pool = [(layer, e) for layer in layers for e in range(cfg.n_experts) if (layer, e) not in ex]
    return _draw_sets(pool, k, n_draws, seed, skip_sets, "experts")


def _draw_sets(pool: list[tuple[int, int]], k: int, n_draws: int, seed: int, skip_sets: Iterable,
               what: str) -> list[list[tuple[int, int]]]:
    """Distinct random k-subsets of ``pool`` (heads or experts), never one of ``skip_sets``."""
    if len(pool) < k:
        raise ValueError(f"k={k} {what} requested but only {len(pool)} {what} to draw from")
    gen = torch.Generator().manual_seed(seed)
    sets: list[list[tuple[int, int]]] = []
    skip = {frozenset(tuple(map(int, h)) for h in s) for s in skip_sets}
    seen: set[frozenset] = set()
    for _ in range(50 * n_draws):
        pick = [pool[int(i)] for i in torch.randperm(len(pool), generator=gen)[:k]]
        if frozenset(pick) not in seen and frozenset(pick) not in skip:
            seen.add(frozenset(pick))
            sets.append(pick)
        if len(sets) == n_draws:
            break
    return sets


def compare_with_random(measure, target: Sequence[tuple[int, int]], model: Any, *, n_draws: int = 20,
                        seed: int = 0, exclude_target: bool = False,
                        layers: Sequence[int] | None = None, units: str = "heads") -> pd.DataFrame:
    """The effect of ablating ``target`` beside the effects of ablating random head sets of the same size.

    With ``units="experts"`` the sets are ``(layer, expert)`` pairs of a mixture-of-experts model, drawn by
    :func:`random_expert_sets` (``measure`` then ablates experts, e.g. with
    :func:`interp.analysis.experts.ablate_experts`).

    Args:
        measure: ``measure(heads) -> float``, the quantity with ``heads`` ablated (e.g. the in-context gain).
        target: the heads the claim is about.
        model: gives the head counts for the random draws.
        n_draws: random sets (>= 20 for a claim; fewer when the model has fewer distinct sets).
        seed: of the random draws.
        exclude_target: draw random sets among the other heads only (by default random sets may share heads
            with the target, but are never the target set itself).
        layers: draw random sets only from these layers.

    Returns:
        DataFrame ``set, heads, value``: the first row is ``"none"`` (nothing ablated), then ``"target"``, then
        ``"random {i}"``. ``df.attrs``: ``n_random``, ``target_value``, ``random_min``, ``random_max``,
        ``random_mean``, ``random_sd``, ``rank`` (random sets whose value is <= the target's; 0 = the target
        lowers the measure more than every random set).

    Example:
        >>> df = compare_with_random(lambda hs: gain_with(hs), induction_heads, model, n_draws=20)
        >>> df.attrs["rank"]   # 0: the target removes more gain than every random set
    """
    target = [tuple(map(int, h)) for h in target]
    k = len(target)
    if k == 0:
        raise ValueError("target is empty: name the heads the claim is about")
    if units not in ("heads", "experts"):
        raise ValueError(f"units={units!r} must be 'heads' or 'experts'")
    draw = random_head_sets if units == "heads" else random_expert_sets
    sets = draw(model, k, n_draws, seed=seed, exclude=target if exclude_target else (), layers=layers,
                skip_sets=[target])
    tag = "H" if units == "heads" else "E"
    rows = [{"set": "none", "heads": "", "value": float(measure([]))},
            {"set": "target", "heads": " ".join(f"L{a}{tag}{b}" for a, b in target), "value": float(measure(target))}]
    for i, s in enumerate(sets):
        rows.append({"set": f"random {i}", "heads": " ".join(f"L{a}{tag}{b}" for a, b in s),
                     "value": float(measure(s))})
    df = pd.DataFrame(rows)
    rand = df.value[2:]
    tv = float(df.value[1])
    df.attrs.update(n_random=len(sets), target_value=tv, random_min=float(rand.min()), random_max=float(rand.max()),
                    random_mean=float(rand.mean()), random_sd=float(rand.std(ddof=1)) if len(rand) > 1 else 0.0,
                    rank=int((rand <= tv).sum()))
    return df


def repeated_text_sequences(model: Any, texts: Iterable[str], n_seqs: int, half_len: int, *,
                            bos_id: int | None = None) -> torch.Tensor:
    """Natural text repeated once: ``[bos] x_1..x_n x_1..x_n`` with x a run of ``half_len`` consecutive tokens
    of the texts (joined, special tokens dropped), so the first half has the model's ordinary text loss and the
    repeated half can be predicted by induction.

    Args:
        model: a model with a tokenizer (``model.to_tokens``).
        texts: the text source (e.g. UD EWT dev sentences from :func:`interp.pruning.ud_sentences`).
        n_seqs: sequences to build (consecutive, non-overlapping runs).
        half_len: tokens per half.
        bos_id: prepended when given (default: the tokenizer's ``bos_id`` when it has one).

    Returns:
        LongTensor ``[n_seqs, (1 if bos) + 2 * half_len]``.

    Raises:
        ValueError: not enough text for ``n_seqs`` runs, or non-positive sizes.

    Example:
        >>> toks = repeated_text_sequences(model, ud_sentences(path, 500), 32, 40)
    """
    if n_seqs < 1 or half_len < 1:
        raise ValueError(f"n_seqs={n_seqs} and half_len={half_len} must be >= 1")
    tok = model._need_tokenizer() if hasattr(model, "_need_tokenizer") else model.tokenizer
    if bos_id is None:
        bos_id = getattr(tok, "bos_id", None)
    special = set(getattr(tok, "special_ids", set()) or set())
    stream: list[int] = []
    need = n_seqs * half_len
    for text in texts:
        ids = model.to_tokens(text)[0].tolist()  # [T] with the model's special tokens
        stream.extend(i for i in ids if i not in special)
        if len(stream) >= need:
            break
    if len(stream) < need:
        raise ValueError(f"the texts hold {len(stream)} tokens, {need} needed for {n_seqs} x {half_len}")
    half = torch.tensor(stream[:need], dtype=torch.long).view(n_seqs, half_len)  # [N, n]
    parts = [half, half]
    if bos_id is not None:
        parts.insert(0, torch.full((n_seqs, 1), int(bos_id), dtype=torch.long))
    return torch.cat(parts, dim=1)  # [N, (1) + 2n]
