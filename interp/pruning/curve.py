"""PruningCurve: a metric against the fraction of heads pruned, for one method, with I/O and a figure."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._io import atomic_path


@dataclass
class CurvePoint:
    """One point of a curve.

    Attributes:
        fraction: heads pruned / all heads.
        n_pruned: heads pruned.
        metric: the objective's metric with those heads gated off (mean over seeds for the random baseline).
        metric_std: spread over seeds (random baseline), else None.
        mask: ``[L][H]`` bools, True = pruned (None when several masks were averaged).
        kv_bytes_saved: KV-cache bytes per token saved by removing these heads (fp16), see kv_cache_savings.
        extra: method details (target, lambda, seed, expected sparsity...).
    """

    fraction: float
    n_pruned: int
    metric: float
    metric_std: float | None = None
    mask: list[list[bool]] | None = None
    kv_bytes_saved: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PruningCurve:
    """The metric against the fraction of heads pruned for one method.

    Args:
        method: ``"importance"``, ``"l0"``, ``"random"``...
        metric_name: what ``metric`` measures (higher is better).
        n_heads_total: heads in the model (L * H).
        points: the points, in pruning order.
        model_name: the model's name.
        config: the method's settings (kept with the results).

    Example:
        >>> from interp.examples import model, objective, batches
        >>> from interp.pruning import importance_curve, random_curve
        >>> curve = importance_curve(model, batches, objective, step=0.5)
        >>> curve.auc(), curve.to_frame().head()
        >>> curve.figure(random_curve(model, batches, objective, seeds=(0,), step=0.5)).show()
    """

    method: str
    metric_name: str
    n_heads_total: int
    points: list[CurvePoint] = field(default_factory=list)
    model_name: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    # --- access -------------------------------------------------------------------------------------
    @property
    def fractions(self) -> np.ndarray:
        return np.array([p.fraction for p in self.points], dtype=float)

    @property
    def metrics(self) -> np.ndarray:
        return np.array([p.metric for p in self.points], dtype=float)

    def sorted(self) -> PruningCurve:
        """A copy with points ordered by fraction (L0 sweeps finish in target order, not fraction order)."""
        pts = sorted(self.points, key=lambda p: (p.fraction, -p.metric))
        return PruningCurve(self.method, self.metric_name, self.n_heads_total, pts, self.model_name, dict(self.config))

    def auc(self, upto: float | None = None) -> float:
        """Area under metric(fraction) by the trapezoid rule, from fraction 0 to ``upto``.

        Args:
            upto: right end (default: the curve's last fraction). Beyond its last point the curve is held at its
                last value, so curves that stopped early (a threshold) can still be compared on [0, upto].

        Returns:
            The area (for a metric in [0, 1] and ``upto=1``, a number in [0, 1]).

        Raises:
            ValueError: the curve has no points, or upto is outside (0, 1].
        """
        if not self.points:
            raise ValueError("the curve has no points")
        c = self.sorted()
        x, y = c.fractions, c.metrics
        upto = float(x[-1]) if upto is None else float(upto)
        if not 0.0 < upto <= 1.0:
            raise ValueError(f"upto={upto} must be in (0, 1]")
        grid = np.unique(np.concatenate([[0.0], x[x < upto], [upto]]))
        vals = np.interp(grid, x, y)  # held at the end values outside [x0, xn]
        return float(np.trapezoid(vals, grid))

    # --- tables and files -----------------------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """One row per point: method, fraction_pruned, n_pruned, metric, metric_std, kv_bytes_saved, extra fields."""
        rows = []
        for p in self.points:
            row = {"method": self.method, "fraction_pruned": p.fraction, "n_pruned": p.n_pruned, "metric": p.metric,
                   "metric_std": p.metric_std, "kv_bytes_saved": p.kv_bytes_saved}
            row.update({k: v for k, v in p.extra.items() if np.isscalar(v) or v is None})
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "metric_name": self.metric_name, "n_heads_total": self.n_heads_total,
                "model_name": self.model_name, "config": self.config, "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PruningCurve:
        """Rebuild a curve from :meth:`to_dict` output (a saved ``.json``), checking every point.

        Raises:
            ValueError: not a curve's dict, or a point outside the curve's range (a fraction outside
                [0, 1], a head count outside [0, n_heads_total], a metric that is not a number); the
                message names the point.
        """
        if not isinstance(data, dict) or not all(k in data for k in ("method", "metric_name", "n_heads_total")):
            raise ValueError("a pruning curve is a JSON object with method, metric_name, n_heads_total and points")
        total = data["n_heads_total"]
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"n_heads_total must be a positive int, got {total!r}")
        raw = data.get("points", [])
        if not isinstance(raw, list):
            raise ValueError(f"points must be a list, got {type(raw).__name__}")
        pts = []
        for i, p in enumerate(raw):
            try:
                pt = CurvePoint(**p)
            except TypeError as e:
                raise ValueError(f"point {i} is not a curve point: {e}") from None
            if not isinstance(pt.fraction, (int, float)) or not 0.0 <= pt.fraction <= 1.0:
                raise ValueError(f"point {i}: fraction {pt.fraction!r} must be in [0, 1]")
            if isinstance(pt.n_pruned, bool) or not isinstance(pt.n_pruned, int) or not 0 <= pt.n_pruned <= total:
                raise ValueError(f"point {i}: n_pruned {pt.n_pruned!r} must be an int in [0, {total}]")
            if isinstance(pt.metric, bool) or not isinstance(pt.metric, (int, float)):
                raise ValueError(f"point {i}: metric {pt.metric!r} must be a number")
            pts.append(pt)
        return cls(data["method"], data["metric_name"], total, pts, data.get("model_name", ""),
                   data.get("config", {}))

    def save(self, path: str | Path) -> Path:
        """Write the curve as ``.json`` (everything, masks included) or ``.csv`` (the table).

        Raises:
            ValueError: another suffix.
        """
        path = Path(path)
        if path.suffix not in (".json", ".csv"):
            raise ValueError(f"save to .json or .csv, got {path.name!r}")
        with atomic_path(path) as tmp:  # an interrupted run never leaves half a file
            if path.suffix == ".json":
                tmp.write_text(json.dumps(self.to_dict(), indent=1))
            else:
                self.to_frame().to_csv(tmp, index=False)
        return path

    @classmethod
    def load(cls, path: str | Path) -> PruningCurve:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def merge(cls, curves: Sequence[PruningCurve]) -> PruningCurve:
        """Concatenate the points of curves of one method (e.g. one L0 run per target), sorted by fraction."""
        if not curves:
            raise ValueError("merge needs at least one curve")
        first = curves[0]
        pts = [p for c in curves for p in c.points]
        return PruningCurve(first.method, first.metric_name, first.n_heads_total, pts, first.model_name,
                            dict(first.config)).sorted()

    # --- display --------------------------------------------------------------------------------------
    def figure(self, *others: PruningCurve, title: str | None = None):
        """A plotly figure of this curve and ``others`` (metric against fraction pruned)."""
        from ..viz import pruning_curves

        return pruning_curves([self, *others], title=title)

    def __repr__(self) -> str:
        if not self.points:
            return f"PruningCurve(method={self.method!r}, model={self.model_name!r}, no points)"
        c = self.sorted()
        return (f"PruningCurve(method={self.method!r}, model={self.model_name!r}, metric={self.metric_name!r}, "
                f"points={len(self.points)}, fraction {c.fractions[0]:.2f}->{c.fractions[-1]:.2f}, "
                f"metric {c.metrics[0]:.3f}->{c.metrics[-1]:.3f}, auc={self.auc():.3f})")

    def _repr_html_(self) -> str:
        head = html.escape(repr(self))
        table = self.to_frame().to_html(index=False, float_format=lambda v: f"{v:.4f}", na_rep="")
        return f"<div><p><code>{head}</code></p>{table}</div>"


def common_range(curves: Sequence[PruningCurve]) -> float:
    """The largest fraction every curve reaches (L0 sweeps and threshold runs may stop before 1)."""
    return float(min(c.fractions.max() for c in curves))


def auc_table(curves: Sequence[PruningCurve], upto: float | None = None) -> pd.DataFrame:
    """Area under each curve on a common range [0, upto] (default: :func:`common_range`), and that area divided
    by upto (the mean metric over the range, comparable between tables with different ranges).

    Returns:
        DataFrame with columns method, auc, upto, mean_metric, points.
    """
    upto = common_range(curves) if upto is None else upto
    return pd.DataFrame([{"method": c.method, "auc": c.auc(upto=upto), "upto": upto,
                          "mean_metric": c.auc(upto=upto) / upto, "points": len(c.points)} for c in curves])
