"""interp.viz figures: the data they draw equals the recorded tensors / tables, hover text names the tokens,
and bad input raises ValueError/TypeError quoting it."""

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

import interp
from interp import viz

CFG = interp.ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=40, n_ctx=16)


@pytest.fixture(scope="module")
def run():
    torch.manual_seed(0)
    model = interp.Transformer(CFG).eval()
    tokens = torch.randint(0, 40, (2, 7))
    with torch.no_grad():
        _, trace = model.run_with_cache(
            tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_z", "hook_result")))
    return model, tokens, trace


def test_attention_heatmap_draws_the_pattern_with_token_hover(run):
    _, _, trace = run
    tokens = ["the", "cat", "the", "dog", "sat", "the", "end"]  # repeated tokens must stay distinct cells
    pattern = trace.pattern(1)[0, 2]
    fig = viz.attention_heatmap(pattern, tokens, title="L1H2")
    assert isinstance(fig, go.Figure)
    hm = fig.data[0]
    np.testing.assert_allclose(np.array(hm.z, dtype=float), pattern.numpy(), rtol=0, atol=1e-7)
    assert list(fig.layout.xaxis.ticktext) == tokens and list(fig.layout.yaxis.ticktext) == tokens
    # Hover of cell (query 4, key 1) names both tokens and the weight comes from z.
    assert tuple(hm.customdata[4][1]) == ("4: sat", "1: cat")
    assert "weight %{z" in hm.hovertemplate and "query" in hm.hovertemplate and "key" in hm.hovertemplate


def test_attention_heatmap_bad_input(run):
    with pytest.raises(ValueError, match="2 dimensions, got shape"):
        viz.attention_heatmap(np.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match="tokens has 2 entries but the pattern has 3"):
        viz.attention_heatmap(np.eye(3), ["a", "b"])
    with pytest.raises(TypeError, match="pattern must be numeric"):
        viz.attention_heatmap("not a pattern")
    with pytest.raises(ValueError, match="pass key_tokens"):
        viz.attention_heatmap(np.ones((1, 3)) / 3, ["a"])
    fig = viz.attention_heatmap(np.ones((1, 3)) / 3, ["c"], key_tokens=["a", "b", "c"])
    assert tuple(fig.data[0].customdata[0][2]) == ("0: c", "2: c")


def test_head_grid_from_trace_has_every_head(run):
    _, _, trace = run
    fig = viz.head_grid(trace, batch=1)
    assert len(fig.data) == CFG.n_layers * CFG.n_heads
    for i, hm in enumerate(fig.data):
        layer, head = divmod(i, CFG.n_heads)
        assert hm.name == f"L{layer}H{head}"
        np.testing.assert_allclose(np.array(hm.z, dtype=float), trace.pattern(layer)[1, head].numpy(), atol=1e-7)
    # The same from the stacked tensor [L, B, H, T, S].
    fig2 = viz.head_grid(trace.patterns(), batch=1)
    np.testing.assert_allclose(np.array(fig2.data[-1].z, dtype=float), np.array(fig.data[-1].z, dtype=float))
    with pytest.raises(ValueError, match="batch=5 out of range"):
        viz.head_grid(trace.patterns(), batch=5)


def test_layer_heads_wraps_rows(run):
    _, _, trace = run
    fig = viz.layer_heads(trace.pattern(0)[0], ["a"] * 7, layer=0, cols=3)
    assert len(fig.data) == 4
    assert [a.text for a in fig.layout.annotations] == ["L0H0", "L0H1", "L0H2", "L0H3"]
    # Head 3 wraps to the second row: its y axis is the fourth subplot's.
    assert fig.data[3].yaxis == "y4" and fig.layout.yaxis4.domain[1] < fig.layout.yaxis.domain[0]
    with pytest.raises(ValueError, match="cols=0"):
        viz.layer_heads(trace.pattern(0)[0], cols=0)


def test_head_write_norms_match_a_naive_computation(run):
    model, tokens, trace = run
    norms = viz.head_write_norms(trace)
    assert norms.shape == (CFG.n_layers, CFG.n_heads)
    for layer in range(CFG.n_layers):
        z = trace.z(layer)  # [B, T, H, D]
        W_O = model.blocks[layer].attn.W_O.weight  # [M, H*D]
        for h in range(CFG.n_heads):
            d = CFG.d_head
            write = z[:, :, h] @ W_O[:, h * d:(h + 1) * d].T  # [B, T, M]
            assert norms[layer, h] == pytest.approx(write.norm(dim=-1).mean().item(), rel=1e-5)
    # With a mask, only kept positions count.
    mask = torch.ones(2, 7)
    mask[1, 4:] = 0
    masked = viz.head_write_norms(trace, attention_mask=mask)
    outs = trace.head_out(0).norm(dim=-1)  # [B, T, H]
    expected = torch.cat([outs[0], outs[1, :4]]).mean(0)
    np.testing.assert_allclose(masked[0], expected.numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        viz.head_write_norms(trace, attention_mask=torch.ones(2, 3))
    fig = viz.head_norms_figure(norms)
    np.testing.assert_allclose(np.array(fig.data[0].z, dtype=float), norms)


def test_head_write_norms_needs_recorded_writes(run):
    model, tokens, _ = run
    _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
    with pytest.raises(KeyError, match="hook_result"):
        viz.head_write_norms(trace)


def _legend(fig):
    return [t.name for t in fig.data if t.type == "scatter" and t.name]


def test_head_map_splits_cells_by_kind_and_lists_every_kind():
    df = pd.DataFrame({
        "layer": [0, 0, 1, 1, 1],
        "head": [0, 1, 0, 0, 2],
        "kind": ["previous_token", "none", "copying", "induction", "positional_-1"],
        "score": [0.9, 0.0, 0.4, 0.8, 0.7],
        "evidence": ["mass on -1: 0.90", "", "copy 0.4", "induction 0.8", "argmax -1"],
    })
    fig = viz.head_map(df)
    hm = fig.data[0]
    z = np.array(hm.z, dtype=float)
    assert z.shape == (2, 3 * 2)  # two stripes per cell: the most kinds any head has
    # The legend lists every kind present on any head (copying is never a main kind here), "no kind" last.
    kinds_in_order = ["copying", "induction", "positional_-1", "previous_token", "no kind", "none"]
    assert _legend(fig) == [k.replace("_", " ") for k in kinds_in_order]
    # L1H0 carries induction (higher score: first stripe) and copying (second stripe).
    assert list(z[1, 0:2]) == [kinds_in_order.index("induction"), kinds_in_order.index("copying")]
    assert list(z[0, 0:2]) == [kinds_in_order.index("previous_token")] * 2  # one kind fills the cell
    text = fig.data[1]
    assert text.mode == "text" and "induction<br>copying" in list(text.text)
    assert "induction (score 0.800): induction 0.8" in hm.customdata[1][0][1]
    assert hm.customdata[1][1][0] == 0 and hm.customdata[1][2][0] == 1  # each stripe hovers its head
    assert list(z[0, 2:4]) == [kinds_in_order.index("none")] * 2
    assert list(z[0, 4:6]) == [kinds_in_order.index("no kind")] * 2
    assert hm.customdata[0][4][1] == "no kind found"
    colours = [t.marker.color for t in fig.data if t.type == "scatter" and t.name]
    assert len(set(colours[:4])) == 4  # distinct colours for distinct kinds


def test_head_map_shows_both_kinds_of_a_smollm2_like_induction_head():
    # SmolLM2's induction heads also put most attention on the first token: both kinds must show.
    df = pd.DataFrame({"layer": [23, 23, 23, 5], "head": [2, 2, 7, 0],
                       "kind": ["positional:first", "induction", "induction", "previous-token"],
                       "score": [0.95, 0.41, 0.38, 0.9]})
    fig = viz.head_map(df, n_layers=30, n_heads=9)
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (30, 9 * 2)
    legend = _legend(fig)
    assert {"induction", "positional:first", "previous-token", "no kind"} == set(legend)
    code = {name: i for i, name in enumerate(legend)}
    assert list(z[23, 4:6]) == [code["positional:first"], code["induction"]]
    assert list(z[23, 14:16]) == [code["induction"]] * 2
    colour = {t.name: t.marker.color for t in fig.data if t.type == "scatter" and t.name}
    assert colour["induction"] != colour["positional:first"]
    assert fig.layout.height <= 30 * 26 + 140  # 270 heads: no text, compact rows


def test_head_map_accepts_a_report_object_and_rejects_bad_tables():
    class Report:
        df = pd.DataFrame({"layer": [0], "head": [1], "kind": ["induction"]})
        n_layers, n_heads = 2, 3

    fig = viz.head_map(Report())
    assert np.array(fig.data[0].z, dtype=float).shape == (2, 3)  # the whole model, not just classified heads
    assert _legend(fig) == ["induction", "no kind"]
    Report.df = Report.df.iloc[:0]
    assert _legend(viz.head_map(Report())) == ["no kind"]  # nothing found: all grey
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['kind'\]"):
        viz.head_map(pd.DataFrame({"layer": [0], "head": [0]}))
    with pytest.raises(TypeError, match="must be a pandas DataFrame or have a .df"):
        viz.head_map([1, 2])


def test_score_map_and_induction_map_pivot_the_table():
    df = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "previous_token": [0.9, 0.1, 0.2, 0.0],
                       "duplicate_token": [0.0, 0.1, 0.3, 0.1], "induction": [0.0, 0.0, 0.1, 0.85],
                       "copying": [0.1, -0.2, 0.0, 0.7]})
    fig = viz.score_map(df, value="induction")
    np.testing.assert_allclose(np.array(fig.data[0].z, dtype=float), [[0.0, 0.0], [0.1, 0.85]])
    ind = viz.induction_map(df)
    assert len(ind.data) == 4
    np.testing.assert_allclose(np.array(ind.data[0].z, dtype=float), [[0.9, 0.1], [0.2, 0.0]])
    assert ind.layout.coloraxis.cmin == pytest.approx(-0.2)  # negative copying stays visible
    with pytest.raises(ValueError, match="value= must name the column"):
        viz.score_map(df)
    with pytest.raises(ValueError, match="no induction score columns"):
        viz.induction_map(df[["layer", "head"]])


