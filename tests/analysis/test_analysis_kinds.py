"""The head-kind registry and the kinds added on it (sink, copy suppression, successor), on hand-built models whose
answer is known (tests/toy_kinds.py), with their intervals and their bad input."""

import pytest
import torch
from helpers import run_cli
from toy_kinds import ORDINAL, ov_model, sink_model, successor_of
from toy_models import HAND_BUILT_KINDS, hand_built_model

from interp.analysis import classify_heads
from interp.analysis.kind_causal import kind_metric, ordinal_prompts, paired_random_test
from interp.analysis.kinds import HeadKind, head_kinds, register_kind, resolve_kinds
from interp.analysis.retrieval import RetrievalReducer
from interp.analysis.successor import succession_scores
from interp.analysis.uncertainty import bootstrap_interval
from interp.data.needle import needle_batches
from interp.data.ordinal import ORDINAL_SEQUENCES, ordinal_token_sequences
from interp.streaming import MeanReducer

OPTS = {"ordinal_tokens": ORDINAL}


@pytest.fixture(scope="module")
def ov_report():
    return classify_heads(ov_model(), kinds=["copy-suppression", "successor"], options=OPTS, progress=False)


# --- the registry -----------------------------------------------------------------------------------------------
def test_registry_holds_every_kind_with_data_threshold_reason_and_source():
    kinds = head_kinds()
    classic = {"positional", "previous-token", "duplicate-token", "induction", "syntactic", "coreference"}
    assert set(kinds) >= classic | {"sink", "copy-suppression", "successor", "retrieval"}
    for k in kinds.values():
        assert k.threshold and k.reason and k.source and k.labels
    assert {k.name for k in resolve_kinds(None)} == classic  # the new kinds are opt-in
    assert {k.name for k in resolve_kinds("all")} == set(kinds)


def test_unknown_kind_name_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown head kind\(s\) \['inductoin'\].*'induction'"):
        classify_heads(hand_built_model(), kinds=["induction", "inductoin"])
    with pytest.raises(ValueError, match="needs conllu="):
        classify_heads(hand_built_model(), kinds=["syntactic"])
    with pytest.raises(ValueError, match=r"options \['sink_treshold'\]"):
        classify_heads(hand_built_model(), kinds=["sink"], options={"sink_treshold": 0.5})
    with pytest.raises(ValueError, match="sink_threshold='high' must be a float"):
        classify_heads(hand_built_model(), kinds=["sink"], options={"sink_threshold": "high"})
    with pytest.raises(ValueError, match="already registered"):
        register_kind(HeadKind("induction", ("x",), "text", None, lambda run, r: [], "t", "r", "s"))
    with pytest.raises(ValueError, match="data='video'"):
        register_kind(HeadKind("new", ("x",), "video", None, lambda run, r: [], "t", "r", "s"))


def test_a_subset_runs_only_its_kinds_and_says_what_data_each_used():
    r = classify_heads(hand_built_model(), kinds=["previous-token"], n_seqs=8, progress=False)
    assert r.as_dict() == {(0, 0): {"previous-token"}}
    assert r.kinds_run == ["previous-token"] and "positional" not in r.details
    assert list(r.probes) == ["previous-token"] and "repeated once" in r.probes["previous-token"]
    full = classify_heads(hand_built_model(), n_seqs=16, progress=False)
    assert full.as_dict() == HAND_BUILT_KINDS  # the default selection is unchanged
    assert "uniform random tokens" in full.probes["positional"]


def test_extra_reducers_reach_the_report():
    red = MeanReducer("blocks.0.attn.hook_pattern")
    r = classify_heads(hand_built_model(), n_seqs=4, extra_reducers=[red], progress=False)
    pattern = r.extra["0:MeanReducer"]["blocks.0.attn.hook_pattern"]
    assert pattern.shape[0] == 2 and torch.allclose(pattern.sum(-1), torch.ones(pattern.shape[:2]))


