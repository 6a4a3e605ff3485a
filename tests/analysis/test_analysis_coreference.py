"""Coreference heads: a hand-built head wired to attend from a pronoun to its antecedent is found, and only it."""

import math
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import binomtest

from interp import ModelConfig, Transformer
from interp.analysis import classify_heads
from interp.analysis.coreference import (
    CorefReducer,
    coreference_kinds,
    coreference_scores,
    wilson_interval,
)
from interp.data.coref import gap_windows, read_gap

FEMALE, MALE = ["Anna", "Mary", "Kate"], ["Bob", "John", "Tom"]
OTHER = ["she", "he", "met", "and", "then", "smiled", "left", ".", "Rosenthal", "##s"]
VOCAB = ["[PAD]"] + FEMALE + MALE + OTHER  # id 0 pads


class WordTok:
    """One id per word, except "Rosenthals" -> "Rosenthal" "##s" (so sub-token sums matter); no specials."""

    pad_token_id = 0

    def __init__(self):
        self.id = {w: i for i, w in enumerate(VOCAB)}

    def encode_words(self, words):
        ids, where = [], []
        for i, w in enumerate(words):
            for p in (["Rosenthal", "##s"] if w == "Rosenthals" else [w]):
                ids.append(self.id[p])
                where.append(i)
        return ids, where


@torch.no_grad()
def coref_model(n_ctx: int = 32, sharpness: float = 20.0, seed: int = 0, causal: bool = True) -> Transformer:
    """An attention-only model (causal by default); residual = [token one-hot (V) | position one-hot (N)].

    - L0H0, the coreference head: "she" queries a "female" feature that the female names' keys hold, "he" a
      "male" one (a pronoun attends to the names of its gender); every other token attends uniformly.
    - L0H1 previous-token head; L1H0 first-token head; L1H1 random query and key weights on the positions.
      These three see positions only, so on two rows that differ only in the pronoun (and so in the answer)
      they pick the same name: at most one of the two is right, 50 %, exactly the nearest / first-name baseline.
    """
    V, N = len(VOCAB), n_ctx
    D = max(V, N)
    TOK, POS = 0, V
    M = V + N
    cfg = ModelConfig(n_layers=2, d_model=M, n_heads=2, d_head=D, attn_only=True, causal=causal, positional="learned",
                      normalization="none", d_vocab=V, n_ctx=N, attn_bias=True, out_bias=False)
    model = Transformer(cfg)
    for p in model.parameters():
        p.zero_()
    model.W_E.weight[torch.arange(V), TOK + torch.arange(V)] = 1.0
    model.W_pos.weight[torch.arange(N), POS + torch.arange(N)] = 1.0
    c = sharpness * D ** 0.5  # scores are divided by sqrt(D)
    H = 2
    idx = {w: i for i, w in enumerate(VOCAB)}

    def rows(attn, kind: str, head: int):
        base = {"q": 0, "k": H * D, "v": 2 * H * D}[kind] + head * D
        return attn.W_qkv.weight[base:base + D]

    a0, a1 = model.blocks[0].attn, model.blocks[1].attn
    q, k = rows(a0, "q", 0), rows(a0, "k", 0)
    q[0, TOK + idx["she"]] = c
    q[1, TOK + idx["he"]] = c
    for w in FEMALE:
        k[0, TOK + idx[w]] = 1.0
    for w in MALE:
        k[1, TOK + idx[w]] = 1.0
    q, k = rows(a0, "q", 1), rows(a0, "k", 1)
    j = torch.arange(N - 1)
    q[j, POS + j + 1] = c  # query at position i lights dimension i - 1, which the key at i - 1 holds
    k[torch.arange(N), POS + torch.arange(N)] = 1.0
    a1.W_qkv.bias[0] = c  # L1H0: a constant query ...
    rows(a1, "k", 0)[0, POS + 0] = 1.0  # ... that matches the key of position 0
    g = torch.Generator().manual_seed(seed)
    for kind in ("q", "k"):  # random, but reading positions only: blind to which pronoun it is
        rows(a1, kind, 1)[:, POS:POS + N] = torch.randn(D, N, generator=g)
    rows(a1, "v", 1)[:] = torch.randn(D, M, generator=g)
    model.name = "hand-built-coref"
    model.tokenizer = WordTok()
    return model.eval()


HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"


def gap_rows():
    """Twelve rows in she/he pairs (same names and positions, opposite answers), the antecedent first in half
    and nearest in the other half; plus two cataphoric rows."""
    rows = []
    pairs = [("Anna", "Bob"), ("Mary", "John"), ("Kate", "Tom")]
    for i, (f, m) in enumerate(pairs):
        for first, second in ((f, m), (m, f)):
            for pron in ("she", "he"):
                text = f"{first} met {second} and then {pron} smiled ."
                a_is = (first in FEMALE) == (pron == "she")
                rows.append([f"t{i}", text, pron, str(text.index(f" {pron} ") + 1), first, "0", str(a_is).upper(),
                             second, str(len(first) + 5), str(not a_is).upper(), "-"])
    for pron, name in (("she", "Anna"), ("he", "Bob")):  # the names come after the pronoun: not causal-scorable
        text = f"then {pron} smiled and {name} met Rosenthals ."
        rows.append(["cata", text, pron, "5", name, str(text.index(name)), "TRUE", "Rosenthals",
                     str(text.index("Rosenthals")), "FALSE", "-"])
    return [HEADER] + ["\t".join(r) for r in rows]


