"""The picture in tritonshm.client's docstring is the code's: every module of the package is in
its table, and each imports (from the package) only modules above it -- so the table read top
down is the order to read the package in, and no import circle can form."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tritonshm.client

PACKAGE = Path(tritonshm.client.__file__).parent


def table_order():
    return re.findall(r"^``(_\w+)``", tritonshm.client.__doc__, flags=re.M)


def package_imports(module: str) -> set[str]:
    """The modules of tritonshm.client that *module* imports (``from ._x import``, ``from . import _x``)."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_every_module_is_in_the_docstrings_table_once():
    order = table_order()
    modules = sorted(path.stem for path in PACKAGE.glob("_*.py") if path.stem != "__init__")
    assert sorted(order) == modules
    assert len(order) == len(set(order))


def test_each_module_imports_only_modules_above_it():
    order = table_order()
    for position, module in enumerate(order):
        below = package_imports(module) - set(order[:position])
        assert not below, f"{module} imports {sorted(below)}, which the table puts at or below it"
