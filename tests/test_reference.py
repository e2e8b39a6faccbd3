"""The API reference shows each parameter's real type and default.

The site's reference pages (docs/reference/*.md, ``::: path``) are rendered by mkdocstrings from
what griffe parses out of the docstrings, with the griffe extensions mkdocs.yml names. Here the
same parse, with the same extensions, is compared row by row with ``inspect.signature`` of the
installed objects: every parameter row must name a real parameter, show that parameter's own
default, and a type that is the signature's or one the docstring gives that agrees with it.
Needs griffe (the `docs` extra) and a checkout (docs/ is not in the sdist); CI sets
FASTSHARD_REQUIRE_DOCS=1, under which a missing griffe fails instead of skipping.
"""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"

if not (REFERENCE.is_dir() and (ROOT / "mkdocs.yml").is_file()):
    pytest.skip("no docs/reference beside tests/ (an sdist)", allow_module_level=True)
if os.environ.get("FASTSHARD_REQUIRE_DOCS") == "1":
    import griffe
    import yaml
else:
    griffe = pytest.importorskip("griffe", reason="needs the docs extra")
    yaml = pytest.importorskip("yaml", reason="needs the docs extra")

SIMPLE = {"int", "bool", "float", "str", "bytes"}


def handler_options() -> dict[str, Any]:
    # mkdocs.yml may carry YAML tags of plugins; the loader ignores them.
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            return plugin["mkdocstrings"]["handlers"]["python"]
    raise AssertionError("mkdocs.yml has no mkdocstrings python handler")


@pytest.fixture(scope="module")
def package() -> Any:
    handler = handler_options()
    options = handler["options"]
    cwd = os.getcwd()
    os.chdir(ROOT)  # the extensions are named relative to the root, as mkdocs reads them
    try:
        extensions = griffe.load_extensions(*options.get("extensions", []))
    finally:
        os.chdir(cwd)
    loader = griffe.GriffeLoader(
        docstring_parser=griffe.Parser(options["docstring_style"]),
        search_paths=[str(ROOT / p) for p in handler.get("paths", ["."])],
        extensions=extensions,
    )
    loader.load("fastshard")
    loader.load("fastshard.transformers")
    loader.resolve_aliases(implicit=False, external=False)
    return loader.modules_collection, options


def documented_paths() -> list[str]:
    paths = []
    for page in sorted(REFERENCE.glob("*.md")):
        paths += re.findall(r"(?m)^::: ([\w.]+)", page.read_text(encoding="utf-8"))
    return paths


def shown(name: str, filters: list[str]) -> bool:
    keep = True
    for f in filters:
        negate, pattern = f.startswith("!"), f.lstrip("!")
        if re.search(pattern, name):
            keep = not negate
    return keep


def runtime(path: str) -> Any:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ImportError as err:
            if err.name and not f"{module}.".startswith(f"{err.name}."):
                raise  # a module that exists but needs what is missing (fastshard.transformers)
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)


def callables(collection: Any, options: dict[str, Any]) -> list[tuple[str, Any]]:
    """(path, griffe object) of every callable whose parameters the reference shows."""
    filters = options.get("filters", [])
    out: list[tuple[str, Any]] = []
    for path in documented_paths():
        obj = collection[path]
        obj = obj.final_target if obj.is_alias else obj
        if obj.is_function:
            out.append((path, obj))
        elif obj.is_class:
            out.append((path, obj))
            for name, member in obj.all_members.items():
                target = member.final_target if member.is_alias else member
                if target.is_function and shown(name, filters) and target.docstring:
                    out.append((f"{path}.{name}", target))
        elif obj.is_module:
            for name, member in obj.members.items():
                if member.is_alias or not shown(name, filters) or name.startswith("_"):
                    continue
                if member.is_function and member.docstring:
                    out.append((f"{path}.{name}", member))
    return out


def parameter_rows(obj: Any) -> list[Any]:
    rows = []
    for section in obj.docstring.parsed if obj.docstring else []:
        if section.kind.value in ("parameters", "other parameters"):
            rows += section.value
    return rows


def literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def annotation_text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def agrees(shown_type: str, signature_type: str) -> bool:
    """A type written in the docstring agrees with the annotation: the same, or, where the
    annotation is made of simple types, one of them (``int`` for ``int | None``; a set of
    choices for ``str``)."""
    norm = lambda t: re.sub(r"\s+", "", t)  # noqa: E731
    if norm(shown_type) == norm(signature_type) or signature_type in ("", "Any"):
        return True
    parts = {p.strip() for p in signature_type.split("|")} - {"None"}
    if not parts <= SIMPLE:
        return True  # a prose type beside a complex annotation: not compared
    if shown_type.startswith("{") or shown_type.startswith("("):
        return "str" in parts or "int" in parts
    words = set(re.findall(r"[A-Za-z_]+", shown_type)) - {"or", "optional", "None"}
    return bool(words & parts) and words <= parts | {"default"}