def test_figure_legend_and_colours_come_from_the_registry():
    r = classify_heads(sink_model(), kinds=["positional", "sink"], n_seqs=8, progress=False)
    legend = {t.name: t for t in r.figure().data if t.type == "scatter" and t.name}
    assert "sink" in legend
    assert legend["sink"].marker.color == head_kinds()["sink"].colour
    assert legend["sink"].meta.startswith("Xiao et al. 2023")


def test_cli_kinds_option(capsys):
    code, _, err = run_cli(capsys, "heads", "--model", "random-tiny", "--kinds", "sink,bogus", "--no-progress")
    assert code != 0 and "bogus" in err and "copy-suppression" in err


# --- sinks ------------------------------------------------------------------------------------------------------
def test_sink_head_found_and_told_apart_from_a_first_token_reader():
    r = classify_heads(sink_model(), kinds=["positional", "sink"], n_seqs=16, progress=False)
    assert r.heads("sink") == [(0, 0)]
    # L0H1 attends to the first token as much, but reads a value as large as any: a positional head, no sink.
    assert r.heads("positional:first") == [(0, 1)]
    assert r.kinds(0, 2) == {"positional:-1"}
    table = r.details["sink"].set_index(["layer", "head"])
    assert table.loc[(0, 0), "sink_mass"] > 0.99 and table.loc[(0, 0), "value_ratio"] == 0
    assert table.loc[(0, 1), "sink_mass"] > 0.99 and table.loc[(0, 1), "value_ratio"] == pytest.approx(1)
    assert table.loc[(0, 2), "sink_mass"] < 0.1  # previous-token: only row 1 attends to the first token
    # Without the sink kind both first-token heads keep positional:first.
    plain = classify_heads(sink_model(), kinds=["positional"], n_seqs=16, progress=False)
    assert plain.heads("positional:first") == [(0, 0), (0, 1)]


def test_sink_mass_matches_a_naive_loop():
    model = sink_model()
    with torch.no_grad():
        model.blocks[0].attn.W_qkv.bias.mul_(0.01)  # soften: masses strictly between 0 and 1
    tokens = torch.randint(0, 16, (6, 12), generator=torch.Generator().manual_seed(3))
    r = classify_heads(model, kinds=["sink"], tokens=tokens, progress=False)
    _, cache = model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_pattern"])
    p = cache["blocks.0.attn.hook_pattern"]  # [B, H, T, S]
    naive = p[:, :, 1:, 0].mean(-1).mean(0)  # per sequence over queries 1.., then over sequences
    got = torch.tensor(r.details["sink"].sink_mass.values, dtype=torch.float32)
    assert torch.allclose(got, naive.float(), atol=1e-6)
    assert 0.05 < float(naive[0]) < 0.95


# --- copy suppression and successor (weights) ---------------------------------------------------------------------
def test_copy_suppression_head_found_alone(ov_report):
    assert ov_report.heads("copy-suppression") == [(1, 0)]
    row = ov_report.df[ov_report.df.kind == "copy-suppression"].iloc[0]
    assert row.score == 1.0  # the attended token is below every other token, always


def test_successor_head_found_alone_and_scores_match_a_naive_ov_product(ov_report):
    assert ov_report.heads("successor") == [(1, 1)]
    model = ov_model()
    hits = succession_scores(model, ORDINAL)  # [L, H, n]
    # Reference: one-hot token @ W_V @ W_O @ W_U^T, argmax over the ordinal tokens (layer 0 writes nothing).
    pool = sorted({t for s in ORDINAL for t in s})
    items = [t for s in ORDINAL for t in s[:-1]]
    for head in range(4):
        w_v = model.blocks[1].attn.W_qkv.weight[2 * 4 * 32 + head * 32: 2 * 4 * 32 + (head + 1) * 32]  # [D, M]
        w_o = model.blocks[1].attn.W_O.weight[:, head * 32:(head + 1) * 32]  # [M, D]
        logits = torch.eye(64)[items] @ w_v.T @ w_o.T @ model.unembed.weight.T  # [n, V]
        top = torch.tensor(pool)[logits[:, pool].argmax(-1)]
        naive = (top == torch.tensor([successor_of(t) for t in items])).float()
        assert torch.equal(hits[1, head], naive)
    assert hits[1, 1].mean() == 1 and hits[1, 3].mean() == pytest.approx(11 / 24)


