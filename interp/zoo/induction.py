"""The "induction-2l" model: a 2-layer attention-only decoder trained to continue repeated token spans.

Trained by :func:`interp.training.train_induction_model` on :func:`interp.data.induction_training_batch`
(random sequences, half of which copy a
random span to a later position), it grows the textbook two-head circuit (Olsson et al., 2022): a
previous-token head in layer 0 writes "the token before me was A" into each position, and an induction head
in layer 1 uses it (K-composition) to attend from the current token A to the token right after an earlier A,
and copies that token. On a sequence that repeats a random half, loss on the repeated half falls far below
the first half (the in-context gain).

The shipped checkpoint lives beside this module (``checkpoints/induction-2l.safetensors``) and is rebuilt by
``python experiments/train_induction.py --out DIR --replace-shipped`` (same seed, same weights up to floating point).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..model import Transformer
from .checkpoint import load_checkpoint, save_checkpoint
from .token_ids import BOS_ID, TOKEN_ID_KIND, TokenIdTokenizer, token_id_tokenizer

__all__ = [
    "INDUCTION_2L_CONFIG", "INDUCTION_2L_PATH", "BOS_ID", "RANDOM_TINY_CONFIG", "TOKEN_ID_KIND", "TokenIdTokenizer",
    "build_induction_model", "load_induction_2l", "load_random_tiny", "save_induction_model", "token_id_tokenizer",
]

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

#: Architecture of "random-tiny": a randomly initialised 2-layer GQA decoder, small enough to load instantly
#: (for trying the tools, the dashboard and tests; its heads mean nothing).
RANDOM_TINY_CONFIG = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=64, n_ctx=48,
                                 attn_only=True)


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
        >>> from interp.zoo.induction import build_induction_model
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
    meta = {"bos_id": json.dumps(getattr(tok, "bos_id", None)), "tokenizer_kind": TOKEN_ID_KIND}
    for k, v in (metadata or {}).items():
        meta[k] = v if isinstance(v, str) else json.dumps(v)
    return save_checkpoint(model, path, metadata=meta)


def load_induction_2l(path: str | Path | None = None, *, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None) -> Transformer:
    """Load the shipped induction-2l checkpoint (no training needed), or another one written by
    :func:`save_induction_model`.

    Args:
        path: another checkpoint written by :func:`save_induction_model`; default the shipped one.
        device: where to put the model.
        dtype: the parameters' dtype, built in it (default: as stored, float32).

    Returns:
        The model in eval mode with a :class:`TokenIdTokenizer` (``"t17"`` labels), named ``"induction-2l"``
        for the shipped checkpoint and after its file (``path.stem``) for any other.

    Raises:
        FileNotFoundError: the checkpoint is missing (rebuild it with
            ``python experiments/train_induction.py --out DIR --replace-shipped``).

    Example:
        >>> import torch
        >>> from interp.zoo.induction import load_induction_2l
        >>> model = load_induction_2l()
        >>> model.to_str_tokens(torch.tensor([0, 5, 9]))
        ['<bos>', 't5', 't9']
    """
    path = Path(INDUCTION_2L_PATH if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"no induction checkpoint at {str(path)!r}; build it with "
                                "`python experiments/train_induction.py --out DIR --replace-shipped`")
    model = load_checkpoint(path, device=device, dtype=dtype)  # attaches the TokenIdTokenizer its header records
    model.name = "induction-2l" if path.resolve() == INDUCTION_2L_PATH else path.stem
    return model


def load_random_tiny(*, seed: int = 0) -> Transformer:
    """The "random-tiny" model: :data:`RANDOM_TINY_CONFIG`, randomly initialised, with a token-id tokenizer.

    Args:
        seed: initialisation seed (drawn from a forked RNG: the global torch RNG is left untouched).

    Returns:
        A :class:`Transformer` in eval mode named ``"random-tiny"``.

    Example:
        >>> from interp.zoo.induction import load_random_tiny
        >>> load_random_tiny().cfg.n_kv_heads
        2
    """
    model = build_induction_model(RANDOM_TINY_CONFIG, seed=seed)
    model.name = "random-tiny"
    return model.eval()
