"""Labels that carry their uncertainty: a bootstrap interval over a score's rows, and "uncertain" when it straddles
the kind's threshold.

A kind's row builder may return, beside ``layer, head, kind, score, evidence``:

- ``samples``: the per-row values whose mean is the score (a 1-D tensor or array: one value per sequence, per
  scored token...);
- ``threshold``: the threshold the score was compared with;
- ``passed``: whether the head passed (rows that did not pass are dropped unless their interval reaches the
  threshold, so a head just below it is reported as uncertain rather than silently absent).

Rows without ``samples`` (kinds whose reducers keep only sums) pass through unchanged, with NaN bounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["bootstrap_interval", "with_intervals"]


def bootstrap_interval(samples: Any, n_resamples: int = 1000, *, ci: float = 0.95,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``samples``.

    Args:
        samples: per-row values (1-D tensor, array or list); NaNs are dropped.
        n_resamples: bootstrap resamples.
        ci: the interval's coverage.
        seed: of the resampling.

    Returns:
        ``(low, high)``; ``(nan, nan)`` without any finite value.

    Raises:
        ValueError: ``n_resamples < 1`` or ``ci`` outside (0, 1).

    Example:
        >>> from interp.analysis.uncertainty import bootstrap_interval
        >>> low, high = bootstrap_interval([0.0, 1.0] * 50, 500)
        >>> 0.35 < low < 0.5 < high < 0.65
        True
    """
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples!r} must be an int >= 1")
    if not 0 < ci < 1:
        raise ValueError(f"ci={ci!r} must lie in (0, 1)")
    x = samples.detach().double().cpu().numpy() if isinstance(samples, torch.Tensor) else np.asarray(samples, float)
    x = x[np.isfinite(x)]  # [N]
    if not len(x):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(1)  # [n_resamples]
    a = (1 - ci) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def with_intervals(rows: list[dict[str, Any]], n_resamples: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """Add ``low, high, uncertain`` to every row (see the module docstring) and keep the rows to report.

    Args:
        rows: a kind's rows.
        n_resamples: bootstrap resamples; 0 computes no interval (rows that did not pass are dropped).
        seed: of the resampling.

    Returns:
        The rows that passed, plus (with intervals) those whose interval reaches the threshold.

    Example:
        >>> from interp.analysis.uncertainty import with_intervals
        >>> rows = [{"layer": 0, "head": 0, "kind": "k", "score": 0.48, "samples": [0.0, 1.0] * 25,
        ...          "threshold": 0.5, "passed": False}]
        >>> with_intervals(rows, 200)[0]["uncertain"]
        True
    """
    out = []
    for r in rows:
        r = dict(r)
        samples = r.pop("samples", None)
        threshold = r.pop("threshold", None)
        passed = bool(r.pop("passed", True))
        low = high = math.nan
        if n_resamples and samples is not None:
            low, high = bootstrap_interval(samples, n_resamples, seed=seed)
        uncertain = threshold is not None and low == low and low < threshold <= high
        if passed or uncertain:
            r.update(low=low, high=high, uncertain=bool(uncertain))
            out.append(r)
    return out
