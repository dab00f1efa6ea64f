"""MkDocs hook: the reST roles of our docstrings (``:class:`~a.b.C```) as links in the API reference.

The docstrings are written for both ``help()`` and the site; mkdocstrings renders Markdown and leaves a role as
the literal text ``:class:`` before a code span. This hook turns ``:role:<code>target</code>`` into a
cross-reference that mkdocs-autorefs resolves after every page is rendered: a link where the target is
documented on the site, plain code otherwise. ``~`` keeps only the last name as the text, as Sphinx does.
"""

from __future__ import annotations

import html
import re
from typing import Any

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([\w.]+)</code>")


def linked_roles(text: str) -> str:
    """``text`` (HTML) with each ``:role:<code>target</code>`` made an optional autorefs cross-reference."""

    def link(match: re.Match[str]) -> str:
        short, target = match.group(1), match.group(2)
        shown = target.rsplit(".", 1)[-1] if short else target
        return f'<autoref identifier="{html.escape(target)}" optional><code>{html.escape(shown)}</code></autoref>'

    return ROLE.sub(link, text)


def on_page_content(html_text: str, **_: Any) -> str:
    """MkDocs' page-content event."""
    return linked_roles(html_text)
