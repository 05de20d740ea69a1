"""The package type-checks: mypy, configured in pyproject.toml's [tool.mypy] (strict, with each
relaxation written down there), on python/tritonshm -- part of `python -m pytest`, so of the
README's test command and CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors_in_the_package():
    if not (REPO / "python" / "tritonshm").is_dir():
        pytest.skip("no source tree here (the tests run against an installed wheel)")
    # A missing mypy fails (ModuleNotFoundError below), never skips: the test extra has it.
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mypy found errors:\n{done.stdout}{done.stderr}"
    assert "Success: no issues found" in done.stdout