def test_borderline_head_is_reported_uncertain_not_flipped():
    r = classify_heads(ov_model(), kinds=["successor"], options=OPTS, bootstrap=500, progress=False)
    df = r.df.set_index(["layer", "head"])
    assert list(r.df.columns)[-3:] == ["low", "high", "uncertain"]
    assert not df.loc[(1, 1), "uncertain"] and df.loc[(1, 1), "low"] == 1.0
    # L1H3 scores 11/24 < 0.5, but its interval reaches 0.5: reported as uncertain, not silently absent.
    assert df.loc[(1, 3), "uncertain"] and df.loc[(1, 3), "low"] < 0.5 <= df.loc[(1, 3), "high"]
    strict = classify_heads(ov_model(), kinds=["successor"], options={**OPTS, "successor_threshold": 0.9},
                            bootstrap=500, progress=False)
    assert strict.heads("successor") == [(1, 1)]  # far from 0.9: no longer borderline
    assert "ordinal_tokens" in strict.probes["successor"]


def test_successor_bad_input():
    with pytest.raises(ValueError, match=r"ordinal tokens \[99\] lie outside"):
        succession_scores(ov_model(), [[1, 2, 99]])
    with pytest.raises(ValueError, match="at least one ordinal sequence"):
        succession_scores(ov_model(), [[5]])


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_rows():
    gen = torch.Generator().manual_seed(0)
    small = (torch.rand(40, generator=gen) < 0.3).float()
    big = (torch.rand(4000, generator=gen) < 0.3).float()
    lo_s, hi_s = bootstrap_interval(small, 500)
    lo_b, hi_b = bootstrap_interval(big, 500)
    assert lo_s <= float(small.mean()) <= hi_s and lo_b <= float(big.mean()) <= hi_b
    assert hi_b - lo_b < (hi_s - lo_s) / 5  # ~sqrt(100) narrower
    with pytest.raises(ValueError, match="n_resamples=0"):
        bootstrap_interval(small, 0)


# --- the ordinal data --------------------------------------------------------------------------------------------
class _Tok:
    """A tokenizer whose vocabulary holds some items as one token and splits the rest."""

    def __init__(self, single: set[str]):
        self.single = sorted(single)

    def encode(self, text, add_special_tokens=False):
        return [self.single.index(text)] if text in self.single else [0, 1]


def test_ordinal_tokens_keep_the_longest_single_token_run():
    days = ORDINAL_SEQUENCES["days"]
    tok = _Tok({" " + d for d in days if d != "Wednesday"} | {" " + m for m in ORDINAL_SEQUENCES["months"]})
    seqs = ordinal_token_sequences(tok)
    assert set(seqs) == {"days", "months"}  # numbers and letters are not single tokens here
    assert [tok.single[i].strip() for i in seqs["days"]] == ["Thursday", "Friday", "Saturday", "Sunday"]
    assert len(seqs["months"]) == 12
    with pytest.raises(ValueError, match="no ordinal task"):
        ordinal_token_sequences(_Tok(set()))


# --- causal evidence against random head sets ---------------------------------------------------------------------
def test_paired_random_test_statistics_match_a_naive_computation():
    model = ov_model()
    effect = {(1, 1): 2.0}  # per example i: clean i, ablating L1H1 adds 2 + i / 10, any other head adds 0.1

    def per(heads):
        base = torch.arange(6, dtype=torch.float64)
        return base + sum(effect.get(h, 0.1) + (torch.arange(6) / 10 if h in effect else 0) for h in heads)

    df = paired_random_test(model, [(1, 1)], per, n_draws=20)
    assert df.attrs["n_random"] == 7  # 8 heads, the target excluded as a set: 7 distinct single heads
    assert df.attrs["target_effect"] == pytest.approx(2.25)
    assert df.attrs["random_effect"] == pytest.approx(0.1)
    assert df.attrs["paired_mean"] == pytest.approx(2.15)
    assert df.attrs["paired_low"] <= 2.15 <= df.attrs["paired_high"]
    assert df.attrs["beyond_random"] == 0 and df.attrs["p_value"] < 0.05