def test_the_reference_documents_the_public_callables(package):
    collection, options = package
    paths = [p for p, _ in callables(collection, options)]
    for name in ("fastshard.MixtureSampler", "fastshard.ShardedStream", "fastshard.PackedSampler"):
        assert name in paths
    assert "fastshard.DistributedSampler.indices" in paths
    assert len(paths) > 40


def test_every_parameter_row_shows_the_real_default_and_type(package):
    collection, options = package
    wrong = []
    checked = 0
    for path, obj in callables(collection, options):
        try:
            live = runtime(path)
        except ImportError:
            continue  # fastshard.transformers without transformers installed
        try:
            signature = inspect.signature(live)
        except (TypeError, ValueError):
            continue
        params = signature.parameters
        for row in parameter_rows(obj):
            checked += 1
            where = f"{path}({row.name})"
            name = row.name.lstrip("*")
            if name not in params:
                wrong.append(f"{where}: no such parameter")
                continue
            real = params[name]
            if not (row.description or "").strip():
                wrong.append(f"{where}: no description")
            if real.kind in (real.VAR_POSITIONAL, real.VAR_KEYWORD):
                pass  # griffe writes () and {} for *args and **kwargs: what they are when empty
            elif real.default is inspect.Parameter.empty:
                if row.default not in (None, ""):
                    wrong.append(f"{where}: shows default {row.default}, has none")
            else:
                text = str(row.default) if row.default is not None else ""
                same = literal(text) == real.default if text else False
                # a module constant's name (window=DEFAULT_WINDOW) is no default a reader can
                # use: the row shows its value (docs/_hooks/constant_defaults.py)
                if not same and text != repr(real.default):
                    wrong.append(f"{where}: shows default {text or 'none'}, is {real.default!r}")
            shown_type = "" if row.annotation is None else str(row.annotation)
            if not agrees(shown_type, annotation_text(real.annotation)):
                wrong.append(
                    f"{where}: shows type {shown_type!r}, is {annotation_text(real.annotation)!r}"
                )
    assert checked > 100
    assert not wrong, "\n".join(wrong)


def test_a_grouped_entry_gets_each_names_own_values(package):
    # The case the extension exists for: seed and auto_epoch are described in one entry with
    # other names, and each row must still show its own default.
    collection, _ = package
    rows = {r.name: r for r in parameter_rows(collection["fastshard.MixtureSampler"])}
    assert rows["seed"].default == "0" and rows["auto_epoch"].default == "False"
    assert str(rows["drop_last"].annotation) == "bool"


def test_every_signature_shows_default_values(package):
    # The signature above each entry is drawn from the same parameters: a default that is a
    # module constant shows its value (window: int = 16), not the constant's name.
    collection, options = package
    wrong = []
    checked = 0
    for path, obj in callables(collection, options):
        try:
            live = inspect.signature(runtime(path))
        except ImportError:
            continue  # fastshard.transformers without transformers installed
        except (TypeError, ValueError):
            continue
        for param in obj.parameters:
            real = live.parameters.get(param.name)
            if real is None or real.default is inspect.Parameter.empty or param.default is None:
                continue
            checked += 1
            text = str(param.default)
            if literal(text) != real.default and text != repr(real.default):
                wrong.append(f"{path}({param.name}): shows = {text}, is {real.default!r}")
    assert checked > 50
    assert not wrong, "\n".join(wrong)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as .ci/run builds it (strict), into a temporary folder."""
    if os.environ.get("FASTSHARD_REQUIRE_DOCS") != "1":
        pytest.importorskip("mkdocs", reason="needs the docs extra")
        pytest.importorskip("mkdocstrings_handlers.python", reason="needs the docs extra")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def page_text(site: Path, page: str) -> str:
    """A built page's text, tags dropped and whitespace collapsed (a signature is split into
    one span per token)."""
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / page / "index.html").read_text("utf-8")))
    return re.sub(r"\s+", " ", text)


def test_the_built_reference_shows_constant_defaults_as_values(site):
    streams = page_text(site, "reference/streams")
    assert "window: int = 16," in streams
    assert "max_open_files: int = 64," in streams
    for name in ("DEFAULT_WINDOW", "MAX_OPEN_FILES", "INDEX_EVERY", "CACHE_BYTES", "PY_ROWS"):
        assert name not in streams


# The readers' classes that a `*_shards` function builds and returns as `read`: what a user
# calls is the function, and the classes' constructors are not an interface to keep.
INTERNAL_READERS = {"FilePool", "TarRead", "RowGroupCache", "ParquetRead", "MdsRead"}


def test_the_streams_reference_lists_what_users_call(site):
    text = (site / "reference" / "streams" / "index.html").read_text("utf-8")
    entries = set(re.findall(r'id="fastshard\.readers\.(\w+)"', text))
    readers = importlib.import_module("fastshard.readers")
    public = set(readers.__all__) - INTERNAL_READERS
    assert {"tar_shards", "parquet_shards", "mds_shards", "Shards"} <= public
    # a public name added to fastshard.readers must be added to docs/reference/streams.md
    assert public - entries == set()
    assert entries & INTERNAL_READERS == set()
