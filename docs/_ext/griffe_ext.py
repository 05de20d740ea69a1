"""A griffe extension for the API reference (mkdocs.yml names it for mkdocstrings' python handler).

What it does, once the ``tritonshm`` package is loaded from the source tree:

* **Docstrings of the Cython modules.** griffe reads ``tritonshm._memory`` through its ``.pyi``
  stubs, which carry the signatures; the docstrings are written once, in the ``.pyx`` sources, and
  compiled in. An object of a stub without a docstring gets the compiled object's (imported from
  the installed package; the signature Cython embeds as its first line is dropped).
* **Sphinx roles read as links.** The docstrings are written for ``help()`` and use Sphinx's
  roles (``:class:`Client```); the reference renders them as code spans (``Client``), each a link
  to the object's entry where the name resolves (as Sphinx would: the object's own scope, then
  its class's and module's) to one the reference shows -- an optional cross-reference, as
  mkdocstrings' own: one the site has no entry for stays a code span, no warning.
* **No private names in signatures.** A default that is a private constant (``patience=_IN_USE_PATIENCE``)
  shows its value (``1.0``), or ``...`` where it is a sentinel (``_UNSET``: "not given"); a type
  named through a private import (``'_re.Pattern[str]'``, ``import re as _re``) shows the module's
  own name (``re.Pattern[str]``); an attribute's value that names something private shows the
  constant's value, or nothing where it is code (``UNKNOWN_MODEL = _re.compile(...)``).
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

import ast
import html
import importlib
import logging
import re
import types
from typing import Any, Callable

import griffe

# A logger under "mkdocs": its warnings count for `--strict` (mkdocs counts every warning there).
log = logging.getLogger("mkdocs.plugins.tritonshm.reference")

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|all):`([^`]+)`")
# The signature Cython's embedsignature puts on a docstring's first line: "Name.meth(self, x)\n\n".
_EMBEDDED_SIGNATURE = re.compile(r"\A[\w.]+\(.*?\)(?:\s*->\s*[^\n]+)?\n\n?", re.S)

_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)


def _role_text(match: re.Match[str], resolve: Callable[[str], str | None] | None = None) -> str:
    target = match[1].strip()
    target = re.sub(r"^.*<(.+)>$", r"\1", target)  # "text <target>" -> target
    short = target.startswith("~")
    target = target.lstrip("~")
    title = target.rsplit(".", 1)[-1] if short else target
    path = resolve(target.removesuffix("()")) if resolve else None
    if path is None:
        return f"`{title}`"
    # autorefs' own element (what mkdocstrings writes for a type in a signature): a link where the
    # site has an entry for *path* (its canonical path or the one it is shown under), else the title.
    return f'<autoref identifier="{html.escape(path)}" optional><code>{html.escape(title)}</code></autoref>'


def readable(text: str, resolve: Callable[[str], str | None] | None = None) -> str:
    """*text* with Sphinx roles as code spans -- links where *resolve* gives a role's target a path
    -- and reST's ``::`` before a literal block as ``:``."""
    text = _ROLE.sub(lambda match: _role_text(match, resolve), text)
    return re.sub(r"(\S)::\n", r"\1:\n", text)


def _resolver(obj: griffe.Object) -> Callable[[str], str | None]:
    """Where a role's target in *obj*'s docstring is: the canonical path of the object the name
    finds in *obj*'s scope, then its parents' (the class's, the module's), or as a full path; None
    where it finds none, or one of another package (numpy's, tritonclient's: not on this site)."""

    def resolve(target: str) -> str | None:
        first, _, rest = target.partition(".")
        scope: griffe.Object | None = obj
        found: Any = None
        while scope is not None and found is None:
            if first in scope.members:
                found = scope.members[first]
                for part in rest.split(".") if rest else ():
                    try:
                        found = found.members[part]
                    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                        found = None
                        break
            scope = scope.parent
        if found is None and rest:
            try:
                found = obj.modules_collection.get_member(target)
            except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                found = None
        if found is None:
            return None
        try:
            return found.final_target.canonical_path if found.is_alias else found.canonical_path
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None

    return resolve


# A module imported under a private name (``import re as _re``), in a type: ``'_re.Pattern[str]'``.
_QUOTED_PRIVATE = re.compile(r"""(['"])(_\w+\.[\w.\[\], |]+)\1""")
_PRIVATE_QUALIFIER = re.compile(r"(?<![\w.])(_\w+)\.")


