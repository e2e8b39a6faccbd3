"""A griffe extension for the API reference: a default that is a module constant shows its value.

``ShardedStream(..., window: int = DEFAULT_WINDOW)`` reads well in the source, but in the
reference the name tells a reader nothing: the constant is not documented and its value (16)
is what they need. Once the package is loaded, every parameter whose default is the name of a
module-level constant with a literal or integer-arithmetic value (``CACHE_BYTES = 256 << 20``)
gets that value instead, in the signature and in the parameter rows (which the NumPy parser
takes from the signature). A name whose value cannot be worked out statically stays as it is.
tests/test_reference.py checks every signature and row against ``inspect.signature``, and the
built page for ``window: int = 16``.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

import griffe

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.expr) -> Any:
    """The value of a literal, or of integer arithmetic on literals; ValueError otherwise."""
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if not (isinstance(left, int) and isinstance(right, int)):
            raise ValueError("arithmetic on non-integers")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    return ast.literal_eval(node)


def constant_value(module: Any, name: str) -> str | None:
    """``repr`` of the value of constant ``name`` as ``module`` sees it, or None."""
    member = module.members.get(name)
    try:
        target = member.final_target if member is not None and member.is_alias else member
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    if target is None or not target.is_attribute or target.value is None:
        return None
    try:
        return repr(_evaluate(ast.parse(str(target.value), mode="eval").body))
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _functions(obj: Any) -> Any:
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_function:
            yield member
        elif member.is_class or member.is_module:
            yield from _functions(member)


class ConstantDefaults(griffe.Extension):
    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        for function in _functions(pkg):
            for parameter in function.parameters:
                if isinstance(parameter.default, griffe.ExprName):
                    value = constant_value(function.module, parameter.default.name)
                    if value is not None:
                        parameter.default = value
