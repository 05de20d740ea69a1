"""A griffe extension for the API reference (mkdocs.yml names it for mkdocstrings' python handler).

Three things, once the ``tritonshm`` package is loaded from the source tree:

* **Docstrings of the Cython modules.** griffe reads ``tritonshm._memory`` through its ``.pyi``
  stubs, which carry the signatures; the docstrings are written once, in the ``.pyx`` sources, and
  compiled in. An object of a stub without a docstring gets the compiled object's (imported from
  the installed package; the signature Cython embeds as its first line is dropped).
* **Sphinx roles read as code.** The docstrings are written for ``help()`` and use Sphinx's
  roles (``:class:`Client```); the reference renders them as code spans (``Client``).
* **Attributes' Sphinx comments.** ``x: int  #: what x is`` (or ``#:`` lines right above it) is
  the attribute's docstring, as Sphinx reads it; a property made by a helper gets its runtime
  docstring; a name bound to another (``InferInput = _KeptInput``, ``limit = _LIMIT``) has the
  docstring of what it names. An attribute set on ``self`` in a method with neither is a constructor's argument
  kept, which its class's docstring describes: it is left out of the reference.
* **No undocumented public name.** Every name a documented module exports (its ``__all__``), and
  every public member of an exported class, must have a docstring: one without is a warning,
  which ``mkdocs build --strict`` turns into a failure (tests/docs/test_site.py).
"""

from __future__ import annotations

import importlib
import logging
import re
import types
from typing import Any

import griffe

