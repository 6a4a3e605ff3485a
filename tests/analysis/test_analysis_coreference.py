"""Coreference heads: a hand-built head wired to attend from a pronoun to its antecedent is found, and only it."""

import math

import pytest
import torch
from toy_coref import (
    hand_built_coref_model,
    toy_corefud_lines,
    toy_gap_lines,
)

from interp.analysis import classify_heads
from interp.analysis.coreference import (
    CorefReducer,
    coreference_kinds,
    coreference_scores,
    wilson_interval,
)
from interp.data.coref import gap_windows, read_gap


@pytest.fixture
def gap_file(tmp_path):
    path = tmp_path / "toy-gap.tsv"
    path.write_text("\n".join(toy_gap_lines()) + "\n", encoding="utf-8")
    return path


def test_wired_head_has_accuracy_one_and_no_other_head_does(gap_file, one_thread):
    model = hand_built_coref_model()
    df = coreference_scores(model, gap_file)
    assert df.attrs["not_scorable_causal"] == 2  # names after the pronoun: a causal head cannot see them
    all_ = df[df.group == "all"].set_index(["layer", "head"])
    assert (all_.n == 12).all()
    assert all_.loc[(0, 0), "accuracy"] == 1.0
    others = all_.drop(index=(0, 0))
    assert (others.accuracy < 1.0).all(), others
    # Baselines on the same twelve rows: nearest and first name are right half of the time, random 0.5.
    base = {r["baseline"]: r["accuracy"] for r in df.attrs["baselines"] if r["group"] == "all"}
    assert base["nearest"] == 0.5 and base["first"] == 0.5 and base["random"] == 0.5
    assert (others.accuracy <= 0.5).all() and (others.gain <= 0).all()
    # The first-token head always picks the first name (right half the time); the previous-token head attends to
    # "then", which is no candidate: a tie between the two names, counted as a miss.
    assert all_.loc[(1, 0), "accuracy"] == 0.5 and all_.loc[(0, 1), "accuracy"] == 0.0


def test_classify_heads_names_only_the_wired_head(gap_file, one_thread):
    report = classify_heads(hand_built_coref_model(), coref={"toy": gap_file}, coref_min_count=10, n_seqs=4)
    assert report.heads("coreference:") == [(0, 0)]
    (ev,) = report.df[report.df.kind == "coreference:toy"].evidence
    assert "accuracy 1.00" in ev and "n=12" in ev
    assert "coreference:toy" in report.details


def test_query_chunks_fold_like_a_whole_pass(gap_file, one_thread):
    model = hand_built_coref_model()
    whole = coreference_scores(model, gap_file)
    model.set_query_chunk(3)
    try:
        chunked = coreference_scores(model, gap_file, batch_size=3)
    finally:
        model.set_query_chunk(None)
    assert whole.accuracy.tolist() == chunked.accuracy.tolist()


def test_bidirectional_model_scores_cataphora(gap_file, one_thread):
    """Without the causal mask the two rows whose names follow the pronoun are scored too, and still right."""
    model = hand_built_coref_model(causal=False)
    df = coreference_scores(model, gap_windows(read_gap(gap_file), model.tokenizer), dataset="gap")
    assert df.attrs["not_scorable_causal"] == 0
    n = df.groupby("group").n.first().to_dict()
    assert n == {"all": 14, "backward": 12}  # "backward": both names precede the pronoun, the causal subset
    assert (df[(df.layer == 0) & (df["head"] == 0)].accuracy == 1.0).all()


def test_reducer_sums_attention_to_a_candidate_and_averages_it_from_the_source():
    """One query whose source is two tokens, candidates of one and two tokens, a hand-set pattern."""
    red = CorefReducer(1, 2, ["all"], keep_queries=True)
    T = 5
    source = torch.tensor([[[0.0, 0.0, 0.0, 0.5, 0.5]]])  # mean over tokens 3 and 4
    units = torch.tensor([[[1.0, 0, 0, 0, 0], [0, 1.0, 1.0, 0, 0]]])  # candidate 0: token 0; 1: tokens 1, 2
    red.set_batch(source, units, torch.tensor([[[0, 1]]]), torch.tensor([[[True, False]]]),
                  torch.tensor([[[True]]]))
    p = torch.zeros(1, 2, T, T)
    # Head 0: from token 3, 0.4 on token 0 and 0.3 + 0.3 on tokens 1, 2; from token 4, all on token 0.
    # Summed per candidate and averaged over the source: 0.7 vs 0.3 -> candidate 0 (correct). Judging by the
    # single most-attended token (0.4 vs 0.3) or by the mean over a candidate's tokens would agree here, so
    # head 1 separates the rules: from both source tokens 0.3 on token 0 and 0.25 + 0.25 on tokens 1, 2.
    p[0, 0, 3, :3] = torch.tensor([0.4, 0.3, 0.3])
    p[0, 0, 4, 0] = 1.0
    p[0, 1, 3:, :3] = torch.tensor([0.3, 0.25, 0.25])
    red.update("blocks.0.attn.hook_pattern", p, q_start=0)
    res = red.result()
    assert res["n"].tolist() == [1.0]
    assert res["hits"][0, 0].tolist() == [1.0, 0.0]  # head 1 sums 0.5 on candidate 1 (wrong), not 0.25 each
    assert res["per_query"].tolist() == [[[True, False]]]  # one mention, one layer, two heads


