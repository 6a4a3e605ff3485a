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
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..model import Transformer
from .checkpoint import load_checkpoint, save_checkpoint

__all__ = [
    "INDUCTION_2L_CONFIG", "INDUCTION_2L_PATH", "BOS_ID", "RANDOM_TINY_CONFIG", "TOKEN_ID_KIND", "TokenIdTokenizer",
    "build_induction_model", "load_induction_2l", "load_random_tiny", "save_induction_model",
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

#: Architecture of "random-tiny": a randomly initialised 2-layer GQA decoder, small enough to load instantly
#: (for trying the tools, the dashboard and tests; its heads mean nothing).
RANDOM_TINY_CONFIG = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=64, n_ctx=48,
                                 attn_only=True)

#: The ``tokenizer_kind`` a checkpoint's header records for a :class:`TokenIdTokenizer` (which has no JSON form).
TOKEN_ID_KIND = "token-id"

_TOKEN_RX = re.compile(r"^t(\d+)$")


class TokenIdTokenizer:
    """A tokenizer for abstract token ids: id 17 is the string ``"t17"``, the BOS id is ``"<bos>"``.

    It exists so that figures and the app can label positions; it has no text semantics.

    Args:
        d_vocab: vocabulary size.
        bos_id: the BOS id (or ``None``).

    Example:
        >>> from interp.zoo.induction import TokenIdTokenizer
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

    @property
    def bos_token_id(self) -> int | None:
        """:attr:`bos_id` under the name :class:`~interp.zoo.tokenizer.Tokenizer` (and Hugging Face) gives it:
        ``model.tokenizer.bos_token_id`` reads the BOS id of every model interp loads (the docs' recipes use it)."""
        return self.bos_id

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

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        """The ``t<id>`` strings of one sequence joined by spaces (the BOS dropped if ``skip_special_tokens``)."""
        strs = self.to_str_tokens(ids)
        return " ".join(s for s in strs if not (skip_special_tokens and s == self.bos_token))

    def to_tokens(self, text: str | Sequence[str], *, max_length: int | None = None,
                  prepend_bos: bool = True, special_tokens: bool = True) -> torch.Tensor:
        """Parse whitespace-separated ``t<id>`` strings (one text, or a list of equally long texts).

        Args:
            text: e.g. ``"t3 t9 t3"``, or a list of such strings.
            max_length: refuse longer sequences.
            special_tokens: ``False``: no BOS whatever ``prepend_bos`` says.
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
            if special_tokens and prepend_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
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


def load_induction_2l(path: str | Path | None = None, *, device: torch.device | str | None = None) -> Transformer:
    """Load the shipped induction-2l checkpoint (no training needed), or another one written by
    :func:`save_induction_model`.

    Args:
        path: another checkpoint written by :func:`save_induction_model`; default the shipped one.
        device: where to put the model.

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
    model = load_checkpoint(path, device=device)  # attaches the TokenIdTokenizer its header records
    model.name = "induction-2l" if path.resolve() == INDUCTION_2L_PATH else path.stem
    return model


def token_id_tokenizer(header: dict[str, str], d_vocab: int, where: str) -> TokenIdTokenizer:
    """The :class:`TokenIdTokenizer` a checkpoint header describes (``tokenizer_kind`` ``"token-id"``, ``bos_id``).

    Raises:
        ValueError: the stored BOS id is not JSON null or an integer inside the vocabulary (``where`` named).
    """
    try:
        bos_id = json.loads(header.get("bos_id", "null"))
    except json.JSONDecodeError:
        bos_id = header.get("bos_id")
    if bos_id is not None and (not isinstance(bos_id, int) or isinstance(bos_id, bool)):
        raise ValueError(f"{where}: bos_id {header.get('bos_id')!r} in the header is not an integer")
    try:
        return TokenIdTokenizer(d_vocab, bos_id)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


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
