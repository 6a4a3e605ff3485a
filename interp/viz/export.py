"""Saving figures: HTML that opens offline, PNG through kaleido with an error that says what to install."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from .._io import atomic_path

PNG_EXTRA = "png"  # pyproject extra that provides kaleido: pip install "interp[png]"


def save_figure(fig: go.Figure, path: str | Path, **image_kwargs: Any) -> Path:
    """Write ``fig`` as ``.html`` (plotly.js embedded, so it opens without internet) or as an image.

    Args:
        fig: a plotly figure.
        path: ``.html``, or ``.png`` / ``.svg`` / ``.pdf`` / ``.jpg`` / ``.webp`` (static export by kaleido).
        image_kwargs: passed to ``fig.write_image`` (``width``, ``height``, ``scale``).

    Returns:
        The path written.

    Raises:
        ImportError: a static image was asked for and kaleido is not installed (the message names the extra).
        RuntimeError: kaleido is installed but could not export (for example no Chrome/Chromium for it); the
            message keeps kaleido's whole explanation.
        ValueError: an unknown suffix.

    Example:
        >>> import interp
        >>> import torch
        >>> from interp.viz.export import save_figure
        >>> from interp.examples import tmp
        >>> save_figure(interp.viz.attention_heatmap(torch.rand(3, 3)), tmp / "head.html")
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        with atomic_path(path) as tmp:
            fig.write_html(tmp, include_plotlyjs=True)  # ~4 MB, but saved results must open offline
        return path
    if suffix not in (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp"):
        raise ValueError(f"cannot save a figure as {path.name!r}: use .html, .png, .svg, .pdf, .jpg or .webp")
    if importlib.util.find_spec("kaleido") is None:
        raise ImportError(f"saving {path.name} needs kaleido, which is not installed: pip install "
                          f"\"interp[{PNG_EXTRA}]\" (kaleido >= 1.0 also needs Chrome or Chromium; "
                          "`plotly_get_chrome` installs one). The .html figure needs nothing.")
    try:
        with atomic_path(path) as tmp:
            fig.write_image(tmp, **image_kwargs)
    except Exception as e:  # kaleido reports a missing browser and similar problems with its own types
        raise RuntimeError(f"kaleido could not write {path.name}: {' '.join(str(e).split())}") from e
    return path