@pytest.fixture
def gap_file(tmp_path):
    path = tmp_path / "toy-gap.tsv"
    path.write_text("\n".join(gap_rows()) + "\n", encoding="utf-8")
    return path


def test_wired_head_has_accuracy_one_and_no_other_head_does(gap_file, one_thread):
    model = coref_model()
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
    report = classify_heads(coref_model(), coref={"toy": gap_file}, coref_min_count=10, n_seqs=4)
    assert report.heads("coreference:") == [(0, 0)]
    (ev,) = report.df[report.df.kind == "coreference:toy"].evidence
    assert "accuracy 1.00" in ev and "n=12" in ev
    assert "coreference:toy" in report.details


def test_query_chunks_fold_like_a_whole_pass(gap_file, one_thread):
    model = coref_model()
    whole = coreference_scores(model, gap_file)
    model.set_query_chunk(3)
    try:
        chunked = coreference_scores(model, gap_file, batch_size=3)
    finally:
        model.set_query_chunk(None)
    assert whole.accuracy.tolist() == chunked.accuracy.tolist()


def test_bidirectional_model_scores_cataphora(gap_file, one_thread):
    """Without the causal mask the two rows whose names follow the pronoun are scored too, and still right."""
    model = coref_model(causal=False)
    df = coreference_scores(model, gap_windows(read_gap(gap_file), model.tokenizer), dataset="gap")
    assert df.attrs["not_scorable_causal"] == 0
    n = df.groupby("group").n.first().to_dict()
    assert n == {"all": 14, "backward": 12}  # "backward": both names precede the pronoun, the causal subset
    assert (df[(df.layer == 0) & (df["head"] == 0)].accuracy == 1.0).all()


def test_reducer_sums_attention_to_a_candidate_and_averages_it_from_the_source():
    """One query whose source is two tokens, candidates of one and two tokens, a hand-set pattern."""
    red = CorefReducer(1, 2, ["all"])
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
    red.update("blocks.0.attn.hook_pattern", p, SimpleNamespace(ctx={}))
    res = red.result()
    assert res["n"].tolist() == [1.0]
    assert res["hits"][0, 0].tolist() == [1.0, 0.0]  # head 1 sums 0.5 on candidate 1 (wrong), not 0.25 each


def test_wilson_interval_matches_scipy():
    for hits, n in ((0, 10), (7, 10), (65, 100), (1799, 1800)):
        ref = binomtest(hits, n).proportion_ci(method="wilson")
        lo, hi = wilson_interval(float(hits), float(n))
        assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-4)
        tlo, thi = wilson_interval(torch.tensor([float(hits)]), torch.tensor([float(n)]))
        assert (float(tlo), float(thi)) == pytest.approx((lo, hi))
    assert all(math.isnan(x) for x in wilson_interval(0.0, 0.0))


def test_bad_arguments_are_named(gap_file):
    model = coref_model()
    with pytest.raises(ValueError, match="batch_size=0 must be a positive int"):
        coreference_scores(model, gap_file, batch_size=0)
    with pytest.raises(ValueError, match=r"cannot tell the coreference format of '.*toy-gap.txt'"):
        coreference_scores(model, gap_file.with_suffix(".txt"))
    with pytest.raises(ValueError, match="max_tokens=64 must be a positive int <= the model's n_ctx=32"):
        coreference_scores(model, gap_file, max_tokens=64)
    with pytest.raises(ValueError, match="coref margin=2 must be a number"):
        coreference_kinds(coreference_scores(model, gap_file), "toy", margin=2)


def corefud_lines():
    """The twelve causal-scorable rows as CorefUD documents: names and pronoun as mentions, entity per person."""
    out = []
    for d, row in enumerate(gap_rows()[1:13]):
        f = row.split("\t")
        words, pron, first, second, a_true = f[1].split(), f[2], f[4], f[7], f[6] == "TRUE"
        ent = {first: "1", second: "2"}
        ref = ent[first] if a_true else ent[second]
        out.append(f"# newdoc id = d{d}\n")
        for i, w in enumerate(words):
            e = ent.get(w) or (ref if w == pron else None)
            upos = "PRON" if w == pron else "PROPN" if e else "X"
            misc = f"Entity=({e}-person-x-x-x-1-coref)" if e else "_"
            out.append(f"{i + 1}\t{w}\t{w}\t{upos}\t_\t_\t0\troot\t_\t{misc}\n")
        out.append("\n")
    return out


def test_wired_head_found_on_corefud_documents(tmp_path, one_thread):
    path = tmp_path / "toy.conllu"
    path.write_text("".join(corefud_lines()), encoding="utf-8")
    df = coreference_scores(coref_model(), path)
    pron = df[df.group == "pronoun"].set_index(["layer", "head"])
    assert (pron.n == 12).all() and pron.loc[(0, 0), "accuracy"] == 1.0
    assert (pron.drop(index=(0, 0)).accuracy <= 0.5).all()
    base = {r["baseline"]: r["accuracy"] for r in df.attrs["baselines"] if r["group"] == "pronoun"}
    assert base["nearest"] == 0.5 and base["random"] == 0.5
    assert set(df.group) == {"all", "pronoun"}  # no name has an antecedent: the nominal group is empty
