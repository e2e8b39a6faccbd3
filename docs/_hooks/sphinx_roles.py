"""A griffe extension for the API reference: the docstrings' Sphinx roles as Markdown.

fastshard's docstrings are NumPy style and name other objects with Sphinx roles
(:class:`DistributedSampler`, :meth:`state_dict`), which IDEs and ``help()`` show as they are.
mkdocstrings renders Markdown, where a role would show as ``:class:`` text. This rewrites each
role to a cross-reference when it names a public object of fastshard (``fastshard.X`` for a
name in ``fastshard.__all__``, ``fastshard.transformers.X``, or a method of the documented
class), and to plain code otherwise (torch's objects, private helpers). It also drops reST's
literal-block marker ``::``.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Any

import griffe

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ROLE = re.compile(r":(?:class|meth|func|attr|exc|obj|data|mod):`~?([A-Za-z_][\w.]*)(?:\(\))?`")


def _public_names() -> set[str]:
    """``fastshard.__all__``, read from the source (the build need not import the package)."""
    with open(os.path.join(_ROOT, "fastshard", "__init__.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise RuntimeError("fastshard/__init__.py has no __all__")


_PUBLIC = _public_names()
_TRANSFORMERS = {"FastshardTrainer"}


def _public_path(name: str) -> str | None:
    if name in _PUBLIC:
        return f"fastshard.{name}"
    if name in _TRANSFORMERS:
        return f"fastshard.transformers.{name}"
    return None


def _enclosing_class(obj: Any) -> str | None:
    while obj is not None and not getattr(obj, "is_class", False):
        obj = obj.parent
    return None if obj is None else obj.name


def _target(name: str, obj: Any) -> str | None:
    parts = name.split(".")
    if parts[0] == "fastshard":
        parts = parts[1:]
        if parts[:1] == ["transformers"]:
            parts = parts[1:]
    if not parts:
        return None
    head = _public_path(parts[0])
    if head is not None:
        return ".".join([head, *parts[1:]])
    if len(parts) == 1:  # a method or attribute of the class being documented
        cls = _enclosing_class(obj)
        path = None if cls is None else _public_path(cls)
        if path is not None:
            return f"{path}.{parts[0]}"
    return None


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is None:
            return
        # reST's literal-block marker: "text::" shows as "text:", a lone "::" not at all (the
        # indented block after it is a code block in Markdown too).
        value = re.sub(r"(?m)^[ \t]*::[ \t]*\n", "", docstring.value)
        docstring.value = re.sub(r"(?<=\S)::(?=[ \t]*\n)", ":", value)
        if ":`" not in docstring.value:
            return

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            target = _target(name, obj)
            shown = f"`{name.split('.')[-1] if match.group(0).find('~') > 0 else name}`"
            return shown if target is None else f"[{shown}][{target}]"

        docstring.value = _ROLE.sub(replace, docstring.value)
