"""Circuit figures draw the tables they are given: cells land where the table says."""

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from interp import viz


def _table(by):
    rows = []
    for layer in range(2):
        for head in range(3):
            for pos in range(4):
                rows.append({"layer": layer, "head": head, "pos": pos, "normalized": layer + 0.1 * head + 0.01 * pos})
    df = pd.DataFrame(rows)
    if by == "head":
        df = df[df["pos"] == 0].drop(columns="pos")
    if by == "layer_pos":
        df = df[df["head"] == 0].drop(columns="head")
    df.attrs.update(method="activation", act="z", direction="noising")
    return df


def test_patching_heatmap_layouts():
    fig = viz.patching_heatmap(_table("head"))
    assert isinstance(fig, go.Figure)
    z = np.asarray(fig.data[0].z)
    assert z.shape == (2, 3) and z[1, 2] == pytest.approx(1.2)
    assert fig.layout.title.text == "activation z noising patching"
    fig = viz.patching_heatmap(_table("head_pos"))
    assert list(fig.data[0].y)[:2] == ["L0H0", "L0H1"] and np.asarray(fig.data[0].z).shape == (6, 4)
    fig = viz.patching_heatmap(_table("layer_pos"), pos_labels=["a", "b", "c", "d"])
    assert list(fig.data[0].x) == ["0: a", "1: b", "2: c", "3: d"]
    assert np.asarray(fig.data[0].z)[1, 3] == pytest.approx(1.03)
    with pytest.raises(ValueError, match="lacks column"):
        viz.patching_heatmap(_table("head"), value="nope")


def test_attribution_bar_and_composition_heatmap():
    df = pd.DataFrame({"component": ["embed", "L0H0", "L0H1"], "kind": ["embed", "head", "head"],
                       "attribution": [0.5, -2.0, 1.0]})
    df.attrs["logit_diff"] = -0.5
    fig = viz.logit_attribution_bar(df, top=2)
    assert sorted(x for trace in fig.data for x in trace.x) == ["L0H0", "L0H1"]
    assert "-0.500" in fig.layout.title.text
    s = torch.full((2, 2, 2, 2), float("nan"))
    s[0, :, 1, :] = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    fig = viz.composition_heatmap(s)
    assert list(fig.data[0].y) == ["L0H0", "L0H1"] and list(fig.data[0].x) == ["L1H0", "L1H1"]
    assert np.asarray(fig.data[0].z)[1, 0] == pytest.approx(0.3)
    with pytest.raises(ValueError, match=r"scores must be \[L, H, L, H\]"):
        viz.composition_heatmap(torch.zeros(2, 2))
