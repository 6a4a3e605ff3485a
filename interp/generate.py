"""Generation, gpt-fast style: :func:`prefill` the prompt, then :func:`decode_one_token` at a time, each token
chosen by :func:`sample` (greedy, or temperature / top-k / top-p sampling as Hugging Face computes them).

Both steps are the model's own forward pass over a static :class:`~interp.kv_cache.KVCache`, so every hook
attached to the model fires during generation: steering (adding a vector at a layer, ablating a head) is a
hook around :func:`generate`. While nothing is attached, a step past the prompt runs the same blocks as one
traced, hook-free function over weights laid out for few-row products (:mod:`interp.decode`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from .decode import LeanDecoder, layout_for_generate
from .hooks import NamesFilter
from .kv_cache import KVCache
from .rotary import cache_needs_recompute

if TYPE_CHECKING:
    from .model import Transformer
    from .trace import Trace


class GenerateOptions(TypedDict, total=False):
    """The keyword arguments of :func:`generate`, which :meth:`interp.Transformer.generate` passes on (a test
    keeps the two lists equal)."""

    use_cache: bool
    eos_token_id: int | None
    pack_weights: bool | None
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int | None
    stop_tokens: int | Sequence[int] | None
    pad_token_id: int | None
    return_trace: bool
    trace_filter: NamesFilter


def prefill(model: Transformer, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the prompt ``tokens`` ``[B, T]`` through the model into ``cache``; returns the last position's
    logits ``[B, d_vocab]`` (the others are not unembedded).

    Example:
        >>> import torch
        >>> from interp.generate import prefill
        >>> from interp import ModelConfig, Transformer
        >>> model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=11, n_ctx=16))
        >>> cache = model.make_cache(batch_size=1)
        >>> with torch.no_grad():
        ...     prefill(model, torch.tensor([[1, 2, 3]]), cache).shape, cache.length
        (torch.Size([1, 11]), 3)
    """
    return _last_logits(model, tokens, cache)


def decode_one_token(model: Transformer, token: torch.Tensor, cache: KVCache,
                     decoder: LeanDecoder | None = None) -> torch.Tensor:
    """Append one token per sequence (``token`` ``[B]``) to ``cache``; returns the next logits ``[B, d_vocab]``.

    Args:
        decoder: a :class:`~interp.decode.LeanDecoder` that :meth:`~interp.decode.LeanDecoder.usable` allows:
            the step then runs as its traced, hook-free function. ``None``: the hooked forward pass.

    Example:
        >>> import torch
        >>> from interp.generate import decode_one_token, prefill
        >>> from interp import ModelConfig, Transformer
        >>> model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=11, n_ctx=16))
        >>> cache = model.make_cache(batch_size=1)
        >>> with torch.no_grad():
        ...     logits = prefill(model, torch.tensor([[1, 2, 3]]), cache)
        ...     decode_one_token(model, logits.argmax(-1), cache).shape, cache.length
        (torch.Size([1, 11]), 4)
    """
    if decoder is not None:
        return decoder.step(token, cache)
    return _last_logits(model, token[:, None], cache)