def test_successor_and_copy_suppression_heads_beat_random_sets_causally():
    model = ov_model()
    prompts, answers = ordinal_prompts(ORDINAL)
    succ = paired_random_test(model, [(1, 1)], kind_metric(model, "successor", prompts, answers=answers))
    assert succ.attrs["rank"] == 0 and succ.attrs["beyond_random"] == 0  # lowers the successor's log-prob most
    assert succ.attrs["paired_high"] < 0 and succ.attrs["p_value"] < 0.01
    text = torch.randint(0, 32, (16, 12), generator=torch.Generator().manual_seed(0))
    cs = paired_random_test(model, [(1, 0)], kind_metric(model, "copy-suppression", text))
    assert cs.attrs["target_effect"] > 0 and cs.attrs["beyond_random"] == 0  # earlier tokens rise without it
    assert cs.attrs["paired_low"] > 0 and cs.attrs["p_value"] < 0.01


def test_a_dormant_sink_changes_nothing_when_ablated():
    model = sink_model()
    text = torch.randint(0, 16, (8, 12), generator=torch.Generator().manual_seed(0))
    df = paired_random_test(model, [(0, 0)], kind_metric(model, "sink", text))
    assert abs(df.attrs["target_effect"]) < 1e-6  # it writes nothing: mean ablation writes the same nothing
    with pytest.raises(ValueError, match="kind='function-vector'"):
        kind_metric(model, "function-vector", text)
    with pytest.raises(ValueError, match="needs answers="):
        kind_metric(model, "successor", text)


# --- retrieval (needle in a haystack) ------------------------------------------------------------------------------
NEEDLE = {"needle_len": 6, "needle_context": 32}


def test_retrieval_head_found_alone_on_the_hand_built_model():
    # L1H0 attends to the token after the earlier occurrence of the current token: in the answer, the needle
    # token to copy next. No other head does.
    r = classify_heads(hand_built_model(), kinds=["retrieval"], n_seqs=16, options=NEEDLE, progress=False)
    assert r.heads("retrieval") == [(1, 0)]
    assert r.df.score.iloc[0] > 0.99 and "needle" in r.probes["retrieval"]


def test_needle_batches_layout_and_targets_match_a_naive_loop():
    b = needle_batches(40, 3, 24, 5, bos_id=0, seed=1)[0]
    for row, (n0, a0) in enumerate(zip(b.annotations["needle"].tolist(), b.annotations["answer"].tolist())):
        seq = b.tokens[row].tolist()
        assert seq[0] == 0 and a0 == 19 and seq[n0:n0 + 5] == seq[a0:]
        hay = seq[1:n0] + seq[n0 + 5:a0]
        assert not set(hay) & set(seq[a0:])  # the needle's tokens never occur in the haystack
    tgt = RetrievalReducer(hand_built_model()).targets(b, slice(None))["retrieval"]  # [B, T, S]
    naive = torch.zeros_like(tgt)
    for row, (n0, a0) in enumerate(zip(b.annotations["needle"].tolist(), b.annotations["answer"].tolist())):
        for j in range(4):  # answer token j predicts needle token j + 1
            naive[row, a0 + j, n0 + j + 1] = True
    assert torch.equal(tgt, naive)


def test_a_needle_longer_than_the_context_is_refused_by_value():
    with pytest.raises(ValueError, match="needle_len=20 does not fit in context=32"):
        classify_heads(hand_built_model(), kinds=["retrieval"], options={"needle_len": 20, "needle_context": 32})
    with pytest.raises(ValueError, match="context=64 is longer than the model's n_ctx=32"):
        classify_heads(hand_built_model(), kinds=["retrieval"], options={"needle_len": 6, "needle_context": 64})
    with pytest.raises(ValueError, match="needle_len=1 must be an int >= 2"):
        needle_batches(40, 2, 24, 1)


