import pandas as pd
import pytest

from interp.viz.ablation import ablation_vs_random_figure


def _table(target: float) -> pd.DataFrame:
    return pd.DataFrame({"set": ["none", "target", "random 0", "random 1", "random 2"],
                         "value": [2.0, target, 1.5, 1.8, 1.9]})


def test_ablation_vs_random_figure_places_each_set():
    fig = ablation_vs_random_figure({"mean": _table(0.1), "resample": _table(-0.5)})
    assert len(fig.data) == 6
    rand, tgt, none = fig.data[3:6]
    assert list(rand.y) == [1.5, 1.8, 1.9] and set(rand.x) == {"resample"}
    assert list(tgt.y) == [-0.5] and list(none.y) == [2.0]
    assert [t.showlegend for t in fig.data[:3]] == [True] * 3 and not any(t.showlegend for t in fig.data[3:])


def test_ablation_vs_random_figure_rejects_bad_tables():
    with pytest.raises(ValueError, match="at least one table"):
        ablation_vs_random_figure({})
    with pytest.raises(ValueError, match="lacks the none / target / random rows"):
        ablation_vs_random_figure({"x": pd.DataFrame({"set": ["none", "target"], "value": [1.0, 0.5]})})