def _last_logits(model: Transformer, tokens: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """The next-token logits ``[B, d_vocab]`` after ``tokens`` ``[B, T]``: the blocks run over every position (into
    ``cache``), the output head only over the last (generation reads nothing else; no hook sees the others)."""
    resid = model(tokens, kv_cache=cache, stop_at_layer=model.cfg.n_layers)  # [B, T, M]
    return model.unembed_residual(resid[:, -1:])[:, -1]  # [B, 1, M] -> [B, V]


#: Temperatures below this are applied to logits shifted by their maximum (see :func:`process_logits`).
SHIFTED_BELOW = 1e-4


def process_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering of ``logits`` ``[B, V]``, in the order and with
    the arithmetic of Hugging Face's ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and
    ``TopPLogitsWarper``: removed entries become ``-inf``; top-p keeps at least one token.

    Below a temperature of :data:`SHIFTED_BELOW`, ``logits / T`` can overflow (a denormal ``T = 1e-45`` turns every
    logit into +-inf, and softmax into NaN): there each row's maximum is subtracted first (softmax does not change)
    and the maximum stays 0 even where ``T`` rounds to 0 in float32, so a tiny temperature samples the argmax.

    Example:
        >>> import torch
        >>> from interp.generate import process_logits
        >>> process_logits(torch.tensor([[1.0, 3.0, 2.0]]), top_k=2)
        tensor([[-inf, 3., 2.]])
        >>> process_logits(torch.tensor([[1.0, 3.0, 2.0]]), temperature=1e-45).softmax(-1)
        tensor([[0., 1., 0.]])
    """
    if temperature >= SHIFTED_BELOW:
        scores = logits / temperature if temperature != 1.0 else logits
    else:
        shifted = logits - logits.max(-1, keepdim=True).values  # [B, V], <= 0
        scores = torch.where(shifted == 0, shifted, shifted / temperature)  # 0 / 0 would be NaN
    if top_k is not None:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]))[0][..., -1, None]  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)  # [B, V] each
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - top_p)
        remove_sorted[..., -1:] = False  # the most likely token always stays
        remove = remove_sorted.scatter(1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def sample(logits: torch.Tensor, *, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of each sequence from ``logits`` ``[B, V]``: the argmax at ``temperature`` 0, else one
    draw from ``softmax(process_logits(...))`` with ``torch.multinomial`` (Hugging Face's sampling step).

    Args:
        generator: the random stream (``None``: torch's global one, as Hugging Face uses).

    Returns:
        ``[B]`` token ids.

    Example:
        >>> import torch
        >>> from interp.generate import sample
        >>> sample(torch.tensor([[0.0, 5.0, 1.0]]))
        tensor([1])
        >>> sample(torch.tensor([[0.0, 5.0, 1.0]]), temperature=1.0, top_k=1)
        tensor([1])
    """
    if temperature == 0:
        return logits.argmax(-1)
    probs = process_logits(logits.float(), temperature=temperature, top_k=top_k, top_p=top_p).softmax(-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)  # [B, 1] -> [B]


@torch.no_grad()
def generate(
    model: Transformer,
    tokens: torch.Tensor,
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    eos_token_id: int | None = None,
    pack_weights: bool | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    return_trace: bool = False,
    trace_filter: NamesFilter = None,
) -> torch.Tensor | tuple[torch.Tensor, Trace]:
    """Append ``max_new_tokens`` tokens to each prompt: greedy by default, or sampled.

    One static :class:`~interp.kv_cache.KVCache` and one output buffer serve the whole run, and the prompt's
    logits are computed for its last position only. Every hook attached to the model fires at the prompt and
    at every step (the steering recipe of ``docs/generation.md``). While none is attached (and no head gate),
    a step past the prompt runs as :class:`~interp.decode.LeanDecoder`'s traced, hook-free form of the same
    blocks, over the weights laid out by :func:`interp.decode.decoding` when inside it, else by this call
    when it pays. The tokens are the same on every path, up to float rounding in near ties.

    Args:
        model: a causal :class:`~interp.model.Transformer` with an unembedding.
        tokens: ``[B, T]`` (or ``[T]``) prompt ids, unpadded.
        max_new_tokens: how many tokens to append.
        use_cache: decode with the KV cache (False recomputes the whole sequence every step).
        eos_token_id: a stop token (as ``stop_tokens=[eos_token_id]``).
        pack_weights: lay the float32 CPU linear weights out for this call's row count (MKL-packed copies
            from ``PACK_MIN_ROWS`` sequences, transposed ones below); ``None`` when it pays (see
            :func:`interp.decode.layout_for_generate`). Inside :func:`~interp.decode.decoding` its layout serves.
        temperature: 0 picks the most likely token (greedy); above 0 samples from ``softmax(logits / T)``.
        top_k: sample among the ``top_k`` most likely tokens only (``None``: all).
        top_p: sample from the smallest set of tokens whose probability reaches ``top_p`` (``None``: all).
        seed: seeds this call's own random generator (an int in ``[-2**63, 2**64)``), so the same seed gives the
            same tokens (``None``: torch's global generator, as Hugging Face's ``generate`` uses).
        stop_tokens: a sequence is done once it produces one of these; the run stops when every sequence is.
        pad_token_id: what a done sequence gets at the positions after its stop token (default: that stop
            token again).
        return_trace: also return a :class:`~interp.trace.Trace` of the result: one forward pass over the
            returned tokens with the same hooks attached, recording ``trace_filter`` (every hook point by
            default), i.e. the activations that chose each generated token, up to float rounding.
        trace_filter: the hook names to record (as ``run_with_cache``'s ``names_filter``).

    Returns:
        ``[B, T + new]`` ids (fewer new ones when every sequence stopped), or ``(ids, trace)``.

    Raises:
        TypeError: an argument has the wrong type (``max_new_tokens``, ``pack_weights``, ``seed``, ...).
        ValueError: the model is not a causal decoder with an unembedding, prompt + new > n_ctx, or a sampling
            argument is out of range (``temperature`` < 0, ``top_k`` < 1, ``top_p`` outside (0, 1], ``seed``
            outside ``[-2**63, 2**64)``, a stop token outside the vocabulary).

    Example:
        >>> import torch
        >>> from interp.generate import generate
        >>> from interp import ModelConfig, Transformer
        >>> model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=11, n_ctx=16))
        >>> prompt = torch.tensor([[1, 2, 3]])
        >>> generate(model, prompt, 4).shape
        torch.Size([1, 7])
        >>> a = generate(model, prompt, 4, temperature=0.8, top_p=0.9, seed=0)
        >>> torch.equal(a, generate(model, prompt, 4, temperature=0.8, top_p=0.9, seed=0))
        True
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens={max_new_tokens!r} must be an int")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    cfg = model.cfg
    if not (cfg.causal and cfg.unembed):
        raise ValueError("generate needs a causal decoder with an unembedding (cfg.causal and cfg.unembed)")
    tokens = model._check_tokens(tokens)
    B, T = tokens.shape
    if T + max_new_tokens > cfg.n_ctx:
        raise ValueError(f"prompt {T} + max_new_tokens {max_new_tokens} exceeds n_ctx={cfg.n_ctx}")
    _check_sampling(temperature, top_k, top_p, seed)
    stops = _stop_ids(stop_tokens, eos_token_id, cfg.d_vocab)
    if pad_token_id is not None and (isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)
                                     or not 0 <= pad_token_id < cfg.d_vocab):
        raise ValueError(f"pad_token_id={pad_token_id!r} must be a token id in [0, {cfg.d_vocab})")
    generator = None if seed is None else torch.Generator(device=tokens.device).manual_seed(seed)
    cache = model.make_cache(B, T + max_new_tokens) if use_cache else None
    # One output buffer and one static cache for the whole run: steps write in place, nothing regrows.
    out = tokens.new_empty(B, T + max_new_tokens)  # [B, T + new]
    out[:, :T] = tokens
    n = T
    stop_set = torch.tensor(stops, dtype=out.dtype, device=out.device) if stops else None
    done = torch.zeros(B, dtype=torch.bool, device=out.device)
    fill = out.new_zeros(B)  # what a done sequence gets from then on
    # The lock is held for the whole run: the laid-out weights must not meet another thread's pass.
    with model.lock:
        held = model._decode_layout  # decoding()'s layout, when inside that block
        own = None if held is not None else layout_for_generate(model, B, max_new_tokens, use_cache=use_cache,
                                                                 pack_weights=pack_weights)
        if held is not None and pack_weights is not None and not isinstance(pack_weights, bool):
            raise TypeError(f"pack_weights={pack_weights!r} must be True, False or None")
        try:
            # Past the prompt, a step skips the hooked forward while nothing could observe the difference.
            layout = held if held is not None else own
            decoder = LeanDecoder.for_generate(model, layout, B) if use_cache and layout is not None else None
            for _ in range(max_new_tokens):
                if cache is None:  # use_cache=False
                    logits = _last_logits(model, out[:, :n], None)
                elif n == T:
                    logits = prefill(model, out[:, :T], cache)  # [B, V]
                elif cache_needs_recompute(cfg.rope_scaling, n - 1, n):  # LongRoPE past its original context
                    cache.reset()
                    logits = prefill(model, out[:, :n], cache)  # [B, V]
                else:
                    logits = decode_one_token(model, out[:, n - 1], cache, decoder)  # [B, V]
                nxt = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
                if stop_set is not None:
                    nxt = torch.where(done, fill, nxt)
                    hit = ~done & torch.isin(nxt, stop_set)
                    fill = torch.where(hit, nxt if pad_token_id is None else fill.new_full((B,), pad_token_id),
                                       fill)
                    done |= hit
                out[:, n] = nxt
                n += 1
                if stop_set is not None and bool(done.all()):
                    break
            if not return_trace:
                return out[:, :n]
            _, trace = model.run_with_cache(out[:, :n], names_filter=trace_filter)
            return out[:, :n], trace
        finally:
            if own is not None:
                own.release()


def _check_sampling(temperature: Any, top_k: Any, top_p: Any, seed: Any) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature={temperature!r} must be a number")
    if not temperature >= 0 or temperature == float("inf"):
        raise ValueError(f"temperature={temperature!r} must be a finite number >= 0 (0 is greedy)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise TypeError(f"top_k={top_k!r} must be an int or None")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1 (None keeps every token)")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))):
        raise TypeError(f"top_p={top_p!r} must be a number or None")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r} must be in (0, 1] (None keeps every token)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed={seed!r} must be an int or None")
    if seed is not None and not -2 ** 63 <= seed < 2 ** 64:
        raise ValueError(f"seed={seed} is outside what torch's random generator takes, [-2**63, 2**64)")


def _stop_ids(stop_tokens: Any, eos_token_id: Any, d_vocab: int) -> list[int]:
    if stop_tokens is None:
        ids: list[Any] = []
    elif isinstance(stop_tokens, int) and not isinstance(stop_tokens, bool):
        ids = [stop_tokens]
    elif isinstance(stop_tokens, (list, tuple, set, frozenset)):
        ids = list(stop_tokens)
    else:
        raise TypeError(f"stop_tokens={stop_tokens!r} must be a token id or a sequence of token ids")
    if eos_token_id is not None:
        ids.append(eos_token_id)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"stop token {i!r} must be an int token id")
        if not 0 <= i < d_vocab:
            raise ValueError(f"stop token {i} is outside the vocabulary [0, {d_vocab})")
    return sorted(set(ids))