def test_positional_map_rows_are_heads_columns_are_targets():
    df = pd.DataFrame({"layer": [1, 0], "head": [0, 0], "mass_-1": [0.2, 0.9], "mass_first": [0.7, 0.05],
                       "argmax_-1": [0.1, 1.0], "confidence": [0.5, 0.9]})
    fig = viz.positional_map(df)
    assert list(fig.data[0].y) == ["L0H0", "L1H0"] and list(fig.data[0].x) == ["-1", "first"]
    np.testing.assert_allclose(np.array(fig.data[0].z, dtype=float), [[0.9, 0.05], [0.2, 0.7]])
    assert list(viz.positional_map(df, stat="argmax").data[0].x) == ["-1"]
    with pytest.raises(ValueError, match="no nothing_\\* score columns"):
        viz.positional_map(df, stat="nothing")


def test_positional_map_on_real_positional_scores(run):
    analysis = pytest.importorskip("interp.analysis.positional")
    model, tokens, _ = run
    df = analysis.positional_scores(model, torch.randint(0, 40, (4, 10)), window=2)
    fig = viz.positional_map(df)
    assert len(fig.data[0].y) == CFG.n_layers * CFG.n_heads
    assert "-1" in list(fig.data[0].x)


def test_pruning_curves_one_line_per_method_sorted_by_fraction():
    df = pd.DataFrame({"method": ["importance", "importance", "random", "random", "importance"],
                       "fraction_pruned": [0.5, 0.0, 0.0, 0.5, 1.0], "metric": [0.8, 1.0, 1.0, 0.4, 0.1]})
    fig = viz.pruning_curves(df, baseline=1.0)
    lines = [t for t in fig.data if isinstance(t, go.Scatter)]
    assert [t.name for t in lines] == ["importance", "random"]
    assert list(lines[0].x) == [0.0, 0.5, 1.0] and list(lines[0].y) == [1.0, 0.8, 0.1]
    assert lines[0].error_y.array is None  # no std column: no error bars
    with_std = df.assign(metric_std=[None, None, 0.1, 0.2, None])
    rand = viz.pruning_curves(with_std).data[1]
    assert list(rand.error_y.array) == [0.1, 0.2]
    with pytest.raises(ValueError, match=r"no column\(s\) \['metric'\]"):
        viz.pruning_curves(df.rename(columns={"metric": "m"}))
    with pytest.raises(TypeError, match="cannot read a pruning curve from int"):
        viz.pruning_curves([3])


