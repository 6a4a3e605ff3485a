"""The KV figure draws each curve's metric on the left axis and its KV bytes saved on the right axis."""

from __future__ import annotations

import pytest

from interp.pruning import CurvePoint, PruningCurve
from interp.viz.pruning_kv import pruning_kv_figure


def curve(method: str, saved: list[int | None]) -> PruningCurve:
    pts = [CurvePoint(fraction=i / 4, n_pruned=i, metric=1.0 - 0.2 * i, kv_bytes_saved=s) for i, s in enumerate(saved)]
    return PruningCurve(method, "neg_loss", 4, pts, "toy")


def test_metric_left_and_kv_bytes_right():
    fig = pruning_kv_figure([curve("importance", [0, 0, 64, 64, 128]), curve("random", [None] * 5)])
    names = [t.name for t in fig.data]
    assert names == ["importance: metric", "importance: KV bytes saved", "random: metric"]  # no bytes: no line
    kv = fig.data[1]
    assert list(kv.y) == [0, 0, 64, 64, 128] and kv.yaxis == "y2"
    assert fig.data[0].yaxis == "y" and list(fig.data[0].y) == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    assert "KV-cache bytes" in fig.layout.yaxis2.title.text
    with pytest.raises(ValueError, match="at least one curve"):
        pruning_kv_figure([])
