"""The shipped induction-2l model, its training function and the repeated-sequence data generators."""

from __future__ import annotations

import math

import pytest
import torch

from interp import ModelConfig
from interp.analysis import in_context_gain
from interp.data import first_occurrence_mask, induction_training_batch, repeated_sequences
from interp.training import evaluate_induction, train_induction_model
from interp.zoo.induction import (
    INDUCTION_2L_PATH,
    TokenIdTokenizer,
    build_induction_model,
    load_induction_2l,
    save_induction_model,
)

EVAL_SEED = 777  # training used seeds 0, 1, 2; the script's evaluation uses 2024


# --- data generators --------------------------------------------------------------------------------------
def test_repeated_sequences_shape_repeat_and_bos():
    toks = repeated_sequences(16, 10, 50, seed=3, bos_id=7)
    assert toks.shape == (16, 21) and toks.dtype == torch.long
    assert (toks[:, 0] == 7).all()
    assert torch.equal(toks[:, 1:11], toks[:, 11:])
    assert not (toks[:, 1:] == 7).any(), "the BOS id must not appear inside a sequence"
    assert toks.min() >= 0 and toks.max() < 50
    assert torch.equal(toks, repeated_sequences(16, 10, 50, seed=3, bos_id=7))
    assert not torch.equal(toks, repeated_sequences(16, 10, 50, seed=4, bos_id=7))
    gen = torch.Generator().manual_seed(3)
    assert torch.equal(repeated_sequences(16, 10, 50, generator=gen, bos_id=7), toks)


def test_repeated_sequences_are_uniform_over_non_bos_ids():
    toks = repeated_sequences(2000, 25, 10, seed=0, bos_id=4)[:, 1:26]
    counts = torch.bincount(toks.flatten(), minlength=10).float()
    assert counts[4] == 0
    expected = toks.numel() / 9
    # chi-square with 8 dof: 40 is far beyond the 99.99% quantile (~31.8)
    chi2 = float(((counts[counts > 0] - expected) ** 2 / expected).sum())
    assert chi2 < 40, chi2


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_seqs=0, half_len=3, d_vocab=5), "n_seqs=0"),
    (dict(n_seqs=2, half_len=3, d_vocab=5, bos_id=5), "bos_id=5"),
    (dict(n_seqs=2, half_len=-1, d_vocab=5), "half_len=-1"),
])
def test_repeated_sequences_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        repeated_sequences(**kwargs)


def test_training_batch_copies_spans_and_mask_marks_them():
    toks, pred = induction_training_batch(200, 40, 30, p_repeat=0.5, bos_id=0, seed=1, return_mask=True)
    assert toks.shape == pred.shape == (200, 40)
    assert (toks[:, 0] == 0).all() and not (toks[:, 1:] == 0).any()
    has_repeat = pred.any(1)
    assert 0.35 < float(has_repeat.float().mean()) < 0.65, "about half the sequences repeat a span"
    for row, marks in zip(toks.tolist(), pred.tolist()):
        for t in (t for t, m in enumerate(marks) if m):
            # Brute force: the bigram (t-1, t) occurs earlier, so an induction head can predict token t.
            assert (row[t - 1], row[t]) in set(zip(row[:t - 2], row[1:t - 1])), (row, t)
    spans = pred.sum(1)[has_repeat] + 1  # the copy's first token is not marked
    assert spans.min() >= 4 and spans.max() <= 19 and len(set(spans.tolist())) > 5, "span lengths vary"


def test_training_batch_without_repeats_and_bad_args():
    toks, pred = induction_training_batch(8, 16, 20, p_repeat=0.0, seed=0, return_mask=True)
    assert not pred.any()
    with pytest.raises(ValueError, match="p_repeat=1.5"):
        induction_training_batch(8, 16, 20, p_repeat=1.5)
    with pytest.raises(ValueError, match="min_span=10"):
        induction_training_batch(8, 16, 20, min_span=10)