def test_pruning_curves_reads_pruning_curve_objects():
    pruning = pytest.importorskip("interp.pruning")
    imp = pruning.PruningCurve("importance", "accuracy", 4, [pruning.CurvePoint(0.0, 0, 0.9),
                                                             pruning.CurvePoint(0.5, 2, 0.8)])
    rnd = pruning.PruningCurve("random", "accuracy", 4, [pruning.CurvePoint(0.0, 0, 0.9, metric_std=0.0),
                                                         pruning.CurvePoint(0.5, 2, 0.5, metric_std=0.1)])
    fig = viz.pruning_curves([imp, rnd])
    # Labelled with the AUC on [0, 0.5]: trapezoids (0.9 + 0.8) / 4 and (0.9 + 0.5) / 4.
    assert [t.name for t in fig.data] == ["importance (AUC[0, 0.50] 0.425)", "random (AUC[0, 0.50] 0.350)"]
    assert list(fig.data[0].y) == [0.9, 0.8] and list(fig.data[1].error_y.array) == [0.0, 0.1]


def test_head_grid_token_ticks_and_kv_group_lines():
    pats = torch.softmax(torch.randn(2, 6, 5, 5), -1)  # [L, H, T, S]
    toks = ["a", "b", "c", "d", "e"]
    fig = viz.head_grid(pats, toks, n_kv_heads=2)
    assert len(fig.layout.shapes) == 1  # one line between the two K/V groups of 3 heads
    x = fig.layout.shapes[0].x0
    assert fig.layout.xaxis3.domain[1] < x < fig.layout.xaxis4.domain[0]
    titles = [a.text for a in fig.layout.annotations]
    assert "H2 · kv0" in titles and "H3 · kv1" in titles
    assert list(fig.layout.yaxis.ticktext) == toks  # left column: query tokens
    assert list(fig.layout.xaxis12.ticktext) == toks  # bottom row (L1, H5): key tokens
    long = viz.head_grid(torch.softmax(torch.randn(1, 2, 40, 40), -1))
    assert not long.layout.yaxis.showticklabels  # 40 tokens do not fit a small cell
    with pytest.raises(ValueError, match="n_kv_heads=4 must be a positive int dividing the 6 heads"):
        viz.head_grid(pats, toks, n_kv_heads=4)


