"""A griffe extension for the API reference: one row per parameter, with its own type and default.

NumPy-style docstrings may describe several parameters in one entry (``num_replicas, rank,
seed``). griffe gives each name a row of its own but takes the type and default of every row
in such an entry from the signature of the first name only, so ``seed`` would show the default
of ``num_replicas``. This splits such an entry into one entry per name before the docstring is
parsed: the first keeps the description, the others point to it, and each row's type and
default come from the signature of its own name (or from the entry's type, when it gives one).
tests/test_reference.py checks every row against ``inspect.signature``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SECTIONS = ("Parameters", "Other Parameters")
_NAME = re.compile(r"\*{0,2}[A-Za-z_]\w*")


def split_grouped_entries(text: str) -> str:
    """The docstring ``text`` with every grouped parameter entry split, one entry per name."""
    lines = text.split("\n")
    out: list[str] = []
    in_section = False
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line and not line[0].isspace() and re.fullmatch(r"-{3,}", nxt.strip()):
            in_section = line.strip() in _SECTIONS
            out += [line, nxt]
            i += 2
            continue
        if in_section and line and not line[0].isspace():
            names_part, sep, kind = line.partition(" : ")
            names = [n.strip() for n in names_part.split(",")]
            if len(names) > 1 and all(_NAME.fullmatch(n) for n in names):
                body: list[str] = []
                i += 1
                while i < len(lines) and (not lines[i] or lines[i][0].isspace()):
                    body.append(lines[i])
                    i += 1
                while body and not body[-1]:
                    body.pop()
                indent = next((b[: len(b) - len(b.lstrip())] for b in body if b), "    ")
                first = names[0].lstrip("*")
                for k, name in enumerate(names):
                    out.append(f"{name}{sep}{kind}")
                    out += body if k == 0 else [f"{indent}See ``{first}``."]
                out.append("")
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class GroupedParameters(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is not None and any(s in docstring.value for s in _SECTIONS):
            docstring.value = split_grouped_entries(docstring.value)