def test_first_occurrence_mask_matches_naive_positions():
    for bos in (False, True):
        off = int(bos)
        first, rep = first_occurrence_mask(2, 4, bos=bos)
        T = off + 8
        # Naive: target position p = t + 1; first half is positions off..off+3, repeated off+4..off+7.
        exp_first = [1 <= t + 1 < off + 4 and t + 1 >= off for t in range(T - 1)]
        exp_rep = [t + 1 > off + 4 for t in range(T - 1)]
        assert first[0].tolist() == exp_first and rep[1].tolist() == exp_rep


# --- tokenizer ----------------------------------------------------------------------------------------------
def test_token_id_tokenizer_round_trip_and_errors():
    tok = TokenIdTokenizer(128, bos_id=0)
    ids = torch.tensor([[0, 17, 5, 127]])
    strs = tok.to_str_tokens(ids[0])
    assert strs == ["<bos>", "t17", "t5", "t127"]
    assert torch.equal(tok.to_tokens(" ".join(strs[1:])), ids)
    assert torch.equal(tok.to_tokens(" ".join(strs)), ids)
    with pytest.raises(ValueError, match="'x3'"):
        tok.to_tokens("t1 x3")
    with pytest.raises(ValueError, match="t128"):
        tok.to_tokens("t128")


# --- the shipped checkpoint ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    if not INDUCTION_2L_PATH.is_file():
        pytest.fail(f"shipped checkpoint missing: {INDUCTION_2L_PATH}; run experiments/train_induction.py")
    return load_induction_2l()


def test_shipped_checkpoint_is_small_and_loads(shipped):
    assert INDUCTION_2L_PATH.stat().st_size < 2 * 1024 * 1024
    assert shipped.cfg.n_layers == 2 and shipped.cfg.attn_only and shipped.cfg.causal
    assert shipped.name == "induction-2l" and not shipped.training
    assert shipped.to_str_tokens(torch.tensor([0, 5])) == ["<bos>", "t5"]


def test_interp_load_builtin_name_gives_same_weights(shipped):
    from interp.zoo import load

    model = load("induction-2l")
    toks = repeated_sequences(4, 20, model.cfg.d_vocab, seed=EVAL_SEED, bos_id=0)
    assert torch.equal(model(toks), shipped(toks))


def test_shipped_model_has_in_context_gain_on_fresh_data(shipped):
    half = 25
    toks = repeated_sequences(64, half, shipped.cfg.d_vocab, seed=EVAL_SEED, bos_id=0)
    # Independent naive reference: per-position log-softmax loss computed position by position.
    with torch.no_grad():
        logits = shipped(toks)
    logp = torch.log_softmax(logits, -1)
    first = [-logp[:, t, toks[:, t + 1]].diagonal().mean() for t in range(0, half)]  # targets 1..half
    rep = [-logp[:, t, toks[:, t + 1]].diagonal().mean() for t in range(half + 1, 2 * half)]
    first_loss, rep_loss = float(torch.stack(first).mean()), float(torch.stack(rep).mean())
    assert first_loss > 0.9 * math.log(shipped.cfg.d_vocab - 1), "first occurrences are unpredictable"
    assert rep_loss < 0.3 * first_loss, (first_loss, rep_loss)
    got = in_context_gain(shipped, toks, half, bos=True)
    assert got["first"] == pytest.approx(first_loss, rel=1e-5)
    assert got["repeated"] == pytest.approx(rep_loss, rel=1e-5)


def test_shipped_model_has_previous_token_and_induction_heads(shipped):
    half = 20
    toks = repeated_sequences(32, half, shipped.cfg.d_vocab, seed=EVAL_SEED + 1, bos_id=0)
    ev = evaluate_induction(shipped, n_seqs=32, half_len=half, seed=EVAL_SEED + 1)
    # Naive reference, one query at a time from the recorded patterns: mean weight on the targets over the
    # rows that have one (previous token: key q - 1; induction: keys k != q whose previous token equals q's).
    _, trace = shipped.run_with_cache(toks, names_filter="*hook_pattern")
    B, T = toks.shape
    for kind, layer in (("prev_token", 0), ("induction", 1)):
        p = trace.pattern(layer)  # [B, H, T, T]
        masses = []
        for b in range(B):
            for q in range(T):
                if kind == "prev_token":
                    keys = [q - 1] if q else []
                else:
                    keys = [k for k in range(1, q + 1) if k != q and toks[b, k - 1] == toks[b, q]]
                if keys:
                    masses.append(p[b, :, q, keys].sum(-1))
        naive = torch.stack(masses).mean(0)  # [H]
        assert torch.allclose(ev[kind][layer].float(), naive, atol=1e-5), kind
        assert float(naive.max()) > 0.5
    assert ev["best_prev_token"][0] == int(ev["prev_token"][0].argmax())
    assert ev["best_induction"][0] == int(ev["induction"][1].argmax())


