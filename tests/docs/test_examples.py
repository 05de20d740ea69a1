"""Every Python block of README.md and of docs/ runs as written, in order, and prints what it shows.

A newcomer starts ``tritonshm server --grpc-port 8001 --http-port 8000`` (as the README says) and
copies a page's blocks in order into one interpreter, so later blocks may use what earlier ones on
the same page made; each page (the README, each ``docs/**/*.md``) starts afresh. The tests do the
same, one namespace per page, against the session's server: its addresses replace
``localhost:8001`` and ``localhost:8000`` (fixed ports could be taken by another test session or
by a server the user runs), and the pages may name no other address.

What a block's info string says:

``python``
    runs everywhere, after the ``python`` blocks before it;
``python gpu``
    runs only where a GPU is usable (the ``gpu`` marker), after every block before it;
``python no-run``
    is not meant to run (a signature, a sketch); it is checked to compile.

Any other info string starting with ``py`` fails the tests. A block that prints must be followed
by a ````` ```text ````` block (only blank lines between) holding exactly what it prints; a block
followed by one must print exactly that. (The site shows ``gpu`` and ``no-run`` blocks as plain
Python with a note above them: docs/_ext/hooks.py.) Blocks in other languages (``bash``, ``yaml``,
``text``) do not run; the ``yaml`` ones (Kubernetes manifests) are checked to parse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import pathlib
import re
import textwrap
import types
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: The info strings of Python blocks, and whether each runs: "cpu" (everywhere), "gpu", or None.
KINDS = {"python": "cpu", "python gpu": "gpu", "python no-run": None}

#: The addresses the examples use: what ``tritonshm server --grpc-port 8001 --http-port 8000`` serves.
GRPC_ADDRESS, HTTP_ADDRESS = "localhost:8001", "localhost:8000"
SERVER_COMMAND = "tritonshm server --grpc-port 8001 --http-port 8000"

# A fenced block, indented or not (inside a list item): its opening fence, info string, body, closing fence.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
# Any line that opens a Python block, however written: each must be one the runner found.
_PYTHON_OPENING = re.compile(r"^[ \t]*(?:```|~~~)[ \t]*py", re.M | re.I)


def documents() -> list[pathlib.Path]:
    """README.md, then every page of docs/ (in path order)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def name_of(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


@dataclasses.dataclass
class Block:
    """A fenced code block of a page: its info string, code, first line's number and printed text."""

    info: str
    code: str
    line: int                   #: the page's line number of the block's first line of code
    printed: str | None = None  #: the ```text block right after it, if any
    document: str = "README.md"  #: the page, relative to the repository

    @property
    def kind(self) -> str | None:
        return KINDS[self.info]

    def where(self) -> str:
        return f"{self.document} line {self.line}"


def fenced_blocks(text: str, language: str) -> list[Block]:
    """The blocks of *text* whose info string starts with *language* (any case), in order."""
    fences = list(_FENCE.finditer(text))
    blocks = []
    for i, fence in enumerate(fences):
        info = fence["info"].strip()
        if not info.lower().startswith(language):
            continue
        line = text.count("\n", 0, fence.start("body")) + 1
        block = Block(info, textwrap.dedent(fence["body"]), line)
        if i + 1 < len(fences):
            after = fences[i + 1]
            if after["info"].strip() == "text" and not text[fence.end():after.start()].strip():
                block.printed = textwrap.dedent(after["body"])
        blocks.append(block)
    return blocks


def python_blocks(text: str, document: str = "README.md") -> list[Block]:
    """The Python blocks of *text* in order, each with the text block that follows it (if any)."""
    blocks = fenced_blocks(text, "py")
    for block in blocks:
        block.document = document
    return blocks


def for_server(code: str, server) -> str:
    """*code* with the pages' addresses replaced by *server*'s."""
    return code.replace(GRPC_ADDRESS, server.grpc_url).replace(HTTP_ADDRESS, server.http_url)


def run_blocks(blocks: list[Block], server) -> None:
    """Run *blocks* in order in one namespace, each checked against what its page says it prints."""
    namespace: dict = {"__name__": "__main__"}
    try:
        for block in blocks:
            # Blank lines first, so that a traceback names the page's own line numbers.
            code = compile("\n" * (block.line - 1) + for_server(block.code, server), block.document, "exec")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, namespace)
            printed = out.getvalue()
            if block.printed is None:
                assert not printed, f"{block.where()} prints, but no ```text block after it shows what:\n{printed}"
            else:
                assert printed == block.printed, (
                    f"{block.where()} printed\n{printed}\nbut the page shows\n{block.printed}")
    finally:
        namespace.clear()  # what the blocks made is gone before the leak check


PAGES = {name_of(path): python_blocks(path.read_text(), name_of(path)) for path in documents()}
#: The pages with blocks that run everywhere, and those with blocks that need a GPU.
CPU_PAGES = [name for name, blocks in PAGES.items() if any(b.kind == "cpu" for b in blocks)]
GPU_PAGES = [name for name, blocks in PAGES.items() if any(b.kind == "gpu" for b in blocks)]


