"""Test fixture: a hand-built model with one coreference head, and GAP / CorefUD files it is judged on: a known answer.

Residual stream (no norms, attention only): ``[token one-hot (V) | position one-hot (N)]``; a WordPiece
tokenizer over a tiny vocabulary (``Rosenthals`` splits into ``Rosenthal ##s``, so sub-token sums matter).

- ``L0H0`` the coreference head: the pronoun *she* queries a "female" feature that the keys of the female names
  hold, *he* a "male" one; every other token attends uniformly. It picks the antecedent in every row of
  :func:`toy_gap_lines`.
- ``L0H1`` previous-token head, ``L1H0`` first-token head, ``L1H1`` random query/key weights on positions only.
  These three read positions only, so on the two rows of a she/he pair (same names, same positions, opposite
  answers) they pick the same name: at most half right, no better than the nearest-name baseline.
"""

from __future__ import annotations

import torch

from interp.config import ModelConfig
from interp.model import Transformer

__all__ = ["COREF_HEAD", "hand_built_coref_model", "toy_corefud_lines", "toy_gap_lines"]

FEMALE, MALE = ("Anna", "Mary", "Kate"), ("Bob", "John", "Tom")
_OTHER = ("she", "he", "met", "and", "then", "smiled", "left", ".", "Rosenthal", "##s")
VOCAB = ("[PAD]", "[UNK]", *FEMALE, *MALE, *_OTHER)

#: The one head :func:`hand_built_coref_model` wires for coreference.
COREF_HEAD = (0, 0)


def _tokenizer():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    from interp.zoo.tokenizer import Tokenizer

    tok = HFTokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return Tokenizer(tok, pad_token_id=0)


@torch.no_grad()
def hand_built_coref_model(n_ctx: int = 32, *, sharpness: float = 20.0, seed: int = 0,
                           causal: bool = True) -> Transformer:
    """Build the model of the module docstring, with its tokenizer.

    Args:
        n_ctx: context length.
        sharpness: attention logit of a matching key (others 0).
        seed: seed of L1H1's random weights.
        causal: a decoder (default) or a bidirectional encoder.

    Returns:
        An attention-only :class:`~interp.Transformer` with 2 layers of 2 heads and ``tokenizer`` set.

    Example:
        >>> model = hand_built_coref_model()
        >>> model.tokenizer.encode_words(["Anna", "met", "Rosenthals"])[1]
        [0, 1, 2, 2]
    """
    V, N = len(VOCAB), n_ctx
    D = max(V, N)
    TOK, POS = 0, V
    M = V + N
    cfg = ModelConfig(n_layers=2, d_model=M, n_heads=2, d_head=D, attn_only=True, causal=causal,
                      positional="learned", normalization="none", d_vocab=V, n_ctx=N, attn_bias=True, out_bias=False)
    model = Transformer(cfg)
    for p in model.parameters():
        p.zero_()
    model.embed.weight[torch.arange(V), TOK + torch.arange(V)] = 1.0
    model.pos_embed.weight[torch.arange(N), POS + torch.arange(N)] = 1.0
    c = sharpness * D ** 0.5  # scores are divided by sqrt(D)
    H = 2
    idx = {w: i for i, w in enumerate(VOCAB)}

    def rows(attn, kind: str, head: int) -> torch.Tensor:
        base = {"q": 0, "k": H * D, "v": 2 * H * D}[kind] + head * D  # W_qkv rows: [q heads | k heads | v heads]
        return attn.W_qkv.weight[base:base + D]

    a0, a1 = model.blocks[0].attn, model.blocks[1].attn
    q, k = rows(a0, "q", 0), rows(a0, "k", 0)
    q[0, TOK + idx["she"]] = c  # "she" looks for feature 0 ...
    q[1, TOK + idx["he"]] = c
    for w in FEMALE:
        k[0, TOK + idx[w]] = 1.0  # ... which the female names hold
    for w in MALE:
        k[1, TOK + idx[w]] = 1.0
    q, k = rows(a0, "q", 1), rows(a0, "k", 1)
    j = torch.arange(N - 1)
    q[j, POS + j + 1] = c  # the query at position i lights dimension i - 1, which the key at i - 1 holds
    k[torch.arange(N), POS + torch.arange(N)] = 1.0
    a1.W_qkv.bias[0] = c  # L1H0: a constant query ...
    rows(a1, "k", 0)[0, POS + 0] = 1.0  # ... that matches the key of position 0
    g = torch.Generator().manual_seed(seed)
    for kind in ("q", "k"):  # random, but reading positions only: blind to which pronoun it is
        rows(a1, kind, 1)[:, POS:POS + N] = torch.randn(D, N, generator=g)
    rows(a1, "v", 1)[:] = torch.randn(D, M, generator=g)
    model.name = "hand-built-coref"
    model.tokenizer = _tokenizer()
    return model.eval()


_HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"


def toy_gap_lines(cataphora: bool = True) -> list[str]:
    """GAP TSV lines (header first) for :func:`hand_built_coref_model`.

    Twelve rows in she/he pairs (same names and positions, opposite answers), the antecedent first in half of
    them and nearest in the other half; with ``cataphora``, two more rows whose names follow the pronoun (not
    scorable by a causal model).
    """
    out = [_HEADER]
    for i, (f, m) in enumerate(zip(FEMALE, MALE)):
        for first, second in ((f, m), (m, f)):
            for pron in ("she", "he"):
                text = f"{first} met {second} and then {pron} smiled ."
                a_is = (first in FEMALE) == (pron == "she")
                out.append("\t".join([f"t{i}", text, pron, str(text.index(f" {pron} ") + 1), first, "0",
                                      str(a_is).upper(), second, str(len(first) + 5), str(not a_is).upper(), "-"]))
    if cataphora:
        for pron, name in (("she", "Anna"), ("he", "Bob")):
            text = f"then {pron} smiled and {name} met Rosenthals ."
            out.append("\t".join(["cata", text, pron, "5", name, str(text.index(name)), "TRUE", "Rosenthals",
                                  str(text.index("Rosenthals")), "FALSE", "-"]))
    return out


def toy_corefud_lines() -> list[str]:
    """The twelve backward rows of :func:`toy_gap_lines` as CorefUD documents (names and pronoun as mentions)."""
    out = []
    for d, row in enumerate(toy_gap_lines(cataphora=False)[1:]):
        f = row.split("\t")
        words, pron, first, second = f[1].split(), f[2], f[4], f[7]
        ent = {first: "1", second: "2"}
        ref = ent[first] if f[6] == "TRUE" else ent[second]
        out.append(f"# newdoc id = d{d}\n")
        for i, w in enumerate(words):
            e = ent.get(w) or (ref if w == pron else None)
            upos = "PRON" if w == pron else "PROPN" if e else "X"
            misc = f"Entity=({e}-person-x-x-x-1-coref)" if e else "_"
            out.append(f"{i + 1}\t{w}\t{w}\t{upos}\t_\t_\t0\troot\t_\t{misc}\n")
        out.append("\n")
    return out
