"""Positional scores: the hand-built model's known heads, a naive loop reference, streaming and bad input."""

import math

import pytest
import torch
from helpers import tiny_model
from toy_models import hand_built_model

from interp import ModelConfig, Transformer
from interp.analysis import positional_scores
from interp.analysis.positional import offset_label


def _small_model(causal: bool, seed: int = 0) -> Transformer:
    model = tiny_model(seed, n_ctx=16, causal=causal, positional="rotary")
    with torch.no_grad():  # sharpen attention so that argmaxes are unique and informative
        for block in model.blocks:
            block.attn.W_qkv.weight.mul_(4.0)
    return model


def _naive(model, tokens, mask, window, delims):
    """Loop-by-loop reference of the documented statistics (mean over valid rows; unique argmax)."""
    _, trace = model.run_with_cache(tokens, attention_mask=mask, names_filter="*hook_pattern")
    B, T = tokens.shape
    L, H = model.cfg.n_layers, model.cfg.n_heads
    real = mask.bool()
    out = {}
    for layer in range(L):
        pat = trace.pattern(layer)
        for h in range(H):
            acc = {}
            for b in range(B):
                for q in range(T):
                    if not real[b, q]:
                        continue
                    row = pat[b, h, q]
                    ok = [bool(real[b, k]) and (not model.cfg.causal or k <= q) for k in range(T)]
                    vals = sorted((float(row[k]) for k in range(T)), reverse=True)
                    unique = len(vals) == 1 or vals[0] - vals[1] > 1e-6
                    best = int(row.argmax())
                    cats = {offset_label(o): [q + o] for o in range(-window, window + 1)}
                    cats["first"] = [0] if q > 0 else []
                    cats["delimiter"] = [k for k in range(T) if int(tokens[b, k]) in delims and k != q]
                    for cat, ks in cats.items():
                        ks = [k for k in ks if 0 <= k < T and ok[k]]
                        if not ks:
                            continue
                        m, hit, n = acc.get(cat, (0.0, 0, 0))
                        acc[cat] = (m + sum(float(row[k]) for k in ks), hit + int(unique and best in ks), n + 1)
            out[(layer, h)] = {c: (m / n, hit / n) for c, (m, hit, n) in acc.items()}
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_matches_naive_loops_with_padding_and_query_chunks(causal):
    model = _small_model(causal)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(1, 20, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 9:] = 0  # right padding
    mask[2, 6:] = 0
    delims = [5, 7]
    ref = _naive(model, tokens, mask, 2, delims)
    model.set_query_chunk(5)  # patterns now arrive in query chunks: the reducer must stitch them
    df = positional_scores(model, [(tokens[:2], mask[:2]), (tokens[2:], mask[2:])], window=2, delimiter_ids=delims)
    model.set_query_chunk(None)
    for r in df.itertuples():
        cats = ref[(r.layer, r.head)]
        for cat in [offset_label(o) for o in range(-2, 3)] + ["first", "delimiter"]:
            mass, share = df.at[r.Index, f"mass_{cat}"], df.at[r.Index, f"argmax_{cat}"]
            if cat not in cats:
                assert math.isnan(mass) and math.isnan(share), (r.layer, r.head, cat)
            else:
                assert mass == pytest.approx(cats[cat][0], abs=1e-5), (r.layer, r.head, cat)
                assert share == pytest.approx(cats[cat][1], abs=1e-9), (r.layer, r.head, cat)
    if causal:  # no query may look at a later token
        assert df["argmax_+1"].isna().all()


def test_hand_built_heads_are_positional_where_built():
    model = hand_built_model()
    tokens = torch.randint(0, 32, (8, 32), generator=torch.Generator().manual_seed(0))
    df = positional_scores(model, tokens).set_index(["layer", "head"])
    assert df.loc[(0, 0), "argmax_-1"] == 1.0 and df.loc[(0, 0), "best_offset"] == -1
    assert df.loc[(0, 1), "argmax_first"] == 1.0
    assert df.loc[(0, 0), "confidence"] > 0.99
    # The induction head attends by content, the control head at random: neither is positional.
    for head in [(1, 0), (1, 1)]:
        assert df.loc[head, "best_argmax"] < 0.5
        assert df.loc[head, "argmax_first"] < 0.5


def test_flat_rows_have_no_argmax():
    """A uniform head must not look like a first-token head because argmax breaks ties at index 0."""
    cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, attn_only=True)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.blocks[0].attn.W_qkv.weight.zero_()
        model.blocks[0].attn.W_qkv.bias.zero_()
    df = positional_scores(model, torch.randint(0, 10, (2, 8)))
    assert (df.argmax_first == 0).all()
    assert df.mass_first.iloc[0] == pytest.approx(sum(1 / (q + 1) for q in range(1, 8)) / 7, abs=1e-6)


def test_one_tensor_equals_its_batches():
    model = _small_model(True, seed=1)
    tokens = torch.randint(0, 20, (6, 10), generator=torch.Generator().manual_seed(2))
    a = positional_scores(model, tokens, batch_size=6)
    b = positional_scores(model, iter([tokens[:2], tokens[2:5], tokens[5:]]))
    assert ((a - b).abs().max(numeric_only=True).max()) < 1e-6  # float32 kernels differ by batch size
    assert a.attrs["n_sequences"] == b.attrs["n_sequences"] == 6


def test_bad_input():
    model = _small_model(True)
    with pytest.raises(ValueError, match="empty dataset"):
        positional_scores(model, [])
    with pytest.raises(ValueError, match="exceeds the model's n_ctx=16"):
        positional_scores(model, torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(TypeError, match="must be integers"):
        positional_scores(model, torch.zeros(1, 4))
    with pytest.raises(ValueError, match="window=-1"):
        positional_scores(model, torch.zeros(1, 4, dtype=torch.long), window=-1)


def test_tables_of_reducers_that_saw_no_data_raise():
    # A stream that never ran (e.g. a wrong treebank path caught in a notebook) must not read as all-NaN scores.
    from interp.analysis import PositionalReducer, SyntacticReducer

    model = _small_model(causal=False)
    with pytest.raises(ValueError, match="no sequence was folded"):
        PositionalReducer(model).table()
    with pytest.raises(ValueError, match="no sentence was folded"):
        SyntacticReducer(model).table()
