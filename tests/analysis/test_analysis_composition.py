"""Composition scores: the factored computation equals the naive full-matrix formula, and on induction-2l the
previous-token heads K-compose with the layer-1 induction heads more than any other pair composes."""

import pytest
import torch
from helpers import tiny_model

import interp
from interp.analysis import composition_baseline, composition_scores, composition_table
from interp.data import repeated_sequences


def _naive(model, mode, l1, h1, l2, h2):
    """Elhage et al.'s score from materialised M x M matrices, ln1 weights folded, writes centred."""
    def w(name, layer, head):
        x = getattr(model, name)[layer, head]
        if name != "W_O":
            x = x * model.blocks[layer].ln1.weight.detach()[:, None]
        return x
    w_o = w("W_O", l1, h1)
    w_o = w_o - w_o.mean(-1, keepdim=True)
    ov1 = w("W_V", l1, h1) @ w_o
    qk2 = w("W_Q", l2, h2) @ w("W_K", l2, h2).T
    w_o2 = w("W_O", l2, h2)
    right = {"Q": qk2, "K": qk2.T, "V": w("W_V", l2, h2) @ (w_o2 - w_o2.mean(-1, keepdim=True))}[mode]
    return torch.linalg.matrix_norm(ov1 @ right) / (torch.linalg.matrix_norm(ov1) * torch.linalg.matrix_norm(right))


def test_factored_scores_equal_the_naive_formula():
    model = tiny_model(0, n_layers=3, d_model=24, n_heads=3, d_vocab=20, n_ctx=8, attn_only=True)
    with torch.no_grad():  # non-trivial norm weights, so folding them matters
        for block in model.blocks:
            block.ln1.weight.uniform_(0.5, 1.5)
    for mode in "QKV":
        s = composition_scores(model, mode)
        assert s.shape == (3, 3, 3, 3)
        assert torch.isnan(s[1, :, 0]).all() and torch.isnan(s[1, :, 1]).all()  # only earlier -> later
        for (l1, h1, l2, h2) in [(0, 0, 1, 2), (0, 2, 2, 1), (1, 1, 2, 0)]:
            torch.testing.assert_close(s[l1, h1, l2, h2], _naive(model, mode, l1, h1, l2, h2), rtol=1e-4, atol=1e-6)


def _previous_token_heads(model):
    toks = repeated_sequences(8, 10, model.cfg.d_vocab, seed=3, bos_id=0)
    _, tr = model.run_with_cache(toks, names_filter="blocks.0.attn.hook_pattern")
    prev = tr["pattern", 0].diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, 2))  # [H]: mass on q - 1
    return [h for h in range(model.cfg.n_heads) if prev[h] > 0.5]


def test_induction_2l_k_composition_from_previous_token_heads_is_the_largest():
    model = interp.load("induction-2l")
    prev = _previous_token_heads(model)
    assert prev, "induction-2l should have previous-token heads in layer 0"
    df = composition_table(model)
    circuit = (df["mode"] == "K") & df["src_head"].isin(prev) & (df["dst_layer"] == 1)
    assert circuit.sum() == len(prev) * model.cfg.n_heads
    # Every previous-token -> layer-1 K pair beats every other cross-layer pair in every mode.
    assert df.loc[circuit, "score"].min() > df.loc[~circuit, "score"].max()
    assert (df.loc[circuit, "ratio"] > 2).all()  # and sits well above a random reader
    assert 0 < composition_baseline(model, "K") < df.loc[circuit, "score"].min()


def test_errors():
    model = interp.load("induction-2l")
    with pytest.raises(ValueError, match="mode must be one of"):
        composition_scores(model, "X")