def test_ablating_layer_one_removes_the_gain(shipped):
    toks = repeated_sequences(32, 25, shipped.cfg.d_vocab, seed=EVAL_SEED + 2, bos_id=0)
    base = in_context_gain(shipped, toks, 25, bos=True)
    ablated = in_context_gain(shipped, toks, 25, bos=True, ablate=[(1, h) for h in range(shipped.cfg.n_heads)])
    assert shipped.blocks[1].attn.gate is None  # the gates were removed again
    assert ablated["gain"] < 0.25 * base["gain"], (base, ablated)


# --- training -----------------------------------------------------------------------------------------------
TINY = ModelConfig(n_layers=2, d_model=32, n_heads=2, attn_only=True, d_vocab=32, n_ctx=24)


def test_training_is_deterministic_and_loss_decreases():
    kw = dict(steps=30, seed=5, cfg=TINY, batch_size=16, lr=1e-2, warmup=5, eval_every=15, progress=False)
    m1, h1 = train_induction_model(**kw)
    m2, h2 = train_induction_model(**kw)
    assert h1.train_loss.tolist()[1:] == h2.train_loss.tolist()[1:]
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert list(h1.step) == [0, 15, 30]
    # Before training the loss is about log(V) above the floor; it drops once unigram statistics are learned.
    assert h1.first_loss.iloc[-1] < h1.first_loss.iloc[0]
    assert h1.train_loss.iloc[-1] < h1.train_loss.iloc[1]
    _, h3 = train_induction_model(**{**kw, "seed": 6})
    assert h3.train_loss.tolist()[1:] != h1.train_loss.tolist()[1:]


def test_save_and_load_round_trip(tmp_path):
    model = build_induction_model(TINY, seed=1)
    path = save_induction_model(model, tmp_path / "tiny.safetensors", metadata={"note": "x"})
    back = load_induction_2l(path)
    toks = repeated_sequences(2, 5, TINY.d_vocab, seed=0, bos_id=0)
    assert torch.equal(back(toks), model.eval()(toks))
    assert back.tokenizer.bos_id == 0 and back.checkpoint_metadata["note"] == "x"


def test_interp_load_of_a_saved_induction_checkpoint_has_its_tokenizer_and_own_name(tmp_path):
    # `interp train-induction` tells users to load its output with interp.load(path).
    import interp

    model = build_induction_model(TINY, seed=1)
    assert model.name == "induction-2l"  # what the header stores: it must not pass for the shipped model
    path = save_induction_model(model, tmp_path / "retrained.safetensors")
    back = interp.load(path)
    assert back.name == "retrained" and back.name == load_induction_2l(path).name
    assert isinstance(back.tokenizer, TokenIdTokenizer) and back.tokenizer.bos_id == 0
    assert back.to_str_tokens(torch.tensor([0, 5, 9])) == ["<bos>", "t5", "t9"]
    toks = back.to_tokens("t3 t4 t3")
    assert toks.tolist() == [[0, 3, 4, 3]] and torch.equal(back(toks), model.eval()(toks))
    assert interp.load(INDUCTION_2L_PATH).name == "induction-2l"  # the shipped file keeps the built-in's name
    none = save_induction_model(build_induction_model(TINY, bos_id=None), tmp_path / "no-bos.safetensors")
    assert interp.load(none).tokenizer.bos_id is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps=0"):
        train_induction_model(steps=0, progress=False)
    with pytest.raises(FileNotFoundError, match="train_induction.py"):
        load_induction_2l("/nonexistent/x.safetensors")
    with pytest.raises(ValueError, match=r"expected \[B, 11\]"):
        in_context_gain(build_induction_model(TINY), torch.zeros(2, 7, dtype=torch.long), 5, bos=True)