# A logger under "mkdocs": its warnings count for `--strict` (mkdocs counts every warning there).
log = logging.getLogger("mkdocs.plugins.tritonshm.reference")

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|all):`([^`]+)`")
# The signature Cython's embedsignature puts on a docstring's first line: "Name.meth(self, x)\n\n".
_EMBEDDED_SIGNATURE = re.compile(r"\A[\w.]+\(.*?\)(?:\s*->\s*[^\n]+)?\n\n?", re.S)

_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)


def _role_text(match: re.Match[str]) -> str:
    target = match[1].strip()
    target = re.sub(r"^.*<(.+)>$", r"\1", target)  # "text <target>" -> target
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def readable(text: str) -> str:
    """*text* with Sphinx roles as code spans and reST's ``::`` before a literal block as ``:``."""
    text = _ROLE.sub(_role_text, text)
    return re.sub(r"(\S)::\n", r"\1:\n", text)


def _walk(obj: griffe.Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # type: ignore[arg-type]


class ReadableDocstrings(griffe.Extension):
    """The extension; *modules*: the documented modules whose public names must have docstrings."""

    def __init__(self, modules: list[str] | None = None) -> None:
        super().__init__()
        self.modules = modules or []

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "tritonshm":
            return
        undocumented_self = []
        for obj in _walk(pkg):
            if obj.docstring is None:
                doc = _sphinx_comment(obj) if obj.is_attribute else None
                if doc is None and (_in_stub(obj) or (obj.is_attribute and obj.parent and obj.parent.is_class)):
                    doc = _runtime_docstring(obj)
                if doc:
                    obj.docstring = griffe.Docstring(doc, parent=obj)
                elif _set_on_self(obj):
                    undocumented_self.append(obj)
            if obj.docstring is not None:
                obj.docstring.value = readable(obj.docstring.value)
        for obj in undocumented_self:  # a constructor's argument kept: its class documents it
            del obj.parent.members[obj.name]
        for obj in _walk(pkg):  # once every docstring is in: `A = B` is documented where B is
            if obj.is_attribute and obj.docstring is None:
                doc = _docstring_of_named(obj)
                if doc:
                    obj.docstring = griffe.Docstring(doc, parent=obj)
        self._warned: set[str] = set()
        for path in self.modules:
            self._check_documented(pkg, path)

    def _check_documented(self, pkg: griffe.Module, path: str) -> None:
        module = pkg if path == pkg.path else pkg[path[len(pkg.path) + 1:]]
        _require_docstring(module)
        # An `__all__` griffe cannot read (computed: the facades') reads as empty: then every public name.
        names = sorted(module.exports) if module.exports else [
            name for name in module.members if not name.startswith("_")]
        for name in names:
            member = module.get_member(name) if name in module.members else None
            if member is None:
                log.warning("%s.__all__ names %s, which the reference cannot find", path, name)
                continue
            try:
                target = member.final_target if member.is_alias else member
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue  # another package's (tritonclient's, re-exported): its own documentation
            _require_docstring(target, f"{path}.{name}", self._warned)
            if target.is_class:
                for child_name, child in target.members.items():
                    if child_name.startswith("_") or child.is_alias:
                        continue
                    _require_docstring(child, f"{path}.{name}.{child_name}", self._warned)


def _docstring_of_named(obj: griffe.Object) -> str | None:
    """The docstring of what *obj* is bound to, where its value is a bare name (``A = B``, a class
    attribute ``limit = _LIMIT``): the name looked up in its class, then its module, as Python
    would."""
    value = getattr(obj, "value", None)
    if not isinstance(value, griffe.ExprName):
        return None
    scope = obj.parent
    while scope is not None:
        if value.name in scope.members:
            target = scope.members[value.name]
            try:
                target = target.final_target if target.is_alias else target
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return None
            if target is obj or target.docstring is None:
                return None
            return target.docstring.value
        scope = scope.parent
    return None


def _set_on_self(obj: griffe.Object) -> bool:
    """Whether *obj* is an attribute made by ``self.name = ...`` in a method (not a declared field)."""
    if not (obj.is_attribute and obj.lineno and obj.module.filepath):
        return False
    line = obj.lines_collection[obj.module.filepath][obj.lineno - 1]
    return line.strip().startswith("self.")


def _require_docstring(obj: griffe.Object, name: str | None = None, warned: set[str] | None = None) -> None:
    if warned is not None:
        if obj.path in warned:  # the same object exported by two modules: one warning
            return
        warned.add(obj.path)
    if obj.docstring is None or not obj.docstring.value.strip():
        where = f" ({obj.relative_filepath}:{obj.lineno})" if obj.lineno else ""
        log.warning("the public %s %s has no docstring%s", obj.kind.value, name or obj.path, where)


def _in_stub(obj: griffe.Object) -> bool:
    return str(obj.module.filepath).endswith(".pyi")


def _sphinx_comment(obj: griffe.Object) -> str | None:
    """An attribute's Sphinx comment: ``x: int  #: what x is``, or ``#:`` lines right above it."""
    if not obj.lineno or obj.module.filepath is None:
        return None
    try:
        lines = obj.lines_collection[obj.module.filepath]
    except KeyError:
        return None
    own = lines[obj.lineno - 1]
    if "#:" in own:
        return own.split("#:", 1)[1].strip() or None
    above = []
    for line in reversed(lines[:obj.lineno - 1]):
        if not line.strip().startswith("#:"):
            break
        above.insert(0, line.strip()[2:].strip())
    return "\n".join(above) or None


def _runtime_docstring(obj: griffe.Object) -> str | None:
    """The docstring of *obj*'s runtime counterpart in the installed package, if any: a compiled
    module's object (a stub has none), or a class attribute made by a descriptor (a property)."""
    parts = obj.path.split(".")
    module_path = obj.module.path
    try:
        value: Any = importlib.import_module(module_path)
    except ImportError as exc:
        if not _in_stub(obj):
            return None
        log.warning("cannot import %s for the docstrings of its stubs: %s (install the package first)",
                    module_path, exc)
        return None
    if obj is obj.module:
        doc = value.__doc__
    else:
        for part in parts[len(module_path.split(".")):]:
            holder = value
            value = (holder.__dict__.get(part) if isinstance(holder, type) else None) or getattr(holder, part, None)
            if value is None:
                return None
        if obj.is_attribute and not isinstance(value, (property, *_DESCRIPTORS)):
            return None  # a plain value (a class attribute's str, say): its type's docstring is not its own
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        doc = getattr(value, "__doc__", None)
        if doc == type(value).__doc__:
            return None  # the docstring of its type (classmethod's, say), not its own
    if not isinstance(doc, str):
        return None
    return _EMBEDDED_SIGNATURE.sub("", doc, count=1).strip() or None
