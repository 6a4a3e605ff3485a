"""The dashboard's pages, one module each, in sidebar order.

Adding a page is one module here with a ``PAGE = Page(...)`` (:class:`interp.app.page.Page`) and its line in
:data:`PAGES`; the dashboard script builds the navigation from this list.

The package is not called ``pages``: Streamlit treats a ``pages/`` folder beside the entry script as the
pages of a version-1 multipage app and runs those files as scripts instead of the script's ``st.navigation``
(under ``streamlit.testing`` on every run), so ``interp/app/pages/`` would break the dashboard.
"""

from __future__ import annotations

from interp.app.page import Page
from interp.app.views import attention, circuits, costs, head_map, induction, pruning

#: Every page, in sidebar order (the first is the default page).
PAGES: tuple[Page, ...] = (attention.PAGE, head_map.PAGE, induction.PAGE, circuits.PAGE, pruning.PAGE, costs.PAGE)


def page_titles() -> list[str]:
    """The pages' titles, in sidebar order.

    Example:
        >>> from interp.app.views import page_titles
        >>> page_titles()[:2]
        ['Attention patterns', 'Head map']
    """
    return [p.title for p in PAGES]
