"""mkdocs hooks for the docs build (``hooks:`` in mkdocs.yml).

interp's docstrings title their doctest section ``Example:`` (singular); griffe's Google parser knows only
``Examples:``, and would render the ``>>>`` lines as prose (where ``x[0]["kind"]`` reads as a Markdown link).
Teach it the singular title, so every example renders as a code block.
"""

from __future__ import annotations


def on_startup(**_: object) -> None:
    from griffe import DocstringSectionKind
    from griffe._internal.docstrings import google

    google._section_kind.setdefault("example", DocstringSectionKind.examples)
