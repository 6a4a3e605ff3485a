"""Ready-made inputs for trying interp, the names the docstring examples start from.

Each name is built when it is imported (a module ``__getattr__``), afresh on every import and seeded (the same
numbers each time), so an example pastes into a notebook as written and may change what it imported::

    >>> from interp.examples import model, tokens
    >>> model(tokens).shape
    torch.Size([2, 21, 128])

- ``model``: ``interp.load("induction-2l")`` (2 layers x 4 heads, vocabulary 128, BOS id 0);
- ``tokens``: ``[2, 21]`` repeated random sequences for it (``[bos] x x``, 10 tokens repeated once);
- ``trace``: the trace of ``model.run_with_cache(tokens)`` (every hook recorded);
- ``clean`` (``tokens``), ``corrupted`` (the repeated half replaced), ``answers`` (``[2, 2]`` correct / wrong next
  tokens at the last position) and ``metric`` (the in-context advantage), for activation patching;
- ``train``, ``held_out``, ``objective``: ``build_task(model, data={"n_seqs": 8, "batch_size": 4})``, and
  ``batches`` (``train``), for pruning;
- ``moe_model``, ``moe_tokens``: a tiny mixture-of-experts decoder (2 layers of 4 experts, top-2) and ``[4, 8]``
  random ids for it;
- ``tok``: MiniLM's :class:`interp.zoo.tokenizer.Tokenizer`;
- ``tmp``: a new temporary folder (a ``Path``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_HALF = 10  # the repeated half of ``tokens``


def _model() -> Any:
    import interp

    torch.manual_seed(0)
    return interp.load("induction-2l")


def _tokens() -> torch.Tensor:
    from .data import repeated_sequences

    model = _model()
    return repeated_sequences(2, _HALF, model.cfg.d_vocab, seed=0, bos_id=model.tokenizer.bos_id)  # [2, 21]


def _trace() -> Any:
    return _model().run_with_cache(_tokens())[1]


def _corrupted() -> torch.Tensor:
    from .analysis import corrupt_repeats

    model = _model()
    return corrupt_repeats(_tokens(), _HALF, model.cfg.d_vocab, bos_id=model.tokenizer.bos_id, seed=1)


def _answers() -> torch.Tensor:
    tokens, d_vocab = _tokens(), _model().cfg.d_vocab
    return torch.stack([tokens[:, _HALF + 1], (tokens[:, _HALF + 1] + 1) % d_vocab], dim=1)  # [2, 2]


def _metric() -> Callable[[torch.Tensor], torch.Tensor]:
    from .analysis import in_context_metric

    return in_context_metric(_tokens(), _HALF, bos=True)


def _task(part: int) -> Any:
    from .pruning import build_task

    return list(build_task(_model(), data={"n_seqs": 8, "batch_size": 4}))[part]  # (train, held_out, objective)


def _moe_model() -> Any:
    from .config import ModelConfig
    from .model import Transformer

    torch.manual_seed(0)
    return Transformer(ModelConfig(
        n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=8, activation="swiglu", positional="rotary",
        normalization="rms", causal=True, n_experts=4, n_experts_per_token=2)).eval()


def _moe_tokens() -> torch.Tensor:
    torch.manual_seed(0)
    _moe_model()  # the ids follow the model's draws, as in the examples' original setup
    return torch.randint(0, 20, (4, 8))


def _tok() -> Any:
    import os

    from .zoo.minilm import minilm_path
    from .zoo.tokenizer import Tokenizer

    return Tokenizer.from_file(os.path.join(minilm_path(), "tokenizer.json"))


_BUILDERS: dict[str, Callable[[], Any]] = {
    "model": _model, "tokens": _tokens, "clean": _tokens, "trace": _trace, "corrupted": _corrupted,
    "answers": _answers, "metric": _metric, "train": lambda: _task(0), "held_out": lambda: _task(1),
    "objective": lambda: _task(2), "batches": lambda: _task(0), "moe_model": _moe_model, "moe_tokens": _moe_tokens,
    "tok": _tok, "tmp": lambda: Path(tempfile.mkdtemp(prefix="interp-example-")),
}


def __getattr__(name: str) -> Any:
    """Build ``name`` (one of the names listed in the module docstring) afresh.

    Raises:
        AttributeError: ``name`` is not one of them.
    """
    if name not in _BUILDERS:
        raise AttributeError(f"module 'interp.examples' has no {name!r}; it builds {sorted(_BUILDERS)}")
    return _BUILDERS[name]()


def __dir__() -> list[str]:
    return sorted(_BUILDERS)
