"""viz.coreference_figure: the accuracy grid, the top heads with their intervals, one line per baseline."""

import numpy as np
import pandas as pd
import pytest

from interp import viz


def table():
    rows = []
    for layer in range(2):
        for head in range(3):
            acc = 0.1 * (layer * 3 + head)
            rows.append({"layer": layer, "head": head, "group": "all", "n": 40, "accuracy": acc, "ci_low": acc - 0.05,
                         "ci_high": acc + 0.1, "best_baseline": "nearest", "baseline_accuracy": 0.3,
                         "gain": acc - 0.3})
    df = pd.DataFrame(rows)
    df.attrs["baselines"] = [{"group": "all", "baseline": b, "n": 40, "accuracy": a, "ci_low": a - 0.1,
                              "ci_high": a + 0.1} for b, a in (("nearest", 0.3), ("random", 0.25))]
    return df


def test_grid_intervals_and_baselines():
    df = table()
    fig = viz.coreference_figure(df, top=2)
    heat, points = fig.data[0], fig.data[1]
    assert np.allclose(np.asarray(heat.z, dtype=float), df.accuracy.to_numpy().reshape(2, 3))
    assert list(points.x) == ["L1H2", "L1H1"]  # best first
    assert np.allclose(points.error_y.array, [0.1, 0.1]) and np.allclose(points.error_y.arrayminus, [0.05, 0.05])
    lines = {t.name: t.y[0] for t in fig.data[2:]}
    assert lines == {"nearest": 0.3, "random": 0.25}
    assert "n=40" in fig.layout.title.text


def test_bad_tables_are_named():
    with pytest.raises(ValueError, match=r"group 'pronoun' is not in the table; it has \['all'\]"):
        viz.coreference_figure(table(), group="pronoun")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['ci_low'\]"):
        viz.coreference_figure(table().drop(columns="ci_low"))
