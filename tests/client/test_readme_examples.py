"""The README's streaming and sequence examples run as written (against the session's server)."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

pytestmark = pytest.mark.server

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def example(marker: str) -> str:
    """The README's python block that mentions *marker*."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


@pytest.mark.parametrize("marker, printed", [
    ('c.stream("stream_fp32"', ["[0] [0. 0. 0. 0.]", "[1] [1. 1. 1. 1.]", "[2] [2. 2. 2. 2.]"]),
    ('"accumulate_fp32"', ["[[1. 1. 1. 1.]]", "[[2. 2. 2. 2.]]", "[[3. 3. 3. 3.]]"]),
])
def test_readme_example_runs_as_written(server, marker, printed):
    code = example(marker).replace('"localhost:8001"', repr(server.grpc_url))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile("import numpy as np, tritonshm\n" + code, "README.md", "exec"), {})
    assert out.getvalue().splitlines() == printed
