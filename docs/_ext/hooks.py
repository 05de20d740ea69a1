"""MkDocs hooks (mkdocs.yml: ``hooks``).

The pages' Python blocks carry a run marker in their info string, which
tests/docs/test_examples.py reads (``python`` runs, ``python gpu`` runs only where there is a GPU,
``python no-run`` only compiles). Markdown knows only the language: the marker is taken off
before the page is rendered, and a block that runs only with a GPU says so in a line above it.
"""

from __future__ import annotations

import re
from typing import Any

_MARKED = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]+(?P<marker>gpu|no-run)[ \t]*$", re.M)
_LABELS = {"gpu": "needs a CUDA GPU", "no-run": "a sketch, not run as written"}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    def plain(match: re.Match[str]) -> str:
        indent = match["indent"]
        return f"{indent}<small>({_LABELS[match['marker']]})</small>\n\n{indent}```python"

    return _MARKED.sub(plain, markdown)
