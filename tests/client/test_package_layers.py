"""The pictures in the docstrings of tritonshm.client and tritonshm.facade are the code's: every
module of the package is in its table, and each imports (from the package) only modules above it
-- so the table read top down is the order to read the package in, and no import circle can form.
And the facade's layout holds: tritonclient's API (tritonshm.grpc, tritonshm.http and their .aio)
stands on the slot routing in tritonshm.facade, never the other way round."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tritonshm
import tritonshm.client
import tritonshm.facade

PACKAGES = [tritonshm.client, tritonshm.facade]
ROOT = Path(tritonshm.__file__).parent


def table_order(package):
    return re.findall(r"^``(_\w+)``", package.__doc__, flags=re.M)


def package_imports(package, module: str) -> set[str]:
    """The modules of *package* that *module* imports (``from ._x import``, ``from . import _x``)."""
    found = set()
    source = Path(package.__file__).parent / f"{module}.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def tritonshm_imports(path: Path) -> set[str]:
    """The tritonshm modules the file at *path* imports, as dotted names (relative imports resolved)."""
    package = ".".join(path.parent.relative_to(ROOT.parent).parts)  # what a relative import starts from
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "tritonshm" or name.startswith("tritonshm.")}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.__name__)
def test_every_module_is_in_the_docstrings_table_once(package):
    order = table_order(package)
    modules = sorted(path.stem for path in Path(package.__file__).parent.glob("_*.py") if path.stem != "__init__")
    assert sorted(order) == modules
    assert len(order) == len(set(order))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.__name__)
def test_each_module_imports_only_modules_above_it(package):
    order = table_order(package)
    for position, module in enumerate(order):
        below = package_imports(package, module) - set(order[:position])
        assert not below, f"{module} imports {sorted(below)}, which the table puts at or below it"


def test_the_facades_modules_are_in_one_package_under_tritonclients_names():
    """What is ours is in tritonshm/facade/, what is tritonclient's API in tritonshm/grpc/ and
    tritonshm/http/: no facade module lies loose at the top of the package."""
    assert sorted(path.name for path in ROOT.glob("*facade*")) == ["facade"]
    for public in ("grpc", "http"):
        assert sorted(path.name for path in (ROOT / public).glob("*.py")) == ["__init__.py", "aio.py"]


def test_the_slot_routing_never_imports_tritonclients_api():
    for path in sorted((ROOT / "facade").glob("*.py")):
        above = {name for name in tritonshm_imports(path)
                 if name.split(".")[:2] in (["tritonshm", "grpc"], ["tritonshm", "http"])}
        assert not above, f"facade/{path.name} imports {sorted(above)}: the public modules stand on it, not under it"


def test_tritonclients_api_reaches_the_slot_routing_through_the_facade_package():
    """tritonshm.grpc / .http import the facade's modules, and nothing else of tritonshm that
    is the facade's to hold: the held client and its stream table are reached through it."""
    for public in ("grpc", "http"):
        for path in sorted((ROOT / public).glob("*.py")):
            names = tritonshm_imports(path)
            assert any(name.startswith("tritonshm.facade.") for name in names), f"{public}/{path.name}"
            client = {name for name in names if name.startswith("tritonshm.client")}
            assert not client, f"{public}/{path.name} imports {sorted(client)}: the facade's route holds the client"
