"""MkDocs hooks (mkdocs.yml: ``hooks``).

The pages' Python blocks carry a run marker in their info string, which
tests/docs/test_examples.py reads (``python`` runs, ``python gpu`` runs only where there is a GPU,
``python no-run`` only compiles). Markdown knows only the language: the marker is taken off
before the page is rendered, and a block that runs only with a GPU says so in a line above it.

The API reference's signatures are laid out one parameter a line where they are long (as Black or
Ruff would, which mkdocstrings uses where one is installed: neither is a dependency here), so that
``Client``'s twelve parameters and their defaults read as a list, not one line to scroll.
"""

from __future__ import annotations

import html
import re
from typing import Any

_MARKED = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]+(?P<marker>gpu|no-run)[ \t]*$", re.M)
_LABELS = {"gpu": "needs a CUDA GPU", "no-run": "a sketch, not run as written"}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    def plain(match: re.Match[str]) -> str:
        indent = match["indent"]
        return f"{indent}<small>({_LABELS[match['marker']]})</small>\n\n{indent}```python"

    return _MARKED.sub(plain, markdown)


# mkdocstrings-python's signature block (separate_signature: true), as Pygments highlighted it.
_SIGNATURE = re.compile(r'(<div class="doc-signature highlight"><pre><span></span><code>)(.*?)(</code></pre></div>)',
                        re.S)
_PUNCTUATION = re.compile(r'<span class="p">([^<]*)</span>')
_TAG = re.compile(r"<[^>]+>")
#: mkdocstrings' line_length: a signature longer than this is laid out one parameter a line.
LINE_LENGTH = 60


def one_parameter_a_line(code: str) -> str:
    """The highlighted signature *code* with each parameter on a line of its own, four spaces in,
    and the closing parenthesis on its own line (a trailing comma before it, as Black writes it);
    *code* itself where it is short, already on several lines, or has no parameters."""
    text = html.unescape(_TAG.sub("", code))
    if len(text) <= LINE_LENGTH or "\n" in text.strip() or "(" not in text:
        return code
    out: list[str] = []
    depth = 0
    state = "before"  # "before" the parameters' "(", "in" them, "after" their ")"
    skip_space = False
    pos = 0
    for match in _PUNCTUATION.finditer(code):
        between = code[pos:match.start()]
        out.append(between[1:] if skip_space and between.startswith(" ") else between)
        skip_space = False
        piece = ""
        for char in match[1]:
            if char in "([{":
                depth += 1
                piece += char
                if state == "before" and char == "(" and depth == 1:
                    state = "in"
                    piece += "\n    "
            elif char in ")]}":
                if state == "in" and depth == 1 and char == ")":
                    state = "after"
                    opened, joined = "(\n    ", "".join(out)
                    if piece.endswith(opened):  # no parameters: "()" stays as it is
                        piece = piece.removesuffix(opened) + "("
                    elif not piece and joined.endswith(f"{opened}</span>"):
                        out = [joined.removesuffix(f"{opened}</span>") + "(</span>"]
                    else:
                        piece += ",\n"
                piece += char
                depth -= 1
            elif char == "," and state == "in" and depth == 1:
                piece += ",\n    "
                skip_space = True
            else:
                piece += char
        out.append(f'<span class="p">{piece}</span>')
        pos = match.end()
    out.append(code[pos:])
    return "".join(out)


def on_page_content(content: str, **kwargs: Any) -> str:
    return _SIGNATURE.sub(lambda m: m[1] + one_parameter_a_line(m[2]) + m[3], content)