def test_ablating_the_retrieval_head_lowers_needle_recall_more_than_random_heads():
    model = hand_built_model()
    tokens = torch.cat([b.tokens for b in needle_batches(32, 8, 32, 6, seed=0)])
    df = paired_random_test(model, [(1, 0)], kind_metric(model, "retrieval", tokens, half_len=6))
    assert df.attrs["rank"] == 0 and df.attrs["beyond_random"] == 0
    assert df.attrs["paired_high"] < 0 and df.attrs["p_value"] < 0.05


# --- intervals for the induction family ------------------------------------------------------------------------------
def test_induction_family_intervals_resample_sequences_whose_mean_is_the_score():
    from helpers import tiny_model

    model = tiny_model(1)
    r = classify_heads(model, kinds=["previous-token", "induction"], n_seqs=12, bootstrap=300,
                       previous_token_threshold=0.2, induction_threshold=0.1, copying_threshold=0.0,
                       progress=False)
    ind = r.details["induction"].set_index(["layer", "head"])
    rows = r.df[r.df.kind == "induction"].set_index(["layer", "head"])
    assert len(rows) and (rows.low <= rows.score).all() and (rows.score <= rows.high).all()
    # Random repeats have equal-length sequences: the mean of per-sequence masses is the pooled score.
    assert (rows.score - ind.loc[rows.index, "induction"]).abs().max() < 1e-6
    # A threshold just above the best head: no head passes, but the best one's interval reaches it.
    best = ind.induction.max()
    near = classify_heads(model, kinds=["induction"], n_seqs=12, bootstrap=300, induction_threshold=best + 0.001,
                          copying_threshold=0.0, progress=False)
    assert len(near.df) and near.df.uncertain.all() and (near.df.score < best + 0.001).all()
    assert ind.induction.idxmax() in set(zip(near.df["layer"], near.df["head"]))
    none = classify_heads(model, kinds=["induction"], n_seqs=12, induction_threshold=best + 0.001,
                          copying_threshold=0.0, progress=False)
    assert len(none.df) == 0  # without intervals the same heads are simply absent
    # The hand-built model's heads are far from every threshold: same kinds, none uncertain.
    hb = classify_heads(hand_built_model(), n_seqs=16, bootstrap=300, progress=False)
    assert hb.as_dict() == HAND_BUILT_KINDS and not hb.df.uncertain.any()


# --- induction on natural repeats, beside random ones ------------------------------------------------------------------
def _with_words(model):
    from helpers import word_tokenizer

    from interp.zoo.tokenizer import Tokenizer

    model.tokenizer = Tokenizer(word_tokenizer(32).backend_tokenizer)
    return model


def test_induction_on_natural_repeats_and_the_disagreement_with_random_repeats():
    model = _with_words(hand_built_model())
    gen = torch.Generator().manual_seed(0)
    texts = [" ".join(f"w{int(i)}" for i in torch.randint(1, 32, (12,), generator=gen)) for _ in range(10)]
    r = classify_heads(model, texts=texts, kinds=["induction", "induction:natural"], n_seqs=8, half_len=10,
                       progress=False)
    assert r.heads("induction") == r.heads("induction:natural") == [(1, 0)]
    assert r.details["induction:disagreement"].empty and "10 given texts" in r.probes["induction:natural"]
    # A text of one word repeated: every key after a copy of it is a prefix-matching target, so the
    # previous-token head and the random head look like induction heads there (copying gate off), not on random
    # repeats: the disagreement names them.
    same = classify_heads(model, texts=["w5 " * 30], kinds=["induction", "induction:natural"], n_seqs=2,
                          half_len=10, copying_threshold=0.0, progress=False)
    diff = same.details["induction:disagreement"].set_index(["layer", "head"])
    assert {(0, 0), (1, 1)} <= set(diff.index) and (diff.loc[[(0, 0), (1, 1)], "induction_on"] == "natural repeats").all()
    with pytest.raises(ValueError, match=r"'induction:natural' needs texts="):
        classify_heads(model, kinds=["induction:natural"])