@pytest.mark.parametrize("document", list(PAGES))
def test_every_python_block_says_whether_it_runs(document):
    text = (ROOT / document).read_text()
    blocks = PAGES[document]
    openings = len(_PYTHON_OPENING.findall(text))
    assert openings == len(blocks), f"{openings} Python blocks open in {document}, the runner found {len(blocks)}"
    unknown = [f"{b.where()}: ```{b.info}" for b in blocks if b.info not in KINDS]
    assert not unknown, f"Python blocks must be one of {sorted(KINDS)}: {unknown}"
    for block in blocks:  # the ones that never run compile, at least
        compile(block.code, block.where(), "exec")
    for block in blocks:
        addresses = set(re.findall(r"(?:localhost|127\.0\.0\.1|\[::1\]):\d+", block.code))
        assert addresses <= {GRPC_ADDRESS, HTTP_ADDRESS}, f"{block.where()} uses {addresses}"


def test_the_readme_runs_examples_and_starts_their_server():
    assert [b for b in PAGES["README.md"] if b.kind == "cpu"], "the README has no Python block that runs"
    text = README.read_text()
    assert SERVER_COMMAND in text
    # Said before the first example: its blocks share one interpreter.
    first = text.index("```python")
    assert "run in order, in one interpreter" in text[:first]


def test_the_site_renders_every_run_marker():
    """docs/_ext/hooks.py turns each non-plain kind into plain Python with a note: the same kinds."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "_ext" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert {f"python {marker}" for marker in hooks._LABELS} == {k for k in KINDS if k != "python"}
    page = "* a step:\n\n  ```python gpu\n  x = 1\n  ```\n"
    assert hooks.on_page_markdown(page) == (
        "* a step:\n\n  <small>(needs a CUDA GPU)</small>\n\n  ```python\n  x = 1\n  ```\n")


def test_blocks_in_list_items_and_their_output_are_found():
    text = ("* a step:\n\n  ```python\n  print(1)\n  ```\n\n  ```text\n  1\n  ```\n\n"
            "```Python\nx = 2\n```\n")
    first, second = python_blocks(text, "docs/a.md")
    assert (first.info, first.code, first.line, first.printed) == ("python", "print(1)\n", 4, "1\n")
    assert first.where() == "docs/a.md line 4"
    assert (second.info, second.printed) == ("Python", None)  # found, so that its info string fails


def test_a_changed_example_fails():
    """What the runner catches: a block that prints something else, one that prints unannounced,
    one that needs a name no block before it makes."""
    server = types.SimpleNamespace(grpc_url="127.0.0.1:1", http_url="127.0.0.1:2")
    x = "import numpy as np\nx = np.arange(4, dtype=np.float32)\n"
    with pytest.raises(AssertionError, match="but the page shows"):
        run_blocks([Block("python", x + "print(2 * x)\n", 1, printed="[0. 2. 4. 6.]\n"),
                    Block("python", "print(x.sum())\n", 3, printed="7.0\n")], server)
    with pytest.raises(AssertionError, match="no ```text block"):
        run_blocks([Block("python", x + "print(x)\n", 1)], server)
    with pytest.raises(NameError):  # the second block depends on a name the first no longer makes
        run_blocks([Block("python", "import numpy as np\n", 1), Block("python", "x.sum()\n", 2)], server)


@pytest.mark.parametrize("document", [name for name in PAGES if name != "README.md"])
def test_yaml_blocks_parse(document):
    """The manifests the pages show (Kubernetes) are valid YAML, every document of them."""
    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with mkdocs, the test extra) checks them")
    for block in fenced_blocks((ROOT / document).read_text(), "yaml"):
        try:
            list(yaml.safe_load_all(block.code))
        except yaml.YAMLError as exc:
            pytest.fail(f"{document} line {block.line}: {exc}")


def _heading_ids(text: str) -> set[str]:
    """The ids Python-Markdown's toc gives *text*'s headings (outside code blocks)."""
    text = _FENCE.sub("", text)
    ids = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", text, re.M):
        plain = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        ids.add(re.sub(r"[-\s]+", "-", plain))
    return ids


def test_readme_links_lead_somewhere():
    """The README is not part of the site (mkdocs checks the site's own links): its links into
    docs/ and the repository must name files that exist, and headings that exist in them."""
    text = _FENCE.sub("", README.read_text())
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # https://...: not checked here (no network in the tests)
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else README
        assert target.exists(), f"README.md links to {link}: no such file"
        if anchor:
            assert anchor in _heading_ids(target.read_text()), f"README.md links to {link}: no such heading"


@pytest.mark.parametrize("document", CPU_PAGES)
def test_python_blocks_run_in_order(document, server):
    run_blocks([b for b in PAGES[document] if b.kind == "cpu"], server)


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu", "torch")
@pytest.mark.parametrize("document", GPU_PAGES)
def test_python_blocks_run_in_order_with_a_gpu(document, server):
    # A GPU example that quietly fell back to pinned host memory did not show what it says.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="tritonshm: GPU tensors fall back", category=RuntimeWarning)
        run_blocks([b for b in PAGES[document] if b.kind in ("cpu", "gpu")], server)
