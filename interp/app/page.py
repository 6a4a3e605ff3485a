"""What a dashboard page is: a title, a URL path, what it needs before it can draw, and its render function.

Each page is one module of :mod:`interp.app.views` holding a ``PAGE``; :data:`interp.app.views.PAGES` lists them
in sidebar order, and the dashboard script turns each into a Streamlit page (``st.navigation``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

import interp

#: What a page needs before it draws: nothing (it works without a model), a loaded model, or the model and the
#: sidebar's text as ``[1, T]`` token ids.
Needs = Literal["nothing", "model", "text"]


@dataclass(frozen=True)
class PageContext:
    """What the dashboard hands a page.

    Attributes:
        key: the model's ``(source, ref)`` key (cache key of every computation), or None.
        model: the loaded model, or None (only for pages that need nothing).
        ids: the sidebar text's ``[1, T]`` token ids (pages that need text), else None.
    """

    key: tuple[str, str] | None
    model: interp.Transformer | None
    ids: torch.Tensor | None = None


@dataclass(frozen=True)
class Page:
    """One dashboard page.

    Attributes:
        title: the sidebar's label and the page heading (unique).
        slug: its URL path (``/head-map``).
        render: draws the page from a :class:`PageContext`.
        needs: what must be there first (:data:`Needs`); the dashboard draws the sidebar's text box only for
            pages that need text.
    """

    title: str
    slug: str
    render: Callable[[PageContext], None]
    needs: Needs = "model"
