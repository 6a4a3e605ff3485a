"""Tokenizers for abstract token ids (``"t17"``), for the built-in toy models and token-id checkpoints."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import torch

#: The BOS id of induction-2l: every sequence starts with it, it never appears elsewhere (an attention sink).
BOS_ID = 0

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
        >>> from interp.zoo.token_ids import TokenIdTokenizer
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


__all__ = ["BOS_ID", "TOKEN_ID_KIND", "TokenIdTokenizer", "token_id_tokenizer"]
