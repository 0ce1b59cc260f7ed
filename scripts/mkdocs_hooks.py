"""MkDocs hooks for the docs site (mkdocs.yml ``hooks:``).

Docstrings name other objects with Sphinx roles (``:func:`enqueue```,
``:exc:`~django_pgqueue.exceptions.InvalidMessage```), which Markdown renders as the role's
text followed by the name in code: keep the name alone (its last part after a ``~``).
"""

from __future__ import annotations

import re
from typing import Any

SPHINX_ROLE = re.compile(
    r":(?:func|class|meth|mod|attr|exc|data|obj|const):<code>(?:~(?:[\w.]*\.)?)?([^<]*)</code>"
)


def on_page_content(html: str, **kwargs: Any) -> str:
    """Drop the Sphinx role before each inline code span of the rendered page."""
    return SPHINX_ROLE.sub(r"<code>\1</code>", html)
