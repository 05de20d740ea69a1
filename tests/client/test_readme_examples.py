"""Every Python block of README.md runs as written, in order, and prints what the README shows.

A newcomer starts ``tritonshm server --grpc-port 8001 --http-port 8000`` (as the README says) and
copies the blocks in order into one interpreter, so later blocks may use what earlier ones made.
The tests do the same, in one namespace, against the session's server: its addresses replace
``localhost:8001`` and ``localhost:8000`` (fixed ports could be taken by another test session or
by a server the user runs), and the README may name no other address.

What a block's info string says:

``python``
    runs everywhere, after the ``python`` blocks before it;
``python gpu``
    runs only where a GPU is usable (the ``gpu`` marker), after every block before it;
``python no-run``
    is not meant to run (a signature, a sketch); it is checked to compile.

Any other info string starting with ``py`` fails the tests. A block that prints must be followed
by a ````` ```text ````` block (only blank lines between) holding exactly what it prints; a block
followed by one must print exactly that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import pathlib
import re
import textwrap
import types

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"

#: The info strings of Python blocks, and whether each runs: "cpu" (everywhere), "gpu", or None.
KINDS = {"python": "cpu", "python gpu": "gpu", "python no-run": None}

#: The addresses the README's examples use: what ``tritonshm server --grpc-port 8001 --http-port 8000`` serves.
GRPC_ADDRESS, HTTP_ADDRESS = "localhost:8001", "localhost:8000"
SERVER_COMMAND = "tritonshm server --grpc-port 8001 --http-port 8000"

# A fenced block, indented or not (inside a list item): its opening fence, info string, body, closing fence.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
# Any line that opens a Python block, however written: each must be one the runner found.
_PYTHON_OPENING = re.compile(r"^[ \t]*(?:```|~~~)[ \t]*py", re.M | re.I)


@dataclasses.dataclass
class Block:
    """A fenced code block of the README: its info string, code, first line's number and printed text."""

    info: str
    code: str
    line: int                   #: the README's line number of the block's first line of code
    printed: str | None = None  #: the ```text block right after it, if any

    @property
    def kind(self) -> str | None:
        return KINDS[self.info]

    def where(self) -> str:
        return f"README.md line {self.line}"


def python_blocks(text: str) -> list[Block]:
    """The Python blocks of *text* in order, each with the text block that follows it (if any)."""
    fences = list(_FENCE.finditer(text))
    blocks = []
    for i, fence in enumerate(fences):
        info = fence["info"].strip()
        if not info.lower().startswith("py"):
            continue
        line = text.count("\n", 0, fence.start("body")) + 1
        block = Block(info, textwrap.dedent(fence["body"]), line)
        if i + 1 < len(fences):
            after = fences[i + 1]
            if after["info"].strip() == "text" and not text[fence.end():after.start()].strip():
                block.printed = textwrap.dedent(after["body"])
        blocks.append(block)
    return blocks


def for_server(code: str, server) -> str:
    """*code* with the README's addresses replaced by *server*'s."""
    return code.replace(GRPC_ADDRESS, server.grpc_url).replace(HTTP_ADDRESS, server.http_url)


def run_blocks(blocks: list[Block], server) -> None:
    """Run *blocks* in order in one namespace, each checked against what the README says it prints."""
    namespace: dict = {"__name__": "__main__"}
    try:
        for block in blocks:
            # Blank lines first, so that a traceback names the README's own line numbers.
            code = compile("\n" * (block.line - 1) + for_server(block.code, server), "README.md", "exec")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, namespace)
            printed = out.getvalue()
            if block.printed is None:
                assert not printed, f"{block.where()} prints, but no ```text block after it shows what:\n{printed}"
            else:
                assert printed == block.printed, (
                    f"{block.where()} printed\n{printed}\nbut the README shows\n{block.printed}")
    finally:
        namespace.clear()  # what the blocks made is gone before the leak check


BLOCKS = python_blocks(README.read_text())


def test_every_python_block_says_whether_it_runs():
    openings = len(_PYTHON_OPENING.findall(README.read_text()))
    assert openings == len(BLOCKS), f"{openings} Python blocks open in the README, the runner found {len(BLOCKS)}"
    unknown = [f"{b.where()}: ```{b.info}" for b in BLOCKS if b.info not in KINDS]
    assert not unknown, f"Python blocks must be one of {sorted(KINDS)}: {unknown}"
    assert [b for b in BLOCKS if b.kind == "cpu"], "the README has no Python block that runs"
    for block in BLOCKS:  # the ones that never run compile, at least
        compile(block.code, block.where(), "exec")


def test_examples_use_the_addresses_the_readme_starts_a_server_on():
    text = README.read_text()
    assert SERVER_COMMAND in text
    for block in BLOCKS:
        addresses = set(re.findall(r"(?:localhost|127\.0\.0\.1|\[::1\]):\d+", block.code))
        assert addresses <= {GRPC_ADDRESS, HTTP_ADDRESS}, f"{block.where()} uses {addresses}"


def test_blocks_in_list_items_and_their_output_are_found():
    text = ("* a step:\n\n  ```python\n  print(1)\n  ```\n\n  ```text\n  1\n  ```\n\n"
            "```Python\nx = 2\n```\n")
    first, second = python_blocks(text)
    assert (first.info, first.code, first.line, first.printed) == ("python", "print(1)\n", 4, "1\n")
    assert (second.info, second.printed) == ("Python", None)  # found, so that its info string fails


def test_a_changed_example_fails():
    """What the runner catches: a block that prints something else, one that prints unannounced,
    one that needs a name no block before it makes."""
    server = types.SimpleNamespace(grpc_url="127.0.0.1:1", http_url="127.0.0.1:2")
    x = "import numpy as np\nx = np.arange(4, dtype=np.float32)\n"
    with pytest.raises(AssertionError, match="but the README shows"):
        run_blocks([Block("python", x + "print(2 * x)\n", 1, printed="[0. 2. 4. 6.]\n"),
                    Block("python", "print(x.sum())\n", 3, printed="7.0\n")], server)
    with pytest.raises(AssertionError, match="no ```text block"):
        run_blocks([Block("python", x + "print(x)\n", 1)], server)
    with pytest.raises(NameError):  # the second block depends on a name the first no longer makes
        run_blocks([Block("python", "import numpy as np\n", 1), Block("python", "x.sum()\n", 2)], server)


def test_readme_python_blocks_run_in_order(server):
    run_blocks([b for b in BLOCKS if b.kind == "cpu"], server)


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu", "torch")
def test_readme_python_blocks_run_in_order_with_a_gpu(server):
    run_blocks([b for b in BLOCKS if b.kind in ("cpu", "gpu")], server)
