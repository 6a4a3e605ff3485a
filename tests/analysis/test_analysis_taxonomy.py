"""classify_heads / HeadReport: exact kinds on the hand-built model, display, and the causal check on induction-2l."""

import pytest
from toy_models import HAND_BUILT_KINDS, hand_built_model

from interp.analysis import HeadReport, classify_heads
from interp.analysis.ablate import ablation_table, in_context_gain
from interp.data import repeated_sequences


@pytest.fixture(scope="module")
def report() -> HeadReport:
    return classify_heads(hand_built_model(), n_seqs=16)


def test_hand_built_model_gets_exactly_its_kinds(report):
    # L0H0 previous-token (also positional:-1), L0H1 first-token, L1H0 induction; the random L1H1: nothing.
    assert report.as_dict() == HAND_BUILT_KINDS
    assert report.heads("induction") == [(1, 0)]
    assert report.heads("positional:") == [(0, 0), (0, 1)]
    assert report.kinds(1, 1) == set()
    assert list(report.df.columns) == ["layer", "head", "kind", "score", "evidence"]
    assert (report.df.score > 0.9).all()


@pytest.mark.parametrize("variant", ["transformer_lens", "query_chunks"])
def test_kinds_are_stable_under_tl_definition_and_chunking(variant):
    model = hand_built_model()
    if variant == "query_chunks":
        model.set_query_chunk(5)
        r = classify_heads(model, n_seqs=8)
    else:
        r = classify_heads(model, n_seqs=8, definition="transformer_lens")
    assert r.as_dict() == HAND_BUILT_KINDS


def test_thresholds_are_parameters(report):
    strict = classify_heads(hand_built_model(), n_seqs=16, induction_threshold=0.99)
    assert "induction" not in set(strict.df.kind)
    no_copy = classify_heads(hand_built_model(), n_seqs=16, copying_threshold=0.99)
    assert "induction" not in set(no_copy.df.kind)  # its copying score is ~0.96
    with pytest.raises(ValueError, match="positional_threshold=1.5"):
        classify_heads(hand_built_model(), positional_threshold=1.5)


def test_display(report):
    text = repr(report)
    assert text.startswith("HeadReport('hand-built-induction': 4 kinds on 3 of 4 heads)")
    assert "positional:first" in text and "induction" in text
    page = report._repr_html_()
    assert "<table" in page and "previous-token" in page
    fig = report.figure()  # viz.head_map: a stripe per kind in each cell, and the kinds written in it
    assert len(fig.data[0].z) == 2 and len(fig.data[0].z[0]) == 2 * 2  # 2 layers x (2 heads x 2 stripes)
    labels = fig.data[1]
    kinds = {(x, y): len(t.split("<br>")) for x, y, t in zip(labels.x, labels.y, labels.text)}
    assert [[kinds.get((h, layer), 0) for h in range(2)] for layer in range(2)] == [[2, 1], [1, 0]]


def test_bad_input():
    model = hand_built_model()
    with pytest.raises(ValueError, match="has no text tokenizer"):
        classify_heads(model, texts=["hello"])
    with pytest.raises(ValueError, match="empty dataset"):
        classify_heads(model, tokens=[])


def test_ablation_on_hand_built_model():
    model = hand_built_model()
    table = ablation_table(model, [(1, 0)], n_seqs=8, half_len=10).set_index("ablated")
    assert table.loc["none", "gain"] > 0.5  # unit logits: at most log(32) - log(31 + e) + 1 ~ 0.94 nats
    assert table.loc["induction heads", "gain_kept"] < 0.1
    assert table.loc["L1H1", "gain_kept"] > 0.9 and table.loc["L0H1", "gain_kept"] > 0.9
    assert table.loc["L0H0", "gain_kept"] < 0.1  # the previous-token head feeds the induction head (K-composition)
    with pytest.raises(ValueError, match=r"head \(2, 0\) is outside"):
        in_context_gain(model, repeated_sequences(1, 3, 32), 3, bos=False, ablate=[(2, 0)])


def _induction_2l():
    from interp.zoo.induction import INDUCTION_2L_PATH, load_induction_2l

    if not INDUCTION_2L_PATH.is_file():
        pytest.skip(f"induction-2l checkpoint not built yet ({INDUCTION_2L_PATH})")
    return load_induction_2l()


def test_induction_2l_heads_found_and_causal():
    model = _induction_2l()
    report = classify_heads(model, n_seqs=32)
    prev, ind = report.heads("previous-token"), report.heads("induction")
    assert prev and all(layer == 0 for layer, _ in prev)
    assert ind and all(layer == 1 for layer, _ in ind)
    table = ablation_table(model, ind, n_seqs=32, half_len=25).set_index("ablated")
    assert table.loc["none", "gain"] > 1.0
    assert table.loc["induction heads", "gain_kept"] < 0.5  # most of the in-context gain is gone
    # Any single other head keeps most of it, except the previous-token heads that feed the induction heads.
    others = [f"L{layer}H{head}" for layer in range(2) for head in range(4) if (layer, head) not in ind + prev]
    assert (table.loc[others, "gain_kept"] > 0.5).all()


@pytest.mark.slow
def test_minilm_from_texts_finds_its_previous_token_head():
    """MiniLM's L0H2 attends to the previous token (experiments/results/minilm_taxonomy.csv); texts are tokenized."""
    from interp.zoo import load

    model = load("minilm-l6")
    texts = ["The quick brown fox jumps over the lazy dog.", "Attention heads do many different things.",
             "She said that the results, which surprised everyone, were correct."] * 4
    report = classify_heads(model, texts=texts, n_seqs=8, half_len=20)
    assert {"positional:-1", "previous-token"} <= report.kinds(0, 2)
    assert report.heads("positional:-1") == [(0, 2)]
    assert report.details["positional"].attrs["n_sequences"] == len(texts)