def test_wilson_interval_matches_the_closed_form_and_scipy():
    # 0 successes: the interval is [0, z^2 / (n + z^2)] (Wilson's formula with p = 0).
    assert wilson_interval(0.0, 10.0) == pytest.approx((0.0, 1.96 ** 2 / (10 + 1.96 ** 2)))
    binomtest = pytest.importorskip("scipy.stats").binomtest
    for hits, n in ((0, 10), (7, 10), (65, 100), (1799, 1800)):
        ref = binomtest(hits, n).proportion_ci(method="wilson")
        lo, hi = wilson_interval(float(hits), float(n))
        assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-4)
        tlo, thi = wilson_interval(torch.tensor([float(hits)]), torch.tensor([float(n)]))
        assert (float(tlo), float(thi)) == pytest.approx((lo, hi))
    assert all(math.isnan(x) for x in wilson_interval(0.0, 0.0))


def test_bad_arguments_are_named(gap_file):
    model = hand_built_coref_model()
    with pytest.raises(ValueError, match="batch_size=0 must be a positive int"):
        coreference_scores(model, gap_file, batch_size=0)
    with pytest.raises(ValueError, match=r"cannot tell the coreference format of '.*toy-gap.txt'"):
        coreference_scores(model, gap_file.with_suffix(".txt"))
    with pytest.raises(ValueError, match="max_tokens=64 must be a positive int <= the model's n_ctx=32"):
        coreference_scores(model, gap_file, max_tokens=64)
    with pytest.raises(ValueError, match="coref margin=2 must be a number"):
        coreference_kinds(coreference_scores(model, gap_file), "toy", margin=2)


def test_wired_head_found_on_corefud_documents(tmp_path, one_thread):
    path = tmp_path / "toy.conllu"
    path.write_text("".join(toy_corefud_lines()), encoding="utf-8")
    df = coreference_scores(hand_built_coref_model(), path)
    pron = df[df.group == "pronoun"].set_index(["layer", "head"])
    assert (pron.n == 12).all() and pron.loc[(0, 0), "accuracy"] == 1.0
    assert (pron.drop(index=(0, 0)).accuracy <= 0.5).all()
    base = {r["baseline"]: r["accuracy"] for r in df.attrs["baselines"] if r["group"] == "pronoun"}
    assert base["nearest"] == 0.5 and base["random"] == 0.5
    assert set(df.group) == {"all", "pronoun"}  # no name has an antecedent: the nominal group is empty


def test_gain_interval_is_a_paired_bootstrap_over_mentions(gap_file, one_thread):
    model = hand_built_coref_model()
    df = coreference_scores(model, gap_file, n_boot=300, seed=1)
    alls = df[df.group == "all"].set_index(["layer", "head"])
    assert (alls.best_baseline == "nearest").all()  # all baselines tie at 0.5: the first listed is kept
    # Reference: the wired head is always right, so its per-mention gain is 1 - (nearest baseline right); draw
    # the same mentions (same generator, same call) and take the percentiles.
    queries = [w.queries[0] for w in gap_windows(read_gap(gap_file), model.tokenizer) if w.doc_id != "cata"]
    diff = torch.tensor([1.0 - q.gold[q.baselines["nearest"]] for q in queries], dtype=torch.float64)
    idx = torch.randint(0, len(diff), (300, len(diff)), generator=torch.Generator().manual_seed(1))
    ref = torch.quantile(diff[idx].mean(1), torch.tensor([0.025, 0.975], dtype=torch.float64))
    wired = alls.loc[(0, 0)]
    assert (wired.gain_ci_low, wired.gain_ci_high) == pytest.approx((float(ref[0]), float(ref[1])))
    assert wired.gain_ci_low > 0 and wired.gain == 0.5
    assert (alls.drop(index=(0, 0)).gain_ci_low <= 0).all()
    assert df[["gain_ci_low", "gain_ci_high"]].notna().all().all()
    none = coreference_scores(model, gap_file, n_boot=0)
    assert none.gain_ci_low.isna().all() and none.accuracy.tolist() == df.accuracy.tolist()
