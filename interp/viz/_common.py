"""Small helpers shared by the figure modules: array conversion, token labels, layer x head tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

#: One sequential colour scale for attention weights (0 = white, 1 = dark blue) and one diverging scale.
PATTERN_SCALE = "Blues"
SCORE_SCALE = "Viridis"


def to_numpy(x: Any, name: str = "array", ndim: int | tuple[int, ...] | None = None) -> np.ndarray:
    """A float numpy array from a tensor, array or nested list; checks its rank.

    Raises:
        TypeError: ``x`` cannot be turned into a numeric array.
        ValueError: the rank is not ``ndim``.
    """
    if hasattr(x, "detach"):  # torch.Tensor without importing torch here
        x = x.detach().float().cpu().numpy()
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be numeric (tensor, array or list), got {type(x).__name__}") from e
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if arr.ndim not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimensions, got shape {arr.shape}")
    return arr


def token_labels(tokens: Sequence[str] | None, n: int, name: str = "tokens") -> list[str]:
    """``n`` readable labels: the token strings, or positions when there are none.

    Raises:
        ValueError: ``tokens`` has the wrong length.
    """
    if tokens is None:
        return [str(i) for i in range(n)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{name} has {len(tokens)} entries but the pattern has {n} positions")
    return tokens


def layer_head_grid(df: pd.DataFrame, value: str) -> np.ndarray:
    """Pivot a long table with ``layer``, ``head`` and ``value`` columns to a ``[L, H]`` array (NaN where missing).

    Raises:
        ValueError: a required column is missing.
    """
    missing = [c for c in ("layer", "head", value) if c not in df.columns]
    if missing:
        raise ValueError(f"table lacks column(s) {missing}; it has {list(df.columns)}")
    L = int(df["layer"].max()) + 1
    H = int(df["head"].max()) + 1
    grid = np.full((L, H), np.nan)
    for layer, head, v in zip(df["layer"], df["head"], df[value]):
        grid[int(layer), int(head)] = float(v)
    return grid


def as_frame(obj: Any, name: str) -> pd.DataFrame:
    """A DataFrame from a DataFrame or any object with a ``.df`` DataFrame (HeadReport)."""
    if isinstance(obj, pd.DataFrame):
        return obj
    df = getattr(obj, "df", None)
    if isinstance(df, pd.DataFrame):
        return df
    raise TypeError(f"{name} must be a pandas DataFrame or have a .df DataFrame, got {type(obj).__name__}")
