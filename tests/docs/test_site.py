"""The documentation site builds with ``mkdocs build --strict``: a broken link, a heading a link
names that is not there, or a public name without a docstring fails the build, and so this test.

mkdocs, the Material theme and mkdocstrings come with the ``test`` extra; where they are missing
(an environment without the extra) the build is skipped, saying so. The build fetches nothing: no
plugin here reaches the internet.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_NEEDED = {"mkdocs": "mkdocs", "material": "mkdocs-material", "mkdocstrings": "mkdocstrings",
           "mkdocstrings_handlers.python": "mkdocstrings-python", "yaml": "PyYAML", "griffe": "griffe"}


def _missing() -> list[str]:
    missing = []
    for module, package in _NEEDED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(package)
    return missing


needs_mkdocs = pytest.mark.skipif(
    bool(_missing()), reason=f"the site needs {', '.join(_missing())} (pip install '.[test]')")


def mkdocs_build(config: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
    # From the repository root: mkdocs.yml names the griffe extension by a path relative to it.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about MkDocs 2.0, not ours
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@needs_mkdocs
def test_site_builds_strict(tmp_path):
    done = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").exists()
    reference = (tmp_path / "site" / "reference" / "tritonshm" / "index.html").read_text()
    # The API reference has the client and the regions, with their docstrings (the Cython ones
    # from the compiled modules: the stubs have signatures only) and no Sphinx roles left.
    assert "tritonshm.Client" in reference and "infer_async" in reference
    assert "Create a new segment of" in reference  # SystemRegion.create's docstring, in _system.pyx
    assert ":class:" not in reference and ":meth:" not in reference


@needs_mkdocs
def test_a_broken_link_fails_the_build(tmp_path):
    """The site's validation settings (mkdocs.yml's own) turn a link to a missing page or heading
    into an error: a small site with the same settings and two bad links does not build."""
    import yaml

    settings = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](missing.md) and [no such heading](other.md#nowhere)\n")
    (docs / "other.md").write_text("# Other\n\n## Somewhere\n")
    config = {"site_name": "t", "docs_dir": str(docs), "strict": settings["strict"],
              "validation": settings["validation"], "markdown_extensions": ["toc"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "missing.md" in done.stderr and "nowhere" in done.stderr, done.stderr


@needs_mkdocs
def test_a_missing_docstring_is_a_warning(tmp_path, caplog):
    """docs/_ext/griffe_ext.py warns (on a logger of mkdocs', so --strict fails) for an exported
    name without a docstring, reads Sphinx's #: comments as attributes' docstrings, and gives a
    name bound to another (``limit = _LIMIT``) the docstring of what it names."""
    import griffe

    package = tmp_path / "tritonshm"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent('''\
        """A package."""
        __all__ = ["documented", "undocumented", "Thing"]
        def documented():
            """Has one: see :class:`Thing`."""
        def undocumented():
            pass
        #: the most there may be
        _LIMIT = 3
        class Thing:
            """A thing."""
            size: int  #: how big
            limit = _LIMIT
            def method(self):
                pass
        '''))
    spec = importlib.util.spec_from_file_location("griffe_ext", DOCS / "_ext" / "griffe_ext.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.tritonshm.reference"):
        pkg = griffe.load("tritonshm", search_paths=[str(tmp_path)],
                          extensions=griffe.load_extensions(ext.ReadableDocstrings(modules=["tritonshm"])))
    warned = " | ".join(r.getMessage() for r in caplog.records)
    assert "tritonshm.undocumented has no docstring" in warned
    assert "tritonshm.Thing.method has no docstring" in warned
    assert "documented has no" not in warned.replace("undocumented has no", "")
    assert pkg["Thing.size"].docstring.value == "how big"
    assert pkg["Thing.limit"].docstring.value == "the most there may be"
    assert pkg["documented"].docstring.value == "Has one: see `Thing`."