def _public_type(annotation: Any, module: griffe.Module) -> Any:
    """*annotation* with a module's private import name (``_re``) as the module's own (``re``), and
    the quotes around such a type dropped; *annotation* itself where it has none."""
    if annotation is None:
        return None
    text = str(annotation)

    def module_name(match: re.Match[str]) -> str:
        member = module.members.get(match[1])
        if member is not None and member.is_alias and "." not in match[1]:
            target = member.target_path
            if not target.split(".")[-1].startswith("_"):
                return target + "."
        return match[0]

    public = _PRIVATE_QUALIFIER.sub(module_name, _QUOTED_PRIVATE.sub(
        lambda m: m[2] if _PRIVATE_QUALIFIER.sub(module_name, m[2]) != m[2] else m[0], text))
    return annotation if public == text else public


_LITERAL_NODES = (ast.Expression, ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.BinOp, ast.UnaryOp,
                  ast.operator, ast.unaryop, ast.Load)


def _is_literal(text: str) -> bool:
    """Whether *text* is a literal, or arithmetic on literals (``128 << 10``)."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return False
    return all(isinstance(node, _LITERAL_NODES) for node in ast.walk(tree))


def _public_default(default: Any, scope: griffe.Object) -> Any:
    """A parameter's default that is a private name (``_IN_USE_PATIENCE``): its value where that is a
    literal (``1.0``), else ``...`` (a sentinel, ``_UNSET``: the parameter is optional, and what
    leaving it out means its description says)."""
    if not isinstance(default, griffe.ExprName) or not default.name.startswith("_"):
        return default
    holder: griffe.Object | None = scope
    while holder is not None:
        member = holder.members.get(default.name)
        if member is not None:
            try:
                target = member.final_target if member.is_alias else member
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                break
            value = getattr(target, "value", None)
            if value is None:  # a class, a function, an attribute with no value
                break
            if not _is_literal(str(value)):
                break
            return str(value)
        holder = holder.parent
    return "..."


def _public_signature(obj: griffe.Object) -> None:
    """*obj*'s signature (a function's parameters and return type, an attribute's type) with no
    private name in it: see :func:`_public_type` and :func:`_public_default`."""
    module = obj.module
    if obj.is_function:
        for parameter in obj.parameters:  # type: ignore[attr-defined]
            parameter.annotation = _public_type(parameter.annotation, module)
            parameter.default = _public_default(parameter.default, obj.parent or module)
        obj.returns = _public_type(obj.returns, module)  # type: ignore[attr-defined]
    elif obj.is_attribute:
        obj.annotation = _public_type(obj.annotation, module)  # type: ignore[attr-defined]
        obj.value = _public_value(obj.value, obj, obj.parent or module)  # type: ignore[attr-defined]


def _public_value(value: Any, owner: griffe.Object, scope: griffe.Object) -> Any:
    """An attribute's value as the reference shows it: as written (an enum member's string, a table
    of reasons, a field's default), unless it names something private -- then a private constant's
    literal value (``_INLINE_BYTES``: ``128 << 10``), or none where it is code
    (``UNKNOWN_MODEL = _re.compile(...)``, ``_rule(...)``): the attribute's docstring says what it
    is -- and none for an attribute set in a method (``self.model = model``: not a default)."""
    if value is None or _is_literal(str(value)):
        return value
    if "instance-attribute" in owner.labels and "class-attribute" not in owner.labels:
        return None
    if isinstance(value, griffe.ExprName) and value.name.startswith("_"):
        shown = _public_default(value, scope)
        return None if shown == "..." else shown
    if isinstance(value, griffe.Expr) and not any(
            isinstance(part, griffe.ExprName) and part.name.startswith("_") for part in value.iterate(flat=True)):
        return value
    return None


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
                obj.docstring.value = readable(obj.docstring.value, _resolver(obj))
        for obj in undocumented_self:  # a constructor's argument kept: its class documents it
            del obj.parent.members[obj.name]
        for obj in _walk(pkg):  # once every docstring is in: `A = B` is documented where B is
            if obj.is_attribute and obj.docstring is None:
                doc = _docstring_of_named(obj)
                if doc:
                    obj.docstring = griffe.Docstring(doc, parent=obj)
        for obj in _walk(pkg):  # last: the pass above reads the values as written
            _public_signature(obj)
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