def test_layer_heads_names_kv_groups_and_ticks_short_inputs():
    fig = viz.layer_heads(torch.softmax(torch.randn(4, 3, 3), -1), ["x", "y", "z"], layer=1, n_kv_heads=2, cols=4)
    assert [a.text for a in fig.layout.annotations] == ["L1H0 · kv0", "L1H1 · kv0", "L1H2 · kv1", "L1H3 · kv1"]
    assert list(fig.layout.xaxis.ticktext) == ["x", "y", "z"]


def test_head_norms_scale_is_clipped_and_distinct():
    norms = np.array([[0.05, 40.0, 38.0], [1.0, 2.0, 900.0]])
    fig = viz.head_norms_figure(norms)
    hm = fig.data[0]
    assert hm.colorscale[0][1] != hm.colorscale[-1][1]  # a sequential scale, not one hue
    assert hm.zmin == 0 and hm.zmax < 900  # the outlier does not squash 0.05 and 40 into one colour
    assert 40.0 / hm.zmax > 0.05  # 40 sits well above ~0 on the scale
    assert "max 900" in hm.colorbar.title.text
    np.testing.assert_allclose(np.array(hm.z, dtype=float), norms)


def test_positional_map_one_layer_or_aggregated():
    df = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "mass_-1": [0.2, 0.9, 0.1, 0.3],
                       "mass_first": [0.7, 0.05, 0.6, 0.2]})
    one = viz.positional_map(df, layers=[1])
    assert list(one.data[0].y) == ["L1H0", "L1H1"]
    agg = viz.positional_map(df, aggregate=True)
    assert list(agg.data[0].y) == ["L0", "L1"]
    np.testing.assert_allclose(np.array(agg.data[0].z, dtype=float), [[0.9, 0.7], [0.3, 0.6]])
    assert agg.data[0].customdata[0][0] == "H1" and agg.data[0].customdata[1][1] == "H0"
    assert agg.layout.xaxis.title.text == "target (offset from the query, first token)"
    with pytest.raises(ValueError, match=r"layers=\[7\] selects no head"):
        viz.positional_map(df, layers=[7])
