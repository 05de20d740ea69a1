"""The documentation site builds with ``mkdocs build --strict``: a broken link, a heading a link
names that is not there, or a public name without a docstring fails the build, and so this test.

mkdocs, the Material theme and mkdocstrings come with the ``test`` extra; where they are missing
(an environment without the extra) the build is skipped, saying so. The build fetches nothing: no
plugin here reaches the internet.
"""

from __future__ import annotations

import html
import importlib.util
import logging
import os
import pathlib
import re
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
    # Issue 39: a class's signature is its constructor's, with the defaults (the pool's size, the
    # slot wait), laid out one parameter a line; a Sphinx role in a docstring links to its entry.
    signatures = [_text(code) for code in SIGNATURE.findall(reference)]
    client = next(sig for sig in signatures if sig.startswith("Client("))
    for parameter in ("url: str = 'localhost:8001'", "slots: int = 4", "max_pool_bytes: int = 1 << 30",
                      "slot_timeout: float | None = 60.0", "max_lent_bytes: int = 2 << 30"):
        assert f"\n    {parameter},\n" in client, client
    assert any(sig.startswith("RequestOptions(\n    *,\n    parameters:") for sig in signatures), signatures
    # A dataclass field's default_factory stays the constructor's default (not a required field).
    assert any(sig.startswith("LentStats(") and "copied: dict[str, int] = dict()," in sig for sig in signatures)
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="#tritonshm\.Client\.infer"><code>', reference)
    # ... and no private name: not the classes' private bases, not a private default or module.
    for page in sorted((tmp_path / "site" / "reference").glob("*/index.html")):
        html_text = page.read_text()
        text = _text(html_text)
        assert "ClientFace" not in text and "RequestFace" not in text and "HeldSlots" not in text, page
        assert "_re.compile" not in text and "_re." not in text, page
        if page.parent.name != "errors":  # there the exception hierarchy is shown: Error, ValueError
            assert "Bases:" not in text, page
        for signature in SIGNATURE.findall(html_text):
            assert not PRIVATE.search(_text(signature)), (page, _text(signature))


SIGNATURE = re.compile(r'<div class="doc-signature highlight"><pre><span></span><code>(.*?)</code></pre></div>', re.S)
PRIVATE = re.compile(r"(?<![\w.'\"])_[A-Za-z]\w*")


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_long_signature_is_one_parameter_a_line():
    """docs/_ext/hooks.py lays out a long signature as Black would (mkdocstrings does it only with
    Black or Ruff installed): Pygments' punctuation spans are where the lines break."""
    hooks = _load("hooks")

    def highlighted(*tokens: tuple[str, str]) -> str:
        return "".join(f'<span class="{kind}">{html.escape(text)}</span>' if kind else text for kind, text in tokens)

    long = highlighted(("nf", "Client"), ("p", "("), ("n", "url"), ("p", ":"), ("", " "), ("n", "str"), ("", " "),
                       ("o", "="), ("", " "), ("s1", "'localhost:8001'"), ("p", ","), ("", " "), ("o", "*"),
                       ("p", ","), ("", " "), ("n", "shapes"), ("p", ":"), ("", " "), ("n", "dict"), ("p", "["),
                       ("n", "str"), ("p", ","), ("", " "), ("n", "int"), ("p", "]"), ("", " "), ("o", "="),
                       ("", " "), ("mi", "4"), ("p", ")"), ("", " "), ("o", "->"), ("", " "), ("n", "tuple"),
                       ("p", "["), ("n", "int"), ("p", ","), ("", " "), ("n", "int"), ("p", "]"))
    assert _text(hooks.one_parameter_a_line(long)) == (
        "Client(\n    url: str = 'localhost:8001',\n    *,\n    shapes: dict[str, int] = 4,\n) -> tuple[int, int]")
    empty = highlighted(("nf", "no_parameters_but_a_long_name_and_return_type"), ("p", "()"), ("", " "),
                        ("o", "->"), ("", " "), ("n", "dict"), ("p", "["), ("n", "str"), ("p", ","), ("", " "),
                        ("n", "SomeVeryLongTypeName"), ("p", "]"))
    assert hooks.one_parameter_a_line(empty) == empty
    short = highlighted(("nf", "copy"), ("p", "("), ("n", "dst"), ("p", ","), ("", " "), ("n", "src"), ("p", ")"))
    assert hooks.one_parameter_a_line(short) == short


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
        import re as _re
        __all__ = ["documented", "undocumented", "Thing"]
        def documented():
            """Has one: see :class:`Thing`, :meth:`~Thing.method`, :class:`numpy.ndarray` and :func:`nowhere`."""
        def undocumented():
            pass
        #: the most there may be
        _LIMIT = 3
        _UNSET = object()
        class Thing:
            """A thing."""
            size: int  #: how big
            limit = _LIMIT
            pattern: "_re.Pattern[str]"  #: what it matches
            compiled = _re.compile("x")  #: a value that is code
            def method(self, n: int = _LIMIT, *, m: int = _UNSET, p: "_re.Pattern[str] | None" = None):
                pass
        '''))
    ext = _load("griffe_ext")
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.tritonshm.reference"):
        pkg = griffe.load("tritonshm", search_paths=[str(tmp_path)],
                          extensions=griffe.load_extensions(ext.ReadableDocstrings(modules=["tritonshm"])))
    warned = " | ".join(r.getMessage() for r in caplog.records)
    assert "tritonshm.undocumented has no docstring" in warned
    assert "tritonshm.Thing.method has no docstring" in warned
    assert "documented has no" not in warned.replace("undocumented has no", "")
    assert pkg["Thing.size"].docstring.value == "how big"
    assert pkg["Thing.limit"].docstring.value == "the most there may be"
    # A role is a link (autorefs' optional one) where the name is one of the package's, else code.
    assert pkg["documented"].docstring.value == (
        'Has one: see <autoref identifier="tritonshm.Thing" optional><code>Thing</code></autoref>, '
        '<autoref identifier="tritonshm.Thing.method" optional><code>method</code></autoref>, '
        '`numpy.ndarray` and `nowhere`.')
    # No private name in a signature: a private constant's value, "..." for a sentinel, a
    # module's own name for its private import.
    method = pkg["Thing.method"]
    assert [(p.name, str(p.default), str(p.annotation)) for p in method.parameters][1:] == [
        ("n", "3", "int"), ("m", "...", "int"), ("p", "None", "re.Pattern[str] | None")]
    assert str(pkg["Thing.pattern"].annotation) == "re.Pattern[str]"
    # An attribute's value is shown where it is a literal (a private constant's too), not code.
    assert str(pkg["Thing.limit"].value) == "3" and pkg["Thing.compiled"].value is None
